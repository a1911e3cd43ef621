"""A user's folder in miniature: 60 generated 8x8 PNGs of 3 visually distinct classes (mostly red, green or blue),
loose in one flat folder, the first 30 of them (10 per class) labelled in a CSV; and a run directory over it, as
``selfsup pretrain`` leaves one (config.yaml and an exported random tiny ResNet), for the evaluation tests.

Image ``i`` is of class ``i % 3`` and carries its number in its top-left pixel (all three channels equal ``i``), so
a test reads back from raw-pixel features exactly which files were evaluated.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from selfsup.checkpoint import export_backbone
from selfsup.config import save_config
from selfsup.load import load_config
from selfsup.models import build_backbone

COLOURS = ("red", "green", "blue")  # class of image i: COLOURS[i % 3] (its bright channel)
CLASSES = sorted(COLOURS)  # the CSV's classes, sorted by name: label k is CLASSES[k]
IMAGES, LABELLED = 60, 30
PARAMS = {"block": "basic", "layers": [1], "width": 4, "small_stem": True, "in_channels": 3}


def make_photos(root: Path, count: int = IMAGES) -> Path:
    """``root/img_NN.png``: image i bright in channel i % 3, its number in pixel (0, 0)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        pixels = rng.integers(0, 40, size=(8, 8, 3), dtype=np.uint8)
        pixels[:, :, i % 3] = rng.integers(180, 250, size=(8, 8), dtype=np.uint8)
        pixels[0, 0] = i
        Image.fromarray(pixels, mode="RGB").save(root / f"img_{i:02d}.png")
    return root


def write_labels(path: Path, root: Path, rows: range = range(LABELLED), header: bool = True) -> Path:
    """A CSV labelling images ``rows`` of ``root`` by their colour; the first row's path is absolute, the others
    relative to ``root`` (one with a leading ./)."""
    lines = ["path,label"] if header else []
    for n, i in enumerate(rows):
        name = f"img_{i:02d}.png"
        path_text = str(root.absolute() / name) if n == 0 else f"./{name}" if n == 1 else name
        lines.append(f"{path_text},{COLOURS[i % 3]}")
    path.write_text("\n".join(lines) + "\n")
    return path


def image_numbers(raw_features: torch.Tensor) -> list[int]:
    """The number each raw-pixel feature row carries (its top-left red value, pixels scaled to [0, 1])."""
    return [round(float(v) * 255) for v in raw_features[:, 0]]


def labelled_run(tmp_path: Path, *overrides: str, rows: range = range(LABELLED)) -> tuple[Path, Path, Path]:
    """(run directory, photo folder, CSV) for an evaluation of the labelled photos (``rows``: the first 30)."""
    root = make_photos(tmp_path / "photos")
    labels = write_labels(tmp_path / "labels.csv", root, rows)
    run = tmp_path / "run"
    cfg = load_config(None, ["data.dataset=imagefolder", f"data.root={root}", f"data.labels={labels}",
                             "data.image_size=8", "views=[{preset: minimal, num: 2}]", "eval.batch_size=64",
                             "eval.linear_epochs=2", "eval.lowshot_splits=1", "eval.cluster_n_init=1", *overrides])
    run.mkdir()
    save_config(cfg, run / "config.yaml")
    torch.manual_seed(0)
    export_backbone(run, build_backbone("resnet", **PARAMS), {
        "backbone": "resnet", "params": PARAMS, "image_size": 8, "channels": 3, "mean": [0.4] * 3, "std": [0.3] * 3,
        "seed": 0})
    return run, root, labels


def class_image_folder(root: Path, classes: int = 3, per_class: int = 24, size: int = 16,
                       suffix: str = ".jpg") -> Path:
    """CIFAR-10 as the laptop presets read it, in miniature: ``root/train/class<c>/NNNN<suffix>``, one dominant colour
    channel per class (JPEG at quality 75, or any other format PIL writes from ``suffix``)."""
    rng = np.random.default_rng(0)
    for c in range(classes):
        folder = root / "train" / f"class{c}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            image = rng.integers(0, 80, (size, size, 3), dtype=np.uint8)
            image[..., c % 3] += 150
            Image.fromarray(image).save(folder / f"{i:04d}{suffix}", **({"quality": 75} if suffix == ".jpg" else {}))
    return root
