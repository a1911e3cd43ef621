"""data.labels: a CSV of path,label rows labelling a subset of an image folder; each bad input is one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from labelled_photos import CLASSES, COLOURS, make_photos, write_labels
from selfsup.config import ConfigError
from selfsup.load import load_config
from selfsup.data.datasets import open_images
from selfsup.data.formats.label_csv import labelled_source, read_label_csv
from selfsup.data.imagedata import DataError


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    return make_photos(tmp_path / "photos", count=12)


def test_rows_with_or_without_a_header_label_the_named_images(photos: Path, tmp_path: Path) -> None:
    for header in (True, False):
        table = read_label_csv(write_labels(tmp_path / "labels.csv", photos, range(6), header=header), photos)
        assert table.classes == CLASSES
        assert table.labels == {f"img_{i:02d}.png": COLOURS[i % 3] for i in range(6)}  # absolute, ./ and plain
        source = labelled_source(table, "train", photos)
        assert [source.name(i) for i in range(len(source))] == [f"img_{i:02d}.png" for i in range(6)]
        assert source.labels.tolist() == [CLASSES.index(COLOURS[i % 3]) for i in range(6)]
    (tmp_path / "quoted.csv").write_text('file,class\n"img_00.png", red \nimg_01.png,"green, light"\n\n'
                                         'img_00.png,red\n')  # quotes, spaces, a blank line, a repeated row
    table = read_label_csv(tmp_path / "quoted.csv", photos)
    assert table.labels == {"img_00.png": "red", "img_01.png": "green, light"}
    (tmp_path / "bom.csv").write_text("\ufeffimg_00.png,red\nimg_01.png,green\n")  # as a spreadsheet saves UTF-8
    assert list(read_label_csv(tmp_path / "bom.csv", photos).labels) == ["img_00.png", "img_01.png"]


@pytest.mark.parametrize("text, message", [
    ("img_00.png,red\nimg_01.png\n", "labels.csv line 2: 'img_01.png' is not a path,label row; give each labelled "
                                     "image as its path (relative to data.root) and its class"),
    ("img_00.png,red\nimg_01.png,green,extra\n", "line 2: 'img_01.png,green,extra' is not a path,label row"),
    ("img_00.png,red\n,green\n", "line 2: ',green' is not a path,label row"),
    ("path,label\nimg_00.png,red\nimg_01.png,green\nimg_00.png,blue\n",
     "lines 2 and 4 give img_00.png two labels (red, blue); keep one row per image"),
    ("img_00.png,red\nimg_03.png,red\n", "labels 2 images of 1 class (red); evaluation needs at least 2 classes"),
    ("path,label\n", "labels 0 images of 0 classes (none)"),
])
def test_a_bad_row_is_named_with_its_line_and_the_fix(photos: Path, tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "labels.csv").write_text(text)
    with pytest.raises(DataError, match="data.labels: ") as err:
        read_label_csv(tmp_path / "labels.csv", photos)
    assert message in str(err.value)


def test_a_missing_or_unreadable_csv_is_named(photos: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=f"data.labels: {tmp_path / 'nope.csv'} does not exist; give the CSV of "
                                        f"path,label rows"):
        read_label_csv(tmp_path / "nope.csv", photos)
    (tmp_path / "latin1.csv").write_bytes("img_00.png,caf\xe9\n".encode("latin-1"))
    with pytest.raises(DataError, match="latin1.csv is not UTF-8 text"):
        read_label_csv(tmp_path / "latin1.csv", photos)
    with pytest.raises(DataError, match="is not a file"):
        read_label_csv(tmp_path, photos)


def test_paths_that_are_not_images_of_the_folder_are_listed(photos: Path, tmp_path: Path) -> None:
    (photos / "notes.txt").write_text("not an image")
    outside = make_photos(tmp_path / "elsewhere", count=1) / "img_00.png"
    rows = ["img_00.png,red", "img_01.png,green", "missing.png,red", "notes.txt,green", f"{outside},blue",
            "../photos/img_02.png,blue"]  # the last is inside the folder after all
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")
    table = read_label_csv(tmp_path / "labels.csv", photos)
    with pytest.raises(DataError) as err:
        labelled_source(table, "train", photos)
    assert f"names 3 path(s) that are not images of {photos}: missing.png (line 3), notes.txt (line 4), " \
           f"../elsewhere/img_00.png (line 5); paths are relative to data.root" in str(err.value)


def test_splits_take_the_labelled_images_of_their_folders(tmp_path: Path) -> None:
    root = tmp_path / "root"
    make_photos(root, count=6)
    make_photos(root / "val", count=3)
    rows = [f"img_{i:02d}.png,{COLOURS[i % 3]}" for i in range(6)] + [f"val/img_{i:02d}.png,{COLOURS[i]}"
                                                                      for i in range(3)]
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")
    csv = str(tmp_path / "labels.csv")
    train = open_images("imagefolder", "train", str(root), labels=csv, eval_splits=("val", "test"))
    val = open_images("imagefolder", "val", str(root), labels=csv, eval_splits=("val", "test"))
    assert len(train) == 6 and [val.name(i) for i in range(len(val))] == [f"val/img_{i:02d}.png" for i in range(3)]
    leaked = open_images("imagefolder", "train", str(root), labels=csv)  # nothing held out: val's rows train too
    assert len(leaked) == 9
    with pytest.raises(DataError, match=r"labels none of the images of the test split .*or set data.eval_split=auto"):
        make_photos(root / "test", count=2)
        open_images("imagefolder", "test", str(root), labels=csv, eval_splits=("val", "test"))

    nested = tmp_path / "nested"  # root/train exists: a labelled image outside train/ and the evaluation folders
    make_photos(nested / "train", count=3)
    make_photos(nested / "other", count=1)
    (tmp_path / "stray.csv").write_text("train/img_00.png,red\ntrain/img_01.png,green\nother/img_00.png,red\n")
    with pytest.raises(DataError, match=r"labels 1 image\(s\) outside the train split's folder .*other/img_00.png"):
        open_images("imagefolder", "train", str(nested), labels=str(tmp_path / "stray.csv"), eval_splits=("val",))


def test_a_csv_on_a_dataset_that_is_not_an_image_folder_is_refused_on_load(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="data.labels=labels.csv labels the images of a folder, but data.dataset is "
                                          "cifar10; set data.dataset=imagefolder"):
        load_config(None, ["data.dataset=cifar10", "data.labels=labels.csv"])
    with pytest.raises(DataError, match="data.labels=x.csv labels the images of a folder; data.dataset is shards"):
        open_images("shards", "train", str(tmp_path), labels="x.csv")
