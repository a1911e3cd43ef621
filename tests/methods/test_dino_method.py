"""DINO training steps on tiny ViTs and ResNets: multi-crop wiring, the EMA teacher, the centre, the temperature
warm-up, the frozen last layer, the view count checked on load."""

from __future__ import annotations

import pytest
import torch

from selfsup.config import ConfigError
from selfsup.load import load_config
from selfsup.losses.dino import TeacherCentre, dino_loss
from selfsup.methods import build_method
from selfsup.methods.dino import DINOConfig
from selfsup.models import build_backbone

B, SIZE, LOCAL, PATCH = 6, 16, 8, 4


def _vit(**kwargs):
    return build_backbone("vit_custom", img_size=SIZE, patch_size=PATCH, in_channels=3, embed_dim=32, depth=2,
                          num_heads=2, pos_embed="learned", **kwargs)


def _method(total_steps: int = 100, backbone=None, **cfg):
    torch.manual_seed(0)
    spec = {"name": "dino", "out_dim": 24, "head_hidden": 32, "bottleneck": 8, **cfg}
    return build_method(spec, backbone if backbone is not None else _vit(), total_steps).train()


def _views(num_local: int = 3, channels: int = 3, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return ([torch.rand(B, channels, SIZE, SIZE, generator=g) for _ in range(2)]
            + [torch.rand(B, channels, LOCAL, LOCAL, generator=g) for _ in range(num_local)])


def _block_inputs(vit) -> list[tuple[int, ...]]:
    shapes: list[tuple[int, ...]] = []
    vit.blocks[0].register_forward_hook(lambda mod, inp, out: shapes.append(tuple(inp[0].shape)))
    return shapes


def test_local_crops_reach_the_student_only() -> None:
    method = _method()
    student, teacher = _block_inputs(method.encoder), _block_inputs(method.teacher.module[0])
    method(_views(num_local=3))
    assert student == [(2 * B, 1 + 16, 32), (3 * B, 1 + 4, 32)]  # one call per crop size (their MultiCropWrapper)
    assert teacher == [(2 * B, 1 + 16, 32)]  # the two global crops only


def test_step_is_the_dino_loss_of_teacher_globals_against_every_other_student_view() -> None:
    method = _method(teacher_temperature=0.06, teacher_temperature_warmup=0.0)
    method.centre.center.normal_()
    centre = TeacherCentre(24)
    centre.center.copy_(method.centre.center)
    views = _views(num_local=2)
    out = method(views)
    with torch.no_grad():
        feats = [method.encoder.forward_features(v)["cls"] for v in views]
        student = [method.head(f) for f in feats]
        teacher = [method.teacher.module[1](method.teacher.module[0].forward_features(v)["cls"]) for v in views[:2]]
    expected, _ = dino_loss(student, teacher, centre, 0.1, 0.06)
    torch.testing.assert_close(out.loss.detach(), expected)
    torch.testing.assert_close(method.centre.center, centre.center)  # updated once, with the teacher's outputs


def test_a_few_steps_train_the_student_and_move_the_teacher() -> None:
    method = _method(total_steps=4, freeze_last_layer=0.0)
    opt = torch.optim.AdamW([p for p in method.parameters() if p.requires_grad], lr=1e-3)
    teacher_before = {k: v.clone() for k, v in method.teacher.state_dict().items()}
    centre_before = method.centre.center.clone()
    views = _views()
    for step in range(4):
        opt.zero_grad()
        out = method(views)
        assert torch.isfinite(out.loss)
        out.loss.backward()
        assert all(p.grad is None for p in method.teacher.parameters())  # stop-gradient: the teacher is no leaf
        opt.step()
        method.after_step(step)
    assert int(method.steps_done) == 4
    moved = [k for k, v in method.teacher.state_dict().items() if not torch.equal(v, teacher_before[k])]
    assert any(k.startswith("module.0.") for k in moved) and any(k.startswith("module.1.") for k in moved)
    assert not torch.equal(method.centre.center, centre_before)
    assert "steps_done" in method.state_dict() and "centre.center" in method.state_dict()  # resumed with the run


def test_last_layer_gets_zero_gradients_for_the_first_share_of_the_run() -> None:
    """freeze_last_layer 0.5 of 4 steps: steps 0-1 leave the last layer as it is (their cancel_gradients_last_layer),
    steps 2-3 train it; every other parameter trains throughout."""
    method = _method(total_steps=4, freeze_last_layer=0.5)
    assert method.freeze_last_layer_steps == 2
    opt = torch.optim.AdamW([p for p in method.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.0)
    views = _views()
    for step in range(4):
        last = method.head.last_layer.weight_v.detach().clone()
        opt.zero_grad()
        method(views).loss.backward()
        grad = method.head.last_layer.weight_v.grad
        assert grad is not None  # in the graph, as DistributedDataParallel needs
        assert (grad.abs().sum() == 0) == (step < 2), step
        assert method.head.mlp[0].weight.grad.abs().sum() > 0
        opt.step()
        assert torch.equal(method.head.last_layer.weight_v, last) == (step < 2), step
        method.after_step(step)


def _teacher_temperatures(method, steps: int) -> list[float]:
    """The teacher temperature each of ``steps`` training steps uses (global crops only), rounded to 6 places."""
    temps = []
    for step in range(steps):
        temps.append(round(method(_views(num_local=0)).terms["teacher_temperature"].item(), 6))
        method.after_step(step)
    return temps


def test_teacher_temperature_warms_up_with_the_steps() -> None:
    method = _method(total_steps=10, teacher_temperature_warmup=0.4, warmup_teacher_temperature=0.04,
                     teacher_temperature=0.07)
    assert _teacher_temperatures(method, 6) == [0.04, 0.0475, 0.055, 0.0625, 0.07, 0.07]


def test_resnet_backbone_with_batch_norm_head() -> None:
    backbone = build_backbone("resnet", block="basic", layers=[1, 1, 1, 1], width=8, small_stem=True, in_channels=3)
    method = _method(backbone=backbone, head_batch_norm=True)
    assert sum(isinstance(m, torch.nn.BatchNorm1d) for m in method.head.mlp) == 2  # after each hidden Linear
    assert not any(isinstance(m, torch.nn.BatchNorm1d) for m in _method().head.mlp)  # their ViT default: none
    out = method(_views(num_local=2))
    out.loss.backward()
    assert all(p.grad is not None for p in method.encoder.parameters())
    assert method.backbone is method.teacher.module[0]
    assert out.embeddings.shape == (B, backbone.num_features)


def test_the_teacher_is_exported_with_the_eval_pool() -> None:
    method = _method(eval_pool="mean")
    assert method.backbone is method.teacher.module[0] and method.backbone.pool == "mean"
    assert method.encoder.pool == "cls" and method.export_params == {"pool": "mean"}


def test_learnable_norm_of_the_last_layer() -> None:
    assert not any("weight_g" in n for n, _ in _method().named_parameters())  # norm_last_layer: g fixed to 1
    learnt = _method(norm_last_layer=False)
    learnt(_views()).loss.backward()
    assert learnt.head.last_layer.weight_g.grad is not None


@pytest.mark.parametrize("views, ok", [("[{preset: minimal, num: 1}]", False),
                                       ("[{preset: minimal, num: 2}, {preset: minimal, num: 4, size: 16}]", True)])
def test_view_count_is_checked_on_load(views: str, ok: bool) -> None:
    overrides = ["method.name=dino", f"views={views}"]
    if ok:
        assert load_config(None, overrides).method["name"] == "dino"
    else:
        with pytest.raises(ConfigError, match="method dino needs .* views per image but the config makes 1"):
            load_config(None, overrides)


def test_vit_without_cls_is_refused() -> None:
    message = r"^DINO trains on a ViT's \[CLS\] token: build the ViT with cls_token: true$"
    with pytest.raises(ConfigError, match=message):
        _method(backbone=_vit(cls_token=False, pool="mean"))


def test_carry_over_restarts_the_teacher_from_the_student() -> None:
    method = _method()
    with torch.no_grad():
        for p in method.student.parameters():
            p.add_(0.1)
    method.after_carry_over()
    for (name, s), t in zip(method.student.named_parameters(), method.teacher.module.parameters()):
        assert torch.equal(s, t), name


def test_teacher_temperature_at_the_last_step_and_past_the_schedule() -> None:
    """A warm-up over the whole run of 4 steps: 0.04 + 0.03 * step / 4 at steps 0-3 (the last step takes the last
    value, 0.0625), and a step past the schedule's end (a stretched run) keeps that last value."""
    method = _method(total_steps=4, teacher_temperature_warmup=1.0, warmup_teacher_temperature=0.04,
                     teacher_temperature=0.07)
    assert _teacher_temperatures(method, 5) == [0.04, 0.0475, 0.055, 0.0625, 0.0625]


def test_config_fields_are_checked_by_name() -> None:
    """A DINOConfig built in Python is checked as the YAML is, its errors naming the field as ``method.<field>``."""
    with pytest.raises(ConfigError, match=r"^bad value for method\.student_temperature: 0"):
        DINOConfig(student_temperature=0.0)
