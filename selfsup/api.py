"""The public Python API: a run's backbone in the user's code, and what the command line does.

::

    import selfsup
    model, preprocess = selfsup.load_backbone("runs/quickstart")   # nn.Module in eval mode + its transform
    feats = model(preprocess(pil_image_or_uint8_batch))             # (B, num_features)
    feats = selfsup.embed("runs/quickstart", images)                # a batch in one call, (N, D) float32
    run = selfsup.pretrain("configs/fashion_mnist/quickstart.yaml", "trainer.epochs=1")
    scores = selfsup.evaluate(run, "knn", compare=["raw"])          # what `selfsup eval` prints

The model takes what ``preprocess`` returns: float images of the run's channels and size, normalised with
the mean and std stored with the exported backbone (``backbone.json``).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:  # keep `import selfsup` cheap: nothing heavy at import time
    from torch import nn

    from selfsup.config import Config

__all__ = ["Preprocess", "embed", "evaluate", "load_backbone", "pretrain", "save_eval_result"]


@dataclass(frozen=True)
class Preprocess:
    """Images -> the batch a run's backbone takes: resized as evaluation reads them, scaled to [0, 1], normalised.

    Accepts a PIL image, a path, a uint8 tensor or array ``(C, H, W)`` / ``(B, C, H, W)`` (or ``(H, W)``,
    ``(H, W, C)`` arrays as PIL gives them), a float tensor in [0, 1], or a list of any of these. Always
    returns a float32 batch ``(B, channels, image_size, image_size)``: a single image gives ``B = 1``.
    Resizing follows evaluation: the shorter side to ``image_size``, then a centre crop (PIL images: bicubic,
    as image folders are decoded; tensors: antialiased bilinear, as in-memory datasets are resized); colour
    is converted to the run's channels (gray <-> RGB).
    """

    image_size: int
    channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> Preprocess:
        """The transform recorded with an exported backbone (``backbone.json``)."""
        return cls(int(meta["image_size"]), int(meta["channels"]), tuple(meta["mean"]), tuple(meta["std"]))

    def pixels(self, images: Any) -> torch.Tensor:
        """uint8 ``(B, channels, image_size, image_size)``: resized and colour-converted, not yet normalised."""
        from selfsup.data.imagedata import convert_channels, resize_images

        if isinstance(images, (list, tuple)):
            if not images:
                raise ValueError("no images: pass at least one image")
            return torch.cat([self.pixels(image) for image in images])
        if isinstance(images, (str, Path)) or _is_pil(images):
            return self._decode(images)
        if isinstance(images, np.ndarray):
            images = torch.from_numpy(np.array(images))  # a writable copy
            if images.ndim == 2:  # (H, W) gray, as np.asarray(PIL image) gives it
                images = images[None]
            elif images.ndim == 3 and images.shape[-1] in (1, 3) and images.shape[0] not in (1, 3):
                images = images.permute(2, 0, 1)  # (H, W, C) -> (C, H, W)
        if not isinstance(images, torch.Tensor):
            raise TypeError(f"cannot preprocess {type(images).__name__}; pass PIL images, paths, uint8 tensors "
                            f"(C, H, W) / (B, C, H, W), float tensors in [0, 1], or a list of these")
        if images.ndim == 3:
            images = images[None]
        if images.ndim != 4 or images.shape[1] not in (1, 3):
            raise ValueError(f"expected images (C, H, W) or (B, C, H, W) with 1 or 3 channels, got shape "
                             f"{tuple(images.shape)}")
        if images.is_floating_point():
            if images.numel() and (float(images.min()) < 0 or float(images.max()) > 1):
                raise ValueError("float images must be in [0, 1]; pass uint8 images (0-255) otherwise")
            images = (images * 255).round().to(torch.uint8)
        elif images.dtype != torch.uint8:
            raise TypeError(f"integer images must be uint8 (0-255), got {images.dtype}")
        images = convert_channels(images.cpu(), self.channels)
        return resize_images(images, self.image_size).contiguous()

    def normalize(self, batch: torch.Tensor) -> torch.Tensor:
        """``(x - mean) / std`` per channel, for images already in [0, 1] (on any device)."""
        mean = torch.tensor(self.mean, device=batch.device, dtype=batch.dtype).view(1, -1, 1, 1)
        std = torch.tensor(self.std, device=batch.device, dtype=batch.dtype).view(1, -1, 1, 1)
        return (batch - mean) / std

    def __call__(self, images: Any) -> torch.Tensor:
        return self.normalize(self.pixels(images).float().div_(255.0))

    def _decode(self, image: Any) -> torch.Tensor:
        from selfsup.data.decode import decode_resized, image_mode

        if _is_pil(image):
            from io import BytesIO

            buffer = BytesIO()
            image.save(buffer, format="PNG")  # lossless; decode_resized then treats it as a file of the folder
            buffer.seek(0)
            image = buffer
        array = decode_resized(image, self.image_size, image_mode(self.channels))
        return torch.from_numpy(np.array(array)).permute(2, 0, 1)[None].contiguous()


def _is_pil(obj: Any) -> bool:
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - pillow is a dependency
        return False
    return isinstance(obj, Image.Image)


def load_backbone(run_dir: str | Path, device: str | torch.device | None = None,
                  random_init: bool = False) -> tuple[nn.Module, Preprocess]:
    """A run's exported backbone (``backbone.safetensors`` + ``backbone.json``) in eval mode, and its transform.

    ``model(preprocess(images))`` gives ``(B, model.num_features)`` features, as ``selfsup eval`` and
    ``selfsup embed`` compute them. ``random_init``: the same architecture untrained (the random baseline).
    """
    from selfsup.checkpoint import load_backbone as load

    model, meta = load(Path(run_dir), random_init=random_init)
    model.eval()
    if device is not None:
        model.to(device)
    return model, Preprocess.from_meta(meta)


def embed(run_dir_or_model: str | Path | tuple[nn.Module, Preprocess], images: Any, batch_size: int = 256,
          device: str | torch.device | None = None) -> torch.Tensor:
    """Features ``(N, D)`` (float32, CPU) of a batch of images (anything :class:`Preprocess` takes).

    ``run_dir_or_model``: a run directory, or the ``(model, preprocess)`` pair :func:`load_backbone` returned
    (to embed many batches without reloading). A folder of image files on disk: ``selfsup embed``.
    """
    from selfsup.eval.features import extract_features

    if isinstance(run_dir_or_model, tuple):
        model, preprocess = run_dir_or_model
    else:
        model, preprocess = load_backbone(run_dir_or_model)
    if device is None:
        device = next(model.parameters()).device
    return extract_features(model, preprocess.pixels(images), batch_size=batch_size, device=device,
                            transform=preprocess.normalize)


def _overrides(overrides: Iterable[str], sections: dict[str, Any]) -> list[str]:
    """``key=value`` strings, plus keyword sections flattened: ``trainer={"max_steps": 20}`` ->
    ``trainer.max_steps=20`` (values as YAML, as on the command line)."""
    out = [str(o) for o in overrides]

    def flatten(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                flatten(f"{prefix}.{key}", sub)
        else:
            out.append(f"{prefix}={json.dumps(value) if not isinstance(value, str) else value}")

    for section, value in sections.items():
        flatten(section.replace("__", "."), value)
    return out


def pretrain(config: str | Path | dict[str, Any] | Config, *overrides: str, allow_optim_change: bool = False,
             backbone: nn.Module | None = None, **sections: Any) -> Path:
    """``selfsup pretrain``: train into ``trainer.out`` (resuming it if it exists) and return the run directory.

    ``config``: a YAML file, a run directory (resumed with its own config), a dict of the YAML's content, or a
    :class:`selfsup.config.Config`. Overrides as on the command line (``"trainer.max_steps=20"``) or as keyword
    sections (``trainer={"max_steps": 20}``, or ``trainer__max_steps=20``).

    ``backbone``: your own ``nn.Module`` instead of ``model.backbone`` (see :func:`selfsup.register_backbone` for
    what it needs). It is registered as ``user:<its class name>``, and the run trains a copy of it from its current
    weights; :func:`load_backbone`, :func:`evaluate` and :func:`embed` then rebuild it from the run, in this process
    (another process registers the same name first).
    """
    from selfsup.cli import pretrain_config
    from selfsup.config import Config, deep_merge, from_dict, parse_overrides, to_dict
    from selfsup.launch import pretrain as run
    from selfsup.models import check_backbone, register_backbone

    extra = _overrides(overrides, sections)
    if backbone is not None:
        name = f"user:{type(backbone).__name__}"
        initial = copy.deepcopy(check_backbone(backbone, name)).cpu()
        register_backbone(name, lambda: copy.deepcopy(initial))
    if isinstance(config, Config):
        config = to_dict(config)
    if isinstance(config, dict):
        cfg = from_dict(Config, deep_merge(dict(config), parse_overrides(extra)))
    else:
        cfg = pretrain_config(Path(config), extra)
    if backbone is not None:  # the module replaces the config's backbone and its parameters
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, backbone=name, params={}))
    return run(cfg, allow_optim_change=allow_optim_change)


def evaluate(run_dir: str | Path, kind: str = "all", *overrides: str, baseline: str = "none",
             compare: Sequence[str] = (), save: bool = True, progress: bool = False, **sections: Any,
             ) -> dict[str, float]:
    """``selfsup eval KIND RUN_DIR``: the scores (accuracies in percent) of the backbone, or of a ``baseline``
    (``raw`` pixels, a ``random`` network), with ``compare`` baselines' scores beside it (keys prefixed
    ``raw_`` / ``random_``). ``kind``: knn, linear, lowshot, cluster, all (the four) or finetune. ``save``
    writes the result to ``RUN_DIR/eval/<kind>.json`` as the command does (``selfsup report`` shows it)."""
    from selfsup.config import ConfigError
    from selfsup.eval.run import EVALUATIONS, evaluate_run, run_config, run_finetune

    run_dir = Path(run_dir)
    extra = _overrides(overrides, sections)
    if kind not in (*EVALUATIONS, "all", "finetune"):
        raise ConfigError(f"unknown evaluation {kind!r}; choose one of {', '.join(EVALUATIONS)}, all or finetune")
    cfg = run_config(run_dir, extra)
    kinds = list(EVALUATIONS) if kind == "all" else [kind]
    baselines = [baseline, *(b for b in compare if b)]
    for name in baselines:
        if name not in ("none", "raw", "random"):
            raise ConfigError(f"bad baseline {name!r}; allowed: raw, random")
    result: dict[str, float] = {}
    for name in baselines:
        prefix = "" if name == "none" else f"{name}_"
        if kind == "finetune":
            scores = run_finetune(run_dir, cfg, baseline=name, progress=progress)
        else:
            scores = evaluate_run(run_dir, cfg, kinds, baseline=name, progress=progress)
        result.update({prefix + k: v for k, v in scores.items()})
    if save:
        try:
            save_eval_result(run_dir, kind, result, baselines, extra)
        except OSError as err:  # e.g. a read-only run directory: the scores are still returned and printed
            import logging

            logging.getLogger("selfsup").warning("could not save %s/eval/%s.json: %s", run_dir, kind, err)
    return result


def save_eval_result(run_dir: Path, kind: str, result: dict[str, float], baselines: Sequence[str],
                     overrides: Sequence[str]) -> Path:
    """Write ``RUN_DIR/eval/<kind>.json``: the scores, which baselines they include and the overrides used."""
    from selfsup.checkpoint import atomic_write

    path = Path(run_dir) / "eval" / f"{kind}.json"
    record = {"kind": kind, "baselines": ["backbone" if b == "none" else b for b in baselines],
              "overrides": list(overrides), "result": result,
              "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(record, indent=2)))
    return path
