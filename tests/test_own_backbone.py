"""Your own nn.Module (issue 49): ``selfsup.pretrain(config, backbone=module)`` pretrains it, and the run evaluates
and embeds like any other; ``selfsup.register_backbone`` names a factory for configs; ``model.backbone: timm:NAME``
builds a timm model where timm imports and is one clear error where it does not."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from torch import nn

import selfsup
from selfsup.cli import main
from selfsup.config import ConfigError
from selfsup.models import BACKBONES, TimmBackbone, build_backbone, check_backbone_params, register_backbone
from tiny import VICREG_8PX, tiny, tiny_yaml


class SmallCNN(nn.Module):
    """A user's module: two convolutions and a global pool, nothing from selfsup."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 24, 3, padding=1),
                                  nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.num_features = 24

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


@pytest.fixture(autouse=True)
def registry():
    """Each test leaves the backbone registry as it found it."""
    before = dict(BACKBONES)
    yield
    BACKBONES.clear()
    BACKBONES.update(before)


def test_your_module_pretrains_evaluates_and_embeds(tmp_path) -> None:
    torch.manual_seed(0)
    module = SmallCNN()
    initial = {k: v.clone() for k, v in module.state_dict().items()}
    config = tiny(data={"image_size": 8}, trainer={"max_steps": 20, "out": str(tmp_path / "run")},
                  model={"backbone": "resnet18", "params": {"small_stem": True}},  # replaced by the module
                  monitor={"knn_every_steps": 0})
    run = selfsup.pretrain(config, backbone=module)
    assert all(torch.equal(v, module.state_dict()[k]) for k, v in initial.items())  # the run trained a copy
    model, preprocess = selfsup.load_backbone(run)
    assert isinstance(model, SmallCNN)
    assert any(not torch.equal(v, model.state_dict()[k]) for k, v in initial.items())  # trained
    assert (run / "backbone.json").read_text().count('"user:SmallCNN"') == 1
    scores = selfsup.evaluate(run, "knn", save=False, compare=["random"])
    assert 10 < scores["knn_top1"] <= 100 and "random_knn_top1" in scores
    features = selfsup.embed(run, torch.randint(0, 256, (3, 1, 8, 8), dtype=torch.uint8))
    assert features.shape == (3, 24)
    del BACKBONES["user:SmallCNN"]  # another process, before it registers the name again
    with pytest.raises(Exception, match=r"register it first with selfsup.register_backbone\('user:SmallCNN'"):
        selfsup.load_backbone(run)


def test_a_module_without_num_features_is_refused_naming_the_protocol() -> None:
    register_backbone("bare", lambda: nn.Conv2d(1, 4, 3))
    with pytest.raises(ConfigError, match="without a positive integer num_features; a backbone is an nn.Module"):
        build_backbone("bare")
    with pytest.raises(ValueError, match="built-in backbone's name"):
        register_backbone("resnet18", SmallCNN)


def test_a_registered_factory_takes_model_params(tmp_path) -> None:
    def factory(width: int = 8, in_channels: int = 3) -> nn.Module:
        net = nn.Sequential(nn.Conv2d(in_channels, width, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        net.num_features = width
        return net

    register_backbone("mine", factory)
    check_backbone_params("mine", {"width": 12})
    with pytest.raises(ConfigError, match="unexpected keyword argument 'depth'"):
        check_backbone_params("mine", {"depth": 3})
    (tmp_path / "run.yaml").write_text(tiny_yaml(VICREG_8PX, model={"backbone": "mine", "params": {"width": 12}}))
    assert main(["pretrain", str(tmp_path / "run.yaml"), f"trainer.out={tmp_path / 'run'}", "trainer.max_steps=2"]) == 0
    model, _ = selfsup.load_backbone(tmp_path / "run")
    assert model.num_features == 12 and model[0].in_channels == 1  # the data's channels, given by the engine


def test_timm_backbone_without_timm_is_one_line_exit_2(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "timm", None)  # as where timm is not installed
    (tmp_path / "run.yaml").write_text(tiny_yaml(VICREG_8PX))
    code = main(["pretrain", str(tmp_path / "run.yaml"), f"trainer.out={tmp_path / 'run'}",
                 "model.backbone=timm:resnet50", "model.params={}"])
    err = capsys.readouterr().err
    assert code == 2 and [line for line in err.splitlines() if line.startswith("error:")] == [
        line for line in err.splitlines() if "model.backbone=timm:resnet50 needs timm, which does not import here"
        in line] and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()


def test_timm_backbone_is_timms_pooled_model(monkeypatch) -> None:
    """Where timm imports, TimmBackbone is timm.create_model(name, num_classes=0, in_chans=..., img_size=...) and its
    pooled feature. timm does not import here: a stand-in module records the call (the adapter's side only)."""
    calls = []

    def create_model(name, **kwargs):
        calls.append((name, kwargs))
        if "img_size" in kwargs and name.startswith("resnet"):
            raise TypeError("unexpected img_size")
        net = nn.Sequential(nn.Conv2d(kwargs["in_chans"], 5, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        net.num_features = 5
        return net

    monkeypatch.setitem(sys.modules, "timm", types.SimpleNamespace(create_model=create_model,
                                                                  is_model=lambda name: name == "resnet50"))
    check_backbone_params("timm:resnet50", {})
    with pytest.raises(ConfigError, match="timm has no model named 'resnet5'"):
        check_backbone_params("timm:resnet5", {})
    model = build_backbone("timm:resnet50", in_channels=1, img_size=32)
    assert isinstance(model, TimmBackbone) and model.num_features == 5
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 5)
    assert calls == [("resnet50", {"pretrained": False, "num_classes": 0, "in_chans": 1, "img_size": 32}),
                     ("resnet50", {"pretrained": False, "num_classes": 0, "in_chans": 1})]
