"""The public API: selfsup.load_backbone / embed / pretrain / evaluate, as the command line computes them."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

import selfsup
from selfsup.cli import main
from tiny import ADAMW, QUICK_EVAL, tiny

CONFIG = tiny(optim=ADAMW, trainer={"log_every_steps": 5}, eval=QUICK_EVAL)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("api") / "run"
    # a dict config, keyword sections and a key=value override, as the command line takes them
    assert selfsup.pretrain(CONFIG, "trainer.max_steps=6", trainer={"out": str(out)}) == out
    return out


def test_import_is_cheap():
    code = "import sys, selfsup; print('torch' in sys.modules, callable(selfsup.load_backbone))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]


def test_load_backbone_and_preprocess_match_selfsup_embed(run_dir, tmp_path, capsys):
    model, preprocess = selfsup.load_backbone(run_dir)
    assert not model.training
    assert (preprocess.image_size, preprocess.channels) == (8, 1)
    meta = json.loads((run_dir / "backbone.json").read_text())
    assert preprocess.mean == tuple(meta["mean"]) and preprocess.std == tuple(meta["std"])
    rng = np.random.default_rng(0)
    images = tmp_path / "images"
    (images / "sub").mkdir(parents=True)
    pil = [Image.fromarray(rng.integers(0, 255, (20, 30, 3), dtype=np.uint8)) for _ in range(3)]
    for i, image in enumerate(pil):
        image.save(images / ("sub" if i == 2 else "") / f"{i}.png")
    (images / "notes.txt").write_text("not an image")
    assert main(["embed", str(run_dir), str(images), str(tmp_path / "out.npy"), "--workers", "0"]) == 0
    expected = torch.from_numpy(np.load(tmp_path / "out.npy"))
    assert (tmp_path / "out.files.txt").read_text().split() == ["0.png", "1.png", "sub/2.png"]
    batch = preprocess(pil)
    assert batch.shape == (3, 1, 8, 8) and batch.dtype == torch.float32
    with torch.no_grad():
        assert torch.allclose(model(batch), expected, atol=1e-5)  # PIL images
        assert torch.allclose(model(preprocess(images / "1.png")[None]), expected[1:2], atol=1e-5)  # a path
    assert torch.allclose(selfsup.embed(run_dir, pil), expected, atol=1e-5)
    # A folder: the same files, order and features as `selfsup embed`, and the names of the rows.
    feats, files = selfsup.embed(run_dir, images, return_files=True, workers=0)
    assert files == ["0.png", "1.png", "sub/2.png"] and torch.allclose(feats, expected, atol=1e-6)
    assert torch.allclose(selfsup.embed(run_dir, str(images)), expected, atol=1e-6)


def test_preprocess_gives_one_image_the_same_pixels_as_a_path_a_pil_image_and_a_tensor(tmp_path):
    """One resize path (issue 48.7): a JPEG as a path, as the PIL image and as the uint8 tensor of its pixels gives
    identical pixels, those of `selfsup embed` on its folder, and those of a plain PIL bilinear resize + crop."""
    from selfsup.api import Preprocess
    from selfsup.data.decode import decode_resized

    rng = np.random.default_rng(1)
    small = rng.integers(0, 256, (8, 11, 3), dtype=np.uint8)
    photo = Image.fromarray(small).resize((330, 240), Image.Resampling.BICUBIC)  # a 330 x 240 "photo"
    photo.save(tmp_path / "a.jpg", quality=90)
    with Image.open(tmp_path / "a.jpg") as im:
        decoded = im.convert("RGB")
    tensor = torch.from_numpy(np.array(decoded)).permute(2, 0, 1)
    # By hand: the shorter side 240 -> 32 makes 330 -> round(44.0) = 44 wide; the centre crop starts at (44-32)//2 = 6.
    by_hand = np.asarray(decoded.resize((44, 32), Image.Resampling.BILINEAR).crop((6, 0, 38, 32)))
    for channels in (3, 1):
        pre = Preprocess(32, channels, (0.5,) * channels, (0.25,) * channels)
        from_path, from_pil, from_tensor = (pre.pixels(x) for x in (tmp_path / "a.jpg", decoded, tensor))
        assert from_path.shape == (channels, 32, 32) and from_path.dtype == torch.uint8
        assert torch.equal(from_path, from_pil) and torch.equal(from_path, from_tensor)
        assert torch.equal(pre.pixels(tensor.float() / 255), from_tensor)  # a float tensor in [0, 1]
        folder = torch.from_numpy(decode_resized(str(tmp_path / "a.jpg"), 32, "L" if channels == 1 else "RGB"))
        assert torch.equal(folder.permute(2, 0, 1), from_path)  # what `selfsup embed` and evaluation read
        reference = by_hand if channels == 3 else np.asarray(Image.fromarray(by_hand).convert("L"))[:, :, None]
        # gray: Pillow converts before resizing; converting the resized RGB differs by rounding at most
        tolerance = 0 if channels == 3 else 1
        assert np.abs(from_path.permute(1, 2, 0).numpy().astype(int) - reference.reshape(32, 32, channels)).max() \
            <= tolerance
        assert torch.allclose(pre(tensor), (from_path.float() / 255 - 0.5) / 0.25)


def test_preprocess_is_a_per_image_transform_of_a_torch_dataset(run_dir):
    """One image in, (C, H, W) out, as torchvision transforms: a DataLoader stacks the batch; a list or a 4-D batch
    gives a batch."""
    _, preprocess = selfsup.load_backbone(run_dir)
    rng = np.random.default_rng(2)
    pil = [Image.fromarray(rng.integers(0, 255, (20, 30, 3), dtype=np.uint8)) for _ in range(5)]

    class Photos(torch.utils.data.Dataset):
        def __len__(self):
            return len(pil)

        def __getitem__(self, i):
            return preprocess(pil[i]), i

    loaded = list(torch.utils.data.DataLoader(Photos(), batch_size=2))
    assert [tuple(x.shape) for x, _ in loaded] == [(2, 1, 8, 8), (2, 1, 8, 8), (1, 1, 8, 8)]
    assert torch.equal(torch.cat([x for x, _ in loaded]), preprocess(pil))
    assert preprocess(pil[0]).shape == (1, 8, 8) and preprocess(pil[:1]).shape == (1, 1, 8, 8)
    as_arrays = [np.array(p) for p in pil]  # (H, W, C) as PIL gives them
    assert torch.equal(preprocess(as_arrays[0]), preprocess(pil[0]))
    chw = torch.stack([torch.from_numpy(a).permute(2, 0, 1) for a in as_arrays])
    assert torch.equal(preprocess(chw), preprocess(pil)) and preprocess(chw[0]).shape == (1, 8, 8)


def test_preprocess_takes_uint8_and_float_tensors(run_dir):
    model, preprocess = selfsup.load_backbone(run_dir)
    rgb = torch.randint(0, 256, (4, 3, 16, 12), dtype=torch.uint8)
    pixels = preprocess.pixels(rgb)
    assert pixels.shape == (4, 1, 8, 8) and pixels.dtype == torch.uint8  # gray, shorter side to 8, centre crop
    assert torch.equal(preprocess.pixels(rgb[0]), pixels[0])  # one (C, H, W) image gives one (C, H, W)
    assert torch.allclose(preprocess(rgb.float() / 255), preprocess(rgb), atol=1e-6)
    assert torch.allclose(preprocess.normalize(torch.full((1, 1, 2, 2), preprocess.mean[0])), torch.zeros(1))
    with torch.no_grad():
        direct = model(preprocess(rgb))
    assert torch.allclose(selfsup.embed((model, preprocess), rgb, batch_size=3), direct, atol=1e-5)
    assert torch.allclose(selfsup.embed((model, preprocess), rgb[0]), direct[:1], atol=1e-5)  # one image: N = 1
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        preprocess(rgb.float())
    with pytest.raises(TypeError, match="uint8"):
        preprocess(rgb.int())


def test_evaluate_is_the_cli_and_saves_json(run_dir, capsys):
    scores = selfsup.evaluate(run_dir, "knn", compare=["raw"])
    assert set(scores) == {"knn_top1", "knn_top5", "knn200_top1", "raw_knn_top1", "raw_knn_top5", "raw_knn200_top1"}
    saved = json.loads((run_dir / "eval" / "knn.json").read_text())
    assert saved["result"] == scores and saved["baselines"] == ["backbone", "raw"]
    capsys.readouterr()
    assert main(["eval", "knn", str(run_dir), "eval.knn_k=5"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    saved = json.loads((run_dir / "eval" / "knn.json").read_text())
    assert saved["overrides"] == ["eval.knn_k=5"] and saved["baselines"] == ["backbone"]
    assert {k: round(v, 4) for k, v in saved["result"].items()} == printed
