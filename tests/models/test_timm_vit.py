"""``model.backbone: timm:NAME`` for a plain timm ViT (issue 49, point 3): it comes back as selfsup's ViT with timm's
weights, computing timm's feature exactly, with the token interface the masking methods need (MSN trains on it), and
its run records ``vit_custom`` so that the export loads where timm is absent.

These tests need timm and skip where it does not import (here: the CPU torch wheel has no torchvision for timm). They
were run with timm 1.0.31 importable (its torchvision imports stood in for) on 2026-11-28: all passed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from selfsup.models import TimmBackbone, VisionTransformer, build_backbone, recorded_backbone

timm = pytest.importorskip("timm", reason="timm does not import here")

EXPRESSIBLE = [
    ("vit_tiny_patch16_224", {}),
    ("vit_tiny_patch16_224", {"img_size": 32, "in_chans": 1}),
    ("vit_small_patch16_224", {"img_size": 64, "class_token": False, "global_pool": "avg", "fc_norm": False}),
    ("vit_small_patch16_224", {"img_size": 64, "no_embed_class": True, "qkv_bias": False}),
    ("vit_small_patch16_224", {"img_size": 64, "drop_path_rate": 0.1}),
]
NOT_EXPRESSIBLE = [
    ("vit_small_patch16_224", {"img_size": 64, "global_pool": "avg"}, "fc_norm"),
    ("vit_small_patch16_224", {"img_size": 64, "reg_tokens": 4}, "4 register tokens"),
    ("deit3_small_patch16_224", {"img_size": 64}, "LayerScale"),
    ("vit_small_patch16_224", {"img_size": 64, "qk_norm": True}, "norm inside"),
]


def _pair(name: str, kwargs: dict) -> tuple[torch.nn.Module, torch.nn.Module]:
    """timm's model and ours, built from the same seed (so the same random weights)."""
    torch.manual_seed(0)
    reference = timm.create_model(name, num_classes=0, **kwargs).eval()
    args = {("in_channels" if k == "in_chans" else k): v for k, v in kwargs.items()}
    torch.manual_seed(0)
    ours = build_backbone(f"timm:{name}", **args).eval()
    return reference, ours


@pytest.mark.parametrize("name,kwargs", EXPRESSIBLE, ids=[f"{n}-{'-'.join(k) or 'default'}" for n, k in EXPRESSIBLE])
def test_a_plain_timm_vit_becomes_ours_with_the_same_feature(name: str, kwargs: dict) -> None:
    reference, ours = _pair(name, kwargs)
    assert isinstance(ours, VisionTransformer)
    side = reference.patch_embed.img_size[0]
    x = torch.randn(2, reference.patch_embed.proj.in_channels, side, side)
    with torch.no_grad():
        assert torch.allclose(reference(x), ours(x), atol=1e-5, rtol=0)
        tokens = reference.forward_features(x)[:, reference.num_prefix_tokens:]  # every patch token, normalised
        assert torch.allclose(tokens, ours.forward_features(x)["patch_tokens"], atol=1e-5, rtol=0)
    kind, params = recorded_backbone(f"timm:{name}", kwargs, ours)
    rebuilt = build_backbone(kind, **params)  # no timm needed: selfsup's own ViT
    rebuilt.load_state_dict(ours.state_dict())
    with torch.no_grad():
        assert torch.equal(rebuilt.eval()(x), ours(x))


@pytest.mark.parametrize("name,kwargs,why", NOT_EXPRESSIBLE, ids=[w for _, _, w in NOT_EXPRESSIBLE])
def test_a_timm_vit_ours_cannot_express_stays_timms_and_says_why(name: str, kwargs: dict, why: str, caplog) -> None:
    reference, ours = _pair(name, kwargs)
    assert isinstance(ours, TimmBackbone)
    assert any(why in r.getMessage() and "cannot express" in r.getMessage() for r in caplog.records), caplog.text
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(reference(x), ours(x))
    assert recorded_backbone(f"timm:{name}", kwargs, ours) == (f"timm:{name}", kwargs)


def test_msn_trains_a_timm_vit_and_its_export_loads_without_timm(tmp_path: Path) -> None:
    """The masking methods' token interface on a timm name: MSN on timm:vit_tiny_patch16_224 (2 steps, 32 px digits
    upscaled), its backbone.json names vit_custom, and evaluation in a process where timm cannot import reads it."""
    config = tmp_path / "msn.yaml"
    config.write_text("""
method: {name: msn, projector: [64, 64, 32], num_prototypes: 16, masked_views: 1}
data: {dataset: digits, image_size: 32}
views:
  - {preset: minimal, num: 1}
  - {preset: minimal, num: 1}
model:
  backbone: timm:vit_tiny_patch16_224
  params: {}
trainer: {max_steps: 2, batch_size: 16, progress: false}
monitor: {knn_every_steps: 0}
eval: {holdout: 0.2}
""")
    run = tmp_path / "run"
    cli = [sys.executable, "-m", "selfsup.cli"]
    done = subprocess.run([*cli, "pretrain", str(config), f"trainer.out={run}"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert "runs as selfsup's ViT with timm's weights" in done.stderr
    meta = json.loads((run / "backbone.json").read_text())
    assert meta["backbone"] == "vit_custom"
    assert meta["params"]["embed_dim"] == 192 and meta["params"]["patch_size"] == 16
    blocker = tmp_path / "no_timm"
    blocker.mkdir()
    (blocker / "timm.py").write_text("raise ImportError('timm is absent in this process')\n")
    evaluated = subprocess.run([*cli, "eval", "knn", str(run)], capture_output=True, text=True, timeout=600,
                               env={**os.environ, "PYTHONPATH": f"{blocker}:{Path.cwd()}"})
    assert evaluated.returncode == 0, evaluated.stderr
    assert "knn" in (evaluated.stdout + evaluated.stderr).lower()
