"""FLOPs of a training step and the fraction of the device's peak it reaches (MFU), for ``selfsup bench``.

Counted, not estimated: :class:`torch.utils.flop_counter.FlopCounterMode` sees every matrix multiply, convolution
and attention that runs (forward, backward, no-grad teacher passes alike), at 2 FLOPs per multiply-add; element-wise
ops, normalisation, softmax and the optimiser are left out, as in the MFU figures papers report (they are a few % of
a ViT's or a ResNet's step). Counting works on the meta device too: :func:`on_meta` builds a model without memory or
initialisation, so a ViT-B/16 at 224 px is counted in a second on a laptop.

MFU = achieved FLOP/s / the device's peak for the run's precision. The peak of a known NVIDIA GPU is its datasheet's
dense figure (:data:`DATASHEET_PEAKS`); on a CPU, or a GPU not in the table, it is measured: the best of a few large
square matrix multiplies in the run's dtype with the run's threads (:func:`measure_gemm_tflops`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

__all__ = ["DATASHEET_PEAKS", "achieved_tflops", "compute_precision", "count_flops", "datasheet_peak", "device_peak",
           "measure_gemm_tflops", "on_meta"]


def _cpu_attention(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _cpu_attention_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


# FlopCounterMode counts the CUDA attention kernels (flash, memory-efficient, cuDNN) and the math fallback (bmm), but
# not the CPU's fused kernel, which F.scaled_dot_product_attention runs on CPU tensors: without these, a ViT's
# attention matmuls would count as nothing on the CPU. The formulas are torch's own for the CUDA kernels (the
# backward, as theirs, includes the recomputed scores).
_ATEN = torch.ops.aten
_CPU_ATTENTION = {op: formula for name, formula in (("_scaled_dot_product_flash_attention_for_cpu", _cpu_attention),
                                                    ("_scaled_dot_product_flash_attention_for_cpu_backward",
                                                     _cpu_attention_backward))
                  if (op := getattr(_ATEN, name, None)) is not None}


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs of the matrix multiplies, convolutions and attention that ``fn()`` runs (a forward, or a forward and
    its backward), on any device, the meta device included."""
    counter = FlopCounterMode(display=False, custom_mapping=_CPU_ATTENTION)
    with counter:
        fn()
    return counter.get_total_flops()


def on_meta(build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` with every parameter and buffer on the meta device: shapes only, no memory and no initialisation,
    for counting a real-size model's FLOPs at once (:func:`count_flops` on meta inputs). Buffers a constructor
    computes on the CPU (a ViT's sin-cos position embedding) are moved there too."""
    with torch.device("meta"):
        return build().to("meta")


# Dense peaks (no structured sparsity) in TFLOP/s, from NVIDIA's datasheets: H100 (SXM5 and PCIe), H200 (SXM) and
# A100 (SXM4 and PCIe, the same figures). bf16 / fp16 and tf32 are tensor-core peaks (the datasheets print twice these
# "with sparsity"); fp32 is the non-tensor-core figure. Matched in order against torch.cuda.get_device_name(), e.g.
# "NVIDIA H100 80GB HBM3" (SXM), "NVIDIA H100 PCIe", "NVIDIA H200", "NVIDIA A100-SXM4-80GB". NVL parts (other clocks and
# power) and every other GPU are not in the table: their peak is measured.
_H100_SXM = {"bf16": 989.0, "fp16": 989.0, "tf32": 495.0, "fp32": 67.0}
DATASHEET_PEAKS: list[tuple[str, str, dict[str, float] | None]] = [
    (r"\bNVL\b", "", None),
    (r"\bH100 PCIe\b", "NVIDIA H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0}),
    (r"\bH100\b.*\b(SXM|HBM3)\b", "NVIDIA H100 SXM", _H100_SXM),
    (r"\bH200\b", "NVIDIA H200", _H100_SXM),
    (r"\bA100\b", "NVIDIA A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
]


def compute_precision(precision: str, device: torch.device) -> str:
    """The precision the step's matmuls run in, as the peak tables name it: ``trainer.precision`` bf16-* -> bf16,
    16-mixed -> fp16; 32-true -> tf32 on a GPU where TF32 matmuls are allowed, else fp32."""
    if "bf16" in precision:
        return "bf16"
    if "16" in precision:
        return "fp16"
    if device.type == "cuda" and _tf32_matmuls():
        return "tf32"
    return "fp32"


def _tf32_matmuls() -> bool:
    setting = getattr(torch.backends.cuda.matmul, "fp32_precision", None)  # torch >= 2.9; the old flag before
    return setting == "tf32" if setting is not None else bool(torch.backends.cuda.matmul.allow_tf32)


def datasheet_peak(device_name: str, precision: str) -> tuple[float, str] | None:
    """``(TFLOP/s, source)`` of the first :data:`DATASHEET_PEAKS` entry matching ``device_name`` at ``precision``
    (one of bf16, fp16, tf32, fp32); None for a GPU not in the table."""
    for pattern, label, peaks in DATASHEET_PEAKS:
        if re.search(pattern, device_name, re.IGNORECASE):
            return None if peaks is None else (peaks[precision], f"datasheet {label} {precision} dense")
    return None


_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32, "fp32": torch.float32}


def measure_gemm_tflops(device: torch.device, dtype: torch.dtype, repeats: int = 3, min_seconds: float = 0.06,
                        max_side: int = 16384) -> float:
    """TFLOP/s of the fastest of ``repeats`` square ``n x n`` matrix multiplies in ``dtype`` on ``device`` (with the
    current threads on a CPU). ``n`` is doubled from 256 until one multiply takes ``min_seconds`` (or reaches
    ``max_side``): large enough to run at full speed, above the few milliseconds a busy machine's scheduler can steal,
    and, since the next size takes 8x as long, under 0.5 s a multiply, so the whole measurement stays well under 2 s."""

    def seconds(a: torch.Tensor, b: torch.Tensor) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    generator = torch.Generator(device).manual_seed(0)
    n = 256
    while True:
        a, b = (torch.rand(n, n, generator=generator, device=device, dtype=dtype) for _ in range(2))
        first = seconds(a, b)  # the smaller sizes before it were the warm-up (kernel selection, thread start-up)
        if first >= min_seconds or n >= max_side:
            break
        n *= 2
    best = min([first, *(seconds(a, b) for _ in range(repeats - 1))])
    return 2 * n**3 / best / 1e12


def device_peak(device: torch.device, precision: str) -> tuple[float, str]:
    """``(peak TFLOP/s, where it comes from)`` of ``device`` at ``precision`` (bf16, fp16, tf32, fp32): the
    datasheet's for a GPU in :data:`DATASHEET_PEAKS`, else measured (:func:`measure_gemm_tflops`)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        found = datasheet_peak(name, precision)
        if found is not None:
            return found
        where = f" on {name}"
    else:
        threads = torch.get_num_threads()
        where = f", {threads} thread{'s' if threads > 1 else ''}"
    return measure_gemm_tflops(device, _DTYPES[precision]), f"measured {precision} GEMM{where}"


def achieved_tflops(flops_per_step: int, steps: int, seconds: float) -> float:
    """TFLOP/s of ``steps`` steps of ``flops_per_step`` FLOPs that took ``seconds``."""
    return flops_per_step * steps / seconds / 1e12
