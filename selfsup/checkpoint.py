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

import errno
import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from selfsup.atomic import TMP_SUFFIX, atomic_write, atomic_write_all
from selfsup.models import build_backbone

CHECKPOINT = Path("checkpoints") / "last.pt"


class CheckpointError(RuntimeError):
    """A checkpoint or exported backbone is missing, corrupt or does not match the model."""


def remove_stale_temporaries(run_dir: Path) -> list[Path]:
    """Delete the temporaries of writes that a killed process left behind in a run directory."""
    stale = [p for folder in (run_dir, run_dir / CHECKPOINT.parent) if folder.is_dir()
             for p in folder.glob(f".*{TMP_SUFFIX}")]
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def tensor_bytes(tree: Any) -> int:
    """The bytes of the tensors in a nested state (dicts, lists, tuples): what writing it takes at least."""
    if isinstance(tree, torch.Tensor):
        return tree.nbytes
    if isinstance(tree, dict):
        return sum(tensor_bytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(tensor_bytes(v) for v in tree)
    return 0


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically: a crash mid-write leaves the previous checkpoint intact. The free space
    is checked first (a disk without room for the state's tensors is an OSError before anything is written); a failed
    write (torch's writer reports a full disk as a RuntimeError) is an OSError naming ``path`` and the free space."""
    folder = Path(path).parent
    while not folder.exists() and folder != folder.parent:  # the first checkpoint: its folder is made by the write
        folder = folder.parent
    need, free = tensor_bytes(state), shutil.disk_usage(folder).free
    if need > free:
        raise OSError(errno.ENOSPC, f"needs {need / 2**20:,.0f} MiB but {free / 2**20:,.0f} MiB is free on its disk "
                      "(the checkpoint before is kept)", str(path))

    def write(tmp: str) -> None:
        try:
            torch.save(state, tmp)
        except RuntimeError as err:
            free = shutil.disk_usage(Path(path).parent).free / 2**20
            raise OSError(errno.EIO, f"could not be written ({' '.join(str(err).split())[:160]}; {free:.0f} MiB free "
                          f"on its disk)", str(path)) from err

    atomic_write(path, write)


def load_checkpoint(path: Path, fix: str | None = None) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True``: tensors and plain Python types, never code. ``fix``: what the
    error tells the user to do when the file is unreadable (default: delete it and restart the run)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unpickling failure means the file is unusable
        fix = fix or "delete it to restart the run from scratch (or restore a backup)"
        raise CheckpointError(f"cannot read checkpoint {path}: {err}. It is corrupt or not a selfsup checkpoint; "
                              f"{fix}") from err


# Keys of a run's checkpoint (checkpoints/last.pt) and their types; resuming needs all of them.
_CHECKPOINT_KEYS: dict[str, type] = {"model": dict, "optimizer": dict, "step": int, "config": dict}


def check_run_checkpoint(state: Any, path: Path, fix: str | None = None) -> None:
    """A run's checkpoint as resuming needs it: the keys it holds, and finite weights and optimiser state. A file
    damaged by hand (or by a run that diverged before these checks) is a :class:`CheckpointError` naming it and
    ``fix`` (default: delete it and restart the run)."""
    fix = fix or f"delete {path} to restart the run from scratch (or restore a backup)"
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} is not a selfsup checkpoint (it holds a {type(state).__name__}); {fix}")
    for key, kind in _CHECKPOINT_KEYS.items():
        if not isinstance(state.get(key), kind) or isinstance(state.get(key), bool):
            raise CheckpointError(f"{path}: key {key!r} is missing or not a {kind.__name__}; {fix}")
    tensors = {f"model.{k}": v for k, v in state["model"].items()}
    for pid, values in state["optimizer"].get("state", {}).items():
        tensors.update({f"optimizer.{pid}.{k}": v for k, v in values.items()})
    bad = [k for k, v in tensors.items()
           if torch.is_tensor(v) and v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise CheckpointError(f"{path} holds non-finite values in {', '.join(bad[:5])}: it is corrupt or was saved "
                              f"from a diverged run; {fix}")


def export_backbone(run_dir: Path, backbone: nn.Module, meta: dict[str, Any]) -> None:
    """Save the backbone weights as safetensors plus the JSON needed to rebuild it for evaluation."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in backbone.state_dict().items()}
    atomic_write(run_dir / "backbone.safetensors", lambda tmp: save_file(tensors, tmp))
    atomic_write(run_dir / "backbone.json", lambda tmp: Path(tmp).write_text(json.dumps(meta, indent=2)))


def no_backbone(run_dir: Path) -> CheckpointError:
    """The error for a folder without an exported backbone, with a fix that works for what the folder is: a run
    directory (its config.yaml) is finished by resuming it; any other folder is not a run."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        return CheckpointError(f"{run_dir} does not exist; pass a run directory (the trainer.out of a "
                               f"`selfsup pretrain` run)")
    if (run_dir / "config.yaml").is_file():
        return CheckpointError(f"{run_dir} has no exported backbone (backbone.json + backbone.safetensors) yet; "
                               f"finish or resume the run with `selfsup pretrain {run_dir}`")
    return CheckpointError(f"{run_dir} is not a run directory (no backbone.json, backbone.safetensors or "
                           f"config.yaml); pass the trainer.out of a `selfsup pretrain` run, e.g. runs/quickstart")


def load_backbone(run_dir: Path, random_init: bool = False,
                  extra_params: dict[str, Any] | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild the exported backbone of a run (or, with ``random_init``, the same architecture untrained).

    ``extra_params``: constructor arguments that change training only, not the weights (e.g. a ViT's
    ``drop_path_rate`` for fine-tuning)."""
    run_dir = Path(run_dir)
    meta_path, weights_path = run_dir / "backbone.json", run_dir / "backbone.safetensors"
    if not meta_path.is_file() or not weights_path.is_file():
        raise no_backbone(run_dir)
    meta = read_backbone_meta(run_dir)
    torch.manual_seed(meta.get("seed", 0))
    try:
        backbone = build_backbone(meta["backbone"], **{**meta["params"], **(extra_params or {})})
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{meta_path}: cannot build {meta['backbone']} {meta['params']}: {err}") from err
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
        bad = [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
        if bad:
            raise CheckpointError(f"{weights_path} holds non-finite values in {', '.join(bad[:5])}; the file is "
                                  f"corrupt or the run diverged: re-export it with `selfsup pretrain {run_dir}`")
    return backbone, meta


# Keys of backbone.json and their types; evaluation and embedding need all of them.
_META_KEYS: dict[str, type] = {"backbone": str, "params": dict, "image_size": int, "channels": int,
                                                  "mean": list, "std": list}


def read_backbone_meta(run_dir: Path) -> dict[str, Any]:
    """``backbone.json`` of a run, checked: a malformed file is a :class:`CheckpointError` naming the problem."""
    path = Path(run_dir) / "backbone.json"
    if not path.is_file():
        raise no_backbone(run_dir)
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path} is not valid JSON ({err}); re-export it with `selfsup pretrain {run_dir}`") from err
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path} must hold a JSON object; re-export it with `selfsup pretrain {run_dir}`")
    for key, kind in _META_KEYS.items():
        if not isinstance(meta.get(key), kind) or isinstance(meta.get(key), bool):
            raise CheckpointError(f"{path}: key {key!r} is missing or not a {kind.__name__} "
                                  f"(found {meta.get(key)!r}); re-export it with `selfsup pretrain {run_dir}`")
    if meta["channels"] not in (1, 3) or len(meta["mean"]) != meta["channels"] or len(meta["std"]) != meta["channels"]:
        raise CheckpointError(f"{path}: channels {meta['channels']} with mean {meta['mean']} and std {meta['std']} "
                              f"do not agree; re-export it with `selfsup pretrain {run_dir}`")
    return meta
