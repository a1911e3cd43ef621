"""iBOT training steps on a tiny ViT: masked global views for the student only, the mask token, both objectives,
shared and separate heads, the EMA teacher, the frozen last layer, the view count checked on load."""

from __future__ import annotations

import pytest
import torch

from selfsup.config import ConfigError
from selfsup.data.masking import block_masks
from selfsup.load import load_config
from selfsup.losses.dino import TeacherCentre
from selfsup.losses.ibot import ibot_loss
from selfsup.methods import build_method
from selfsup.methods.ibot import IBOTConfig
from selfsup.models import build_backbone

B, SIZE, LOCAL, PATCH = 6, 16, 8, 4
N = (SIZE // PATCH) ** 2


def _vit(**kwargs):
    return build_backbone("vit_custom", img_size=SIZE, patch_size=PATCH, in_channels=3, embed_dim=32, depth=2,
                          num_heads=2, pos_embed="learned", **kwargs)


def _method(total_steps: int = 100, backbone=None, **cfg):
    torch.manual_seed(0)
    spec = {"name": "ibot", "out_dim": 24, "patch_out_dim": 20, "head_hidden": 32, "bottleneck": 8,
            "mask_ratio": [0.4], "mask_ratio_var": [0.1], **cfg}
    return build_method(spec, backbone if backbone is not None else _vit(), total_steps).train()


def _views(num_local: int = 2, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return ([torch.rand(B, 3, SIZE, SIZE, generator=g) for _ in range(2)]
            + [torch.rand(B, 3, LOCAL, LOCAL, generator=g) for _ in range(num_local)])


def _fixed_masks(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    masks = [torch.rand(B, N, generator=g) < 0.4 for _ in range(2)]
    masks[0][0] = False  # an image without masked patches
    monkeypatch.setattr("selfsup.methods.ibot.block_masks", lambda *a, **k: masks)
    return masks


@pytest.mark.parametrize("shared", [True, False])
def test_step_is_the_ibot_loss_of_masked_student_and_unmasked_teacher(shared: bool,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    method = _method(shared_head=shared, teacher_temperature_warmup=0.0, cls_weight=0.7, patch_weight=1.3)
    masks = _fixed_masks(monkeypatch)
    method.mask_token.data.normal_()
    views = _views()
    out = method(views)
    assert (method.head.patch_last_layer is method.head.last_layer) == shared
    k_patch = 24 if shared else 20
    with torch.no_grad():
        s = method.encoder.forward_features(torch.cat(views[:2]), mask=torch.cat(masks), mask_token=method.mask_token)
        s_cls, s_patch = method.head.forward_tokens(s["cls"], s["patch_tokens"])
        local = [method.head(method.encoder.forward_features(v)["cls"]) for v in views[2:]]
        t = method.teacher.module[0].forward_features(torch.cat(views[:2]))
        t_cls, t_patch = method.teacher.module[1].forward_tokens(t["cls"], t["patch_tokens"])
    assert s_patch.shape == (2 * B, N, k_patch)
    expected, _ = ibot_loss([*s_cls.chunk(2), *local], list(t_cls.chunk(2)), list(s_patch.chunk(2)),
                            list(t_patch.chunk(2)), masks, TeacherCentre(24), TeacherCentre(k_patch), 0.1, 0.07, 0.07,
                            0.7, 1.3)
    torch.testing.assert_close(out.loss.detach(), expected)
    assert out.terms["mim"] > 0 and out.terms["cls"] > 0
    torch.testing.assert_close(out.embeddings, s["cls"][:B])  # monitored: the student's [CLS] of the 1st masked view


def test_mask_token_replaces_masked_patches_for_the_student_only(monkeypatch: pytest.MonkeyPatch) -> None:
    method = _method()
    masks = _fixed_masks(monkeypatch)
    seen: dict[str, list] = {"student": [], "teacher": []}
    for who, vit in (("student", method.encoder), ("teacher", method.teacher.module[0])):
        vit.patch_embed.register_forward_hook(lambda m, i, o, who=who: seen[who].append(o.shape))
        vit.blocks[0].register_forward_hook(lambda m, i, o, who=who: seen[who].append(i[0].detach().clone()))
    out = method(_views(num_local=1))
    out.loss.backward()
    assert method.mask_token.grad is not None and method.mask_token.grad.abs().sum() > 0
    # the teacher ran once, on the two global views; the student on the masked globals, then the local view
    assert len(seen["teacher"]) == 2 and seen["teacher"][1].shape == (2 * B, 1 + N, 32)
    assert len(seen["student"]) == 4 and seen["student"][3].shape == (B, 1 + 4, 32)
    student_tokens = seen["student"][1][:, 1:]
    pos = method.encoder.pos_embed[0].detach()
    masked = torch.cat(masks)
    torch.testing.assert_close(student_tokens[masked], (method.mask_token.detach() + pos).expand(2 * B, N, 32)[masked])
    assert not torch.allclose(student_tokens[~masked], (method.mask_token.detach() + pos).expand(2 * B, N, 32)[~masked])


def test_a_few_steps_train_and_move_the_teacher_and_both_centres() -> None:
    method = _method(total_steps=3, freeze_last_layer=0.0)
    opt = torch.optim.AdamW([p for p in method.parameters() if p.requires_grad], lr=1e-3)
    before = {k: v.clone() for k, v in method.state_dict().items()}
    for step in range(3):
        opt.zero_grad()
        out = method(_views(seed=step))
        assert torch.isfinite(out.loss) and 0 < out.terms["masked_share"] < 1
        out.loss.backward()
        opt.step()
        method.after_step(step)
    after = method.state_dict()
    for key in ("teacher.module.0.blocks.0.attn.qkv.weight", "teacher.module.1.last_layer.weight_v",
                "centre.center", "patch_centre.center", "mask_token"):
        assert not torch.equal(after[key], before[key]), key
    assert not any(k.startswith("teacher.") and "mask_token" in k for k in after)  # the teacher never masks


def test_last_layers_frozen_early(monkeypatch: pytest.MonkeyPatch) -> None:
    method = _method(total_steps=4, freeze_last_layer=0.25, shared_head=False)
    for step in range(2):
        method.zero_grad()
        method(_views()).loss.backward()
        for layer in (method.head.last_layer, method.head.patch_last_layer):
            assert (layer.weight_v.grad.abs().sum() == 0) == (step == 0)
        method.after_step(step)


def test_vit_with_cls_in_its_blocks_only() -> None:
    """A ResNet, a ViT without [CLS] and a ViT whose [CLS] only enters late class-attention blocks are refused."""
    resnet = build_backbone("resnet", block="basic", layers=[1, 1, 1, 1], width=8, small_stem=True, in_channels=3)
    message = (r"^iBOT needs a ViT with a \[CLS\] token in its blocks \(model.backbone vit_laptop, vit_tiny, "
               r"vit_small, vit_base or vit_custom; no class-attention blocks\)$")
    for backbone in (resnet, _vit(cls_token=False, pool="mean"), _vit(num_class_attention_blocks=1)):
        with pytest.raises(ConfigError, match=message):
            _method(backbone=backbone)


def test_view_count_and_mask_ratios_checked_on_load() -> None:
    with pytest.raises(ConfigError, match="method ibot needs .* views per image but the config makes 1"):
        load_config(None, ["method.name=ibot", "views=[{preset: minimal, num: 1}]"])
    with pytest.raises(ConfigError, match="mask_ratio_var"):
        load_config(None, ["method.name=ibot", "method.mask_ratio=[0.3]", "method.mask_ratio_var=[0.0, 0.2]",
                           "views=[{preset: minimal, num: 2}]"])
    assert load_config(None, ["method.name=ibot", "views=[{preset: minimal, num: 2}]"]).method["name"] == "ibot"


@pytest.mark.parametrize("name", ["dino", "ibot"])
def test_global_crops_of_two_sizes_refused_on_load_local_crops_free(name: str) -> None:
    """DINO's teacher (and iBOT's student) takes the two global crops as one batch: sizes that differ are a config
    error naming them, not a torch error at the first step; the local crops may be any size, and data.image_size
    fills an unset size."""
    local = "{preset: minimal, num: 2, size: 8}"
    with pytest.raises(ConfigError, match=rf"method {name} stacks its first 2 views .* \[16, 24\] px"):
        load_config(None, [f"method.name={name}", f"views=[{{preset: minimal, num: 1, size: 16}}, "
                                                  f"{{preset: minimal, num: 1, size: 24}}, {local}]"])
    with pytest.raises(ConfigError, match=r"\[32, 16\] px"):
        load_config(None, [f"method.name={name}", "data.image_size=32",
                           f"views=[{{preset: minimal, num: 1}}, {{preset: minimal, num: 1, size: 16}}, {local}]"])
    for views in [f"[{{preset: minimal, num: 2, size: 16}}, {local}]",
                  f"[{{preset: minimal, num: 1, size: 16}}, {{preset: minimal, num: 1, size: 16}}, {local}]"]:
        assert load_config(None, [f"method.name={name}", f"views={views}"]).method["name"] == name


def test_head_options_centre_momenta_and_the_exported_teacher_reach_the_method() -> None:
    method = _method(head_batch_norm=True, norm_last_layer=False, center_momentum=0.5, patch_center_momentum=0.8,
                     eval_pool="mean")
    assert sum(isinstance(m, torch.nn.BatchNorm1d) for m in method.head.mlp) == 2
    assert method.head.last_layer.weight_g.requires_grad  # the weight norm's g learns
    assert (method.centre.momentum, method.patch_centre.momentum) == (0.5, 0.8)
    assert method.backbone is method.teacher.module[0] and method.backbone.pool == "mean"
    assert method.encoder.pool == "cls" and method.export_params == {"pool": "mean"}
    default = _method()
    assert not any(isinstance(m, torch.nn.BatchNorm1d) for m in default.head.mlp)
    assert not any("weight_g" in n for n, _ in default.named_parameters())


def test_teacher_temperatures_warm_up_and_hold_past_the_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    """Warm-ups over the whole run of 4 steps, [CLS] 0.04 -> 0.07 and patches 0.02 -> 0.06: step s takes
    start + (end - start) * s / 4; a step past the end (a stretched run) keeps the last value."""
    import selfsup.methods.ibot as ibot_module

    seen = []

    def recording(*args):
        seen.append((round(args[8], 6), round(args[9], 6)))
        return ibot_loss(*args)

    monkeypatch.setattr(ibot_module, "ibot_loss", recording)
    method = _method(total_steps=4, teacher_temperature_warmup=1.0, warmup_teacher_temperature=0.04,
                     teacher_temperature=0.07, warmup_teacher_patch_temperature=0.02, teacher_patch_temperature=0.06)
    for step in range(5):
        method(_views(num_local=0))
        method.after_step(step)
    assert seen == [(0.04, 0.02), (0.0475, 0.03), (0.055, 0.04), (0.0625, 0.05), (0.0625, 0.05)]


def test_configured_masks_reach_block_masks_and_global_views_alone_suffice(monkeypatch: pytest.MonkeyPatch) -> None:
    import selfsup.methods.ibot as ibot_module

    calls = []

    def recording(*args, **kwargs):
        calls.append((args, kwargs))
        return block_masks(*args, **kwargs)

    monkeypatch.setattr(ibot_module, "block_masks", recording)
    method = _method(mask_ratio=[0.2, 0.35], mask_ratio_var=[0.1, 0.05], mask_aspect=[0.5, 2.0])
    out = method(_views(num_local=0))  # the two global crops only: no local [CLS]
    assert calls == [((B, 2, (4, 4), [0.2, 0.35], [0.1, 0.05], (0.5, 2.0)), {})]
    assert torch.isfinite(out.loss) and out.terms["cls"] > 0


@pytest.mark.parametrize("fields, message", [
    ({"mask_ratio": [0.3], "mask_ratio_var": [0.4]}, r"each method.mask_ratio r needs mask_ratio_var <= r and "
                                                     r"r \+ var < 1, got \[0.3\] \+- \[0.4\]"),
    ({"mask_ratio": [0.6], "mask_ratio_var": [0.4]}, r"each method.mask_ratio r needs mask_ratio_var <= r and "
                                                     r"r \+ var < 1, got \[0.6\] \+- \[0.4\]"),
    ({"mask_aspect": [3.0, 0.3]}, r"method.mask_aspect is a range \[low, high\], got \[3.0, 0.3\]"),
    ({"mask_aspect": [0.3, 1.0, 3.0]}, r"method.mask_aspect is a range \[low, high\], got \[0.3, 1.0, 3.0\]"),
    ({"cls_weight": -1.0}, r"bad value for method\.cls_weight: -1"),
])
def test_config_refusals_by_message(fields: dict, message: str) -> None:
    """v > r would draw negative ratios, r + v = 1 a view with every patch masked; [low, high] is a log-uniform
    range."""
    with pytest.raises(ConfigError, match=f"^{message}"):
        IBOTConfig(**fields)


def test_config_boundaries_that_are_accepted() -> None:
    """var = r (ratios down to 0), r + var just below 1, and one aspect ratio (square blocks: low = high)."""
    cfg = IBOTConfig(mask_ratio=[0.3, 0.5], mask_ratio_var=[0.3, 0.45], mask_aspect=[1.0, 1.0])
    assert cfg.mask_aspect == [1.0, 1.0]
