"""`selfsup export`: TorchScript and ONNX files that run without selfsup and give the PyTorch model's features,
and a ViT state dict named and shaped as timm's VisionTransformer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from selfsup.checkpoint import export_backbone, load_backbone
from selfsup.cli import main
from selfsup.export import ExportError, export, timm_state_dict
from selfsup.models import build_backbone

TOLERANCE = 1e-4
RESNET = ("resnet", {"block": "basic", "layers": [1, 1], "width": 8, "small_stem": True, "in_channels": 3})
VIT = ("vit", {"img_size": 8, "patch_size": 2, "in_channels": 1, "embed_dim": 32, "depth": 2, "num_heads": 2})


def make_run(folder: Path, kind: str, params: dict, channels: int, seed: int = 0) -> Path:
    """A run directory holding only an exported backbone (random weights, non-trivial BatchNorm statistics)."""
    torch.manual_seed(seed)
    model = build_backbone(kind, **params)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.normal_(0, 0.5)
            module.running_var.uniform_(0.5, 2.0)
            module.weight.data.normal_(1, 0.2)
            module.bias.data.normal_(0, 0.2)
    meta = {"backbone": kind, "params": params, "image_size": 8, "channels": channels,
            "mean": [0.4] * channels, "std": [0.3] * channels, "seed": seed}
    export_backbone(folder, model, meta)
    return folder


# Runs in a fresh interpreter where importing selfsup fails: the exported files must not need it.
OUTSIDE = r"""
import sys
sys.modules["selfsup"] = None  # any `import selfsup...` now raises ImportError
import json
import numpy as np
import torch
x = np.load(sys.argv[1])
out = {}
model = torch.jit.load(sys.argv[2])
with torch.no_grad():
    out["torchscript"] = model(torch.from_numpy(x)).numpy()
if len(sys.argv) > 3:
    import onnxruntime as ort
    session = ort.InferenceSession(sys.argv[3], providers=["CPUExecutionProvider"])
    out["onnx"] = session.run(["features"], {"images": x})[0]
np.savez(sys.argv[1] + ".out.npz", **out)
"""


@pytest.mark.parametrize("kind,params", [RESNET, VIT], ids=["resnet", "vit"])
def test_torchscript_and_onnx_give_the_pytorch_features_without_selfsup(tmp_path, kind, params, capsys):
    channels = params["in_channels"]
    run = make_run(tmp_path / "run", kind, params, channels)
    assert main(["export", str(run), "--format", "torchscript"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    script = Path(summary["out"])
    assert script == run / "export" / "backbone.pt" and script.is_file()
    sidecar = json.loads(Path(summary["sidecar"]).read_text())
    assert sidecar["mean"] == [0.4] * channels and sidecar["input"] == [-1, channels, 8, 8]
    files = [str(script)]
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        onnx_file = None
    else:
        onnx_file = tmp_path / "b.onnx"
        assert main(["export", str(run), "--format", "onnx", "--out", str(onnx_file)]) == 0
        files.append(str(onnx_file))

    model, _ = load_backbone(run)
    model.eval()
    x = torch.randn(5, channels, 8, 8)  # a batch size other than the one traced (2)
    with torch.no_grad():
        expected = model(x).numpy()
    np.save(tmp_path / "x.npy", x.numpy())
    (tmp_path / "outside.py").write_text(OUTSIDE)
    proc = subprocess.run([sys.executable, str(tmp_path / "outside.py"), str(tmp_path / "x.npy"), *files],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = np.load(tmp_path / "x.npy.out.npz")
    diffs = {name: float(np.abs(out[name] - expected).max()) for name in out.files}
    print(f"{kind}: max abs diff {diffs}")
    assert out["torchscript"].shape == expected.shape
    assert diffs["torchscript"] <= TOLERANCE
    if onnx_file is not None:
        assert diffs["onnx"] <= TOLERANCE
        import onnx

        props = {p.key: p.value for p in onnx.load(str(onnx_file)).metadata_props}
        assert json.loads(props["selfsup"])["std"] == [0.3] * channels
    else:
        pytest.skip("onnxruntime is not installed (pip install 'selfsup[onnx]'): ONNX not checked")


# timm's VisionTransformer(img_size=8, patch_size=2, in_chans=1, embed_dim=32, depth=2, num_heads=2, mlp_ratio=4,
# num_classes=0): every tensor of its state dict, written out by hand from timm/models/vision_transformer.py.
TIMM_EXPECTED = {
    "cls_token": (1, 1, 32),
    "pos_embed": (1, 17, 32),  # 16 patches + the class token's position
    "patch_embed.proj.weight": (32, 1, 2, 2),
    "patch_embed.proj.bias": (32,),
    **{name: shape for i in range(2) for name, shape in {
        f"blocks.{i}.norm1.weight": (32,), f"blocks.{i}.norm1.bias": (32,),
        f"blocks.{i}.attn.qkv.weight": (96, 32), f"blocks.{i}.attn.qkv.bias": (96,),
        f"blocks.{i}.attn.proj.weight": (32, 32), f"blocks.{i}.attn.proj.bias": (32,),
        f"blocks.{i}.norm2.weight": (32,), f"blocks.{i}.norm2.bias": (32,),
        f"blocks.{i}.mlp.fc1.weight": (128, 32), f"blocks.{i}.mlp.fc1.bias": (128,),
        f"blocks.{i}.mlp.fc2.weight": (32, 128), f"blocks.{i}.mlp.fc2.bias": (32,),
    }.items()},
    "norm.weight": (32,),
    "norm.bias": (32,),
}


def test_timm_export_has_timms_names_and_shapes(tmp_path, capsys):
    run = make_run(tmp_path / "run", *VIT, channels=1)
    assert main(["export", str(run), "--format", "timm"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    state = load_file(summary["out"])
    assert {k: tuple(v.shape) for k, v in state.items()} == TIMM_EXPECTED
    kwargs = json.loads(Path(summary["sidecar"]).read_text())["timm_kwargs"]
    assert kwargs == {"img_size": 8, "patch_size": 2, "in_chans": 1, "num_classes": 0, "embed_dim": 32, "depth": 2,
                      "num_heads": 2, "mlp_ratio": 4.0, "qkv_bias": True, "class_token": True, "global_pool": "token"}


def timm_forward(state: dict[str, torch.Tensor], kwargs: dict, x: torch.Tensor) -> torch.Tensor:
    """timm's VisionTransformer.forward (num_classes=0) written out from its source, for where timm is absent:
    patchify, prepend [CLS], add pos_embed to every token, pre-norm blocks, final norm, pool."""
    dim, heads = kwargs["embed_dim"], kwargs["num_heads"]
    p = kwargs["patch_size"]
    tokens = F.conv2d(x, state["patch_embed.proj.weight"], state["patch_embed.proj.bias"], stride=p)
    tokens = tokens.flatten(2).transpose(1, 2)
    if kwargs.get("class_token", True):
        tokens = torch.cat([state["cls_token"].expand(len(x), -1, -1), tokens], dim=1)
    tokens = tokens + state["pos_embed"]

    def norm(t, name):
        return F.layer_norm(t, (dim,), state[f"{name}.weight"], state[f"{name}.bias"], eps=1e-6)

    for i in range(kwargs["depth"]):
        b = f"blocks.{i}"
        h = norm(tokens, f"{b}.norm1")
        qkv = F.linear(h, state[f"{b}.attn.qkv.weight"], state.get(f"{b}.attn.qkv.bias"))
        q, k, v = qkv.reshape(len(x), -1, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
        attn = (q @ k.transpose(-2, -1) / (dim // heads) ** 0.5).softmax(-1) @ v
        h = F.linear(attn.transpose(1, 2).reshape(len(x), -1, dim), state[f"{b}.attn.proj.weight"],
                     state[f"{b}.attn.proj.bias"])
        tokens = tokens + h
        h = F.linear(norm(tokens, f"{b}.norm2"), state[f"{b}.mlp.fc1.weight"], state[f"{b}.mlp.fc1.bias"])
        tokens = tokens + F.linear(F.gelu(h), state[f"{b}.mlp.fc2.weight"], state[f"{b}.mlp.fc2.bias"])
    if kwargs.get("final_norm", True) and not kwargs.get("fc_norm"):
        tokens = norm(tokens, "norm")
    prefix = 1 if kwargs.get("class_token", True) else 0
    return tokens[:, 0] if kwargs["global_pool"] == "token" else tokens[:, prefix:].mean(1)


@pytest.mark.parametrize("extra", [{}, {"pool": "mean"}, {"pool": "cls_prenorm", "pos_embed": "learned"},
                                   {"pool": "mean", "cls_token": False, "qkv_bias": False, "mlp_ratio": 2.0}],
                         ids=["cls", "mean", "cls_prenorm_learned", "no_cls"])
def test_timm_state_dict_computes_the_same_feature(extra):
    torch.manual_seed(0)
    model = build_backbone("vit", **{**VIT[1], **extra}).eval()
    if extra.get("pos_embed") == "learned":
        model.pos_embed.data.normal_(0, 0.5)
    state, kwargs = timm_state_dict(model)
    x = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        diff = (timm_forward(state, kwargs, x) - model(x)).abs().max().item()
    assert diff <= 1e-5
    if extra.get("pool") == "cls_prenorm":
        assert kwargs["final_norm"] is False and "norm.weight" not in state


def test_timm_export_loads_into_timm(tmp_path):
    timm_vit = pytest.importorskip("timm.models.vision_transformer", reason="timm does not import here")
    run = make_run(tmp_path / "run", *VIT, channels=1)
    summary = export(run, "timm")
    kwargs = json.loads(Path(summary["sidecar"]).read_text())["timm_kwargs"]
    net = timm_vit.VisionTransformer(**kwargs).eval()
    net.load_state_dict(load_file(summary["out"]), strict=True)
    model, _ = load_backbone(run)
    x = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        assert (net(x) - model.eval()(x)).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize("params,match", [
    ({**VIT[1], "conv_stem": [16]}, "convolutional stem"),
    ({**VIT[1], "num_class_attention_blocks": 1}, "class-attention"),
], ids=["conv_stem", "class_attention"])
def test_timm_export_refuses_what_timm_cannot_express(tmp_path, params, match, capsys):
    run = make_run(tmp_path / "run", "vit", params, channels=1)
    with pytest.raises(ExportError, match=match):
        export(run, "timm")
    assert main(["export", str(run), "--format", "timm"]) == 2
    assert match in capsys.readouterr().err
    resnet = make_run(tmp_path / "resnet", *RESNET, channels=3)
    with pytest.raises(ExportError, match="torchscript or onnx"):
        export(resnet, "timm")
