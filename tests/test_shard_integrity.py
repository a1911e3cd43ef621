"""Shards checked against their index when opened (issue 31, item 5), and `selfsup shard` naming unreadable files by
their source path (item 8), through the CLI."""

from __future__ import annotations

import json
import logging
import os
import re
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from sklearn.datasets import load_digits

from selfsup.cli import main
from tiny import VICREG_8PX, tiny_yaml

CONFIG = tiny_yaml(VICREG_8PX, data={"dataset": "shards", "channels": 1, "stream": False})


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory) -> Path:
    """312 gray 8x8 digits in two class folders, and one file that is not an image."""
    digits = load_digits()
    root = tmp_path_factory.mktemp("images")
    for i in range(312):
        path = root / "train" / str(digits.target[i] % 2) / f"{i:03d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray((digits.images[i] * 255 / 16).astype(np.uint8), mode="L").save(path)
    (root / "train" / "0" / "broken.png").write_bytes(b"not a png")
    return root


@pytest.fixture
def shards(image_folder, tmp_path) -> Path:
    out = tmp_path / "shards"
    with warnings.catch_warnings():  # the unreadable file: test_shard_names_unreadable_files_by_their_source_path
        warnings.simplefilter("ignore")
        assert main(["shard", str(image_folder), str(out), "--max-count", "100"]) == 0
    return out


def cut_after(shard: Path, samples: int, into_next_image: int = 0) -> None:
    """Truncate a shard after its first ``samples`` samples (2 members each), plus ``into_next_image`` bytes."""
    with tarfile.open(shard) as tar:
        members = tar.getmembers()
    os.truncate(shard, members[2 * samples].offset_data + into_next_image if into_next_image
                else members[2 * samples].offset)


def pretrain(tmp_path, shards: Path, *overrides: str) -> int:
    config = tmp_path / "run.yaml"
    config.write_text(CONFIG)
    return main(["pretrain", str(config), f"data.root={shards}", f"trainer.out={tmp_path / 'run'}", *overrides])


def error_lines(capsys) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.startswith("error:")]


def test_the_index_records_counts_and_sizes(shards) -> None:
    index = json.loads((shards / "train" / "index.json").read_text())
    assert [e["nsamples"] for e in index["shardlist"]] == [100, 100, 100, 12]
    assert [e["filesize"] for e in index["shardlist"]] == \
        [(shards / "train" / e["url"]).stat().st_size for e in index["shardlist"]]


@pytest.mark.parametrize("stream", ["false", "true"])
def test_a_shard_cut_at_a_sample_boundary_is_refused_naming_it(shards, tmp_path, capsys, stream) -> None:
    cut_after(shards / "train" / "shard-000001.tar", 50)
    assert pretrain(tmp_path, shards, f"data.stream={stream}") == 2
    [line] = error_lines(capsys)
    assert "shard-000001.tar holds 50 of the 100 samples index.json lists" in line
    assert "allow_incomplete_shards" in line and "262 samples present" in line
    assert not (tmp_path / "run").exists()


def test_a_shard_cut_inside_an_image_loses_that_image_too(shards, tmp_path, capsys) -> None:
    cut_after(shards / "train" / "shard-000002.tar", 70, into_next_image=10)
    assert pretrain(tmp_path, shards) == 2
    [line] = error_lines(capsys)
    assert "shard-000002.tar holds 70 of the 100 samples" in line


def test_a_shard_cut_inside_a_label_loses_that_sample(shards, tmp_path, capsys) -> None:
    with tarfile.open(shards / "train" / "shard-000000.tar") as tar:
        label = tar.getmembers()[2 * 30 + 1]
    os.truncate(shards / "train" / "shard-000000.tar", label.offset_data)  # sample 31's image, not its label
    assert pretrain(tmp_path, shards) == 2
    [line] = error_lines(capsys)
    assert "shard-000000.tar holds 30 of the 100 samples" in line


def test_allow_incomplete_shards_reads_the_rest_with_a_warning(shards, tmp_path, capsys, caplog) -> None:
    cut_after(shards / "train" / "shard-000001.tar", 50)
    with caplog.at_level(logging.WARNING, logger="selfsup"):
        assert pretrain(tmp_path, shards, "data.allow_incomplete_shards=true") == 0
    assert re.search(r"shard-000001.tar holds 50 of the 100 .*reading 262 samples, 50 lost", caplog.text)
    assert error_lines(capsys) == []
    assert json.loads((tmp_path / "run" / "backbone.json").read_text())  # the run went on


def test_an_index_without_file_sizes_still_reads_and_checks_counts(shards, tmp_path, capsys) -> None:
    """Indexes written before filesize existed: read as before; the sample count is still checked."""
    path = shards / "train" / "index.json"
    index = json.loads(path.read_text())
    for entry in index["shardlist"]:
        del entry["filesize"]
    path.write_text(json.dumps(index))
    assert pretrain(tmp_path, shards) == 0
    cut_after(shards / "train" / "shard-000000.tar", 99)
    (tmp_path / "again").mkdir()
    assert pretrain(tmp_path / "again", shards) == 2
    [line] = error_lines(capsys)
    assert "shard-000000.tar holds 99 of the 100 samples" in line


def test_shard_names_unreadable_files_by_their_source_path(image_folder, tmp_path, capsys, caplog) -> None:
    assert main(["shard", str(image_folder), str(tmp_path / "shards")]) == 0
    assert re.search(r"skipped 1 file of 313 in .*train \(not written to the shards\): 0/broken.png: cannot decode",
                     caplog.text)  # a log line (issue 48), no longer a Python warning
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["train"]["skipped"] == 1 and summary["train"]["images"] == 312
    index = json.loads((tmp_path / "shards" / "train" / "index.json").read_text())
    assert index["skipped"] == ["0/broken.png"] and sum(e["nsamples"] for e in index["shardlist"]) == 312
