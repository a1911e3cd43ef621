"""The streaming data path: image folders and tar shards read by loader workers, crops taken at full resolution,
the same per-step batches as the in-memory path, disjoint across ranks, resumable, unreadable files replaced."""

from __future__ import annotations

import io
import json
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from ddp_utils import run_ddp
from selfsup.config import ConfigError, DataConfig
from selfsup.data.datasets import load_dataset, open_images
from selfsup.data.decode import Crop, decode_crops, decode_resized
from selfsup.data.formats.folder import folder_source
from selfsup.data.formats.shards import shard_source, write_shards
from selfsup.data.imagedata import DataError, ImageData
from selfsup.data.sampler import StepSampler
from selfsup.data.stream import CropStream, StepBatches, StreamedSplit, crop_batches, open_split
from selfsup.data.views import CropSpec

SPECS = [CropSpec(size=16, scale=(0.2, 1.0), ratio=(0.75, 4 / 3), hflip_p=0.5, count=2),
         CropSpec(size=8, scale=(0.05, 0.3), ratio=(0.75, 4 / 3), hflip_p=0.5, count=1)]


def photo(seed: int, width: int, height: int) -> np.ndarray:
    """A smooth random image (JPEG-friendly) with detail at every scale."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (height // 16 + 1, width // 16 + 1, 3), dtype=np.uint8)
    big = np.asarray(Image.fromarray(small).resize((width, height), Image.Resampling.BICUBIC))
    return np.clip(big.astype(int) + rng.integers(-20, 21, big.shape), 0, 255).astype(np.uint8)


def make_folder(root: Path, per_class: int = 12, classes: int = 2, ext: str = "jpg") -> Path:
    for c in range(classes):
        for i in range(per_class):
            path = root / f"c{c}" / f"{i:03d}.{ext}"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(photo(100 * c + i, 60 + 7 * i, 48 + 5 * c)).save(path)
    return root


def items(loader) -> list[tuple[list[int], list[torch.Tensor]]]:
    return [(batch.indices.tolist(), batch.crops) for batch in loader]


# ----------------------------------------------------------------------------- decoding


def test_crops_come_from_the_full_resolution_image(tmp_path: Path) -> None:
    pixels = photo(0, 400, 300)
    Image.fromarray(pixels).save(tmp_path / "a.png")  # lossless: the crop can be checked pixel for pixel
    crops = decode_crops(tmp_path / "a.png", "RGB", lambda w, h: [Crop((100.0, 50.0, 32.0, 32.0), 32),
                                                                   Crop((10.0, 20.0, 32.0, 32.0), 32, flip=True)])
    assert (crops[0].shape, crops[1].shape) == ((32, 32, 3), (32, 32, 3))
    assert np.array_equal(crops[0], pixels[50:82, 100:132])  # a 32 px box of a 400 px image, untouched
    assert np.array_equal(crops[1], pixels[20:52, 10:42][:, ::-1])
    # The in-memory path's 32 px image of the same file has lost that detail.
    assert not np.array_equal(decode_resized(tmp_path / "a.png", 32, "RGB"), crops[0])


def test_jpeg_draft_mode_matches_a_full_decode(tmp_path: Path) -> None:
    Image.fromarray(photo(1, 480, 400)).save(tmp_path / "a.jpg", quality=95)
    box = Crop((40.0, 30.0, 320.0, 320.0), 40)  # 8x smaller: decoded at 1/8 scale

    def full(path: Path) -> np.ndarray:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB").resize((40, 40), Image.Resampling.BILINEAR, box=(40, 30, 360, 350)))

    draft = decode_crops(tmp_path / "a.jpg", "RGB", lambda w, h: [box])[0]
    assert np.abs(draft.astype(int) - full(tmp_path / "a.jpg").astype(int)).mean() < 3
    gray = decode_crops(tmp_path / "a.jpg", "L", lambda w, h: [box])[0]
    assert gray.shape == (40, 40, 1)


def test_exif_orientation_is_applied_before_cropping(tmp_path: Path) -> None:
    pixels = photo(2, 64, 32)  # stored 64 wide; EXIF orientation 6 turns it upright to 32 x 64
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(pixels).save(tmp_path / "a.jpg", exif=exif, quality=95)
    sizes = []
    decode_crops(tmp_path / "a.jpg", "RGB", lambda w, h: sizes.append((w, h)) or [Crop((0.0, 0.0, 32.0, 64.0), 8)])
    assert sizes == [(32, 64)]


# ----------------------------------------------------------------------------- formats


def test_shards_hold_the_folder_bytes_labels_and_classes(tmp_path: Path) -> None:
    folder = make_folder(tmp_path / "images")
    (tmp_path / "images" / "val" / "c1").mkdir(parents=True)
    source = folder_source(folder)
    index = write_shards(source, tmp_path / "shards", max_count=5, progress=False)
    assert [s["nsamples"] for s in index["shardlist"]] == [5, 5, 5, 5, 4]
    assert index["__kind__"] == "wids-shard-index-v1" and index["classes"] == ["c0", "c1"]
    shards = shard_source(tmp_path / "shards")
    assert len(shards) == len(source) == 24 and shards.classes == ["c0", "c1"]
    assert shards.labels.tolist() == source.labels.tolist()
    for i in (0, 7, 23):
        assert shards.open(i).read() == Path(source.open(i)).read_bytes()
    # Every shard is a plain tar with WebDataset's <key>.<ext> members.
    with tarfile.open(tmp_path / "shards" / "shard-000000.tar") as tar:
        assert tar.getnames()[:4] == ["00000000.jpg", "00000000.cls", "00000001.jpg", "00000001.cls"]
    # Without the offset cache (or with a stale one) the headers are scanned: same index.
    (tmp_path / "shards" / "index.npz").unlink()
    rescanned = shard_source(tmp_path / "shards")
    assert rescanned.labels.tolist() == shards.labels.tolist() and rescanned.name(6) == shards.name(6)


def test_shards_written_by_another_tool_are_scanned(tmp_path: Path) -> None:
    folder = tmp_path / "foreign"
    folder.mkdir()
    with tarfile.open(folder / "part-0.tar", "w") as tar:
        for key, label in (("a/x1", 3), ("a/x2", 1)):
            buf = io.BytesIO()
            Image.fromarray(photo(len(key) + label, 20, 20)).save(buf, format="PNG")
            for name, data in ((f"{key}.png", buf.getvalue()), (f"{key}.cls", str(label).encode()),
                               (f"{key}.json", b"{}")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    source = shard_source(folder)
    assert len(source) == 2 and source.labels.tolist() == [3, 1] and source.classes == ["0", "1", "2", "3"]
    assert source.name(1) == "part-0.tar:a/x2.png"


def test_shards_load_into_memory_like_the_folder(tmp_path: Path) -> None:
    make_folder(tmp_path / "images" / "train")
    make_folder(tmp_path / "images" / "val", per_class=3)
    from selfsup.cli import main

    assert main(["shard", str(tmp_path / "images"), str(tmp_path / "shards"), "--max-count", "7"]) == 0
    for split in ("train", "val"):
        a = load_dataset("imagefolder", split, root=str(tmp_path / "images"), image_size=16, progress=False)
        b = load_dataset("shards", split, root=str(tmp_path / "shards"), image_size=16, progress=False)
        assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels) and a.classes == b.classes
    assert json.loads((tmp_path / "shards" / "val" / "index.json").read_text())["classes"] == ["c0", "c1"]


def test_missing_shards_and_folders_name_the_fix(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="selfsup shard"):
        open_images("shards", "train", str(tmp_path / "empty"))
    write_shards(folder_source(make_folder(tmp_path / "images")), tmp_path / "s", progress=False)
    (tmp_path / "s" / "shard-000000.tar").unlink()
    with pytest.raises(DataError, match="missing"):
        open_images("shards", "train", str(tmp_path / "s"))


# ----------------------------------------------------------------------------- choosing the path


def test_open_split_chooses_memory_or_streaming(tmp_path: Path, caplog) -> None:
    make_folder(tmp_path)
    caplog.set_level("INFO", logger="selfsup")
    small = open_split(DataConfig(dataset="imagefolder", root=str(tmp_path), image_size=16), "train", progress=False)
    assert isinstance(small, ImageData) and "in memory" in caplog.text
    streamed = open_split(DataConfig(dataset="imagefolder", root=str(tmp_path), image_size=16, stream=True,
                                     num_workers=0), "train")
    assert isinstance(streamed, StreamedSplit) and "streaming imagefolder/train (24 images)" in caplog.text
    half = open_split(DataConfig(dataset="imagefolder", root=str(tmp_path), image_size=16, stream=True), "train",
                      fraction=0.5)
    assert len(half) == 12 and half.labels.shape == (12,)
    with pytest.raises(ConfigError, match="data.image_size"):
        open_split(DataConfig(dataset="imagefolder", root=str(tmp_path), stream=True), "train")
    with pytest.raises(ConfigError, match="not a dataset of image files"):
        open_split(DataConfig(dataset="digits", stream=True), "train")


def test_auto_streams_above_the_memory_threshold(tmp_path: Path, monkeypatch) -> None:
    import selfsup.data.stream as stream

    make_folder(tmp_path)
    monkeypatch.setattr(stream, "STREAM_ABOVE_BYTES", 24 * 3 * 16 * 16 - 1)
    assert isinstance(open_split(DataConfig(dataset="imagefolder", root=str(tmp_path), image_size=16), "train"),
                      StreamedSplit)


# ----------------------------------------------------------------------------- batches


def test_crops_depend_on_the_step_and_position_not_on_the_workers(tmp_path: Path) -> None:
    source = folder_source(make_folder(tmp_path))
    sampler = StepSampler(len(source), 8, seed=3)
    in_process = items(crop_batches(source, sampler, SPECS, 3, seed=5, start=0, stop=4, workers=0))
    in_workers = items(crop_batches(source, sampler, SPECS, 3, seed=5, start=0, stop=4, workers=2))
    assert [i for i, _ in in_process] == [sampler.indices(s).tolist() for s in range(4)]
    for (ia, ca), (ib, cb) in zip(in_process, in_workers):
        assert ia == ib and all(torch.equal(a, b) for a, b in zip(ca, cb))
    shapes = [tuple(c.shape) for c in in_process[0][1]]
    assert shapes == [(8, 3, 16, 16), (8, 3, 16, 16), (8, 3, 8, 8)]
    assert not torch.equal(in_process[0][1][0], in_process[0][1][1])  # two independent crops per image
    # Another seed gives other crops of the same images.
    other = items(crop_batches(source, sampler, SPECS, 3, seed=6, start=0, stop=1, workers=0))
    assert other[0][0] == in_process[0][0] and not torch.equal(other[0][1][0], in_process[0][1][0])


def test_a_resumed_stream_equals_the_uninterrupted_one(tmp_path: Path) -> None:
    source = folder_source(make_folder(tmp_path))
    sampler = StepSampler(len(source), 8, seed=1)  # 3 steps per epoch: the run crosses epochs
    whole = items(crop_batches(source, sampler, SPECS, 3, seed=0, start=0, stop=7, workers=2))
    resumed = items(crop_batches(source, sampler, SPECS, 3, seed=0, start=4, stop=7, workers=2))
    assert [i for i, _ in resumed] == [i for i, _ in whole[4:]]
    assert all(torch.equal(a, b) for (_, ca), (_, cb) in zip(resumed, whole[4:]) for a, b in zip(ca, cb))


def test_ranks_read_disjoint_slices_of_each_global_batch(tmp_path: Path) -> None:
    sampler0, sampler1 = (StepSampler(24, 8, seed=2, rank=r, world_size=2) for r in (0, 1))
    positions = [[pos for _, pos, _ in batch] for batch in StepBatches(sampler1, 0, 1)]
    assert positions == [[4, 5, 6, 7]]
    epoch = [idx for s in (sampler0, sampler1) for batch in StepBatches(s, 0, 3) for _, _, idx in batch]
    assert sorted(epoch) == list(range(24))


def _epoch_on_rank(rank: int, world_size: int, root: str) -> list[int]:
    source = folder_source(Path(root))
    sampler = StepSampler(len(source), 8, seed=4, rank=rank, world_size=world_size)
    loader = crop_batches(source, sampler, SPECS[:1], 3, seed=0, start=0, stop=sampler.steps_per_epoch, workers=2)
    return [i for batch in loader for i in batch.indices.tolist()]


@pytest.mark.multiprocess
def test_two_gloo_processes_cover_every_image_of_an_epoch_once(tmp_path: Path) -> None:
    root = make_folder(tmp_path)
    read = run_ddp(_epoch_on_rank, 2, str(root))
    assert len(read[0]) == len(read[1]) == 12
    assert sorted(read[0] + read[1]) == list(range(24))


def test_unreadable_images_are_replaced_and_counted(tmp_path: Path) -> None:
    root = make_folder(tmp_path, per_class=6)
    (root / "c0" / "003.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    (root / "c1" / "001.jpg").write_bytes(Path(root / "c1" / "002.jpg").read_bytes()[:200])  # truncated
    source = folder_source(root)
    sampler = StepSampler(len(source), 12, seed=0)
    batches = list(crop_batches(source, sampler, SPECS, 3, seed=0, start=0, stop=3, workers=2))
    names = [n.split(" ")[0] for b in batches for n in b.unreadable]
    assert sorted(set(names)) == ["c0/003.jpg", "c1/001.jpg"]
    assert len(names) >= 6  # each is drawn once per epoch (a replacement may draw one again)
    assert all(b.crops[0].shape == (12, 3, 16, 16) for b in batches)  # full batches all the same


def test_a_truncated_shard_is_replaced_too(tmp_path: Path) -> None:
    write_shards(folder_source(make_folder(tmp_path / "images", per_class=4)), tmp_path / "s", max_count=4,
                 progress=False)
    source = shard_source(tmp_path / "s")
    last = tmp_path / "s" / "shard-000001.tar"
    last.write_bytes(last.read_bytes()[:1000])  # cut inside its first image
    stream = CropStream(source, SPECS, 3, seed=0)
    index, crops, unreadable = stream[(0, 0, 4)]
    assert len(unreadable) >= 1 and unreadable[0].startswith("shard-000001.tar:00000004.jpg")
    assert index != 4 and crops[0].shape == (16, 16, 3)


UNIDENTIFIED = "cannot decode (UnidentifiedImageError: cannot identify image file)"


def test_streamed_split_reads_whole_images_in_order_and_leaves_out_unreadable_ones(tmp_path: Path, caplog) -> None:
    root = make_folder(tmp_path, per_class=3)
    (root / "c1" / "000.jpg").write_bytes(b"broken")
    split = StreamedSplit(folder_source(root), 16, 1, workers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reported in the log, never as a Python warning
        rows = torch.cat([r for _, r in split.batches(4)])
        assert rows.tolist() == [0, 1, 2, 4, 5] and split.readable.tolist() == [True] * 3 + [False] + [True] * 2
        assert [m for m in caplog.messages if "skipped" in m] == [
            f"skipped 1 file in {root}: c1/000.jpg: {UNIDENTIFIED}"]
        assert split.skipped == [("c1/000.jpg", UNIDENTIFIED)]
        list(split.batches(4))  # a second pass (the kNN monitor's next round) logs nothing new
        assert len([m for m in caplog.messages if "skipped" in m]) == 1
        memory = load_dataset("imagefolder", root=str(root), image_size=16, channels=1, progress=False)
        images, kept = split.pixels(torch.tensor([4, 3, 0]))
    assert kept.tolist() == [4, 0] and torch.equal(images, memory.images[[3, 0]])
