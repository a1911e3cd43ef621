"""ExtreMA training step on a tiny ViT: kept tokens, one teacher pass for m masks, the loss, EMA, DDP, export, CLI."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp_utils import run_ddp
from selfsup.config import ConfigError
from selfsup.data.masking import multi_mask_keep_indices
from selfsup.losses.extrema import extrema_loss
from selfsup.methods import build_method
from selfsup.models import VisionTransformer, build_backbone

B, SIZE, PATCH, D = 6, 32, 4, 32  # 64 patches per image


def _vit(**kwargs) -> VisionTransformer:
    params = dict(img_size=SIZE, patch_size=PATCH, in_channels=3, embed_dim=D, depth=2, num_heads=2,
                  num_class_attention_blocks=2, **kwargs)
    return build_backbone("vit_custom", **params)


def _method(total_steps: int = 100, backbone=None, **cfg):
    torch.manual_seed(0)
    spec = {"name": "extrema", "projector": [48, 48, 16], "predictor": [48, 16], **cfg}
    return build_method(spec, backbone if backbone is not None else _vit(), total_steps).train()


def _views(n: int = 2) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.rand(B, 3, SIZE, SIZE, generator=g) for _ in range(n)]


def _block_inputs(vit: VisionTransformer) -> list[tuple[int, ...]]:
    shapes: list[tuple[int, ...]] = []
    vit.blocks[0].register_forward_hook(lambda mod, inp, out: shapes.append(tuple(inp[0].shape)))
    return shapes


@pytest.mark.parametrize("ratio, masks, kept", [(0.8, 1, 12), (0.8, 4, 12), (0.75, 4, 16), (0.9, 10, 6)])
def test_student_sees_only_kept_tokens_and_one_teacher_pass_serves_every_mask(ratio, masks, kept) -> None:
    method = _method(mask_ratio=ratio, num_masks=masks)
    student, teacher = _block_inputs(method.encoder), _block_inputs(method.backbone)
    calls = []
    method.target.module[1].register_forward_hook(lambda mod, inp, out: calls.append(tuple(inp[0].shape)))
    out = method(_views())
    assert student == [(masks * B, kept, D)]  # no early [CLS]: only the kept patch tokens enter the blocks
    assert teacher == [(B, 64, D)]  # the teacher sees all 64 tokens, once
    assert calls == [(B, D)]  # one teacher projection per image, whatever the number of masks
    assert out.embeddings.shape == (B, 16)


@pytest.mark.parametrize("loss", ["byol", "infonce"])
def test_step_is_the_extrema_loss_of_masked_student_views_against_the_full_teacher(loss: str) -> None:
    """Sec. 3 written out per mask and image: mean_{m,i} 2 - 2 <q_mi, t_i> / (|q_mi| |t_i|) (BYOL), or MoCo v3's
    -log softmax_i(<q_mi, t_j> / tau) * 2 tau over the teacher keys t_j of the batch (InfoNCE)."""
    method = _method(mask_ratio=0.75, num_masks=3, loss=loss, temperature=0.05)
    with torch.no_grad():  # student and teacher apart, and far from init (where every image has the same [CLS])
        for p in method.parameters():
            p.add_(0.3 * torch.randn_like(p))
    contrast = torch.linspace(-3, 3, B).view(B, 1, 1, 1)  # images that a random ViT tells apart
    student_view, teacher_view = (view * contrast for view in _views())
    torch.manual_seed(5)
    out = method([student_view, teacher_view])
    torch.manual_seed(5)  # the same masks, drawn by hand
    keep = multi_mask_keep_indices(B, 64, 3, 16)
    with torch.no_grad():
        q = [method.predictor(method.projector(method.encoder(student_view, keep[m]))) for m in range(3)]
        teacher_vit, teacher_head = method.target.module
        t = teacher_head(teacher_vit.forward_features(teacher_view)["cls"])  # the teacher's full-image [CLS]
        terms = []
        for m in range(3):
            for i in range(B):
                if loss == "byol":
                    terms.append(2 - 2 * (q[m][i] @ t[i]) / (q[m][i].norm() * t[i].norm()))
                else:
                    logits = torch.stack([q[m][i] @ t[j] / (q[m][i].norm() * t[j].norm()) for j in range(B)]) / 0.05
                    terms.append(-(logits[i] - torch.logsumexp(logits, 0)) * 0.1)
        expected = torch.stack(terms).mean()
    if loss == "infonce":
        assert abs(expected.item() - 0.1 * math.log(B)) > 0.05  # not the collapsed value log B
    torch.testing.assert_close(out.loss.detach(), expected)


def test_non_square_images_mask_a_fraction_of_their_own_patch_grid() -> None:
    """32 x 16 or 16 x 32 pixels: 8 x 4 or 4 x 8 = 32 patches (not the 64 of the 32 x 32 training size); each of the
    2 masks keeps floor(32 * 0.2) = 6 of them, the teacher sees all 32."""
    for height, width in [(32, 16), (16, 32)]:
        method = _method(mask_ratio=0.8, num_masks=2)
        student, teacher = _block_inputs(method.encoder), _block_inputs(method.backbone)
        view = torch.rand(B, 3, height, width, generator=torch.Generator().manual_seed(1))
        assert torch.isfinite(method([view]).loss)
        assert student == [(2 * B, 6, D)] and teacher == [(B, 32, D)], (height, width)


def test_overlapping_masks_option_draws_each_mask_independently() -> None:
    method = _method(num_masks=6, disjoint=False)  # 6 masks x 12 visible > 64 patches: only possible with overlaps
    student = _block_inputs(method.encoder)
    assert torch.isfinite(method(_views()).loss)
    assert student == [(6 * B, 12, D)]


def test_heads_are_the_authors_linear_layernorm_gelu_stacks() -> None:
    """lib/builder.py: _build_proj(3, ...) and _build_pred(2, ...) put LayerNorm + GELU after every Linear but the
    last (the BN-free heads of the paper's Sec. 3)."""
    method = _method()
    hidden = [nn.LayerNorm, nn.GELU]

    def linears(head: nn.Sequential) -> list[tuple[int, ...]]:
        return [tuple(m.weight.shape) for m in head if isinstance(m, nn.Linear)]

    assert [type(m) for m in method.projector] == [nn.Linear, *hidden, nn.Linear, *hidden, nn.Linear]
    assert linears(method.projector) == [(48, D), (48, 48), (16, 48)]
    assert [type(m) for m in method.predictor] == [nn.Linear, *hidden, nn.Linear]
    assert linears(method.predictor) == [(48, 16), (16, 48)]


def test_byol_objective_on_hand_values() -> None:
    t = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    parallel, orthogonal, opposite = t * 3, torch.tensor([[0.0, 1.0], [5.0, 0.0]]), -t
    assert extrema_loss(parallel, t).item() == pytest.approx(0.0, abs=1e-7)
    assert extrema_loss(orthogonal, t).item() == pytest.approx(2.0)
    assert extrema_loss(opposite, t).item() == pytest.approx(4.0)
    # two masks stacked mask-major: the mean of the per-mask losses
    assert extrema_loss(torch.cat([parallel, orthogonal]), t).item() == pytest.approx(1.0)
    q = torch.eye(4)  # InfoNCE for q = k = I: 2 tau log(1 + (n - 1) e^(-1/tau))
    assert extrema_loss(q, q, "infonce", 0.2).item() == pytest.approx(0.4 * math.log(1 + 3 * math.exp(-5)))
    # a queue of two past keys: one along image 0's key (cosine 1 at any length), one orthogonal to every image.
    # Image 0 then has two logits of 1/tau against four of 0; images 1-3 one of 1/tau against five of 0
    q5, queue = torch.eye(5)[:4], torch.tensor([[3.0, 0, 0, 0, 0], [0, 0, 0, 0, 1]])
    e = math.exp(5)
    hand = 0.4 * (-math.log(e / (2 * e + 4)) - 3 * math.log(e / (e + 5))) / 4
    assert extrema_loss(q5, q5, "infonce", 0.2, queue).item() == pytest.approx(hand)
    with pytest.raises(ValueError, match="needs loss='infonce'"):
        extrema_loss(q5, q5, "byol", 0.2, queue)


def test_one_view_is_the_one_aug_scheme() -> None:
    method = _method()
    (view,) = _views(1)
    torch.manual_seed(2)
    one = method([view])
    torch.manual_seed(2)
    assert torch.equal(one.loss, method([view, view]).loss)  # x_t = x_s (other counts: refused on load, VIEWS)


def test_teacher_starts_as_the_student_gets_no_gradient_and_has_no_drop_path() -> None:
    method = _method(backbone=_vit(drop_path_rate=0.3))
    student = nn.Sequential(method.encoder, method.projector)
    for (name, s), t in zip(student.named_parameters(), method.target.module.parameters()):
        assert torch.equal(s, t) and not t.requires_grad, name
    assert all(m.drop_prob == 0.0 for m in method.target.modules() if type(m).__name__ == "DropPath")
    assert any(m.drop_prob > 0.0 for m in method.encoder.modules() if type(m).__name__ == "DropPath")
    method(_views()).loss.backward()
    assert all(p.grad is None for p in method.target.parameters())
    for module in (method.encoder, method.projector, method.predictor):
        assert all(p.grad is not None for p in module.parameters())


def test_ema_follows_the_cosine_momentum_schedule() -> None:
    """m(k) = 1 - (1 - 0.996)(1 + cos(pi k / K)) / 2 (Sec. 5.1): 0.996, 0.9965858, 0.998, 0.9994142 at 0, K/4, K/2, 3K/4."""
    method = _method(total_steps=400)
    for k, value in [(0, 0.996), (100, 0.9965858), (200, 0.998), (300, 0.9994142)]:
        assert method.target.momentum[k] == pytest.approx(value, abs=1e-7)
    assert method.target.momentum[-1] == pytest.approx(1.0, abs=1e-6)
    before = [p.clone() for p in method.target.parameters()]
    with torch.no_grad():
        for p in method.encoder.parameters():
            p.add_(1.0)
    method.after_step(200)
    student = list(nn.Sequential(method.encoder, method.projector).parameters())
    for t, t0, s in zip(method.target.parameters(), before, student):
        torch.testing.assert_close(t, 0.998 * t0 + 0.002 * s)
    horizon = _method(total_steps=1000, momentum_horizon=0.1)
    assert horizon.target.momentum[0] == pytest.approx(0.99)


def test_last_step_and_steps_past_the_schedule_use_its_final_momentum() -> None:
    """K = 4 steps: m(3) = 1 - (1 - 0.996)(1 + cos(3 pi / 4)) / 2 = 0.99941421 at the last step (not m(2) = 0.998),
    and held there if a step index runs past the schedule."""
    method = _method(total_steps=4)
    last = 1 - 0.004 * (1 + math.cos(3 * math.pi / 4)) / 2
    for step in (3, 9):
        before = [p.clone() for p in method.target.parameters()]
        with torch.no_grad():
            for p in method.encoder.parameters():
                p.add_(1.0)
        method.after_step(step)
        student = list(nn.Sequential(method.encoder, method.projector).parameters())
        for t, t0, s in zip(method.target.parameters(), before, student):
            torch.testing.assert_close(t, last * t0 + (1 - last) * s)


def test_exported_backbone_is_the_teacher_instance_representation(tmp_path) -> None:
    from selfsup.checkpoint import load_backbone, load_checkpoint
    from selfsup.cli import main

    config = tmp_path / "extrema.yaml"
    config.write_text("""
method: {name: extrema, projector: [32, 32, 16], predictor: [32, 16], mask_ratio: 0.75, num_masks: 4}
data: {dataset: digits}
views:
  - {preset: extrema, num: 2, shared_crop: true, params: {crop_scale: [0.5, 1.0]}}
model: {backbone: vit_custom, params: {patch_size: 2, embed_dim: 16, depth: 1, num_heads: 2,
                                       num_class_attention_blocks: 2, drop_path_rate: 0.1}}
optim: {name: adamw, lr: 0.001, weight_decay: 0.05, betas: [0.9, 0.95]}
trainer: {max_steps: 4, batch_size: 32, log_every_steps: 2, progress: false, channels_last: false}
""")
    run = tmp_path / "run"
    assert main(["pretrain", str(config), f"trainer.out={run}"]) == 0
    backbone, meta = load_backbone(run)
    assert meta["method"] == "extrema" and backbone.pool == "cls" and len(backbone.ca_blocks) == 2
    model = load_checkpoint(run / "checkpoints" / "last.pt")["model"]
    for name, tensor in load_file(run / "backbone.safetensors").items():
        torch.testing.assert_close(tensor, model[f"target.module.0.{name}"])  # the EMA teacher
    assert not torch.equal(model["target.module.0.cls_token"], model["encoder.cls_token"])


def test_eval_pool_changes_the_export_not_the_trained_representation() -> None:
    views, paper_method, method = _views(), _method(), _method(eval_pool="mean")
    torch.manual_seed(3)
    paper = paper_method(views).loss
    torch.manual_seed(3)
    torch.testing.assert_close(method(views).loss, paper)  # the loss still trains the class-attention [CLS]
    assert method.export_params == {"pool": "mean"} and method.backbone.pool == "mean"
    assert method.encoder.pool == "cls" and _method().export_params == {"pool": "cls"}


def test_eval_pool_cls_prenorm_exports_the_authors_probe_feature() -> None:
    """main_lincls.py: the teacher's class-attention [CLS] without the final LayerNorm."""
    method = _method(eval_pool="cls_prenorm")
    x = _views(1)[0]
    with torch.no_grad():
        teacher = method.backbone
        cls = teacher.cls_token.expand(B, -1, -1)
        patches = teacher.embed_patches(x)
        for block in teacher.blocks:
            patches = block(patches)
        for block in teacher.ca_blocks:
            cls = block(cls, patches)
        torch.testing.assert_close(teacher(x), cls[:, 0])
        assert not torch.allclose(teacher(x), teacher.forward_features(x)["cls"])
    assert method.export_params == {"pool": "cls_prenorm"} and method.encoder.pool == "cls"


def test_batchnorm_heads_option() -> None:
    method = _method(head_norm="batch")
    assert any(isinstance(m, nn.BatchNorm1d) for m in method.projector.modules())
    assert any(isinstance(m, nn.BatchNorm1d) for m in method.predictor.modules())
    assert not any(isinstance(m, nn.BatchNorm1d) for m in _method().modules())  # the paper's heads: LayerNorm
    assert torch.isfinite(method(_views()).loss)


def test_bad_backbones_and_options_fail_clearly() -> None:
    with pytest.raises(ConfigError, match="needs a ViT"):
        _method(backbone=build_backbone("resnet", block="basic", layers=[1], width=4, in_channels=3))
    with pytest.raises(ConfigError, match=r"need 72 patches but the image has 64; use method.num_masks <= 5, "):
        _method(num_masks=6)  # 12 visible of 64: at most 5 disjoint masks
    assert _method(num_masks=6, disjoint=False).cfg.num_masks == 6
    with pytest.raises(ConfigError, match="projector's output width 16"):
        _method(predictor=[48, 8])
    assert len(_method(predictor=[48, 32, 16]).predictor) == 7  # a deeper predictor ending at the projector's width
    with pytest.raises(ConfigError, match="pool is cls"):
        _method(backbone=_vit(pool="cls_prenorm"))
    early_cls = build_backbone("vit_custom", img_size=SIZE, patch_size=PATCH, in_channels=3, embed_dim=D, depth=2,
                               num_heads=2)  # [CLS] enters the blocks with the patches: App. A, does not converge
    with pytest.raises(ConfigError, match="model.params.num_class_attention_blocks: 2"):
        _method(backbone=early_cls)
    for key, value in [("mask_ratio", 1.0), ("num_masks", 0), ("loss", "mse"), ("temperature", 0.0),
                       ("momentum_horizon", 2.0), ("head_norm", "group"), ("eval_pool", "max")]:
        with pytest.raises(ConfigError, match=f"method.{key}"):
            _method(**{key: value})


def test_key_queue_adds_past_teacher_keys_as_negatives_and_takes_this_steps_keys_after_it() -> None:
    method = _method(loss="infonce", queue_size=12, temperature=0.1)
    before = method.queue.features.clone()
    torch.manual_seed(5)
    out = method(_views())
    torch.manual_seed(5)
    plain = _method(loss="infonce", temperature=0.1)(_views())  # same weights, masks and views, no queue
    assert out.loss.item() > plain.loss.item() + 1e-3  # twelve more negatives raise the loss
    torch.testing.assert_close(method.queue.features, before)  # nothing enters before the step's backward
    with torch.no_grad():
        teacher_vit, teacher_head = method.target.module
        t = teacher_head(teacher_vit.forward_features(_views()[1])["cls"])
    method.after_step(0)
    torch.testing.assert_close(method.queue.features[:B], torch.nn.functional.normalize(t, dim=1))
    torch.testing.assert_close(method.queue.features[B:], before[B:])
    assert int(method.queue.pointer) == B
    assert "queue.features" in method.state_dict()  # checkpoints carry it


def test_key_queue_options_fail_clearly() -> None:
    from selfsup.methods import check_dataset, method_config

    with pytest.raises(ConfigError, match="method.loss is 'byol'"):
        _method(queue_size=12)
    _, cfg = method_config({"name": "extrema", "loss": "infonce", "queue_size": 1000})
    with pytest.raises(ConfigError, match="not a multiple of the global batch 128; use e.g. 896"):
        cfg.check_batch(128)
    with pytest.raises(ConfigError, match="own earlier embedding, one of its own negatives"):
        check_dataset({"name": "extrema", "loss": "infonce", "queue_size": 1024}, 1000, 128)
    assert _method().queue is None  # the paper: the batch's keys only


# ------------------------------------------------------------------------------- DDP
IN, OUT, MASKS, BATCH = 6, 5, 3, 8


def _ddp_inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(MASKS, BATCH, IN, generator=g, dtype=torch.float64)  # the m masked views of each image
    t = torch.randn(BATCH, OUT, generator=g, dtype=torch.float64)  # teacher projections
    linear = nn.Linear(IN, OUT).double()
    return x, t, {k: v.clone() for k, v in linear.state_dict().items()}


CASES = ("byol", "infonce", "infonce+queue")  # the queue: the same past keys on every process, extra negatives


def _case(case: str) -> tuple[str, torch.Tensor | None]:
    """The loss and, for ``+queue``, four fixed past keys."""
    loss, _, queue = case.partition("+")
    return loss, torch.linspace(-1, 1, 4 * OUT, dtype=torch.float64).view(4, OUT).cos() if queue else None


def _ddp_rank(rank: int, world: int, x, t, state) -> dict:
    local = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    out = {}
    for case in CASES:
        model = nn.Linear(IN, OUT).double()
        model.load_state_dict(state)
        ddp = DistributedDataParallel(model)  # kept alive: its hooks all-reduce the gradients in backward
        loss, negatives = _case(case)
        extrema_loss(ddp(x[:, local].reshape(-1, IN)), t[local], loss, 0.2, negatives).backward()  # mask-major
        out[case] = {n: p.grad.clone() for n, p in model.named_parameters()}
    return out


@pytest.mark.multiprocess
def test_loss_gradient_in_two_gloo_processes_equals_the_single_process_one() -> None:
    x, t, state = _ddp_inputs()
    results = run_ddp(_ddp_rank, 2, x, t, state)
    for case in CASES:
        model = nn.Linear(IN, OUT).double()
        model.load_state_dict(state)
        loss, negatives = _case(case)
        extrema_loss(model(x.reshape(-1, IN)), t, loss, 0.2, negatives).backward()
        assert model.weight.grad.abs().max() > 1e-3
        for rank, res in enumerate(results):
            for name, p in model.named_parameters():
                torch.testing.assert_close(res[case][name], p.grad, rtol=1e-10, atol=1e-12, msg=f"{case} {rank} {name}")
