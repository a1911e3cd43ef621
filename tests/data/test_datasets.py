"""Tests for selfsup.data.datasets, on tiny files written in the real on-disk formats."""

from __future__ import annotations

import gzip
import os
import pickle
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from selfsup.data import datasets as ds
from selfsup.data.datasets import DATASETS, DataError, ImageData, default_root, load_dataset
from selfsup.data.formats.folder import all_images
from selfsup.data.stream import StreamedSplit
from selfsup.data.imagedata import convert_channels, resize_images

FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")


# ----------------------------------------------------------------------------- writers


def write_idx(path: Path, array: np.ndarray, magic: int, gz: bool) -> None:
    """Write a uint8 array in IDX format (big-endian magic and dims)."""
    payload = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape)
    payload += array.astype(np.uint8).tobytes()
    if gz:
        with gzip.open(str(path) + ".gz", "wb") as f:
            f.write(payload)
    else:
        path.write_bytes(payload)


def make_idx_dir(root: Path, n_train: int = 6, n_test: int = 4, gz: bool = True) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        write_idx(root / f"{prefix}-images-idx3-ubyte", images, 2051, gz)
        write_idx(root / f"{prefix}-labels-idx1-ubyte", labels, 2049, gz)
        out[prefix] = images
        out[prefix + "_labels"] = labels
    return out


def cifar_rows(n: int, offset: int) -> np.ndarray:
    """(n, 3072) uint8 rows, row-major CHW, with pixel (c, y, x) of image i = (offset+i+c+y+x) % 256."""
    c, y, x = np.meshgrid(np.arange(3), np.arange(32), np.arange(32), indexing="ij")
    imgs = np.stack([(offset + i + c + y + x) % 256 for i in range(n)]).astype(np.uint8)
    return imgs.reshape(n, 3072)


def make_cifar10(root: Path, per_batch: int = 2) -> Path:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for b in range(1, 6):
        batch = {
            b"batch_label": f"training batch {b} of 5".encode(),
            b"labels": [(b + i) % 10 for i in range(per_batch)],
            b"data": cifar_rows(per_batch, offset=10 * b),
            b"filenames": [f"img_{b}_{i}.png".encode() for i in range(per_batch)],
        }
        # The real files are Python-2 pickles (protocol 2) written by numpy 1.x, whose arrays
        # reference numpy.core.multiarray._reconstruct.
        raw = pickle.dumps(batch, protocol=2).replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n")
        assert b"numpy.core.multiarray\n_reconstruct" in raw
        (folder / f"data_batch_{b}").write_bytes(raw)
    test = {b"labels": [3, 4, 5], b"data": cifar_rows(3, offset=100), b"batch_label": b"testing batch 1 of 1"}
    (folder / "test_batch").write_bytes(pickle.dumps(test, protocol=2))
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]
    meta = {b"num_cases_per_batch": per_batch, b"label_names": names, b"num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return folder


def make_cifar100(root: Path) -> Path:
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    for split, n, off in (("train", 4, 0), ("test", 2, 50)):
        obj = {
            b"fine_labels": [99 - i for i in range(n)],
            b"coarse_labels": [i for i in range(n)],
            b"data": cifar_rows(n, offset=off),
            b"filenames": [b"x.png"] * n,
        }
        (folder / split).write_bytes(pickle.dumps(obj))
    meta = {b"fine_label_names": [f"fine{i}".encode() for i in range(100)],
            b"coarse_label_names": [f"coarse{i}".encode() for i in range(20)]}
    (folder / "meta").write_bytes(pickle.dumps(meta))
    return folder


def stl_images(n: int, seed: int) -> np.ndarray:
    """Random (n, 3, 96, 96) images in (c, y, x) order."""
    return np.random.default_rng(seed).integers(0, 256, size=(n, 3, 96, 96), dtype=np.uint8)


def write_stl(path: Path, images: np.ndarray) -> None:
    """STL-10 binary: each channel stored column-major, i.e. x outer, y inner."""
    path.write_bytes(np.ascontiguousarray(images.transpose(0, 1, 3, 2)).tobytes())


def make_stl10(root: Path) -> dict[str, np.ndarray]:
    folder = root / "stl10_binary"
    folder.mkdir(parents=True)
    data = {"train": stl_images(4, 1), "test": stl_images(3, 2), "unlabeled": stl_images(6, 3)}
    for split, imgs in data.items():
        write_stl(folder / f"{split}_X.bin", imgs)
    (folder / "train_y.bin").write_bytes(bytes([1, 10, 3, 3]))
    (folder / "test_y.bin").write_bytes(bytes([2, 2, 9]))
    names = ["airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck"]
    (folder / "class_names.txt").write_text("\n".join(names) + "\n")
    return data


def save_image(path: Path, array: np.ndarray, **kwargs: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path, **kwargs)


def solid(h: int, w: int, color: tuple[int, int, int]) -> np.ndarray:
    return np.broadcast_to(np.array(color, dtype=np.uint8), (h, w, 3)).copy()


# ----------------------------------------------------------------------------- generic


def test_unknown_name_lists_allowed_names() -> None:
    assert DATASETS == ("fashion_mnist", "mnist", "cifar10", "cifar100", "stl10", "imagefolder", "shards",
                        "tensors", "digits")
    with pytest.raises(ValueError, match="unknown dataset 'imagenet'.*fashion_mnist.*digits"):
        load_dataset("imagenet")
    with pytest.raises(ValueError, match="unknown dataset"):
        default_root("imagenet")


@pytest.mark.parametrize("fraction", [0.0, -0.5, 1.5])
def test_bad_fraction(fraction: float) -> None:
    with pytest.raises(ValueError, match=r"fraction must be in \(0, 1\]"):
        load_dataset("digits", fraction=fraction)


def test_bad_split_channels_and_size() -> None:
    with pytest.raises(ValueError, match="unknown split 'val' for digits.*'train', 'test'"):
        load_dataset("digits", split="val")
    with pytest.raises(ValueError, match="channels must be 1, 3"):
        load_dataset("digits", channels=2)
    with pytest.raises(ValueError, match="image_size must be a positive int"):
        load_dataset("digits", image_size=0)


def test_digits_splits_and_scaling() -> None:
    from sklearn.datasets import load_digits

    train, test = load_dataset("digits"), load_dataset("digits", "test")
    assert train.images.shape == (1500, 1, 8, 8) and test.images.shape == (297, 1, 8, 8)
    assert train.images.dtype == torch.uint8 and train.labels.dtype == torch.int64
    ref = load_digits()
    expected = np.rint(ref.images[1500] * 255 / 16).astype(np.uint8)
    assert np.array_equal(test.images[0, 0].numpy(), expected)
    assert int(train.images.max()) == 255
    assert test.labels.tolist() == ref.target[1500:].tolist()
    assert train.classes == [str(i) for i in range(10)]
    assert train.skipped == []


def test_fraction_is_seeded_sorted_subset() -> None:
    full = load_dataset("digits")
    a = load_dataset("digits", fraction=0.1, seed=3)
    b = load_dataset("digits", fraction=0.1, seed=3)
    c = load_dataset("digits", fraction=0.1, seed=4)
    assert len(a) == 150
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.images, c.images)
    idx = torch.randperm(1500, generator=torch.Generator().manual_seed(3))[:150].sort().values
    assert torch.equal(a.images, full.images[idx]) and torch.equal(a.labels, full.labels[idx])
    assert len(load_dataset("digits", fraction=1e-6)) == 1  # never empty


def test_resize_and_channel_conversion() -> None:
    full = load_dataset("digits", "test")
    big = load_dataset("digits", "test", image_size=16, channels=3)
    assert big.images.shape == (297, 3, 16, 16) and big.images.is_contiguous()
    assert torch.equal(big.images[:, 0], big.images[:, 1]) and torch.equal(big.images[:, 0], big.images[:, 2])
    ref = torch.nn.functional.interpolate(full.images.float(), size=(16, 16), mode="bilinear",
                                          antialias=True, align_corners=False)
    assert torch.equal(big.images[:, :1], ref.round().clamp(0, 255).to(torch.uint8))
    # A constant image stays constant; RGB -> gray uses luminance weights.
    red = torch.zeros(2, 3, 10, 10, dtype=torch.uint8)
    red[:, 0] = 255
    gray = convert_channels(red, 1)
    assert gray.shape == (2, 1, 10, 10) and int(gray.unique()) == round(0.299 * 255)
    assert int(resize_images(red, 4)[:, 0].unique()) == 255


def test_resize_non_square_center_crops() -> None:
    img = torch.zeros(1, 1, 10, 20, dtype=torch.uint8)
    img[..., 10:] = 200  # left half 0, right half 200
    out = resize_images(img, 10)
    assert out.shape == (1, 1, 10, 10)
    assert out[0, 0, :, :5].eq(0).all() and out[0, 0, :, 5:].eq(200).all()


def test_imagedata_subset_and_validation() -> None:
    images = torch.arange(4 * 3 * 2 * 2, dtype=torch.uint8).view(4, 3, 2, 2)
    data = ImageData(images, torch.tensor([0, 1, 2, 3]), ["a", "b", "c", "d"],
                     [("bad.jpg", "empty file (0 bytes)")])
    sub = data.subset([3, 1])
    assert len(sub) == 2 and sub.labels.tolist() == [3, 1]
    assert torch.equal(sub.images[0], images[3]) and sub.classes == data.classes
    assert sub.skipped == [("bad.jpg", "empty file (0 bytes)")]
    assert data.subset(torch.tensor([True, False, False, True])).labels.tolist() == [0, 3]
    assert ImageData(images, None, None, []).subset([0]).labels is None
    with pytest.raises(ValueError, match="uint8"):
        ImageData(images.float(), None, None, [])
    with pytest.raises(ValueError, match="1 or 3 channels"):
        ImageData(torch.zeros(2, 2, 4, 4, dtype=torch.uint8), None, None, [])
    with pytest.raises(ValueError, match="labels must be int64"):
        ImageData(images, torch.tensor([0, 1]), None, [])


# ----------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("gz", [True, False])
def test_idx_gz_and_plain(tmp_path: Path, gz: bool) -> None:
    ref = make_idx_dir(tmp_path, gz=gz)
    train = load_dataset("fashion_mnist", "train", root=str(tmp_path))
    test = load_dataset("fashion_mnist", "test", root=str(tmp_path))
    assert train.images.shape == (6, 1, 28, 28) and test.images.shape == (4, 1, 28, 28)
    assert np.array_equal(train.images[:, 0].numpy(), ref["train"])
    assert np.array_equal(test.images[:, 0].numpy(), ref["t10k"])
    assert train.labels.tolist() == [0, 1, 2, 3, 4, 5]
    assert train.classes[0] == "T-shirt/top" and train.classes[9] == "Ankle boot"
    mnist = load_dataset("mnist", "test", root=str(tmp_path))
    assert mnist.classes == [str(i) for i in range(10)]
    assert torch.equal(mnist.images, test.images)


def test_idx_missing_file_message(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte.*apt-get install dataset-fashion-mnist"):
        load_dataset("fashion_mnist", root=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="t10k-images-idx3-ubyte.*data.root"):
        load_dataset("mnist", "test", root=str(tmp_path))


def test_idx_bad_magic_truncated_and_mismatch(tmp_path: Path) -> None:
    make_idx_dir(tmp_path, gz=False)
    images_path = tmp_path / "train-images-idx3-ubyte"
    raw = images_path.read_bytes()
    images_path.write_bytes(struct.pack(">I", 2049) + raw[4:])
    with pytest.raises(ValueError, match="train-images-idx3-ubyte: bad IDX magic number 2049"):
        load_dataset("fashion_mnist", root=str(tmp_path))
    images_path.write_bytes(raw[:-5])
    with pytest.raises(ValueError, match="train-images-idx3-ubyte.*truncated"):
        load_dataset("fashion_mnist", root=str(tmp_path))
    images_path.write_bytes(raw)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(5, np.uint8), 2049, gz=False)
    with pytest.raises(ValueError, match="6 images but .* 5 labels"):
        load_dataset("fashion_mnist", root=str(tmp_path))


def test_idx_truncated_gzip(tmp_path: Path) -> None:
    make_idx_dir(tmp_path, gz=True)
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError, match="t10k-images-idx3-ubyte.gz"):
        load_dataset("fashion_mnist", "test", root=str(tmp_path))


def test_selfsup_data_env_and_default_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SELFSUP_DATA", raising=False)
    assert default_root("mnist") is None
    assert default_root("digits") is None
    with pytest.raises(FileNotFoundError, match="no data location for mnist.*root=DIR"):
        load_dataset("mnist")
    (tmp_path / "mnist").mkdir()
    ref = make_idx_dir(tmp_path / "mnist")
    monkeypatch.setenv("SELFSUP_DATA", str(tmp_path))
    assert default_root("mnist") == str(tmp_path / "mnist")
    assert np.array_equal(load_dataset("mnist", "test").images[:, 0].numpy(), ref["t10k"])
    # A missing system path falls back to $SELFSUP_DATA/<name>.
    monkeypatch.setitem(ds._SYSTEM_ROOTS, "fashion_mnist", str(tmp_path / "nowhere"))
    assert default_root("fashion_mnist") == str(tmp_path / "fashion_mnist")
    monkeypatch.delenv("SELFSUP_DATA")
    assert default_root("fashion_mnist") == str(tmp_path / "nowhere")


@pytest.mark.skipif(not FMNIST_DIR.is_dir(), reason="dataset-fashion-mnist not installed")
def test_real_fashion_mnist_test_split() -> None:
    assert default_root("fashion_mnist") == str(FMNIST_DIR)
    data = load_dataset("fashion_mnist", "test", progress=False)
    assert data.images.shape == (10000, 1, 28, 28) and data.images.dtype == torch.uint8
    assert data.labels.min() == 0 and data.labels.max() == 9
    assert data.labels.bincount().tolist() == [1000] * 10
    assert 60 < data.images.float().mean() < 90  # mean pixel of Fashion-MNIST is ~73


# ----------------------------------------------------------------------------- CIFAR


@pytest.mark.parametrize("point_at_folder", [False, True])
def test_cifar10_pickles(tmp_path: Path, point_at_folder: bool) -> None:
    folder = make_cifar10(tmp_path)
    root = folder if point_at_folder else tmp_path
    train = load_dataset("cifar10", "train", root=str(root))
    assert train.images.shape == (10, 3, 32, 32)
    assert train.labels.tolist() == [1, 2, 2, 3, 3, 4, 4, 5, 5, 6]
    assert train.classes[0] == "airplane" and train.classes[9] == "truck"
    # image 1 of batch 3 has offset 30 + 1: pixel (c, y, x) = (31 + c + y + x) % 256
    assert int(train.images[5, 2, 7, 20]) == (31 + 2 + 7 + 20) % 256
    assert int(train.images[5, 0, 31, 1]) == (31 + 0 + 31 + 1) % 256
    test = load_dataset("cifar10", "test", root=str(root))
    assert test.labels.tolist() == [3, 4, 5]
    assert np.array_equal(test.images.numpy().reshape(3, 3072), cifar_rows(3, 100))


def test_cifar100_pickles(tmp_path: Path) -> None:
    make_cifar100(tmp_path)
    train = load_dataset("cifar100", "train", root=str(tmp_path))
    assert train.images.shape == (4, 3, 32, 32)
    assert train.labels.tolist() == [99, 98, 97, 96]
    assert len(train.classes) == 100 and train.classes[99] == "fine99"
    test = load_dataset("cifar100", "test", root=str(tmp_path), image_size=16, fraction=0.5)
    assert test.images.shape == (1, 3, 16, 16)


def test_cifar_missing_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="cifar-10-python.tar.gz.*cifar-10-batches-py"):
        load_dataset("cifar10", root=str(tmp_path))
    folder = make_cifar10(tmp_path)
    (folder / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_3"):
        load_dataset("cifar10", root=str(tmp_path))


def test_cifar_pickle_cannot_run_code(tmp_path: Path) -> None:
    folder = make_cifar10(tmp_path)

    class Evil:
        def __reduce__(self) -> tuple:
            return (os.system, ("echo pwned",))

    (folder / "test_batch").write_bytes(pickle.dumps({b"data": Evil(), b"labels": []}))
    with pytest.raises(ValueError, match="test_batch: not a valid CIFAR python pickle.*not allowed"):
        load_dataset("cifar10", "test", root=str(tmp_path))
    (folder / "test_batch").write_bytes(b"\x80\x02garbage")
    with pytest.raises(ValueError, match="test_batch"):
        load_dataset("cifar10", "test", root=str(tmp_path))


# ----------------------------------------------------------------------------- STL-10


def test_stl10_column_major_layout(tmp_path: Path) -> None:
    ref = make_stl10(tmp_path)
    train = load_dataset("stl10", "train", root=str(tmp_path))
    assert train.images.shape == (4, 3, 96, 96) and train.images.is_contiguous()
    assert np.array_equal(train.images.numpy(), ref["train"])
    assert train.labels.tolist() == [0, 9, 2, 2]
    assert train.classes[7] == "monkey"
    # Byte at offset n*27648 + c*9216 + x*96 + y is pixel (c, y, x): check one by hand.
    raw = (tmp_path / "stl10_binary" / "train_X.bin").read_bytes()
    n, c, y, x = 2, 1, 5, 70
    assert int(train.images[n, c, y, x]) == raw[n * 27648 + c * 9216 + x * 96 + y]
    test = load_dataset("stl10", "test", root=str(tmp_path / "stl10_binary"))
    assert test.labels.tolist() == [1, 1, 8]


def test_stl10_unlabeled_splits_and_fraction(tmp_path: Path) -> None:
    ref = make_stl10(tmp_path)
    unl = load_dataset("stl10", "unlabeled", root=str(tmp_path))
    assert unl.labels is None and np.array_equal(unl.images.numpy(), ref["unlabeled"])
    both = load_dataset("stl10", "train+unlabeled", root=str(tmp_path))
    assert both.labels is None and len(both) == 10
    assert np.array_equal(both.images.numpy(), np.concatenate([ref["train"], ref["unlabeled"]]))
    part = load_dataset("stl10", "train+unlabeled", root=str(tmp_path), fraction=0.5, seed=1)
    idx = torch.randperm(10, generator=torch.Generator().manual_seed(1))[:5].sort().values
    assert torch.equal(part.images, both.images[idx])
    small = load_dataset("stl10", "train", root=str(tmp_path), fraction=0.5, seed=2, image_size=32)
    assert small.images.shape == (2, 3, 32, 32) and len(small.labels) == 2


def test_stl10_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="stl10_binary.tar.gz"):
        load_dataset("stl10", root=str(tmp_path))
    make_stl10(tmp_path)
    folder = tmp_path / "stl10_binary"
    (folder / "test_y.bin").write_bytes(bytes([0, 2, 9]))
    with pytest.raises(ValueError, match="test_y.bin: labels must be 1..10"):
        load_dataset("stl10", "test", root=str(tmp_path))
    (folder / "train_X.bin").write_bytes((folder / "train_X.bin").read_bytes()[:-10])
    with pytest.raises(ValueError, match="train_X.bin: size .* truncated"):
        load_dataset("stl10", "train", root=str(tmp_path))
    with pytest.raises(ValueError, match="unknown split 'val' for stl10"):
        load_dataset("stl10", "val", root=str(tmp_path))


# ----------------------------------------------------------------------------- image folders


def make_class_folder(root: Path) -> None:
    save_image(root / "cat" / "a.png", solid(20, 30, (255, 0, 0)))
    save_image(root / "cat" / "b.JPG", solid(40, 40, (0, 0, 255)), quality=95)
    save_image(root / "dog" / "sub" / "c.webp", solid(16, 24, (0, 255, 0)), quality=100)
    save_image(root / "dog" / "d.png", np.full((30, 20), 128, np.uint8))  # grayscale
    save_image(root / "dog" / "e.bmp", solid(12, 12, (10, 20, 30)))
    (root / "dog" / "notes.txt").write_text("not an image")
    (root / "empty").mkdir()


def test_imagefolder_with_classes(tmp_path: Path) -> None:
    make_class_folder(tmp_path)
    data = load_dataset("imagefolder", root=str(tmp_path), image_size=8, progress=False)
    assert data.images.shape == (5, 3, 8, 8) and data.images.dtype == torch.uint8
    assert data.classes == ["cat", "dog"]
    assert data.labels.tolist() == [0, 0, 1, 1, 1]  # cat/a, cat/b, dog/d, dog/e, dog/sub/c
    assert data.images[0].reshape(3, -1).float().mean(1).tolist() == [255.0, 0.0, 0.0]
    blue = data.images[1].reshape(3, -1).float().mean(1)
    assert blue[2] > 245 and blue[0] < 10 and blue[1] < 10
    assert data.images[2].eq(128).all()  # gray PNG repeated to RGB
    assert data.images[3].reshape(3, -1).float().mean(1).tolist() == [10.0, 20.0, 30.0]
    green = data.images[4].reshape(3, -1).float().mean(1)
    assert green[1] > 245 and green[0] < 10 and green[2] < 10
    assert data.skipped == [(str(tmp_path / "dog" / "notes.txt"), "not an image file (extension .txt)")]
    gray = load_dataset("imagefolder", root=str(tmp_path), image_size=8, channels=1, progress=True)
    assert gray.images.shape == (5, 1, 8, 8)
    assert int(gray.images[0].float().mean()) == round(0.299 * 255)


def test_imagefolder_flat_without_labels_and_native_size(tmp_path: Path) -> None:
    save_image(tmp_path / "x.png", solid(6, 10, (1, 2, 3)))
    save_image(tmp_path / "y.PNG", solid(6, 10, (4, 5, 6)))
    data = load_dataset("imagefolder", root=str(tmp_path), progress=False)
    assert data.labels is None and data.classes is None
    assert data.images.shape == (2, 3, 6, 10)
    assert data.images[1, :, 0, 0].tolist() == [4, 5, 6]


def test_imagefolder_center_crop(tmp_path: Path) -> None:
    img = np.zeros((10, 20, 3), np.uint8)
    img[:, 10:] = 200
    save_image(tmp_path / "wide.png", img)
    data = load_dataset("imagefolder", root=str(tmp_path), image_size=10, progress=False)
    assert data.images.shape == (1, 3, 10, 10)
    assert data.images[0, :, :, :5].eq(0).all() and data.images[0, :, :, 5:].eq(200).all()


def test_imagefolder_skips_unreadable_and_logs_them_once(tmp_path: Path, caplog) -> None:
    for i in range(4):
        save_image(tmp_path / f"ok{i}.png", solid(8, 8, (i, i, i)))
    (tmp_path / "broken.jpg").write_bytes(np.random.default_rng(0).integers(0, 256, 500, dtype=np.uint8).tobytes())
    save_image(tmp_path / "big.png", np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8))
    (tmp_path / "cut.png").write_bytes((tmp_path / "big.png").read_bytes()[:600])
    (tmp_path / "big.png").unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a log line, not a Python warning
        data = load_dataset("imagefolder", root=str(tmp_path), progress=False)
    assert caplog.messages == [
        f"skipped 2 files of 6 in {tmp_path}: broken.jpg: cannot decode (UnidentifiedImageError: cannot identify "
        f"image file); cut.png: cannot decode (OSError: image file is truncated)"]
    assert sorted(Path(p).name for p, _ in data.skipped) == ["broken.jpg", "cut.png"]
    assert len(data) == 4 and data.images[:, 0, 0, 0].tolist() == [0, 1, 2, 3]


def test_imagefolder_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs root"):
        load_dataset("imagefolder")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_dataset("imagefolder", root=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="no images"):
        load_dataset("imagefolder", root=str(tmp_path), progress=False)
    save_image(tmp_path / "a.png", solid(8, 8, (0, 0, 0)))
    save_image(tmp_path / "b.png", solid(8, 12, (0, 0, 0)))
    with pytest.raises(ValueError, match="different sizes.*image_size=N"):
        load_dataset("imagefolder", root=str(tmp_path), progress=False)
    save_image(tmp_path / "cls" / "c.png", solid(8, 8, (0, 0, 0)))
    with pytest.raises(ValueError, match="both images .* and class folders"):
        load_dataset("imagefolder", root=str(tmp_path), progress=False)
    (tmp_path / "only_bad").mkdir()
    (tmp_path / "only_bad" / "x.jpg").write_bytes(b"nope")
    with pytest.raises(ValueError, match="none of the 1 images"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        load_dataset("imagefolder", root=str(tmp_path / "only_bad"), progress=False)


def test_imagefolder_split_subfolders_and_fraction(tmp_path: Path) -> None:
    for split, n in (("train", 6), ("test", 2)):
        for i in range(n):
            save_image(tmp_path / split / f"c{i % 2}" / f"{i}.png", solid(8, 8, (i, 0, 0)))
    train = load_dataset("imagefolder", "train", root=str(tmp_path), progress=False)
    test = load_dataset("imagefolder", "test", root=str(tmp_path), progress=False)
    assert len(train) == 6 and len(test) == 2 and test.classes == ["c0", "c1"]
    part = load_dataset("imagefolder", "train", root=str(tmp_path), fraction=0.5, seed=5, progress=False)
    idx = torch.randperm(6, generator=torch.Generator().manual_seed(5))[:3].sort().values
    assert torch.equal(part.images, train.images[idx]) and torch.equal(part.labels, train.labels[idx])
    with pytest.raises(FileNotFoundError, match="expected a folder .*val"):
        load_dataset("imagefolder", "val", root=str(tmp_path / "train"), progress=False)


# ----------------------------------------------------------------------------- tensors


def test_tensors_pt_and_npz(tmp_path: Path) -> None:
    images = torch.randint(0, 256, (5, 3, 4, 4), dtype=torch.uint8)
    torch.save({"images": images, "labels": torch.tensor([0, 1, 2, 1, 0]), "classes": ["a", "b", "c"]},
               tmp_path / "train.pt")
    data = load_dataset("tensors", root=str(tmp_path / "train.pt"))
    assert torch.equal(data.images, images) and data.labels.tolist() == [0, 1, 2, 1, 0]
    assert data.classes == ["a", "b", "c"]
    gray = np.arange(2 * 6 * 6, dtype=np.float32).reshape(2, 6, 6) / (2 * 6 * 6 - 1)
    np.savez(tmp_path / "test.npz", images=gray, labels=np.array([1, 0], np.int32))
    data = load_dataset("tensors", "test", root=str(tmp_path), image_size=3, channels=3)
    assert data.images.shape == (2, 3, 3, 3) and data.labels.dtype == torch.int64
    raw = load_dataset("tensors", "test", root=str(tmp_path))
    assert raw.images.shape == (2, 1, 6, 6)
    assert int(raw.images[0, 0, 0, 0]) == 0 and int(raw.images[1, 0, 5, 5]) == 255
    assert int(raw.images[0, 0, 1, 0]) == round(6 / 71 * 255)
    assert raw.labels.tolist() == [1, 0] and raw.classes is None
    # Directory form: root/<split>.pt
    assert torch.equal(load_dataset("tensors", "train", root=str(tmp_path)).images, images)
    unlabeled = tmp_path / "u.npz"
    np.savez(unlabeled, images=np.zeros((3, 1, 2, 2), np.uint8))
    assert load_dataset("tensors", root=str(unlabeled)).labels is None


def test_tensors_validation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pt"
    torch.save({"images": torch.zeros(2, 8, 8, 3, dtype=torch.uint8)}, bad)
    with pytest.raises(ValueError, match="1 or 3 channels.*channels-last"):
        load_dataset("tensors", root=str(bad))
    torch.save({"images": torch.full((2, 1, 4, 4), 2.0)}, bad)
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
        load_dataset("tensors", root=str(bad))
    torch.save({"images": torch.full((2, 1, 4, 4), float("nan"))}, bad)
    with pytest.raises(ValueError, match="NaN or inf"):
        load_dataset("tensors", root=str(bad))
    torch.save({"images": torch.zeros(2, 1, 4, 4, dtype=torch.uint8), "labels": torch.tensor([1])}, bad)
    with pytest.raises(ValueError, match=r"'labels' must have shape \(2,\)"):
        load_dataset("tensors", root=str(bad))
    torch.save({"labels": torch.tensor([1])}, bad)
    with pytest.raises(ValueError, match="no 'images' entry"):
        load_dataset("tensors", root=str(bad))
    torch.save(torch.zeros(2, 1, 4, 4, dtype=torch.uint8), bad)
    with pytest.raises(ValueError, match="expected a dict"):
        load_dataset("tensors", root=str(bad))
    torch.save({"images": torch.zeros(1, 1, 2, 2, dtype=torch.uint8), "extra": Path("x")}, bad)
    with pytest.raises(ValueError, match="weights_only=True"):  # arbitrary objects are refused
        load_dataset("tensors", root=str(bad))
    np.savez(tmp_path / "bad.npz", images=np.zeros((2, 1, 2, 2), np.uint8), labels=np.array([0.5, 1.0]))
    with pytest.raises(ValueError, match="'labels' must be integers"):
        load_dataset("tensors", root=str(tmp_path / "bad.npz"))
    (tmp_path / "x.csv").write_text("1,2")
    with pytest.raises(ValueError, match=r"\.pt/\.pth or \.npz"):
        load_dataset("tensors", root=str(tmp_path / "x.csv"))
    with pytest.raises(FileNotFoundError, match="val.pt"):
        load_dataset("tensors", "val", root=str(tmp_path))


def test_imagefolder_splits_share_the_training_class_mapping(tmp_path: Path) -> None:
    """A test split without some class (or with an empty class folder) keeps the training labels."""
    for split, classes in (("train", "abc"), ("test", "bc")):
        for label, name in enumerate("abc"):
            if name in classes:
                save_image(tmp_path / split / name / "0.png", solid(4, 4, (10 * label, 0, 0)))
    (tmp_path / "test" / "a").mkdir()  # an empty class folder
    train = load_dataset("imagefolder", "train", root=str(tmp_path), progress=False)
    test = load_dataset("imagefolder", "test", root=str(tmp_path), progress=False)
    assert train.classes == test.classes == ["a", "b", "c"]
    assert train.labels.tolist() == [0, 1, 2] and test.labels.tolist() == [1, 2]
    assert test.images[:, 0, 0, 0].tolist() == [10, 20]  # labels follow the folder names, not positions

    save_image(tmp_path / "test" / "d" / "0.png", solid(4, 4, (0, 0, 0)))
    with pytest.raises(DataError, match="class folders without training images: d"):
        load_dataset("imagefolder", "test", root=str(tmp_path), progress=False)


def test_imagefolder_without_train_folder_labels_other_splits_by_the_root_classes(tmp_path: Path) -> None:
    for name in ("x", "y"):
        save_image(tmp_path / name / "0.png", solid(4, 4, (0, 0, 0)))
    save_image(tmp_path / "test" / "y" / "0.png", solid(4, 4, (0, 0, 0)))
    test = load_dataset("imagefolder", "test", root=str(tmp_path), progress=False)
    assert test.classes == ["x", "y"] and test.labels.tolist() == [1]


def test_all_images_streams_loose_files_and_sub_folders_in_path_order(tmp_path: Path, caplog) -> None:
    save_image(tmp_path / "b.png", solid(4, 4, (1, 0, 0)))
    save_image(tmp_path / "a" / "z.png", solid(4, 4, (2, 0, 0)))
    (tmp_path / "c.jpg").write_bytes(b"not an image")
    source = all_images(tmp_path)
    assert [source.name(i) for i in range(len(source))] == ["a/z.png", "b.png", "c.jpg"] and source.labels is None
    split = StreamedSplit(source, 4, 3, workers=0)
    batches = list(split.batches(2))
    assert "skipped 1 file in" in caplog.text and "c.jpg: cannot decode" in caplog.text
    assert torch.cat([images for images, _ in batches])[:, 0, 0, 0].tolist() == [2, 1]
    assert split.readable.tolist() == [True, True, False]
