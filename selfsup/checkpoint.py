"""Run-directory files: atomic checkpoints (loaded without executing code) and the exported backbone.

Layout of a run directory::

    config.yaml              resolved config (all defaults filled in)
    metrics.csv              one row per logged step
    checkpoints/last.pt      resumable state (model, optimiser, step); tensors and plain types only
    backbone.safetensors     exported backbone weights
    backbone.json            how to rebuild it: backbone name and parameters, input size, normalisation
    plots/*.png
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from selfsup.models import build_backbone

CHECKPOINT = Path("checkpoints") / "last.pt"


class CheckpointError(RuntimeError):
    """A checkpoint or exported backbone is missing, corrupt or does not match the model."""


def _atomic_write(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically: a crash mid-write leaves the previous checkpoint intact."""
    _atomic_write(path, lambda tmp: torch.save(state, tmp))


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True``: tensors and plain Python types, never code."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unpickling failure means the file is unusable
        raise CheckpointError(f"cannot read checkpoint {path}: {err}. It is corrupt or not a selfsup checkpoint; "
                              f"delete it to restart the run from scratch (or restore a backup)") from err


def export_backbone(run_dir: Path, backbone: nn.Module, meta: dict[str, Any]) -> None:
    """Save the backbone weights as safetensors plus the JSON needed to rebuild it for evaluation."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in backbone.state_dict().items()}
    _atomic_write(run_dir / "backbone.safetensors", lambda tmp: save_file(tensors, tmp))
    _atomic_write(run_dir / "backbone.json", lambda tmp: Path(tmp).write_text(json.dumps(meta, indent=2)))


def load_backbone(run_dir: Path, random_init: bool = False) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild the exported backbone of a run (or, with ``random_init``, the same architecture untrained)."""
    run_dir = Path(run_dir)
    meta_path, weights_path = run_dir / "backbone.json", run_dir / "backbone.safetensors"
    if not meta_path.is_file() or not weights_path.is_file():
        raise CheckpointError(f"{run_dir} has no exported backbone (backbone.json + backbone.safetensors); "
                              f"finish or resume the run with `selfsup pretrain {run_dir}`")
    meta = json.loads(meta_path.read_text())
    torch.manual_seed(meta.get("seed", 0))
    backbone = build_backbone(meta["backbone"], **meta["params"])
    if not random_init:
        try:
            state = load_file(str(weights_path))
        except Exception as err:  # noqa: BLE001
            raise CheckpointError(f"cannot read {weights_path}: {err}; re-export it by re-running "
                                  f"`selfsup pretrain {run_dir}`") from err
        missing, unexpected = backbone.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise CheckpointError(f"{weights_path} does not match backbone {meta['backbone']} {meta['params']}: "
                                  f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    return backbone, meta
