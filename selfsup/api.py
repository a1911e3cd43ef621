"""The public Python API: a run's backbone in the user's code, and what the command line does.

::

    import selfsup
    model, preprocess = selfsup.load_backbone("runs/quickstart")   # nn.Module in eval mode + its transform
    feats = model(preprocess([pil_image, "b.jpg", uint8_chw]))      # (B, num_features); one image -> (C, H, W)
    feats = selfsup.embed("runs/quickstart", images)                # a batch in one call, (N, D) float32
    feats, files = selfsup.embed("runs/quickstart", "photos/", return_files=True)   # = selfsup embed
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

__all__ = ["FolderFeatures", "Preprocess", "embed", "embed_folder", "evaluate", "load_backbone", "pretrain",
           "save_eval_result"]


@dataclass(frozen=True)
class Preprocess:
    """Images -> what a run's backbone takes: resized as evaluation reads them, scaled to [0, 1], normalised.

    Takes one image: a PIL image, a path to an image file, a uint8 tensor ``(C, H, W)``, a float tensor in [0, 1],
    or a numpy array ``(C, H, W)``, ``(H, W, C)`` or ``(H, W)`` (as ``np.asarray(pil_image)`` gives it); and
    returns one float32 ``(channels, image_size, image_size)``, as a torchvision transform does, so it can be a
    torch ``Dataset``'s per-image transform (the ``DataLoader`` stacks the batch). A list of images, or a 4-D
    batch ``(B, C, H, W)``, gives a batch ``(B, channels, image_size, image_size)``.

    Every image takes one path, the one ``selfsup embed`` and the evaluation of an image folder take, so the same
    image gives the same pixels whether it comes as a path, a PIL image or a uint8 tensor:
    :func:`~selfsup.data.decode.open_image` (EXIF orientation applied, 16-bit and float images scaled to 8 bit,
    transparency composited onto white, the run's channels by Pillow's conversion: gray <-> RGB, luma
    ``0.299 R + 0.587 G + 0.114 B``), then :func:`~selfsup.data.decode.fit_square` (the shorter side to
    ``image_size`` with PIL's antialiased bilinear filter, then a centre crop). A tensor becomes a PIL image
    first. Datasets held in memory as arrays (CIFAR-10, Fashion-MNIST) are resized by torch's antialiased
    bilinear, the same filter within 1/255.
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
        """uint8 pixels, resized and colour-converted, not yet normalised: ``(channels, image_size, image_size)``
        for one image, ``(B, channels, image_size, image_size)`` for a list or a 4-D batch."""
        if _is_batch(images):
            return self.batch(images)
        return self._one(images)

    def batch(self, images: Any) -> torch.Tensor:
        """uint8 ``(B, channels, image_size, image_size)`` whatever was given (one image: ``B = 1``)."""
        if not _is_batch(images):
            return self._one(images)[None]
        if len(images) == 0:
            raise ValueError("no images: pass at least one image")
        return torch.stack([self._one(image) for image in images])

    def normalize(self, pixels: torch.Tensor) -> torch.Tensor:
        """``(x - mean) / std`` per channel, for images ``(C, H, W)`` or ``(B, C, H, W)`` already in [0, 1] (on any
        device)."""
        mean = torch.tensor(self.mean, device=pixels.device, dtype=pixels.dtype).view(-1, 1, 1)
        std = torch.tensor(self.std, device=pixels.device, dtype=pixels.dtype).view(-1, 1, 1)
        return (pixels - mean) / std

    def __call__(self, images: Any) -> torch.Tensor:
        return self.normalize(self.pixels(images).float().div_(255.0))

    def _one(self, image: Any) -> torch.Tensor:
        """One image -> uint8 ``(channels, image_size, image_size)``."""
        from selfsup.data.decode import DecodeWarnings, decode_resized, image_mode
        from selfsup.data.imagedata import report_decode_warnings

        if isinstance(image, (str, Path)):
            name = str(image)
        elif _is_pil(image):
            name = "a PIL image"
        else:
            name = "a tensor"
            image = _tensor_image(image)
        with DecodeWarnings() as caught, caught.file(name):
            array = decode_resized(image, self.image_size, image_mode(self.channels))
        report_decode_warnings(caught.notes, "given to Preprocess")
        return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def _is_batch(images: Any) -> bool:
    """A list or tuple of images, or a 4-D tensor or array."""
    return isinstance(images, (list, tuple)) or (isinstance(images, (torch.Tensor, np.ndarray)) and images.ndim == 4)


def _tensor_image(image: Any) -> Any:
    """A tensor or array of one image -> the PIL image (mode "L" or "RGB") of its uint8 pixels."""
    from PIL import Image

    if isinstance(image, np.ndarray):
        image = torch.from_numpy(np.array(image))  # a writable copy
        if image.ndim == 2:  # (H, W) gray, as np.asarray(PIL image) gives it
            image = image[None]
        elif image.ndim == 3 and image.shape[-1] in (1, 3) and image.shape[0] not in (1, 3):
            image = image.permute(2, 0, 1)  # (H, W, C) -> (C, H, W)
    if not isinstance(image, torch.Tensor):
        raise TypeError(f"cannot preprocess {type(image).__name__}; pass PIL images, paths, uint8 tensors "
                        f"(C, H, W) / (B, C, H, W), float tensors in [0, 1], or a list of these")
    if image.ndim != 3 or image.shape[0] not in (1, 3):
        raise ValueError(f"expected images (C, H, W) or (B, C, H, W) with 1 or 3 channels, got shape "
                         f"{tuple(image.shape)}")
    if image.is_floating_point():
        if image.numel() and (float(image.min()) < 0 or float(image.max()) > 1):
            raise ValueError("float images must be in [0, 1]; pass uint8 images (0-255) otherwise")
        image = (image * 255).round().to(torch.uint8)
    elif image.dtype != torch.uint8:
        raise TypeError(f"integer images must be uint8 (0-255), got {image.dtype}")
    hwc = image.detach().cpu().permute(1, 2, 0).numpy()
    return Image.fromarray(np.ascontiguousarray(hwc[:, :, 0] if hwc.shape[2] == 1 else hwc),
                           "L" if hwc.shape[2] == 1 else "RGB")


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
          device: str | torch.device | None = None, return_files: bool = False,
          workers: int | None = None) -> torch.Tensor | tuple[torch.Tensor, list[str]]:
    """Features ``(N, D)`` (float32, CPU) of images: a batch (anything :class:`Preprocess` takes; one image gives
    ``N = 1``), or every image under a folder, as ``selfsup embed RUN_DIR FOLDER`` computes them (the same files,
    order and pixels).

    A folder's rows are its image files sorted by path (loose files and sub-folders alike); files that are not
    used (not images, empty, undecodable) are logged with their reasons and have no row. ``return_files=True``
    returns ``(features, files)``: ``files[i]`` is the path of row ``i``'s file relative to the folder (what
    ``OUT.files.txt`` lists). Images are then read by ``workers`` loader processes (default: one per core, at
    most 8; 0 reads them in this process).

    ``run_dir_or_model``: a run directory, or the ``(model, preprocess)`` pair :func:`load_backbone` returned
    (to embed many batches without reloading).
    """
    from selfsup.eval.features import extract_features

    if isinstance(run_dir_or_model, tuple):
        model, preprocess = run_dir_or_model
    else:
        model, preprocess = load_backbone(run_dir_or_model)
    if device is None:
        device = next(model.parameters()).device
    if isinstance(images, (str, Path)) and Path(images).expanduser().is_dir():
        found = embed_folder(model, preprocess, Path(images).expanduser(), batch_size, device, workers)
        return (found.features, found.files) if return_files else found.features
    if return_files:
        raise ValueError("return_files=True names the rows of a folder's features; a batch's rows are its images "
                         "in the order given (pass a folder, or return_files=False)")
    return extract_features(model, preprocess.batch(images), batch_size=batch_size, device=device,
                            transform=preprocess.normalize)


@dataclass(frozen=True)
class FolderFeatures:
    """The features of a folder's images: ``features[i]`` is the file ``files[i]`` (relative to the folder);
    ``skipped``: ``(file, reason)`` of each file that has no row."""

    features: torch.Tensor
    files: list[str]
    skipped: list[tuple[str, str]]


def embed_folder(model: nn.Module, preprocess: Preprocess, folder: Path, batch_size: int = 256,
                 device: str | torch.device | None = None, workers: int | None = None,
                 progress: bool = False) -> FolderFeatures:
    """Every image under ``folder`` (sorted by path) embedded: decoded by loader workers as evaluation reads a
    folder (:func:`~selfsup.data.decode.decode_resized`, the path :class:`Preprocess` takes), so a folder of any
    size is embedded in constant memory. What :func:`embed` and ``selfsup embed`` compute."""
    from selfsup.data.formats.folder import all_images
    from selfsup.data.stream import StreamedSplit, default_workers
    from selfsup.eval.features import extract_features

    split = StreamedSplit(all_images(folder), preprocess.image_size, preprocess.channels,
                          default_workers() if workers is None else workers)
    feats = extract_features(model, split, batch_size=batch_size, device=device, transform=preprocess.normalize,
                             progress=progress)[split.readable]
    files = [split.source.name(i) for i in torch.nonzero(split.readable).flatten().tolist()]
    return FolderFeatures(feats, files, split.skipped)


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


def pretrain_config(target: Path, overrides: list[str]) -> Config:
    """The config ``selfsup pretrain TARGET`` trains: a YAML file, or a run directory's own config (resumed)."""
    from selfsup.config import ConfigError
    from selfsup.load import load_config

    if target.is_dir():  # resume a run directory with its own config
        if not (target / "config.yaml").is_file():
            raise ConfigError(f"{target} is a directory without config.yaml; pass a YAML config or a run directory")
        return load_config(target / "config.yaml", [f"trainer.out={target}", *overrides])
    return load_config(target, overrides)


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
