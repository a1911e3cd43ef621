"""Weights from and to the ecosystem (issue 49): torchvision's ResNet and timm's ViT names, checked against the key
and shape lists the real libraries made (tests/golden/ecosystem/, by tests/golden/make_ecosystem_keys.py), imported
with ``model.init_weights`` and exported with ``selfsup export --format torchvision|timm|state_dict``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from selfsup.checkpoint import export_backbone, load_backbone
from selfsup.cli import main
from selfsup.config import ConfigError
from selfsup.export import export, timm_state_dict
from selfsup.models import build_backbone, resnet18, resnet50, vit_base, vit_small, vit_tiny
from selfsup.models.weights import init_weights, naming, read_state_dict, torchvision_state_dict

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "ecosystem"


def golden(name: str) -> dict[str, list[int]]:
    return json.loads((GOLDEN / f"{name}.json").read_text())["shapes"]


def random_state(shapes: dict[str, list[int]], seed: int = 0) -> dict[str, torch.Tensor]:
    """A state dict with the given names and shapes and random values (BatchNorm counters as integers)."""
    generator = torch.Generator().manual_seed(seed)
    return {k: (torch.tensor(7) if k.endswith("num_batches_tracked") else
                torch.rand(s, generator=generator) + 0.5 if "running_var" in k else torch.randn(s, generator=generator))
            for k, s in shapes.items()}


CLASSIFIERS = ("fc.", "head.")
PAIRS = [("torchvision_resnet18", lambda: resnet18()), ("torchvision_resnet50", lambda: resnet50()),
         ("timm_vit_tiny_patch16_224", lambda: vit_tiny(pos_embed="learned")),
         ("timm_vit_small_patch16_224", lambda: vit_small(pos_embed="learned")),
         ("timm_vit_base_patch16_224", lambda: vit_base(pos_embed="learned"))]


@pytest.mark.parametrize("name, build", PAIRS, ids=[p[0] for p in PAIRS])
def test_our_weights_in_their_names_are_exactly_their_keys_and_shapes(name, build) -> None:
    """Ours loads strictly into theirs: every key and shape of the real library's model but its classifier."""
    model = build()
    state = torchvision_state_dict(model) if name.startswith("torchvision") else timm_state_dict(model)[0]
    theirs = {k: s for k, s in golden(name).items() if not k.startswith(CLASSIFIERS)}
    assert {k: list(v.shape) for k, v in state.items()} == theirs


@pytest.mark.parametrize("name, build", PAIRS, ids=[p[0] for p in PAIRS])
def test_their_weights_start_ours_with_every_tensor(name, build, tmp_path) -> None:
    """Theirs loads strictly into ours (a file with their names and shapes, random values, classifier included):
    every tensor of our model comes from the file, renamed; timm's [CLS] position row folds into our [CLS]."""
    state = random_state(golden(name))
    save_file(state, tmp_path / "w.safetensors")
    model = build()
    init_weights(model, tmp_path / "w.safetensors")
    ours = model.state_dict()
    if name.startswith("torchvision"):
        assert naming(state) == "torchvision"
        assert torch.equal(ours["stem.0.weight"], state["conv1.weight"])
        assert torch.equal(ours["stem.1.running_var"], state["bn1.running_var"])
        assert torch.equal(ours["layer4.0.shortcut.0.weight"], state["layer4.0.downsample.0.weight"])
        assert torch.equal(ours["layer4.1.conv2.weight"], state["layer4.1.conv2.weight"])
    else:
        assert naming(state) == "timm"
        assert torch.equal(ours["patch_embed.weight"], state["patch_embed.proj.weight"])
        assert torch.equal(ours["cls_token"], state["cls_token"] + state["pos_embed"][:, :1])
        assert torch.equal(ours["pos_embed"], state["pos_embed"][:, 1:])
        assert torch.equal(ours["blocks.11.mlp.fc2.bias"], state["blocks.11.mlp.fc2.bias"])
    folded = model.embed_dim if name.startswith("timm") else 0  # timm's [CLS] position row, folded into the [CLS]
    assert sum(v.numel() for v in ours.values()) == sum(
        v.numel() for k, v in state.items() if not k.startswith(CLASSIFIERS)) - folded


def test_a_renamed_or_misshaped_key_is_an_error_naming_it(tmp_path) -> None:
    state = random_state(golden("torchvision_resnet18"))
    renamed = {k.replace("layer3.1.bn2", "layer3.1.bn_2"): v for k, v in state.items()}  # a renaming bug
    save_file(renamed, tmp_path / "renamed.safetensors")
    with pytest.raises(ConfigError, match=r"lacks 4 of the model's tensors \(e.g. layer3.1.bn2.weight"):
        init_weights(resnet18(), tmp_path / "renamed.safetensors")
    state["layer2.0.conv1.weight"] = torch.zeros(128, 64, 5, 5)
    save_file(state, tmp_path / "shape.safetensors")
    with pytest.raises(ConfigError, match=r"layer2.0.conv1.weight: \[128, 64, 5, 5\] in the file, \[128, 64, 3, 3\]"):
        init_weights(resnet18(), tmp_path / "shape.safetensors")
    with pytest.raises(ConfigError, match="holds a torchvision ResNet's weights but model.backbone is a Vision"):
        init_weights(vit_tiny(), tmp_path / "shape.safetensors")


def test_torch_files_and_checkpoint_wrappers_are_read(tmp_path) -> None:
    state = random_state(golden("torchvision_resnet18"))
    torch.save({"state_dict": {f"module.{k}": v for k, v in state.items()}, "epoch": 3}, tmp_path / "ckpt.pth")
    read = read_state_dict(tmp_path / "ckpt.pth")
    assert read.keys() == state.keys() and all(torch.equal(read[k], state[k]) for k in state)
    (tmp_path / "code.pth").write_bytes(b"not a torch file")
    with pytest.raises(ConfigError, match="cannot read .*code.pth"):
        read_state_dict(tmp_path / "code.pth")
    with pytest.raises(ConfigError, match="is not a file"):
        read_state_dict(tmp_path / "missing.pth")


def test_position_embedding_resized_and_rgb_weights_summed_for_gray(tmp_path) -> None:
    """ViT-S/16 weights made at 224 px (14 x 14 patches) start a 1-channel ViT at 64 px (4 x 4): the position grid is
    resized (bicubic), and the patch projection summed over RGB gives a gray image the response its RGB copy had."""
    state = random_state(golden("timm_vit_small_patch16_224"))
    save_file(state, tmp_path / "w.safetensors")
    model = vit_small(img_size=64, in_channels=1, pos_embed="learned")
    init_weights(model, tmp_path / "w.safetensors")
    grid = state["pos_embed"][:, 1:].reshape(1, 14, 14, 384).permute(0, 3, 1, 2)
    expected = torch.nn.functional.interpolate(grid, size=(4, 4), mode="bicubic", antialias=True)
    assert torch.allclose(model.pos_embed, expected.permute(0, 2, 3, 1).reshape(1, 16, 384))
    x = torch.rand(2, 1, 16, 16)
    with torch.no_grad():
        assert torch.allclose(torch.nn.functional.conv2d(x.repeat(1, 3, 1, 1), state["patch_embed.proj.weight"]),
                              torch.nn.functional.conv2d(x, model.patch_embed.weight), rtol=1e-5, atol=1e-4)
    with pytest.raises(ConfigError, match="set model.params.pos_embed=learned"):
        init_weights(vit_small(), tmp_path / "w.safetensors")


@pytest.mark.parametrize("kind, params, fmt", [
    ("resnet50", {"small_stem": True, "in_channels": 3}, "torchvision"),
    ("resnet", {"block": "basic", "layers": [1, 1], "width": 8, "small_stem": True, "in_channels": 3}, "state_dict"),
    ("vit", {"img_size": 32, "patch_size": 8, "in_channels": 3, "embed_dim": 32, "depth": 2, "num_heads": 2,
             "pos_embed": "learned"}, "timm"),
    ("vit", {"img_size": 32, "patch_size": 8, "in_channels": 3, "embed_dim": 32, "depth": 2, "num_heads": 2},
     "state_dict"),
])
def test_export_then_init_weights_gives_bit_identical_features(tmp_path, kind, params, fmt) -> None:
    torch.manual_seed(0)
    model = build_backbone(kind, **params)
    for module in model.modules():  # non-trivial BatchNorm statistics, a non-zero [CLS]
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.normal_(0, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    if hasattr(model, "pos_embed") and isinstance(model.pos_embed, torch.nn.Parameter):
        model.pos_embed.data.normal_()
    export_backbone(tmp_path / "run", model, {"backbone": kind, "params": params, "image_size": 32, "channels": 3,
                                              "mean": [0.5] * 3, "std": [0.25] * 3})
    assert main(["export", str(tmp_path / "run"), "--format", fmt]) == 0
    exported = tmp_path / "run" / "export" / f"backbone_{fmt}.safetensors"
    fresh = build_backbone(kind, **params)
    init_weights(fresh, exported)
    x = torch.randn(4, 3, 32, 32)
    original, _ = load_backbone(tmp_path / "run")
    with torch.no_grad():
        assert torch.equal(original.eval()(x), fresh.eval()(x))
    if fmt == "torchvision":
        assert "conv1.weight" in load_file(exported) and "layer2.0.downsample.0.weight" in load_file(exported)


def test_export_torchvision_refuses_a_vit(tmp_path, capsys) -> None:
    model = vit_tiny(img_size=32)
    export_backbone(tmp_path / "run", model, {"backbone": "vit_tiny", "params": {"img_size": 32}, "image_size": 32,
                                              "channels": 3, "mean": [0.5] * 3, "std": [0.25] * 3})
    assert main(["export", str(tmp_path / "run"), "--format", "torchvision"]) == 2
    assert "torchvision names are a ResNet's" in capsys.readouterr().err
    assert export(tmp_path / "run", "state_dict")["format"] == "state_dict"


MSN_FROM_TIMM = """
method: {name: msn, projector: [64, 64, 32], num_prototypes: 16, mask_ratio: 0.15}
data: {dataset: digits, image_size: 32}
views:
  - {preset: msn, num: 2, params: {blur_p: 0.0}}
  - {preset: msn_focal, num: 2, size: 16, params: {blur_p: 0.0}}
model: {backbone: vit_small, params: {pos_embed: learned}}
trainer: {batch_size: 16, progress: false, accelerator: cpu}
monitor: {knn_every_steps: 0, collapse_every_steps: 0}
"""
VICREG_FROM_TORCHVISION = """
method: {name: vicreg, expander: [64, 64]}
data: {dataset: digits, image_size: 32}
views: [{preset: minimal, num: 2}]
model: {backbone: resnet50}
trainer: {batch_size: 16, progress: false, accelerator: cpu}
monitor: {knn_every_steps: 0, collapse_every_steps: 0}
"""


@pytest.mark.parametrize("config, name", [(MSN_FROM_TIMM, "timm_vit_small_patch16_224"),
                                          (VICREG_FROM_TORCHVISION, "torchvision_resnet50")], ids=["msn", "vicreg"])
def test_a_method_starts_from_their_weights_and_trains(tmp_path, caplog, config, name) -> None:
    """Issue 49's bar: a state dict in timm's ViT-S/16 (torchvision's ResNet-50) names and shapes starts MSN (VICReg)
    on 1-channel 32 px images: the exported backbone of a 0-step run is the file's weights (MSN exports its EMA
    target, copied after the weights were loaded), and 2 steps train from there; a resume does not read the file."""
    state = random_state(golden(name))
    save_file(state, tmp_path / "w.safetensors")
    (tmp_path / "run.yaml").write_text(config)
    args = ["pretrain", str(tmp_path / "run.yaml"), f"model.init_weights={tmp_path / 'w.safetensors'}"]
    with caplog.at_level("INFO", logger="selfsup"):
        assert main([*args, f"trainer.out={tmp_path / 'start'}", "trainer.max_steps=0"]) == 0
    assert f"init_weights: every tensor of the backbone from {tmp_path / 'w.safetensors'}" in caplog.text
    expected = (build_backbone("vit_small", pos_embed="learned", img_size=32, in_channels=1) if "vit" in name
                else build_backbone("resnet50", in_channels=1))
    init_weights(expected, tmp_path / "w.safetensors")
    exported, _ = load_backbone(tmp_path / "start")
    assert all(torch.equal(v, exported.state_dict()[k]) for k, v in expected.state_dict().items())
    assert main([*args, f"trainer.out={tmp_path / 'run'}", "trainer.max_steps=2"]) == 0
    trained, _ = load_backbone(tmp_path / "run")
    assert any(not torch.equal(v, trained.state_dict()[k]) for k, v in expected.state_dict().items())
    (tmp_path / "w.safetensors").unlink()  # a resume takes the weights from its checkpoint
    assert main(["pretrain", str(tmp_path / "run")]) == 0


@pytest.mark.parametrize("method, extra", [("quickstart", []), ("barlow_twins", []), ("byol", []),
                                           ("nnclr", ["method.queue_size=512"]), ("mast", []), ("msn", []),
                                           ("extrema", []), ("mae", [])])
def test_every_method_starts_from_the_file(tmp_path, method, extra) -> None:
    """Each method's Fashion-MNIST preset (the quick-start for VICReg; on the digits at 28 px), built with another seed but model.init_weights
    set to a first build's exported weights, exports exactly those weights: the file reaches the backbone and every
    copy the method makes of it (the EMA target MSN, BYOL and ExtreMA export)."""
    config = Path(__file__).resolve().parents[2] / "configs" / "fashion_mnist" / f"{method}.yaml"
    common = [str(config), "data.dataset=digits", "data.image_size=28", "trainer.max_steps=0", "trainer.progress=false",
              "monitor.knn_every_steps=0", *extra]
    assert main(["pretrain", *common, f"trainer.out={tmp_path / 'a'}"]) == 0
    assert main(["export", str(tmp_path / "a"), "--format", "state_dict"]) == 0
    weights = tmp_path / "a" / "export" / "backbone_state_dict.safetensors"
    assert main(["pretrain", *common, f"trainer.out={tmp_path / 'b'}", "trainer.seed=1",
                 f"model.init_weights={weights}"]) == 0
    assert main(["pretrain", *common, f"trainer.out={tmp_path / 'c'}", "trainer.seed=1"]) == 0
    file, started, unseeded = load_file(weights), load_file(tmp_path / "b" / "backbone.safetensors"), load_file(
        tmp_path / "c" / "backbone.safetensors")
    assert file.keys() == started.keys() and all(torch.equal(file[k], started[k]) for k in file)
    assert any(not torch.equal(file[k], unseeded[k]) for k in file)  # without the file, seed 1 gives other weights


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_torchvision_export_loads_into_torchvision_and_back(tmp_path, name) -> None:
    """The real library both ways, where torchvision imports (GPU machines; not the CPU wheel here): our export in
    torchvision's names loads strictly into ``torchvision.models.resnet.<name>`` (its classifier aside) and computes our
    feature; torchvision's own state dict starts ours (``init_weights``) with the same feature. Run on 2026-11-28
    with torchvision 0.28.0's resnet.py importable (its package init stood in for): both passed."""
    tv_resnet = pytest.importorskip("torchvision.models.resnet", reason="torchvision does not import here")
    torch.manual_seed(0)
    ours = build_backbone(name)
    for module in ours.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.normal_(0, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    export_backbone(tmp_path / "run", ours, {"backbone": name, "params": {}, "image_size": 64, "channels": 3,
                                             "mean": [0.5] * 3, "std": [0.25] * 3})
    assert main(["export", str(tmp_path / "run"), "--format", "torchvision"]) == 0
    theirs = getattr(tv_resnet, name)()
    theirs.fc = torch.nn.Identity()
    theirs.load_state_dict(load_file(tmp_path / "run" / "export" / "backbone_torchvision.safetensors"), strict=True)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(theirs.eval()(x), ours.eval()(x), rtol=0, atol=1e-5)
        torch.manual_seed(1)
        other = getattr(tv_resnet, name)()  # fresh torchvision weights, classifier included, into a fresh one of ours
        save_file(other.state_dict(), tmp_path / "tv.safetensors")
        started = build_backbone(name)
        init_weights(started, tmp_path / "tv.safetensors")
        other.fc = torch.nn.Identity()
        torch.testing.assert_close(started.eval()(x), other.eval()(x), rtol=0, atol=1e-5)
