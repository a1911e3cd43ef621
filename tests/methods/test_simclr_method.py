"""SimCLR: the step is NT-Xent of the projected views, the head's layout and depth, training on tiny data, the view
count on load. NT-Xent itself against a transcription of Eq. 1: tests/losses/test_ntxent.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from selfsup.config import ConfigError
from selfsup.load import load_config
from selfsup.losses.infonce import nt_xent_loss
from selfsup.methods import build_method
from selfsup.methods.simclr import SimCLR, SimCLRConfig
from selfsup.models import build_backbone

PRESET = Path(__file__).resolve().parents[2] / "configs" / "cifar10" / "laptop" / "simclr.yaml"


def _method(**kwargs) -> SimCLR:
    torch.manual_seed(0)
    backbone = build_backbone("resnet", block="basic", layers=[1, 1, 1, 1], width=8, small_stem=True, in_channels=1)
    return SimCLR(backbone, SimCLRConfig(**{"projector": [32, 16], **kwargs}), total_steps=10).train()


def _views(seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(8, 1, 16, 16, generator=g) for _ in range(2)]


def test_step_is_nt_xent_of_both_views_projected_in_one_pass() -> None:
    """One pass over the 2N views (the authors' code: BatchNorm statistics over both views), then Eq. 1."""
    method = _method(temperature=0.3)
    x1, x2 = _views()
    out = method([x1, x2])
    z1, z2 = method.projector(method.backbone(torch.cat([x1, x2]))).chunk(2)
    torch.testing.assert_close(out.loss, nt_xent_loss(z1, z2, 0.3))
    assert not torch.allclose(out.loss, nt_xent_loss(z1, z2, 0.5))
    torch.testing.assert_close(out.embeddings, z1.detach())
    assert out.terms == {}  # no extra terms to log (the engine iterates them)


def test_views_of_two_sizes_are_encoded_one_size_at_a_time() -> None:
    """A 16 px and an 8 px view (a user's `views` with two sizes) cannot share one pass: each size gets its own
    encoder pass, and the projection head sees the 2N features together."""
    method = _method()
    g = torch.Generator().manual_seed(2)
    x1, x2 = torch.rand(8, 1, 16, 16, generator=g), torch.rand(8, 1, 8, 8, generator=g)
    out = method([x1, x2])
    z1, z2 = method.projector(torch.cat([method.backbone(x1), method.backbone(x2)])).chunk(2)
    torch.testing.assert_close(out.loss, nt_xent_loss(z1, z2, method.temperature))
    out.loss.backward()


@pytest.mark.parametrize("widths, linears", [([32, 16], 2), ([32, 32, 16], 3)])
def test_projection_head_depth_and_layout(widths: list[int], linears: int) -> None:
    """Paper: 2 layers; SimCLR v2: 3. Linear without bias, BatchNorm after every layer, ReLU after the hidden ones."""
    head = _method(projector=widths).projector
    kinds = [type(m) for m in head]
    assert kinds == [nn.Linear, nn.BatchNorm1d, nn.ReLU] * (linears - 1) + [nn.Linear, nn.BatchNorm1d]
    assert all(m.bias is None for m in head if isinstance(m, nn.Linear))
    assert head[-2].out_features == widths[-1]


def test_a_few_steps_train_the_encoder() -> None:
    method = _method()
    opt = torch.optim.SGD(method.parameters(), lr=0.5)
    before = [p.clone() for p in method.backbone.parameters()]
    losses = []
    for step in range(3):
        out = method(_views(seed=step))
        opt.zero_grad()
        out.loss.backward()
        assert all(p.grad is not None for p in method.parameters())
        opt.step()
        method.after_step(step)  # the base class's no-op hook
        losses.append(out.loss.item())
    assert all(np.isfinite(losses))
    assert all(not torch.equal(p, b) for p, b in zip(method.backbone.parameters(), before))


def test_defaults_and_the_view_count_on_load() -> None:
    assert (SimCLRConfig().temperature, SimCLRConfig().projector) == (0.5, [2048, 128])
    with pytest.raises(ConfigError, match=r"bad value for method.temperature: -1"):
        SimCLRConfig(temperature=-1.0)
    for made in (1, 3):
        with pytest.raises(ConfigError, match=f"method simclr needs 2 views per image but the config makes {made}"):
            load_config(None, ["method.name=simclr", f"views=[{{preset: minimal, num: {made}}}]"])
    cfg = load_config(PRESET)
    assert cfg.method == {"name": "simclr", "projector": [256, 128], "temperature": 0.2}  # the laptop lever
    backbone = build_backbone("resnet", block="basic", layers=[1, 1, 1, 1], width=8, small_stem=True, in_channels=1)
    assert isinstance(build_method(cfg.method, backbone, 10), SimCLR)
