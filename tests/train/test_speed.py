"""The fast-step options (issue 53), on the CPU: TF32's settings per device and precision, the fused optimiser's
choice, ``trainer.compile`` (what it compiles, where it cannot, a compiled step equal to the eager one, checkpoints
that resume either way), and ``SELFSUP_SYNC_DEBUG``."""

from __future__ import annotations

import copy
import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import selfsup.train.loop as loop
from selfsup.checkpoint import read_backbone_meta
from selfsup.cli import main
from selfsup.config import ConfigError, OptimConfig
from selfsup.methods import build_method
from selfsup.models import build_backbone
from selfsup.models.vit import VisionTransformer
from selfsup.train import speed
from selfsup.train.optim import LARS, build_optimizer, fused_step
from tiny import tiny_yaml

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


# ------------------------------------------------------------------ TF32


@pytest.mark.parametrize("device, precision, allowed, expected", [
    (CUDA, "32-true", True, {"matmul": True, "cudnn": True}),
    (CUDA, "32-true", False, {"matmul": False, "cudnn": False}),  # the opt-out: full fp32, convolutions included
    (CUDA, "bf16-mixed", True, {}), (CUDA, "16-mixed", True, {}), (CUDA, "bf16-true", True, {}),
    (CPU, "32-true", True, {}), (CPU, "32-true", False, {}), (torch.device("mps"), "32-true", True, {}),
])
def test_tf32_only_where_fp32_is_asked_for_on_cuda(device, precision, allowed, expected) -> None:
    assert speed.tf32_settings(device, precision, allowed) == expected


def _precisions() -> tuple:
    """CUDA's two TF32 flags, then what the CPU's matmuls and convolutions follow (oneDNN's fp32 precisions and the
    global one they fall back on, all "none": full fp32), then the legacy global getter."""
    return (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            torch.backends.mkldnn.matmul.fp32_precision, torch.backends.mkldnn.conv.fp32_precision,
            torch.backends.fp32_precision, torch.get_float32_matmul_precision())


def test_tf32_is_set_for_the_run_and_put_back_and_the_cpu_is_never_touched() -> None:
    before = _precisions()
    assert before == (False, True, "none", "none", "none", "highest")  # torch's defaults
    with speed.fp32_precision(CUDA, "32-true", True):  # the flags can be set without a GPU
        # the CPU's settings unchanged (the legacy getter reports cuBLAS's flag: "high")
        assert _precisions() == (True, True, "none", "none", "none", "high")
    with speed.fp32_precision(CUDA, "32-true", False):
        assert _precisions()[:5] == (False, False, "none", "none", "none")
    assert _precisions() == before
    for device, precision in [(CPU, "32-true"), (CUDA, "bf16-mixed")]:
        with speed.fp32_precision(device, precision, True):
            assert _precisions() == before


# ------------------------------------------------------------------ fused optimiser steps


@pytest.mark.parametrize("device, precision, clip, fused", [
    (CUDA, "32-true", None, True), (CUDA, "bf16-mixed", 3.0, True), (CUDA, "16-mixed", None, True),
    (CUDA, "16-mixed", 3.0, False),  # Fabric unscales before clipping, which a fused optimiser refuses
    (CPU, "32-true", None, False), (torch.device("mps"), "32-true", None, False),
])
def test_fused_adam_on_cuda_only(device, precision, clip, fused) -> None:
    assert fused_step(device, precision, clip) is fused


@pytest.mark.parametrize("name", ["adamw", "adam"])
def test_the_fused_choice_reaches_adam_and_adamw_and_the_cpu_keeps_torchs_default(name) -> None:
    net = nn.Linear(3, 2)
    cfg = OptimConfig(name=name)
    assert all(g["fused"] for g in build_optimizer(net, cfg, None, True).param_groups)
    default = build_optimizer(net, cfg, None, False)
    assert all(g["fused"] is None and g["foreach"] is None for g in default.param_groups)  # torch decides, as before
    assert type(build_optimizer(net, OptimConfig(name="lars"), None, True)) is LARS


# ------------------------------------------------------------------ trainer.compile: where it cannot work


def _no_compiler():
    from torch._inductor.exc import InvalidCxxCompiler

    raise InvalidCxxCompiler()


@pytest.mark.parametrize("missing, device, message", [
    ("compiler", CPU, "compiling for the CPU needs a C\\+\\+ compiler"),
    ("triton", CUDA, "compiling for CUDA needs Triton"),
    ("dynamo", CPU, "torch .* cannot compile on this Python"),
])
def test_compile_where_it_cannot_work_is_a_config_error_naming_what_is_missing(monkeypatch, missing, device,
                                                                             message) -> None:
    import torch._dynamo
    import torch._inductor.cpp_builder
    import torch.utils._triton

    if missing == "compiler":
        monkeypatch.setattr(torch._inductor.cpp_builder, "get_cpp_compiler", _no_compiler)
    elif missing == "triton":
        monkeypatch.setattr(torch.utils._triton, "has_triton", lambda: False)
    else:
        monkeypatch.setattr(torch._dynamo, "is_dynamo_supported", lambda: False)
    with pytest.raises(ConfigError, match=f"trainer.compile=true: {message}.*set trainer.compile=false"):
        speed.check_compile(device)


@pytest.mark.parametrize("command", ["pretrain", "bench"])
def test_compile_on_a_machine_without_a_compiler_exits_2_before_the_data(tmp_path, monkeypatch, capsys,
                                                                         command) -> None:
    import torch._inductor.cpp_builder

    monkeypatch.setattr(torch._inductor.cpp_builder, "get_cpp_compiler", _no_compiler)
    (tmp_path / "tiny.yaml").write_text(tiny_yaml())
    code = main([command, str(tmp_path / "tiny.yaml"), f"trainer.out={tmp_path / 'run'}", "trainer.compile=true",
                 "data.dataset=cifar10", "data.root=/nonexistent"])  # data it would fail on: never reached
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and "Traceback" not in err, err[-2000:]
    assert len(errors) == 1 and "C++ compiler" in errors[0] and "trainer.compile=false" in errors[0], errors
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ trainer.compile: what it compiles


def _tiny_vit(**kwargs) -> VisionTransformer:
    return VisionTransformer(img_size=8, patch_size=4, in_channels=1, embed_dim=16, depth=2, num_heads=2, **kwargs)


def test_compile_regions_are_the_blocks_every_entry_point_passes_through() -> None:
    vit = _tiny_vit(num_class_attention_blocks=1)
    assert speed.compile_regions(vit) == [*vit.blocks, *vit.ca_blocks]
    dropping = _tiny_vit(drop_path_rate=0.1)  # a drop rate per block: their attention and MLP instead
    assert speed.compile_regions(dropping) == [dropping.blocks[0].attn, dropping.blocks[0].mlp,
                                               dropping.blocks[1].attn, dropping.blocks[1].mlp]
    resnet = build_backbone("resnet", block="basic", layers=[2, 1], width=4, small_stem=True, in_channels=1)
    assert speed.compile_regions(resnet) == [resnet.layer1[0], resnet.layer1[1], resnet.layer2[0]]
    other = nn.Linear(3, 3)
    assert speed.compile_regions(other) == [other]


def _tiny_dino() -> nn.Module:
    torch.manual_seed(0)
    spec = {"name": "dino", "out_dim": 12, "head_hidden": 16, "bottleneck": 8, "teacher_temperature_warmup": 0.0}
    return build_method(spec, _tiny_vit(pos_embed="learned"), total_steps=10).train()


def test_compile_covers_the_student_and_the_ema_teacher_in_place_keeping_the_state_dicts_names() -> None:
    eager, compiled = _tiny_dino(), _tiny_dino()
    assert speed.compile_backbones(compiled, CPU) == 4  # 2 blocks of the student, 2 of the teacher's copy
    blocks = [*compiled.encoder.blocks, *compiled.teacher.module[0].blocks]
    assert all(block._compiled_call_impl is not None for block in blocks)  # nn.Module.compile, in place
    assert list(compiled.state_dict()) == list(eager.state_dict())  # no _orig_mod. anywhere
    assert not any("_orig_mod" in name for name in compiled.state_dict())


# ------------------------------------------------------------------ trainer.compile: the same step (slow: compiles)


@pytest.fixture
def compiling():
    """Inductor points its compiled modules at a pointer through an environment variable it sets when it loads
    one; put back after the test as the process had it."""
    name = "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"
    before = os.environ.get(name)
    yield
    if before is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = before


def _loss_and_grads(method: nn.Module, views: list[torch.Tensor]) -> tuple[float, dict[str, torch.Tensor]]:
    method.zero_grad(set_to_none=True)
    out = method(views)
    out.loss.backward()
    return float(out.loss.detach()), {n: p.grad.double() for n, p in method.named_parameters() if p.grad is not None}


@pytest.mark.slow  # inductor compiles the blocks with a C++ compiler: about a minute without its cache
def test_a_compiled_step_gives_the_eager_loss_and_gradients_to_fp32_rounding(compiling) -> None:
    """DINO on a tiny ViT (student and EMA teacher compiled), one step. The reference is the eager step in float64;
    fp32 eager and fp32 compiled both differ from it by rounding (the same sums in another order, fused kernels),
    so the compiled step must be as close to it as the eager fp32 step is: within 4x the eager fp32 error, plus
    1e-6 of the tensor's largest value where that error is 0 (measured on a tiny ViT: compiled within 0.4-1.2x)."""
    eager, compiled, reference = _tiny_dino(), _tiny_dino(), _tiny_dino().double()
    speed.compile_backbones(compiled, CPU)
    g = torch.Generator().manual_seed(1)
    views = [torch.rand(4, 1, 8, 8, generator=g) for _ in range(2)]
    loss, grads = _loss_and_grads(eager, views)
    compiled_loss, compiled_grads = _loss_and_grads(compiled, views)
    reference_loss, reference_grads = _loss_and_grads(reference, [v.double() for v in views])
    assert compiled.encoder.blocks[0]._compiled_call_impl is not None
    assert grads.keys() == compiled_grads.keys() == reference_grads.keys() and len(grads) > 10
    assert abs(compiled_loss - reference_loss) <= 4 * abs(loss - reference_loss) + 1e-6 * abs(reference_loss)
    for name, exact in reference_grads.items():
        eager_error = (grads[name] - exact).abs().max()
        compiled_error = (compiled_grads[name] - exact).abs().max()
        assert compiled_error <= 4 * eager_error + 1e-6 * exact.abs().max(), name


def _interrupted(monkeypatch, at: int) -> None:
    """SIGINT during the ``at``-th optimiser step of the next run: it stops after that step with a checkpoint."""
    build = loop.build_optimizer

    def build_optimizer(*args):
        optimizer, calls = build(*args), []

        def hook(*_) -> None:
            calls.append(1)
            if len(calls) == at:
                os.kill(os.getpid(), signal.SIGINT)

        optimizer.register_step_pre_hook(hook)
        return optimizer

    monkeypatch.setattr(loop, "build_optimizer", build_optimizer)


def _form(run: Path) -> tuple:
    """What a run's files look like, its numbers aside: checkpoint keys, shapes and dtypes, the export's, its JSON."""
    ckpt = torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    model = {k: (tuple(v.shape), v.dtype) for k, v in ckpt["model"].items()}
    state = {(p, k): (tuple(v.shape), v.dtype) for p, s in ckpt["optimizer"]["state"].items() for k, v in s.items()}
    export = {k: (tuple(v.shape), v.dtype) for k, v in load_file(run / "backbone.safetensors").items()}
    meta = {k: v for k, v in read_backbone_meta(run).items() if k not in ("train_time_s", "cpu_time_s")}
    return ckpt["step"], model, state, export, meta


@pytest.mark.slow  # compiles a ResNet's blocks: about a minute without inductor's cache
def test_compiled_and_eager_runs_resume_each_other_and_export_the_same_files(tmp_path, monkeypatch,
                                                                            compiling) -> None:
    (tmp_path / "tiny.yaml").write_text(tiny_yaml(trainer={"max_steps": 4, "checkpoint_every_steps": 100,
                                                           "log_every_steps": 1, "accelerator": "cpu"}))
    config, build = str(tmp_path / "tiny.yaml"), loop.build_optimizer
    assert main(["pretrain", config, f"trainer.out={tmp_path / 'eager'}"]) == 0
    for first, then in [("true", "false"), ("false", "true")]:
        run = tmp_path / f"compile_{first}_then_{then}"
        _interrupted(monkeypatch, at=2)
        assert main(["pretrain", config, f"trainer.out={run}", f"trainer.compile={first}"]) == 130  # SIGINT
        monkeypatch.setattr(loop, "build_optimizer", build)
        assert torch.load(run / "checkpoints" / "last.pt", weights_only=True)["step"] == 2
        assert main(["pretrain", str(run), f"trainer.compile={then}"]) == 0  # a resumable change, recorded
        assert f"trainer.compile: {first.title()} -> {then.title()}" in (run / "config_changes.log").read_text()
        assert _form(run) == _form(tmp_path / "eager")
        reference = load_file(tmp_path / "eager" / "backbone.safetensors")
        for name, value in load_file(run / "backbone.safetensors").items():  # fp32 rounding apart, the same weights
            torch.testing.assert_close(value, reference[name], rtol=1e-3, atol=1e-4)


# ------------------------------------------------------------------ SELFSUP_SYNC_DEBUG


@pytest.mark.parametrize("value, device, mode", [(None, CUDA, None), ("", CUDA, None), ("warn", CUDA, "warn"),
                                                 ("ERROR", CUDA, "error"), ("0", CUDA, None),
                                                 ("warn", CPU, None)])  # torch.cuda's mode: CUDA only
def test_sync_debug_is_opt_in_by_environment_on_cuda(monkeypatch, value, device, mode) -> None:
    if value is None:
        monkeypatch.delenv(speed.SYNC_DEBUG, raising=False)
    else:
        monkeypatch.setenv(speed.SYNC_DEBUG, value)
    assert speed.sync_debug_mode(device) == mode


def test_a_bad_sync_debug_value_is_a_config_error(monkeypatch) -> None:
    monkeypatch.setenv(speed.SYNC_DEBUG, "loud")
    with pytest.raises(ConfigError, match="SELFSUP_SYNC_DEBUG='loud': use warn or error"):
        speed.sync_debug_mode(CPU)


def test_the_loop_debugs_syncs_in_the_steps_that_log_and_save_nothing(tmp_path, monkeypatch) -> None:
    """With the switch on, each step (views, step, bookkeeping) runs in torch.cuda's sync debug mode, except those
    after which a row is logged, a monitor runs, a checkpoint or a snapshot is written (they read on purpose)."""
    import contextlib

    modes: list[str | None] = []

    @contextlib.contextmanager
    def recorded(mode):
        modes.append(mode)
        yield

    monkeypatch.setattr(loop, "sync_debug_mode", lambda device: "warn")
    monkeypatch.setattr(loop, "sync_debug", recorded)
    (tmp_path / "tiny.yaml").write_text(tiny_yaml(trainer={"max_steps": 9, "log_every_steps": 4,
                                                           "checkpoint_every_steps": 6, "export_every_steps": 7},
                                                  monitor={"collapse_every_steps": 5, "knn_every_steps": 0}))
    assert main(["pretrain", str(tmp_path / "tiny.yaml"), f"trainer.out={tmp_path / 'run'}"]) == 0
    quiet = [step for step, mode in enumerate(modes, start=1) if mode == "warn"]
    # rows after steps 4, 8 and 9 (the last), the collapse monitor after 5, a checkpoint after 6, a snapshot after 7
    assert len(modes) == 9 and quiet == [1, 2, 3]
