"""No read from the device inside a training step (issue 53): on a GPU, a value read back to the host (``.item()``,
``float(t)``, ``bool(t)``, ``.tolist()``, ``.cpu()``, an op whose output size depends on the data) makes the host wait
for the step's kernels, so it can no longer queue the next ones. Only the steps that log, monitor or save read.

There is no GPU here, so :class:`DeviceReads` follows, on the CPU, the tensors that would be on the device in a GPU run:
the method's parameters and buffers, the step's views, whatever ``.to(device)`` returns, and every tensor computed
from them (the optimiser's moments, the loss, the metrics); tensors drawn on the CPU (augmentation and mask draws,
torch's own optimiser step counters) stay host tensors, as they would on a GPU. It records every read of a followed
tensor with where it happened. Not followed: tensors made on the device from nothing (``torch.zeros(...,
device=x.device)``), whose reads it misses, and the making of the views (CPU draws, then copies to the device).
"""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
import torch
import yaml
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import selfsup.train.loop as loop
from selfsup.launch import pretrain
from selfsup.load import load_config
from selfsup.train.run_dir import RunDir

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
ATEN = torch.ops.aten
# Ops whose result needs a value on the host: a scalar read (item, float, int, bool), or an output whose size
# depends on the data (nonzero, unique, boolean masks, bincount...).
READS = {ATEN._local_scalar_dense, ATEN.is_nonzero, ATEN.equal, ATEN.allclose, ATEN.nonzero, ATEN._unique,
         ATEN._unique2, ATEN.unique_dim, ATEN.unique_consecutive, ATEN.masked_select, ATEN.bincount,
         ATEN.repeat_interleave}
BOOLEAN_INDEXING = {ATEN.index, ATEN.index_put, ATEN.index_put_, ATEN._index_put_impl_}
MARK = "_selfsup_on_device"


def on_device(tensor: object) -> bool:
    return isinstance(tensor, torch.Tensor) and getattr(tensor, MARK, False)


def mark(tensor: torch.Tensor) -> torch.Tensor:
    setattr(tensor, MARK, True)
    return tensor


class DeviceReads(TorchDispatchMode):
    """Follows device tensors (see the module's docstring) and records the reads of them while ``counting``."""

    def __init__(self) -> None:
        super().__init__()
        self.counting = False
        self.reads: list[str] = []

    def read(self, what: str) -> None:
        if self.counting:
            frames = [f for f in traceback.extract_stack() if "/selfsup/" in f.filename]
            where = " <- ".join(f"{f.filename.split('/selfsup/')[-1]}:{f.lineno}" for f in frames[::-1][:3])
            self.reads.append(f"{what} at {where}")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        inputs = [a for a in tree_flatten((args, kwargs or {}))[0] if isinstance(a, torch.Tensor)]
        followed = any(on_device(a) for a in inputs)
        indices = [a for a in tree_flatten(args[1:2])[0] if isinstance(a, torch.Tensor)]  # index ops' indices
        masked = func.overloadpacket in BOOLEAN_INDEXING and any(a.dtype in (torch.bool, torch.uint8) for a in indices)
        if followed and (func.overloadpacket in READS or masked):
            self.read(str(func))
        out = func(*args, **(kwargs or {}))
        if followed:
            for tensor in tree_flatten(out)[0]:
                if isinstance(tensor, torch.Tensor):
                    mark(tensor)
        return out


@pytest.fixture
def device_reads(monkeypatch) -> DeviceReads:
    """A :class:`DeviceReads` whose Python-level reads (``tolist``, ``numpy``, ``cpu``) are counted too, and whose
    ``.to(device)`` results are device tensors (an alias of the tensor when it is on that device already: the CPU
    original stays a host tensor)."""
    mode = DeviceReads()
    for name in ("tolist", "numpy", "cpu"):
        original = getattr(torch.Tensor, name)

        def patched(self, *args, _original=original, _name=name, **kwargs):
            if on_device(self):
                mode.read(f"Tensor.{_name}()")
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, patched)
    to = torch.Tensor.to

    def patched_to(self, *args, **kwargs):
        out = to(self, *args, **kwargs)
        if "device" in kwargs or any(isinstance(a, (str, torch.device)) for a in args):
            out = mark(out.view_as(out) if out is self else out)
        return out

    monkeypatch.setattr(torch.Tensor, "to", patched_to)
    return mode


# The instrument first: each way of reading a followed tensor is counted, a read of a host tensor is not.
DEVICE_READS = {"item": lambda y: y.sum().item(), "float": lambda y: float(y[0]), "int": lambda y: int(y.argmax()),
                "bool": lambda y: bool(y.sum() > 0), "if": lambda y: 1 if y[0] > 0 else 0,
                "tolist": lambda y: y.tolist(),
                "numpy": lambda y: y.detach().numpy(), "cpu": lambda y: y.cpu(), "mask": lambda y: y[y > 0],
                "nonzero": lambda y: y.nonzero(), "unique": lambda y: y.unique(),
                "moved": lambda y: int(torch.arange(3).to("cpu").max())}  # .to(device): on the device from there
HOST_READS = {"drawn": lambda y: int((torch.rand(5) > 0.5).sum()), "tolist": lambda y: torch.rand(5).tolist(),
              "mask": lambda y: torch.arange(4)[torch.rand(4) > 0.5], "seed": lambda y: int(torch.randint(9, ())),
              "no read": lambda y: (y * 2).detach().max()}


@pytest.mark.parametrize("device, case", [("device", k) for k in DEVICE_READS] + [("host", k) for k in HOST_READS])
def test_the_detector_counts_reads_of_device_tensors_only(device_reads, device, case) -> None:
    weight = mark(torch.nn.Parameter(torch.randn(4, 3)))
    with device_reads:
        y = weight.sum(dim=1)  # computed from a device tensor: on the device
        device_reads.counting = True
        (DEVICE_READS if device == "device" else HOST_READS)[case](y)
    assert bool(device_reads.reads) == (device == "device"), device_reads.reads


# Each method's preset on the digits at 16 px with a tiny backbone of its kind, 5 steps: a row after steps 3 and 5, no
# monitor, checkpoint or snapshot before the end. Steps 1, 2 and 4 must read nothing from the device.
METHODS = {
    "vicreg": "fashion_mnist/quickstart.yaml",  # LARS
    "barlow_twins": "fashion_mnist/barlow_twins.yaml",
    "byol": "fashion_mnist/byol.yaml",
    "nnclr": "fashion_mnist/nnclr.yaml",
    "mast": "fashion_mnist/mast.yaml",
    "msn": "fashion_mnist/msn.yaml",  # AdamW, optim.clip_grad
    "extrema": "fashion_mnist/extrema.yaml",
    "mae": "fashion_mnist/mae.yaml",
    "dino": "cifar10/laptop/dino.yaml",
    "ibot": "cifar10/laptop/ibot.yaml",
    "mocov3": "cifar10/laptop/mocov3.yaml",
    "simclr": "cifar10/laptop/simclr.yaml",
}
TINY_VIT = {"img_size": 16, "patch_size": 4, "embed_dim": 16, "depth": 2, "num_heads": 2, "mlp_ratio": 2.0}


def tiny_run(path: Path, out: Path, *overrides: str):
    """The preset with the run's settings and its backbone shrunk: a ViT to :data:`TINY_VIT` (its preset's other
    arguments kept: learned positions, class attention, pooling), a ResNet to one block of width 4; NNCLR's queue
    below the digits' 1,500 images."""
    common = ["data.dataset=digits", "data.image_size=16", "data.channels=1", "trainer.batch_size=16",
              "trainer.budget=null", "trainer.accelerator=cpu", "trainer.progress=false", "monitor.knn_every_steps=0",
              f"trainer.out={out}", *overrides]
    cfg = load_config(path, common)
    if cfg.model.backbone.startswith("vit"):
        params = {k: v for k, v in cfg.model.params.items() if not k.startswith("conv_stem")}
        tiny = yaml.safe_dump({**params, **TINY_VIT}, default_flow_style=True).strip()
        model = ["model.backbone=vit_custom", f"model.params={tiny}"]
    else:
        model = ["model.backbone=resnet_custom", "model.params={block: basic, layers: [1], width: 4, small_stem: true}"]
    return load_config(path, [*common, *model, *(["method.queue_size=128"] if cfg.method["name"] == "nnclr" else [])])


LOG_EVERY, STEPS = 3, 5


def quiet(done: int) -> bool:
    """Nothing is logged, monitored or saved after ``done`` steps of the run below."""
    return done % LOG_EVERY != 0 and done != STEPS


@pytest.mark.parametrize("name", list(METHODS))
def test_steps_that_log_nothing_read_nothing_from_the_device(name, tmp_path, monkeypatch, device_reads) -> None:
    cfg = tiny_run(CONFIGS / METHODS[name], tmp_path / "run", f"trainer.max_steps={STEPS}",
                   f"trainer.log_every_steps={LOG_EVERY}", "trainer.checkpoint_every_steps=1000",
                   "monitor.collapse_every_steps=0")
    train_step, log_step, quiet_steps = loop.train_step, RunDir.log_step, []

    def step(fabric, method, raw_method, optimizer, views, index, *args):
        for tensor in [*raw_method.parameters(), *raw_method.buffers(), *views]:
            mark(tensor)
        with device_reads:
            device_reads.counting = quiet(index + 1)
            quiet_steps.extend([index + 1] if device_reads.counting else [])
            return train_step(fabric, method, raw_method, optimizer, views, index, *args)

    def logged(run, done, *args):
        with device_reads:
            device_reads.counting = quiet(done)
            return log_step(run, done, *args)

    monkeypatch.setattr(loop, "train_step", step)
    monkeypatch.setattr(RunDir, "log_step", logged)
    monkeypatch.setattr(RunDir, "plot", lambda *args: None)  # the curves at the end: not what this test is about
    pretrain(cfg)
    assert quiet_steps == [1, 2, 4]
    assert device_reads.reads == [], f"{name}: {len(device_reads.reads)} reads, e.g. {device_reads.reads[:3]}"
