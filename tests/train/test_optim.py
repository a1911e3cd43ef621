"""Parameter groups (no decay on biases / norms / opted-out tensors), LARS by hand, the optimiser factory."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from selfsup.config import OptimConfig
from selfsup.train.optim import LARS, build_optimizer, parameter_groups


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.norm = nn.BatchNorm1d(4)
        self.ln = nn.LayerNorm(4)
        self.prototypes = nn.Parameter(torch.randn(5, 4))
        self.prototypes._no_weight_decay = True
        self.conv = nn.Conv2d(1, 2, 3, bias=False)
        self.frozen = nn.Linear(2, 2)
        self.frozen.requires_grad_(False)


def _ids(params) -> set[int]:
    return {id(p) for p in params}


def test_parameter_groups_split() -> None:
    net = _Net()
    groups = parameter_groups(net)
    assert len(groups) == 2
    decay, no_decay = groups
    assert decay["apply_weight_decay"] and decay["apply_lars"]
    assert not no_decay["apply_weight_decay"] and not no_decay["apply_lars"]
    assert _ids(decay["params"]) == _ids([net.fc.weight, net.conv.weight])
    assert _ids(no_decay["params"]) == _ids([net.fc.bias, net.norm.weight, net.norm.bias, net.ln.weight,
                                             net.ln.bias, net.prototypes])
    assert not _ids(net.frozen.parameters()) & (_ids(decay["params"]) | _ids(no_decay["params"]))


def test_parameter_groups_drops_empty_group() -> None:
    groups = parameter_groups(nn.Linear(3, 2, bias=False))
    assert len(groups) == 1 and groups[0]["apply_weight_decay"]


def test_lars_step_matches_hand_computation() -> None:
    w = nn.Parameter(torch.tensor([[3.0, 4.0]], dtype=torch.float64))  # ||w|| = 5
    b = nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    opt = LARS([{"params": [w], "apply_lars": True}, {"params": [b], "apply_lars": False}],
               lr=0.5, weight_decay=0.1, momentum=0.9, eta=0.02)
    w.grad = torch.tensor([[0.6, 0.8]], dtype=torch.float64)
    b.grad = torch.tensor([2.0], dtype=torch.float64)
    opt.step()
    # update = g + wd * w = [0.9, 1.2] (norm 1.5); trust = 0.02 * 5 / 1.5 = 1/15; scaled update = [0.06, 0.08]
    torch.testing.assert_close(w.detach(), torch.tensor([[3.0 - 0.5 * 0.06, 4.0 - 0.5 * 0.08]], dtype=torch.float64))
    # no LARS (and no weight decay) for the bias group: plain SGD step 1 - 0.5 * 2
    torch.testing.assert_close(b.detach(), torch.tensor([0.0], dtype=torch.float64))

    w.grad = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    b.grad = torch.tensor([1.0], dtype=torch.float64)
    opt.step()
    w1 = torch.tensor([2.97, 3.96], dtype=torch.float64)
    u = torch.tensor([0.0, 1.0], dtype=torch.float64) + 0.1 * w1
    trust = 0.02 * math.sqrt(2.97**2 + 3.96**2) / u.norm().item()
    buf = 0.9 * torch.tensor([0.06, 0.08], dtype=torch.float64) + trust * u
    torch.testing.assert_close(w.detach()[0], w1 - 0.5 * buf)
    torch.testing.assert_close(b.detach(), torch.tensor([0.0 - 0.5 * (0.9 * 2.0 + 1.0)], dtype=torch.float64))


def test_lars_zero_weight_uses_trust_one() -> None:
    w = nn.Parameter(torch.zeros(2, 2))
    opt = LARS([w], lr=0.1, weight_decay=0.0, momentum=0.9, eta=0.02)
    w.grad = torch.ones(2, 2)
    opt.step()
    torch.testing.assert_close(w.detach(), torch.full((2, 2), -0.1))


@pytest.mark.parametrize("name,cls", [("adamw", torch.optim.AdamW), ("adam", torch.optim.Adam),
                                      ("sgd", torch.optim.SGD), ("lars", LARS)])
def test_build_optimizer(name: str, cls: type) -> None:
    net = _Net()
    cfg = OptimConfig(name=name, lr=0.05, weight_decay=0.01, betas=[0.8, 0.95], momentum=0.7, lars_eta=0.005)
    opt = build_optimizer(net, cfg)
    assert type(opt) is cls
    assert len(opt.param_groups) == 2
    assert [g["apply_weight_decay"] for g in opt.param_groups] == [True, False]
    for g in opt.param_groups:
        assert g["lr"] == 0.05
        if name in ("adamw", "adam"):
            assert tuple(g["betas"]) == (0.8, 0.95)
        else:
            assert g["momentum"] == 0.7
        if name == "lars":
            assert g["eta"] == 0.005
    before = net.fc.weight.detach().clone()
    loss = net.ln(net.norm(net.fc(torch.randn(4, 3)))).pow(2).sum() + net.prototypes.sum() + net.conv.weight.sum()
    loss.backward()
    opt.step()
    assert not torch.equal(before, net.fc.weight.detach())


def test_layer_decay_groups_scale_each_block_and_the_heads_have_their_own_lr_and_wd() -> None:
    from selfsup.models.vit import VisionTransformer

    torch.manual_seed(0)
    vit = VisionTransformer(img_size=8, patch_size=4, in_channels=1, embed_dim=8, depth=4, num_heads=2)
    model = nn.ModuleDict({"encoder": vit, "head": nn.Linear(8, 3)})
    vit.freeze_blocks(2)  # MAE-CT: the lower half frozen, so it gets no group at all
    groups = parameter_groups(model, vit, layer_decay=0.65, head_lr_scale=2.0, head_wd_scale=0.5)
    scale = {id(p): (g["lr_scale"], g["wd_scale"]) for g in groups for p in g["params"]}
    for name, p in vit.named_parameters():
        if name.startswith(("blocks.0.", "blocks.1.", "patch_embed", "cls_token")):
            assert id(p) not in scale, name
        elif name.startswith("blocks."):
            b = int(name.split(".")[1])
            assert scale[id(p)] == (pytest.approx(0.65 ** (4 - b)), 1.0 if p.ndim > 1 else 0.0), name
        else:  # the final LayerNorm: scale 1, no weight decay
            assert scale[id(p)] == (1.0, 0.0), name
    assert scale[id(model["head"].weight)] == (2.0, 0.5) and scale[id(model["head"].bias)] == (2.0, 0.0)
    # without an encoder: one lr scale, the usual decay / no-decay split
    plain = parameter_groups(model)
    assert [(g["lr_scale"], g["apply_weight_decay"]) for g in plain] == [(1.0, True), (1.0, False)]


def _group_of(groups: list[dict], param: torch.Tensor) -> dict:
    (group,) = [g for g in groups if any(p is param for p in g["params"])]
    return group


def test_tokens_get_weight_decay_as_each_authors_code_does() -> None:
    """ExtreMA's main.py skips the ViT's no_weight_decay() list (cls_token, pos_embed) by name; MAE's
    main_pretrain.py (timm's param_groups_weight_decay, no skip list) and MSN's init_opt select by shape only, so
    the (1, 1, D) [CLS] is decayed there, and MAE's 1-D mask token (theirs is (1, 1, D) and decayed) is not."""
    from selfsup.methods.extrema import ExtreMA, ExtreMAConfig
    from selfsup.methods.mae import MAE, MAEConfig
    from selfsup.models.vit import VisionTransformer

    def vit(**extra) -> VisionTransformer:
        return VisionTransformer(img_size=8, patch_size=4, in_channels=1, embed_dim=8, depth=1, num_heads=2,
                                 pos_embed="learned", **extra)

    extrema = ExtreMA(vit(num_class_attention_blocks=1), ExtreMAConfig(projector=[8, 8], predictor=[8, 8],
                                                                       mask_ratio=0.5, num_masks=1), total_steps=2)
    groups = parameter_groups(extrema, extrema.encoder)
    for param in (extrema.encoder.cls_token, extrema.encoder.pos_embed):
        group = _group_of(groups, param)
        assert not group["apply_weight_decay"] and group["wd_scale"] == 0.0 and group["weight_decay"] == 0.0
    assert _group_of(groups, extrema.encoder.blocks[0].attn.qkv.weight)["apply_weight_decay"]

    encoder = vit()
    mae = MAE(encoder, MAEConfig(decoder_dim=8, decoder_depth=1, decoder_heads=2), total_steps=1)
    groups = parameter_groups(mae, encoder)
    for param in (encoder.cls_token, encoder.pos_embed, encoder.blocks[0].attn.qkv.weight, mae.decoder.embed.weight):
        assert _group_of(groups, param)["apply_weight_decay"]
    assert not _group_of(groups, mae.decoder.mask_token)["apply_weight_decay"]


def _tiny_mast(**options):
    """MAST-2 (flip, crop) on a one-block ResNet, d = 8; ``options`` are more MASTConfig fields."""
    from selfsup.methods.mast import MAST, MASTConfig
    from selfsup.models import build_backbone

    backbone = build_backbone("resnet", block="basic", layers=[1], width=4, small_stem=True, in_channels=1)
    return MAST(backbone, MASTConfig(ops=["flip", "crop"], embedding_dim=8, trunk=[8], **options), total_steps=4)


def test_mast_masks_get_lars_trust_ratio_without_weight_decay() -> None:
    """One LARS step on the masks: lr * eta * ||U|| / ||g|| * g (You et al. 2017), no decay term (the L1 is theirs)."""
    mast = _tiny_mast()
    group = _group_of(parameter_groups(mast), mast.mask_params)
    assert group["apply_lars"] and not group["apply_weight_decay"] and group["weight_decay"] == 0.0
    u = mast.mask_params
    before = u.detach().clone()
    grad = torch.full_like(u, 3.0)
    u.grad = grad.clone()
    LARS([{**group, "params": [u]}], lr=1.6, weight_decay=0.5, momentum=0.9, eta=0.02).step()
    step = 1.6 * 0.02 * before.norm() / grad.norm() * grad  # the group's weight_decay 0 overrides the default 0.5
    torch.testing.assert_close(u.detach(), before - step)


def test_mast_masks_without_lars_take_a_plain_momentum_step() -> None:
    """``masks_lars: false``: the masks' group skips the trust ratio, so one step is lr * g (no decay either)."""
    mast = _tiny_mast(masks_lars=False)
    group = _group_of(parameter_groups(mast), mast.mask_params)
    assert not group["apply_lars"] and not group["apply_weight_decay"] and group["weight_decay"] == 0.0
    u = mast.mask_params
    before = u.detach().clone()
    u.grad = torch.full_like(u, 3.0)
    LARS([{**group, "params": [u]}], lr=0.3, weight_decay=0.5, momentum=0.9, eta=0.02).step()
    torch.testing.assert_close(u.detach(), before - 0.3 * 3.0)


def _lars_by_hand(weights: dict[str, torch.Tensor], grads: dict[str, torch.Tensor | None],
                  velocity: dict[str, torch.Tensor], flags: dict[str, tuple[bool, float, float]], momentum: float,
                  eta: float) -> None:
    """One LARS step (You et al. 2017, Alg. 1, with the BYOL / VICReg / MSN codes' exclusions), parameter by
    parameter, written out: for a parameter w with gradient g, its group's (lars, lr, weight decay),
    u = g + wd w and u <- u * eta ||w|| / ||u|| (lars groups only; trust 1 where a norm is 0); v = m v + u (v = u at
    its first step); w <- w - lr v. A parameter without a gradient is skipped, its velocity kept."""
    for name, w in weights.items():
        g = grads[name]
        if g is None:
            continue
        lars, lr, wd = flags[name]
        u = g.clone()
        if lars:
            u = u + wd * w
            w_norm, u_norm = math.sqrt(float((w * w).sum())), math.sqrt(float((u * u).sum()))
            u = u * (eta * w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0)
        velocity[name] = u if name not in velocity else momentum * velocity[name] + u
        weights[name] = w - lr * velocity[name]


def test_lars_equals_the_update_written_out_per_parameter_over_steps_with_mixed_groups() -> None:
    """The foreach LARS, on the groups the engine builds (LARS with decay; neither, for biases and norms; LARS
    without decay, MAST's masks; a zero weight, trust 1) with per-step lr and wd as the engine sets them and a
    parameter without a gradient at some steps, against :func:`_lars_by_hand` over 6 steps in fp32: within 1e-6
    (observed: at most 5e-7 apart, the norms being summed in another order)."""
    from selfsup.train.loop import set_lr_and_wd

    torch.manual_seed(0)
    net = nn.ModuleDict({"fc": nn.Linear(6, 5), "norm": nn.LayerNorm(5), "zero": nn.Linear(5, 3, bias=False),
                         "late": nn.Linear(3, 2)})
    net["norm"].weight.data.normal_(1.0, 0.3)  # away from 1: its update is seen
    net["zero"].weight.data.zero_()
    net.masks = nn.Parameter(torch.randn(4, 3))
    net.masks._no_weight_decay = True  # as MAST's masks: LARS's trust ratio, no decay
    net.masks._lars_without_weight_decay = True
    cfg = OptimConfig(name="lars", lr=0.4, weight_decay=0.05, momentum=0.9, lars_eta=0.02, head_lr=0.8)
    optimizer = build_optimizer(net, cfg, net["fc"])  # fc is the "encoder": the rest gets the head's lr
    named = dict(net.named_parameters())
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    assert {(g["apply_lars"], g["apply_weight_decay"]) for g in optimizer.param_groups} == {
        (True, True), (False, False), (True, False)}
    weights = {n: p.detach().clone() for n, p in named.items()}
    velocity: dict[str, torch.Tensor] = {}
    g = torch.Generator().manual_seed(1)
    for step in range(6):
        lr, wd = 0.4 * (1 - step / 6), 0.05 + 0.01 * step
        set_lr_and_wd(optimizer, lr, wd)
        grads = {n: None if n.startswith("late.") and step in (1, 2) else torch.randn(p.shape, generator=g)
                 for n, p in named.items()}
        for n, p in named.items():
            p.grad = None if grads[n] is None else grads[n].clone()
        optimizer.step()
        flags = {n: (group_of[id(p)]["apply_lars"], group_of[id(p)]["lr"], group_of[id(p)]["weight_decay"])
                 for n, p in named.items()}
        _lars_by_hand(weights, grads, velocity, flags, momentum=0.9, eta=0.02)
        for n, p in named.items():
            torch.testing.assert_close(p.detach(), weights[n], rtol=1e-6, atol=1e-6, msg=f"{n} at step {step}")
    assert not torch.equal(weights["zero.weight"], torch.zeros(3, 5))  # the zero weight moved (trust 1)
