"""NNCLR / MAE-CT heads: the loss, gradient routing, per-view BatchNorm, EMA copies, DDP equivalence."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp_utils import run_ddp
from selfsup.config import ConfigError
from selfsup.losses.infonce import info_nce_loss
from selfsup.methods.nnclr import NNCLR, NNCLRConfig
from selfsup.models.vit import VisionTransformer
from selfsup.methods.assemble import freeze


def _vit() -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(img_size=8, patch_size=4, in_channels=1, embed_dim=16, depth=4, num_heads=2, pool="mean")


def _method(**kwargs) -> NNCLR:
    cfg = NNCLRConfig(**{"projector": [32, 32, 8], "predictor": [16, 8], "queue_size": 16, "temperature": 0.15, **kwargs})
    return NNCLR(_vit(), cfg, total_steps=10)


@pytest.mark.parametrize("tau, expected", [(0.15, 0.0038106), (0.2, 0.0200123)])
def test_infonce_toy_values_of_the_spec(tau: float, expected: float) -> None:
    eye = torch.eye(4, dtype=torch.float64)
    assert abs(float(info_nce_loss(eye, eye, tau, key_gradient=True)) - expected) < 1e-6
    assert abs(float(info_nce_loss(eye, eye, tau, key_gradient=True)) - math.log(1 + 3 * math.exp(-1 / tau))) < 1e-12
    same = torch.ones(4, 3, dtype=torch.float64)
    assert abs(float(info_nce_loss(same, same, tau, key_gradient=True)) - math.log(4)) < 1e-12


def test_step_is_the_symmetric_loss_of_neighbours_against_the_other_views_predictions() -> None:
    method = _method()
    x1, x2 = torch.randn(8, 1, 8, 8), torch.randn(8, 1, 8, 8)
    queue_before = method.queue.features.clone()
    out = method([x1, x2])
    with torch.no_grad():
        y = [method.encoder(x) for x in (x1, x2)]
        z = [F.normalize(method.projector(yi), dim=1) for yi in y]  # train-mode BN: per-view batch statistics
        p = [method.predictor(method.projector(yi)) for yi in y]
        nn1, nn2 = (queue_before[(zi @ queue_before.t()).argmax(1)] for zi in z)
        by_hand = 0.5 * (F.cross_entropy(nn1 @ F.normalize(p[1], dim=1).t() / 0.15, torch.arange(8))
                         + F.cross_entropy(nn2 @ F.normalize(p[0], dim=1).t() / 0.15, torch.arange(8)))
    torch.testing.assert_close(out.loss.detach(), by_hand)
    assert torch.equal(method.queue.features, queue_before)  # view 1 enters the queue after the step
    method.after_step(0)
    torch.testing.assert_close(method.queue.features[:8], z[0])


def test_both_predictions_get_the_gradient_of_the_symmetric_loss() -> None:
    """The keys of both InfoNCE terms are the other view's predictions, with gradient (``key_gradient=True``)."""
    method = _method()
    x1, x2 = torch.randn(8, 1, 8, 8), torch.randn(8, 1, 8, 8)
    queue = method.queue.features.clone()
    out = method([x1, x2])
    got = torch.autograd.grad(out.loss, list(method.predictor.parameters()))
    y = [method.encoder(x) for x in (x1, x2)]
    z = [method.projector(yi) for yi in y]
    p = [F.normalize(method.predictor(zi), dim=1) for zi in z]
    nn1, nn2 = (queue[(F.normalize(zi.detach(), dim=1) @ queue.t()).argmax(1)] for zi in z)
    by_hand = 0.5 * (F.cross_entropy(nn1 @ p[1].t() / 0.15, torch.arange(8))
                     + F.cross_entropy(nn2 @ p[0].t() / 0.15, torch.arange(8)))
    for g, h in zip(got, torch.autograd.grad(by_hand, list(method.predictor.parameters()))):
        torch.testing.assert_close(g, h)


def test_nn_cos_is_the_mean_cosine_of_view_1_and_its_neighbour() -> None:
    method = _method()
    with torch.no_grad():
        method.queue.features.mul_(torch.arange(1, 17, dtype=torch.float32)[:, None])  # rows of norms 1..16
    x1 = torch.randn(8, 1, 8, 8)
    queue = method.queue.features.clone()
    out = method([x1, torch.randn(8, 1, 8, 8)])
    with torch.no_grad():
        key = F.normalize(method.projector(method.encoder(x1)), dim=1)
        neighbour = queue[(key @ queue.t()).argmax(1)]
        by_hand = sum(float(key[i] @ neighbour[i]) for i in range(8)) / 8
    assert abs(float(out.terms["nn_cos"]) - by_hand) < 1e-5


def test_topk_reaches_the_lookup() -> None:
    """MAE-CT's CT draws the positive among the k nearest (the draw itself: tests/train/test_queue.py): the same
    batch then gives a different loss from one draw to the next, where the nearest neighbour alone (k = 1) cannot."""
    x1, x2 = torch.randn(8, 1, 8, 8), torch.randn(8, 1, 8, 8)
    for k, distinct in ((1, 1), (3, 4)):
        method = _method(topk=k)
        with torch.no_grad():
            losses = set()
            for seed in range(4):
                torch.manual_seed(seed)
                losses.add(round(float(method([x1, x2]).loss), 6))
        assert len(losses) == distinct, (k, losses)


def test_gradients_reach_the_heads_and_trainable_blocks_only() -> None:
    method = _method(projector_momentum=0.9, encoder_momentum=0.99)
    freeze(method.encoder, 2)
    method([torch.randn(8, 1, 8, 8), torch.randn(8, 1, 8, 8)]).loss.backward()
    for name, p in method.named_parameters():
        frozen = name.startswith(("encoder.patch_embed", "encoder.cls_token", "encoder.blocks.0.", "encoder.blocks.1."))
        if name.startswith(("projector_ema", "encoder_ema")) or frozen:
            assert p.grad is None, name
        elif name.startswith(("projector.", "predictor.", "encoder.blocks.3.")):
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert not any(name.startswith("queue") for name, _ in method.named_parameters())  # the support set is not trained


def test_batchnorm_statistics_are_per_view() -> None:
    method = _method()
    x1 = torch.randn(8, 1, 8, 8)
    with torch.no_grad():
        alone = method.projector(method.encoder(x1))  # train-mode BN: statistics of this view's batch only
    out = method([x1, torch.randn(8, 1, 8, 8) * 5 + 3])  # a very different second view
    torch.testing.assert_close(out.embeddings, alone)  # the step's z1 did not see view 2's statistics


def test_ema_projector_is_the_nearest_neighbour_path_and_follows_the_ema_formula() -> None:
    """MAE-CT Alg. 1: the lookup key and the enqueued vector come from the EMA projector, not the online one."""
    method = _method(projector_momentum=0.75)
    with torch.no_grad():
        for p in method.projector.parameters():
            p.add_(0.3 * torch.randn_like(p))  # the online projector now differs from its EMA copy
    ema_before = [p.clone() for p in method.projector_ema.module.parameters()]
    x1, x2 = torch.randn(8, 1, 8, 8), torch.randn(8, 1, 8, 8)
    queue_before = method.queue.features.clone()
    out = method([x1, x2])
    with torch.no_grad():
        y = [method.encoder(x) for x in (x1, x2)]
        key = [F.normalize(method.projector_ema.module(yi), dim=1) for yi in y]
        online = [F.normalize(method.projector(yi), dim=1) for yi in y]
        p = [F.normalize(method.predictor(method.projector(yi)), dim=1) for yi in y]
        nn1, nn2 = (queue_before[(ki @ queue_before.t()).argmax(1)] for ki in key)
        by_hand = 0.5 * (F.cross_entropy(nn1 @ p[1].t() / 0.15, torch.arange(8))
                         + F.cross_entropy(nn2 @ p[0].t() / 0.15, torch.arange(8)))
    assert not torch.allclose(key[0], online[0], atol=1e-3)  # the two paths are distinguishable
    torch.testing.assert_close(out.loss.detach(), by_hand)
    online_params = [p.detach().clone() for p in method.projector.parameters()]
    method.after_step(0)
    torch.testing.assert_close(method.queue.features[:8], key[0])  # enqueued from the EMA projector
    for b, e, s in zip(ema_before, method.projector_ema.module.parameters(), online_params):
        torch.testing.assert_close(e, 0.75 * b + 0.25 * s)


def test_ema_copies_restart_from_carried_weights_and_follow_the_ema_formula() -> None:
    method = _method(projector_momentum=0.5, encoder_momentum=0.9)
    with torch.no_grad():
        for p in [*method.encoder.parameters(), *method.projector.parameters()]:
            p.add_(1.0)  # as if weights were carried over from the previous stage
    method.after_carry_over()
    for ema, online in ((method.encoder_ema.module, method.encoder), (method.projector_ema.module, method.projector)):
        assert all(torch.equal(a, b) for a, b in zip(ema.parameters(), online.parameters()))
    assert method.backbone is method.encoder_ema.module
    before = [p.clone() for p in method.encoder_ema.module.parameters()]
    with torch.no_grad():
        for p in method.encoder.parameters():
            p.add_(2.0)
    method.after_step(0)
    for b, e, s in zip(before, method.encoder_ema.module.parameters(), method.encoder.parameters()):
        torch.testing.assert_close(e, 0.9 * b + 0.1 * s)
    plain = _method()
    assert plain.backbone is plain.encoder and plain.projector_ema is None


def _layers(head: nn.Sequential) -> list[tuple]:
    """A head as (layer, in, out, bias) rows; norms and activations as (type, width)."""
    rows = []
    for m in head:
        if isinstance(m, nn.Linear):
            rows.append(("linear", m.in_features, m.out_features, m.bias is not None))
        else:
            rows.append((type(m).__name__, getattr(m, "num_features", None)))
    return rows


def test_heads_are_the_nnclr_and_mae_ct_layers() -> None:
    """NNCLR Sec. 4 / MAE-CT's code: a 3-layer projector with BatchNorm after every Linear (the last one without
    ReLU) and a 2-layer predictor without BatchNorm after its last Linear; no Linear has a bias (BN follows it)."""
    method = _method()  # projector [32, 32, 8], predictor [16, 8], encoder width 16
    assert _layers(method.projector) == [
        ("linear", 16, 32, False), ("BatchNorm1d", 32), ("ReLU", None),
        ("linear", 32, 32, False), ("BatchNorm1d", 32), ("ReLU", None),
        ("linear", 32, 8, False), ("BatchNorm1d", 8)]
    assert _layers(method.predictor) == [
        ("linear", 8, 16, False), ("BatchNorm1d", 16), ("ReLU", None), ("linear", 16, 8, False)]


def test_eval_pool_sets_the_exported_and_the_trained_feature() -> None:
    """MAE-CT App. A.2: the head is trained on the pooled feature that is evaluated, and the export records it."""
    method = _method(eval_pool="cls")
    assert method.export_params == {"pool": "cls"} and method.encoder.pool == "cls"
    plain = _method()
    assert plain.export_params == {} and plain.encoder.pool == "mean"  # model.params.pool stays


def test_after_step_pushes_a_step_once() -> None:
    method = _method()
    method([torch.randn(8, 1, 8, 8), torch.randn(8, 1, 8, 8)])
    method.after_step(0)
    assert int(method.queue.pointer) == 8
    method.after_step(1)  # no new step in between (a skipped batch): nothing more to push
    assert int(method.queue.pointer) == 8


def test_bad_settings_name_the_key() -> None:
    for key, value in [("topk", 0), ("temperature", 0.0), ("projector_momentum", 1.5), ("queue_size", 0)]:
        with pytest.raises(ConfigError, match=f"method.{key}"):
            NNCLRConfig(**{key: value})
    with pytest.raises(ConfigError, match="method.predictor"):
        NNCLRConfig(projector=[8, 8], predictor=[8, 4])
    with pytest.raises(ConfigError, match=r"method.predictor.*ending at the projector's output \[4\]"):
        NNCLRConfig(projector=[8, 8, 4], predictor=[8, 8])
    assert NNCLRConfig(projector=[8, 4], predictor=[16, 8, 4]).predictor == [16, 8, 4]  # a deeper predictor is fine
    assert NNCLRConfig(queue_size=16, topk=16).topk == 16  # the whole queue may be the candidates
    with pytest.raises(ConfigError, match=r"method.topk.*in \[1, method.queue_size\]"):
        NNCLRConfig(queue_size=16, topk=17)
    with pytest.raises(ConfigError, match="method.queue_size: 50 is not a multiple of the global batch 96; use e.g. 96$"):
        NNCLRConfig(queue_size=50).check_batch(96)  # a queue smaller than a batch: one batch
    NNCLRConfig(queue_size=1000).check_batch(100)
    with pytest.raises(ConfigError, match="method.queue_size: 1000 is not a multiple of the global batch 96; use e.g. 960"):
        NNCLRConfig(queue_size=1000).check_batch(96)


def test_a_queue_holding_the_whole_dataset_is_refused() -> None:
    from selfsup.methods import check_dataset

    spec = {"name": "nnclr", "queue_size": 2048}
    check_dataset(spec, 60000, 256)  # Fashion-MNIST: fine
    check_dataset(spec, 2049, 256)
    for images, fit in ((2048, 512), (1797, 256)):  # a queue of the dataset's size or more holds every image's own
        with pytest.raises(ConfigError, match=f"method.queue_size: 2048 >= the {images} training images.*"  # last
                                              f"use method.queue_size={fit} "):  # a quarter of the data, in batches
            check_dataset(spec, images, 256)
    check_dataset({"name": "vicreg"}, 10, 256)  # methods without a queue have no such check


# ------------------------------------------------------------------------------- DDP
IN, OUT, BATCH = 6, 5, 8


def _ddp_inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, BATCH, IN, generator=g, dtype=torch.float64)  # two views' features
    neighbours = F.normalize(torch.randn(2, BATCH, OUT, generator=g, dtype=torch.float64), dim=-1)  # constants
    linear = nn.Linear(IN, OUT).double()
    return x, neighbours, {k: v.clone() for k, v in linear.state_dict().items()}


def _loss(model, x, neighbours):
    p = [model(x[0]), model(x[1])]
    return 0.5 * (info_nce_loss(neighbours[0], p[1], 0.15, key_gradient=True)
                  + info_nce_loss(neighbours[1], p[0], 0.15, key_gradient=True))


def _ddp_rank(rank: int, world: int, x, neighbours, state) -> dict:
    local = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    model = nn.Linear(IN, OUT).double()
    model.load_state_dict(state)
    ddp = DistributedDataParallel(model)
    _loss(ddp, x[:, local], neighbours[:, local]).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.multiprocess
def test_infonce_with_gathered_predictions_in_two_gloo_processes_equals_one_process() -> None:
    x, neighbours, state = _ddp_inputs()
    results = run_ddp(_ddp_rank, 2, x, neighbours, state)
    model = nn.Linear(IN, OUT).double()
    model.load_state_dict(state)
    _loss(model, x, neighbours).backward()
    assert model.weight.grad.abs().max() > 1e-3
    for rank, grads in enumerate(results):
        for name, p in model.named_parameters():
            torch.testing.assert_close(grads[name], p.grad, rtol=1e-10, atol=1e-12, msg=f"rank {rank} {name}")
