"""Issue 48's road, as the README's "Your own photos" gives it: a folder of photos at their own sizes and in the
formats cameras and tools write (with a 16-bit PNG, an RGBA PNG, a TIFF, a GIF, a CMYK JPEG, a corrupt file, an empty
file, a HEIC and a text file), a CSV labelling a few of them; the photo preset trained to a small budget, then
``embed``, ``eval all`` with the CSV's labels beside raw pixels, and ``report``. Every file is used or listed with its
reason, at every step."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from selfsup.cli import main

PRESETS = Path(__file__).resolve().parents[1] / "configs" / "photos"
CLASSES = {"sky": (60, 120, 230), "grass": (50, 170, 60), "sand": (220, 190, 120)}
ODD = {"deep.png", "glass.png", "scan.tif", "anim.gif", "print.jpg"}  # read, each its own way
NOT_USED = {"corrupt.jpg": "cannot decode", "empty.jpg": "empty file (0 bytes)",
            "IMG_0001.heic": "HEIC/HEIF is not read", "notes.txt": "not an image file (extension .txt)"}


def photo(rng: np.random.Generator, colour: tuple[int, int, int], width: int, height: int) -> np.ndarray:
    """A textured photo of one dominant colour, ``height x width x 3`` uint8."""
    noise = rng.normal(0, 25, (height // 8 + 1, width // 8 + 1, 3)).repeat(8, 0).repeat(8, 1)[:height, :width]
    return np.clip(np.array(colour) + noise, 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> tuple[Path, Path]:
    """``photos/`` (a flat folder: 30 JPEGs of 3 kinds at sizes from 96 to 640 px, the odd files) and ``labels.csv``
    (4 of each kind labelled)."""
    root = tmp_path_factory.mktemp("road")
    folder = root / "photos"
    folder.mkdir()
    rng = np.random.default_rng(0)
    rows = []
    for k, (name, colour) in enumerate(CLASSES.items()):
        for i in range(10):
            width, height = (int(s) for s in rng.integers(96, 641, 2))
            file = f"{k}{i:02d}_{width}x{height}.jpg"
            Image.fromarray(photo(rng, colour, width, height)).save(folder / file, quality=90)
            if i < 4:
                rows.append(f"{file},{name}")
    sky = photo(rng, CLASSES["sky"], 300, 200)
    Image.fromarray(sky[..., 0].astype(np.uint16) * 257).save(folder / "deep.png")  # 16-bit gray
    Image.fromarray(np.dstack([sky, np.full(sky.shape[:2], 128, np.uint8)])).save(folder / "glass.png")  # RGBA
    Image.fromarray(sky).save(folder / "scan.tif")
    frames = [Image.fromarray(photo(rng, CLASSES["grass"], 160, 120)) for _ in range(2)]
    frames[0].save(folder / "anim.gif", save_all=True, append_images=frames[1:])
    Image.fromarray(photo(rng, CLASSES["sand"], 200, 150)).convert("CMYK").save(folder / "print.jpg")
    (folder / "corrupt.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a JPEG after all")
    (folder / "empty.jpg").write_bytes(b"")
    (folder / "IMG_0001.heic").write_bytes(b"\x00\x00\x00\x18ftypheic")
    (folder / "notes.txt").write_text("holiday 2026\n")
    labels = root / "labels.csv"
    labels.write_text("path,label\n" + "\n".join(rows) + "\n")
    return folder, labels


def listed_with_reasons(text: str) -> None:
    for name, reason in NOT_USED.items():
        assert f"{name}: {reason}" in text, name


def test_the_road_from_a_folder_of_photos_to_scores_an_embedding_and_a_report(photos, tmp_path, caplog, capsys):
    folder, labels = photos
    run = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="selfsup"):
        assert main(["pretrain", str(PRESETS / "vicreg.yaml"), f"data.root={folder}", f"data.labels={labels}",
                     f"trainer.out={run}", "trainer.budget=4s", "trainer.batch_size=16", "data.num_workers=0"]) == 0
    listed_with_reasons(caplog.text)
    for name in ("corrupt.jpg", "empty.jpg"):  # once a session, the budget's timing steps included
        assert caplog.text.count(f"replaced by another: {name}") == 1
    budget = json.loads((run / "budget.json").read_text())
    meta = json.loads((run / "backbone.json").read_text())
    # the streamed split counts the corrupt and the empty file until they are read (each replaced when met)
    assert budget["images"] == 30 + len(ODD) + 2 and meta["steps"] == budget["steps"] >= 1
    assert meta["image_size"] == 64 and meta["params"]["small_stem"] is True and meta["params"]["stem_stride"] == 2

    caplog.clear()
    capsys.readouterr()
    with caplog.at_level(logging.INFO, logger="selfsup"):
        assert main(["embed", str(run), str(folder), str(tmp_path / "feats.npy")]) == 0
    listed_with_reasons(caplog.text)
    files = (tmp_path / "feats.files.txt").read_text().splitlines()
    assert len(files) == 30 + len(ODD) and ODD <= set(files)
    skipped = dict(line.split("\t") for line in (tmp_path / "feats.skipped.txt").read_text().splitlines())
    assert skipped.keys() == NOT_USED.keys()
    assert all(skipped[name].startswith(reason) for name, reason in NOT_USED.items())
    feats = np.load(tmp_path / "feats.npy")
    assert feats.shape == (len(files), 256) and np.isfinite(feats).all()

    caplog.clear()
    capsys.readouterr()
    with caplog.at_level(logging.INFO, logger="selfsup"):
        assert main(["eval", "all", str(run), "--compare", "raw"]) == 0
    out, err = capsys.readouterr()
    scores = json.loads(out)  # the JSON line alone on stdout; the table on stderr
    assert {"knn_top1", "linear_top1", "lowshot_1shot_mean", "raw_knn_top1", "raw_lowshot_1shot_mean"} <= scores.keys()
    assert "hold-out" in caplog.text  # no val/ or test/: a stratified hold-out of the 12 labelled photos
    assert "10-shot" in caplog.text and "knn_top1" in err
    assert (run / "eval" / "all.json").is_file()

    assert main(["report", str(run), "--tsne", "0"]) == 0
    page = (run / "report.html").read_text()
    assert page.count("<img") >= 5 and "could not be read" not in page
