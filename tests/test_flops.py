"""selfsup.flops and the FLOPs / MFU of ``selfsup bench`` (issue 53.2): counted FLOPs against hand counts written here
from the architectures' shapes, the step against its forward, the peak table and the measured peak."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import yaml

from selfsup.bench import bench
from selfsup.config import ConfigError
from selfsup.flops import (achieved_tflops, compute_precision, count_flops, datasheet_peak, device_peak,
                           measure_gemm_tflops, on_meta)
from selfsup.load import load_config
from selfsup.methods.assemble import backbone_params
from selfsup.models import build_backbone
from selfsup.models.resnet import resnet50
from selfsup.models.vit import VisionTransformer

CONFIGS = Path(__file__).parent.parent / "configs"


def vit_forward_macs(side: int, patch: int, channels: int, dim: int, depth: int, mlp_ratio: float = 4.0) -> int:
    """Multiply-adds of a ViT's forward on one image (Dosovitskiy et al.): the patch embedding, then per block the
    qkv projection 3ND^2, the scores QK^T N^2D, their product with V N^2D, the output projection ND^2 and the MLP
    2 * ratio * ND^2, with N the patches plus the [CLS] token."""
    patches = (side // patch) ** 2
    n = patches + 1
    block = 3 * n * dim**2 + n * n * dim + n * n * dim + n * dim**2 + 2 * int(mlp_ratio) * n * dim**2
    return patches * (channels * patch * patch) * dim + depth * block


def resnet50_forward_macs(side: int = 224) -> int:
    """Multiply-adds of ResNet-50's convolutions on one image (He et al. 2016, Tab. 1; the stride in the 3x3 conv,
    "v1.5"), no classifier: a conv of k x k from c_in to c_out with an h x w output costs h w c_out c_in k^2."""
    def conv(out_side: int, c_in: int, c_out: int, k: int) -> int:
        return out_side * out_side * c_out * c_in * k * k

    res = side // 2
    macs = conv(res, 3, 64, 7)  # stem: 7x7 stride 2, then a 3x3 max-pool of stride 2
    res //= 2
    c_in = 64
    for stage, (width, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)]):
        for i in range(blocks):
            stride = 2 if stage > 0 and i == 0 else 1
            out = res // stride
            macs += conv(res, c_in, width, 1) + conv(out, width, width, 3) + conv(out, width, 4 * width, 1)
            if i == 0:  # projection shortcut: 1x1, strided
                macs += conv(out, c_in, 4 * width, 1)
            c_in, res = 4 * width, out
    return macs


def test_vit_s16_forward_matches_the_hand_count():
    """The issue's bar: ViT-S/16 at 224 px (built as configs/imagenet/msn_vit_s16.yaml builds it), ~4.6 GMACs =
    ~9.2 GFLOPs per image, counted on the meta device within 5 %."""
    cfg = load_config(str(CONFIGS / "imagenet" / "msn_vit_s16.yaml"), [])
    model = on_meta(lambda: build_backbone(cfg.model.backbone, **backbone_params(cfg, 3, 224)))
    flops = count_flops(lambda: model(torch.empty(1, 3, 224, 224, device="meta")))
    expected = 2 * vit_forward_macs(224, 16, 3, dim=384, depth=12)
    assert expected == pytest.approx(9.2e9, rel=0.01)
    assert flops == pytest.approx(expected, rel=0.05)


def test_resnet50_forward_matches_the_hand_count():
    flops = count_flops(lambda: on_meta(resnet50)(torch.empty(1, 3, 224, 224, device="meta")))
    expected = 2 * resnet50_forward_macs()
    assert expected == pytest.approx(2 * 4.1e9, rel=0.01)
    assert flops == pytest.approx(expected, rel=0.05)


def test_attention_is_counted_on_cpu_tensors_as_on_meta():
    """On CPU tensors F.scaled_dot_product_attention runs a fused kernel that torch's counter does not know: its
    matmuls are counted all the same (here over half the FLOPs: 257 tokens of width 32), forward and backward."""
    torch.manual_seed(0)
    build = lambda: VisionTransformer(img_size=64, patch_size=4, in_channels=3, embed_dim=32, depth=2,  # noqa: E731
                                      num_heads=2)
    x = torch.randn(2, 3, 64, 64)
    cpu = count_flops(lambda: build()(x))
    meta = count_flops(lambda: on_meta(build)(x.to("meta")))
    assert cpu == meta == pytest.approx(2 * 2 * vit_forward_macs(64, 4, 3, dim=32, depth=2), rel=0.05)
    model = build()
    step = count_flops(lambda: model(x).sum().backward())
    assert step == pytest.approx(3 * cpu, rel=0.25)  # the backward recomputes the attention scores: above 3x


# A VICReg step with no attention: conv layers and a Linear expander, on 8 px one-channel images (digits' shape).
TINY_RESNET = """
method: {name: vicreg, expander: [32, 32]}
data: {dataset: digits, root: /nonexistent}
views:
  - {preset: minimal, num: 2}
model: {backbone: resnet, params: {block: basic, layers: [1, 1], width: 8, small_stem: true}}
trainer: {batch_size: 16, num_threads: 1}
"""


def test_bench_counts_the_step_as_three_forwards(tmp_path):
    """The step's forward and backward: the backward costs twice the forward (the gradients of each layer's input and
    of its weights), so the step is 3x the forward, hand-counted here per image, less the stem's input gradient (the
    images need none)."""
    config = tmp_path / "c.yaml"
    config.write_text(TINY_RESNET)
    result = bench(load_config(str(config), []), steps=1, warmup=0, synthetic=True)
    conv = lambda side, c_in, c_out, k: side * side * c_out * c_in * k * k  # noqa: E731
    backbone = (conv(8, 1, 8, 3) + 2 * conv(8, 8, 8, 3)  # stem, stage 1
                + conv(4, 8, 16, 3) + conv(4, 16, 16, 3) + conv(4, 8, 16, 1))  # stage 2 (stride 2, projection)
    expander = 16 * 32 + 32 * 32
    covariance = 32 * 32  # VICReg's covariance of the batch's embeddings, per image
    forward = 2 * 2 * (backbone + expander + covariance)  # 2 views, 2 FLOPs per multiply-add
    stem_input_gradient = 2 * 2 * conv(8, 1, 8, 3)
    assert result["gflops_per_image"] * 1e9 == pytest.approx(3 * forward - stem_input_gradient, rel=0.01)
    assert result["gflops_per_step"] == pytest.approx(result["gflops_per_image"] * 16, rel=1e-3)


def test_peak_table_by_device_name_and_precision():
    assert datasheet_peak("NVIDIA H100 80GB HBM3", "bf16") == (989.0, "datasheet NVIDIA H100 SXM bf16 dense")
    assert datasheet_peak("NVIDIA H100 80GB HBM3", "fp32")[0] == 67.0
    assert datasheet_peak("NVIDIA H100 PCIe", "bf16")[0] == 756.0
    assert datasheet_peak("NVIDIA H100 PCIe", "tf32")[0] == 378.0
    assert datasheet_peak("NVIDIA H200", "fp16")[0] == 989.0
    assert datasheet_peak("NVIDIA H200", "tf32")[0] == 495.0
    assert datasheet_peak("NVIDIA A100-SXM4-80GB", "bf16")[0] == 312.0
    assert datasheet_peak("NVIDIA A100-PCIE-40GB", "fp32")[0] == 19.5
    for other in ("NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA RTX A1000 Laptop GPU", "NVIDIA GeForce RTX 4090",
                  "NVIDIA A10"):
        assert datasheet_peak(other, "bf16") is None, other


def test_the_precision_the_peak_is_read_at():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert compute_precision("bf16-mixed", cuda) == compute_precision("bf16-true", cpu) == "bf16"
    assert compute_precision("16-mixed", cuda) == "fp16"
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    try:
        matmul.fp32_precision = "ieee"
        assert compute_precision("32-true", cuda) == "fp32"
        matmul.fp32_precision = "tf32"  # TF32 matmuls allowed: an fp32 run's matmuls are TF32 ones
        assert compute_precision("32-true", cuda) == "tf32"
        assert compute_precision("32-true", cpu) == "fp32"  # a CUDA setting
    finally:
        matmul.fp32_precision = before


def test_measured_peak_when_the_table_has_none(monkeypatch):
    start = time.perf_counter()
    tflops = measure_gemm_tflops(torch.device("cpu"), torch.float32)
    assert time.perf_counter() - start < 2 and 0 < tflops < 100  # one core of a CPU: far below 100 TFLOP/s
    assert device_peak(torch.device("cpu"), "fp32")[1] == "measured fp32 GEMM, 1 thread"  # tests/conftest.py's 1

    measured = []
    monkeypatch.setattr("selfsup.flops.measure_gemm_tflops", lambda device, dtype: measured.append(dtype) or 123.0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA GeForce RTX 4090")
    assert device_peak(torch.device("cuda"), "bf16") == (123.0, "measured bf16 GEMM on NVIDIA GeForce RTX 4090")
    assert measured == [torch.bfloat16]
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert device_peak(torch.device("cuda"), "tf32") == (495.0, "datasheet NVIDIA H100 SXM tf32 dense")
    assert measured == [torch.bfloat16]  # a datasheet peak measures nothing


def test_achieved_flops_per_second():
    assert achieved_tflops(2 * 10**12, steps=10, seconds=4.0) == pytest.approx(5.0)


STREAMED = """
method: {name: vicreg, expander: [32, 32]}
data: {dataset: imagefolder, root: /nonexistent, stream: true, image_size: 24}
views:
  - {preset: minimal, num: 1}
  - {preset: minimal, num: 2, size: 16}
model: {backbone: resnet, params: {block: basic, layers: [1], width: 8, small_stem: true}}
trainer: {batch_size: 8, num_threads: 1}
"""


def test_synthetic_streamed_step_runs_on_crops_of_each_view_size(tmp_path):
    """A streamed config without its folder: the step runs on random crops of each view's size (24 px, then two
    views at 16 px), the loader is not measured."""
    config = tmp_path / "c.yaml"
    config.write_text(STREAMED)
    result = bench(load_config(str(config), []), steps=1, warmup=0, synthetic=True)
    assert result["data"] == "synthetic" and result["views"] == 3 and result["image_size"] == 24
    assert not {"loader_images_per_s", "augment_images_per_s", "bottleneck"} & result.keys()
    conv = lambda side, c_in, c_out, k: side * side * c_out * c_in * k * k  # noqa: E731
    backbone = lambda side: conv(side, 3, 8, 3) + 2 * conv(side, 8, 8, 3)  # noqa: E731
    forward = 2 * (backbone(24) + 2 * backbone(16) + 3 * (8 * 32 + 32 * 32 + 32 * 32))
    stem_input_gradient = 2 * (conv(24, 3, 8, 3) + 2 * conv(16, 3, 8, 3))
    assert result["gflops_per_image"] * 1e9 == pytest.approx(3 * forward - stem_input_gradient, rel=0.01)

    unsized = yaml.safe_load(STREAMED)
    unsized["data"] = {"dataset": "imagefolder", "root": "/nonexistent", "stream": False}
    config.write_text(yaml.safe_dump(unsized))
    with pytest.raises(ConfigError, match="set data.image_size, e.g. data.image_size=224$"):
        bench(load_config(str(config), []), steps=1, warmup=0, synthetic=True)


def test_cli_bench_synthetic_prints_flops_and_mfu(tmp_path, capsys):
    """``selfsup bench --synthetic`` on a config whose data is absent: 8 px one-channel images (digits' stored shape),
    augmented as usual; the FLOPs, the rate, the peak and the slower side printed, and consistent with each other."""
    from selfsup.cli import main

    config = tmp_path / "c.yaml"
    config.write_text(TINY_RESNET)
    assert main(["bench", str(config), "--synthetic", "--steps", "2", "--warmup", "1"]) == 0
    b = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (b["data"], b["image_size"], b["channels"], b["steps"]) == ("synthetic", 8, 1, 2)
    assert b["gflops_per_step"] == pytest.approx(16 * b["gflops_per_image"], rel=1e-3)
    # achieved = the counted FLOPs of each timed step over their time (train_images_per_s is images over that time)
    assert b["tflops_per_s"] == pytest.approx(b["gflops_per_image"] * b["train_images_per_s"] / 1000, rel=1e-2)
    assert b["mfu"] == pytest.approx(b["tflops_per_s"] / b["peak_tflops"], abs=1e-3)
    assert b["peak_tflops"] > 0 and b["peak_source"] == "measured fp32 GEMM, 1 thread"
    assert b["bottleneck"] == ("augmentation" if b["augment_to_train_ratio"] < 2 else "step")
    assert b["augment_images_per_s"] > 0 and "loader_images_per_s" not in b
