"""Typed run configuration: YAML files + ``key=value`` overrides, validated before any work.

A config is a tree of dataclasses. Every leaf has a type (and, for choices, a ``Literal``), so an
unknown key or a bad value fails at load time with a message naming the key and what is allowed.
Method-, backbone- and view-specific parameters live in free-form mappings that are validated by
the component that owns them (``selfsup.methods``, ``selfsup.models``, ``selfsup.data.augment``),
also before training starts. This module imports none of them: :func:`selfsup.load.load_config`, what callers use,
reads a config here (:func:`read_config`) and checks its method sections with :mod:`selfsup.methods`.

A YAML file may start with ``_base_: other.yaml`` (a path relative to the file, or a list of
paths) to compose presets; later files and overrides win, mappings merge key by key.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import math
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml

from selfsup.atomic import atomic_write


class ConfigError(ValueError):
    """A configuration key or value is invalid; the message names it and what is allowed."""


# ----------------------------------------------------------------------------------------------
# Allowed values, declared with each field's type and enforced by one validator (:func:`from_dict`)


@dataclass(frozen=True)
class Range:
    """The values a numeric field allows, declared where the field is: ``lr: Annotated[float, Range(gt=0)]``.

    :func:`from_dict` checks every field's range when a config is loaded or coerced (``load_config``: pretrain,
    resume, bench; ``run_config``: eval; ``method_config``: the method sections), so a bad value fails with a
    message naming the key and the range before any work. Floats must also be finite (nan and inf never pass).
    """

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    example: str = ""  # shown after the range, e.g. "0.001"

    def allows(self, value: float) -> bool:
        return ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt))

    def describe(self, kind: str = "a number") -> str:
        """E.g. ``"a number in (0, 1), e.g. 0.1"`` (``kind``: "a number" or "an integer")."""
        def num(x: float) -> str:
            return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"

        low = f"[{num(self.ge)}" if self.ge is not None else f"({num(self.gt)}" if self.gt is not None else None
        high = f"{num(self.le)}]" if self.le is not None else f"{num(self.lt)})" if self.lt is not None else None
        if low and high:
            text = f"{kind} in {low}, {high}"
        elif low:
            text = f"{kind} {'>=' if self.ge is not None else '>'} {low[1:]}"
        elif high:
            text = f"{kind} {'<=' if self.le is not None else '<'} {high[:-1]}"
        else:
            text = f"{kind} (finite)"
        return text + (f", e.g. {self.example}" if self.example else "")


@dataclass(frozen=True)
class NonEmpty:
    """A list or string field that needs at least one element: ``Annotated[list[int], NonEmpty()]``."""

    example: str = ""


# The common ranges, by name. Fields with another range, or an example in the message, spell out their Range.
# Every numeric field has both bounds: counts stop at 2**31 - 1, other magnitudes (rates, weights, decays) at 1e6, far
# beyond any value that trains, so that a typo (1e300) is refused on load instead of diverging or allocating.
MAX_COUNT = 2**31 - 1
MAX_MAGNITUDE = 1e6
PositiveInt = Annotated[int, Range(ge=1, le=MAX_COUNT)]
NonNegativeInt = Annotated[int, Range(ge=0, le=MAX_COUNT)]
Positive = Annotated[float, Range(gt=0, le=MAX_MAGNITUDE)]
NonNegative = Annotated[float, Range(ge=0, le=MAX_MAGNITUDE)]
Real = Annotated[float, Range(ge=-MAX_MAGNITUDE, le=MAX_MAGNITUDE)]
Probability = Annotated[float, Range(ge=0, le=1)]
Seed = Annotated[int, Range(ge=0, le=2**31 - 1)]
Width = Annotated[int, Range(ge=1, le=2**20)]  # a layer width or embedding size (sized for memory)
Widths = Annotated[list[Width], NonEmpty()]
ImageSide = Annotated[int, Range(ge=1, le=8192)]  # an image's or a view's side in pixels
Depth = Annotated[int, Range(ge=1, le=1000)]  # blocks in a network or a stage, attention heads
Momentum = Annotated[float, Range(ge=0, le=1, example="0.996")]
Temperature = Annotated[float, Range(gt=0, le=100, example="0.1")]
# A run's length: far beyond any real run (ImageNet, 800 epochs of 256: 4e6 steps), small enough that the per-step
# schedules (float64, times optim.schedule_stretch) fit in memory. Evaluation's repeat counts are bounded likewise,
# so that a typo (1e12) is refused instead of running for ever.
MAX_STEPS = 10**7
Repeats = Annotated[int, Range(ge=1, le=10_000)]


@dataclass
class DataConfig:
    dataset: str = "fashion_mnist"
    root: str | None = None
    train_split: str = "train"
    # The split evaluation tests on. auto: val, else test, else a stratified hold-out of the labelled images
    # (selfsup.data.datasets.resolve_eval_split, fraction AUTO_HOLDOUT = 0.2); eval.holdout set wins. Runs saved
    # before auto existed store test, and evaluate as before.
    eval_split: Annotated[str, NonEmpty(example="auto, val or test")] = "auto"
    # Labels of an imagefolder as a CSV of path,label rows (header optional; paths relative to data.root, or
    # absolute; labels are class names). They label a subset of the folder's images: pretraining still reads every
    # image, evaluation (and the kNN monitor) the labelled ones (selfsup.data.formats.label_csv).
    labels: Annotated[str, NonEmpty(example="labels.csv")] | None = None
    image_size: ImageSide | None = None  # None keeps the stored size
    channels: Literal[1, 3] | None = None  # None keeps the stored channels
    fraction: Annotated[float, Range(gt=0, le=1)] = 1.0  # seeded subset of the pretraining split
    fraction_seed: Seed = 0
    mean: Annotated[list[Real], NonEmpty()] | None = None  # per-channel normalisation; None = measured on the data
    std: Annotated[list[Positive], NonEmpty()] | None = None
    # Image folders and shards: decode them into memory (false), or stream them from the files with the crops
    # taken at full resolution in loader workers (true); auto streams when the decoded split would pass 4 GiB.
    stream: bool | Literal["auto"] = "auto"
    # streaming loader processes; null = one per CPU core, at most 8
    num_workers: Annotated[int, Range(ge=0, le=256)] | None = None
    # Shards whose tar holds fewer samples than index.json lists (a copy cut short) are an error naming the shard
    # (null or false); true reads what is there and warns with the number of samples lost. (null, not false, is
    # the default so that runs saved before this key existed still resume: their config has no such key.)
    allow_incomplete_shards: bool | None = None

    def __post_init__(self) -> None:
        if self.labels is not None and self.dataset != "imagefolder":
            raise ConfigError(f"data.labels={self.labels} labels the images of a folder, but data.dataset is "
                              f"{self.dataset}; set data.dataset=imagefolder (data.root: the folder), or set "
                              f"data.labels=null ({self.dataset} has its own labels)")


@dataclass
class ViewConfig:
    """``num`` crops made with one augmentation preset (plus overrides) at ``size`` pixels."""

    preset: str = "simclr"
    num: Annotated[int, Range(ge=1, le=256)] = 1
    size: ImageSide | None = None  # None = data.image_size (or the stored size)
    params: dict[str, Any] = field(default_factory=dict)
    # The crop and flip drawn once per image and shared by the num views, which differ in colour only
    # (ExtreMA's "shared crop + colour", Wu et al. Sec. 5.1).
    shared_crop: bool = False


@dataclass
class ModelConfig:
    backbone: str = "resnet18"
    params: dict[str, Any] = field(default_factory=dict)
    # Frozen part of the trained encoder: k = the stem and the first k ViT blocks (MAE-CT's contrastive tuning
    # freezes the lower half); all = every encoder parameter (MAE-CT's head initialisation). No gradients, no
    # optimiser state, frozen blocks in eval mode.
    freeze: Annotated[int, Range(ge=0, le=1000)] | Literal["all"] | None = None
    # Start the backbone from these weights (.safetensors, .pth, .pt, .bin): torchvision's ResNet or timm's ViT names,
    # or a selfsup export; read when the run starts, not on a resume (selfsup.models.weights).
    init_weights: str | None = None


@dataclass
class OptimConfig:
    name: Literal["adamw", "adam", "sgd", "lars"] = "adamw"
    # base learning rate, scaled by batch_size / 256 when lr_scaling == "linear"
    lr: Annotated[float, Range(gt=0, le=MAX_MAGNITUDE, example="0.001")] = 1e-3
    lr_scaling: Literal["none", "linear"] = "none"
    min_lr: NonNegative = 0.0
    warmup_epochs: NonNegative = 0.0
    # warm-up as a fraction of the run's steps (instead of warmup_epochs)
    warmup_fraction: Annotated[float, Range(ge=0, lt=1, example="0.05")] | None = None
    schedule: Literal["cosine", "constant"] = "cosine"
    weight_decay: NonNegative = 1e-6
    weight_decay_end: NonNegative | None = None  # cosine weight-decay schedule end value (MSN 0.04 -> 0.4)
    # lr and wd schedules computed over stretch x steps and cut (MSN code: 1.25)
    schedule_stretch: Annotated[float, Range(ge=1, le=4, example="1.25 (MSN's code)")] = 1.0
    betas: list[Annotated[float, Range(ge=0, lt=1)]] = field(default_factory=lambda: [0.9, 0.999])
    momentum: Probability = 0.9  # SGD and LARS
    lars_eta: Positive = 0.02
    clip_grad: Positive | None = None
    # Layer-wise lr decay (BEiT; MAE-CT 0.65): encoder block i of L gets lr * decay^(L - i) (0-indexed), the
    # stem decay^(L + 1), what follows the blocks (final norm) and the heads lr. 1 = off.
    layer_decay: Annotated[float, Range(gt=0, le=1, example="0.65")] = 1.0
    head_lr: Positive | None = None  # lr of the parameters outside the encoder (heads); null = optim.lr
    head_weight_decay: NonNegative | None = None  # their weight decay (MAE-CT 1e-5 against 0.05); null = optim.weight_decay

    def __post_init__(self) -> None:
        if len(self.betas) != 2:
            raise ConfigError(f"bad value for optim.betas: {self.betas!r}; use two numbers in [0, 1), e.g. [0.9, 0.999]")
        if self.warmup_fraction is not None and self.warmup_epochs:
            raise ConfigError("optim.warmup_fraction and optim.warmup_epochs are both set; keep one of them "
                              "(warmup_epochs=0 to use the fraction)")
        if self.min_lr > self.lr:
            raise ConfigError(f"bad value for optim.min_lr: {self.min_lr}; the cosine ends at min_lr, so it must not "
                              f"exceed optim.lr ({self.lr}); use e.g. optim.min_lr=0")


_DURATION_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(sec|min|hr|s|m|h|d)")
MAX_BUDGET_S = 366 * 86400


def parse_duration(text: str) -> float:
    """``trainer.budget``: ``"30min"``, ``"2h"``, ``"90s"``, ``"1h30min"``, ``"1.5h"`` -> seconds (a ConfigError for
    anything else, or for more than a year)."""
    compact = str(text).strip().lower().replace(" ", "")
    parts = _DURATION_PART.findall(compact)
    if not compact or "".join(f"{n}{u}" for n, u in parts) != compact:
        raise ConfigError(f"bad value for trainer.budget: {text!r}; use a duration such as 30min, 2h, 90s or 1h30min")
    seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    if not 0 < seconds <= MAX_BUDGET_S:
        raise ConfigError(f"bad value for trainer.budget: {text!r}; use a positive duration of at most a year, "
                          f"such as 30min")
    return seconds


@dataclass
class TrainerConfig:
    out: Annotated[str, NonEmpty(example="runs/my_run")] = "runs/default"  # '' would write the run into the cwd
    epochs: Annotated[float, Range(ge=0, le=100_000)] = 10.0
    # overrides epochs when set; 0 exports the initial backbone
    max_steps: Annotated[int, Range(ge=0, le=MAX_STEPS)] | None = None
    # Train for this long instead (30min, 2h, 1h30min): the step is timed on this machine first and the run is sized
    # to what the rest buys (selfsup.train.budget); replaces epochs / max_steps (in stages they weight the shares)
    budget: Annotated[str, NonEmpty(example="30min")] | None = None
    # global batch (images); each process gets batch_size / world_size
    batch_size: Annotated[int, Range(ge=2, le=MAX_COUNT, example="256")] = 256
    accelerator: Literal["auto", "cpu", "cuda", "gpu", "mps"] = "auto"
    devices: Annotated[int, Range(ge=1, le=1024)] = 1
    num_nodes: Annotated[int, Range(ge=1, le=65536)] = 1
    strategy: Literal["auto", "ddp", "ddp_spawn"] = "auto"
    precision: Literal["32-true", "bf16-mixed", "16-mixed", "bf16-true"] = "32-true"
    sync_batchnorm: bool = True  # convert BatchNorm to SyncBatchNorm when world size > 1
    channels_last: bool = True  # NHWC memory format: 2-4x faster convolutions on CPU (oneDNN)
    # torch.compile the backbones the step runs (the student's, an EMA teacher's), block by block: a ViT's blocks, a
    # ResNet's residual blocks, any other backbone whole; in place, so checkpoints, exports and resumes keep the same
    # names. The first steps compile (tens of seconds); needs Triton on CUDA, a C++ compiler on the CPU
    # (selfsup.train.speed).
    compile: bool = False
    # With precision 32-true on CUDA: matmuls and convolutions in TF32 (fp32 range, 10-bit mantissa), as the DINOv2
    # scripts allow; false keeps them in full fp32. No effect on other devices or precisions.
    tf32: bool = True
    seed: Seed = 0
    # torch intra-op threads on CPU; None = torch default
    num_threads: Annotated[int, Range(ge=1, le=1024)] | None = None
    log_every_steps: PositiveInt = 20
    checkpoint_every_steps: PositiveInt = 200
    export_every_steps: NonNegativeInt = 0  # also export the backbone to snapshots/step_NNNNNN/ every N steps (0 = off)
    progress: bool = True
    # Experiment loggers: csv (metrics.csv, always written), tensorboard, wandb (offline), mlflow (local file store);
    # each but csv needs its extra: pip install 'selfsup[tensorboard]' (see selfsup.train.loggers)
    loggers: list[str] = field(default_factory=lambda: ["csv"])

    def __post_init__(self) -> None:
        if self.batch_size % (self.devices * self.num_nodes):
            raise ConfigError(f"bad value for trainer.batch_size: {self.batch_size}; the global batch must be divisible "
                              f"by the {self.devices * self.num_nodes} processes (trainer.devices x trainer.num_nodes)")
        if self.budget is not None:
            parse_duration(self.budget)
        if self.max_steps is None and not self.epochs > 0:
            raise ConfigError(f"bad value for trainer.epochs: {self.epochs}; use a positive number (or set "
                              f"trainer.max_steps)")


@dataclass
class MonitorConfig:
    knn_every_steps: NonNegativeInt = 0  # 0 disables the online kNN monitor
    knn_train_size: PositiveInt = 5000
    knn_test_size: PositiveInt = 1000
    knn_k: PositiveInt = 20
    knn_temperature: Temperature = 0.07
    collapse_every_steps: NonNegativeInt = 100  # per-dimension std and effective rank of the embeddings


@dataclass
class EvalConfig:
    batch_size: PositiveInt = 512
    knn_k: PositiveInt = 20
    knn_temperature: Temperature = 0.07
    # Also report knn200_top1: the same weighted kNN at k = 200, T = 0.1, as lightly's benchmark tables do (from the
    # same similarities, so nearly free; left out, with a log line, on 200 labelled training images or fewer);
    # false: knn_top1 / knn_top5 only.
    knn_lightly: bool = True
    linear_epochs: Repeats = 30
    # ...or this many Adam steps, whichever is more: a few hundred labels give a few steps per pass (issue 52)
    linear_min_steps: Annotated[int, Range(ge=0, le=10**7, example="5000")] = 5000
    linear_lrs: Annotated[list[Positive], NonEmpty()] = field(default_factory=lambda: [1e-3, 3e-3, 1e-2])
    linear_weight_decays: Annotated[list[NonNegative], NonEmpty()] = field(default_factory=lambda: [0.0, 1e-4])
    # Features averaged over 1 clean + (n - 1) views augmented with views.0's preset (Ghosh et al. 2024: 16).
    linear_views: Annotated[int, Range(ge=1, le=1024)] = 1
    linear_label_smoothing: Annotated[float, Range(ge=0, lt=1)] = 0.0  # Ghosh et al. 2024's probe: 0.1
    lowshot_shots: list[PositiveInt] = field(default_factory=lambda: [1, 2, 5, 10])
    lowshot_percents: list[Annotated[float, Range(gt=0, le=100, example="1.0 (1 %)")]] = field(default_factory=lambda: [1.0])
    lowshot_splits: Annotated[int, Range(ge=1, le=100)] = 3
    cluster_n_init: Annotated[int, Range(ge=1, le=1000)] = 3
    # Fine-tuning (selfsup eval finetune): AdamW, warm-up (a fraction of the steps) + cosine, layer-wise lr decay,
    # label smoothing, drop path (ViTs), the run's views.0 augmentation; on all the labels, a fraction of each class
    # (MAE / ExtreMA: 0.01, 0.1) or a number per class.
    finetune_epochs: Repeats = 10
    finetune_batch_size: PositiveInt = 128
    finetune_lr: Annotated[float, Range(gt=0, le=10, example="0.001")] = 1.0e-3
    finetune_layer_decay: Annotated[float, Range(gt=0, le=1, example="0.65")] = 0.65
    finetune_weight_decay: NonNegative = 0.05
    finetune_warmup: Annotated[float, Range(ge=0, lt=1)] = 0.1
    finetune_label_smoothing: Annotated[float, Range(ge=0, lt=1)] = 0.1
    finetune_drop_path: Annotated[float, Range(ge=0, lt=1)] = 0.1
    finetune_fraction: Annotated[float, Range(gt=0, le=1)] = 1.0
    finetune_per_class: PositiveInt | None = None
    seed: Seed = 0
    # Model selection without the test set: hold out this class-stratified, seeded fraction of the labelled
    # training split and evaluate on it instead of data.eval_split (the rest is the labelled training set).
    holdout: Annotated[float, Range(gt=0, lt=1, example="0.1, or null to evaluate on data.eval_split")] | None = None

    def __post_init__(self) -> None:
        if not self.lowshot_shots and not self.lowshot_percents:
            raise ConfigError("eval.lowshot_shots and eval.lowshot_percents are both empty; give at least one, "
                              "e.g. eval.lowshot_shots=[1,2,5]")


@dataclass
class Config:
    method: dict[str, Any] = field(default_factory=lambda: {"name": "vicreg"})
    data: DataConfig = field(default_factory=DataConfig)
    views: list[ViewConfig] = field(default_factory=lambda: [ViewConfig(), ViewConfig()])
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    # Stages run one after the other into one run directory (MAE-CT: MAE, head initialisation, contrastive
    # tuning). Each is ``{name: ..., <overrides of the sections above>}``, e.g. ``{name: ct, method: {...},
    # model: {freeze: 2}, optim: {lr: 1e-4}, trainer: {epochs: 2}}``, plus an optional ``init_from: RUN_DIR``
    # (start from that run's weights instead of the previous stage's). Empty: one stage, the config itself.
    stages: list[dict[str, Any]] = field(default_factory=list)
    # Not a config key (never read from YAML, never saved): what readers derive from the sections above, made once
    # and handed down with the config (see :func:`derived`).
    derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False, metadata={"yaml": False})

    def __post_init__(self) -> None:
        self.derived = dict(self.derived)  # a copy's own (``dataclasses.replace`` starts it from the original's)


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """A config dataclass's field types with their ranges (``Annotated`` kept)."""
    return typing.get_type_hints(cls, include_extras=True)


def check_fields(obj: Any, prefix: str) -> None:
    """Check each field of the flat config dataclass ``obj`` against its declared type and range, as
    :func:`from_dict` does on load, and store the coerced value (an int given for a float, a list for a tuple); call
    it from ``__post_init__`` so a config built in Python is checked too (``MSNConfig(momentum=2)``)."""
    hints = _type_hints(type(obj))
    for f in dataclasses.fields(obj):
        object.__setattr__(obj, f.name, _coerce(hints[f.name], getattr(obj, f.name), f"{prefix}{f.name}"))


def check_arguments(fn: Callable[..., Any], kwargs: dict[str, Any], prefix: str) -> None:
    """Check keyword arguments for ``fn`` (a class or a function) against its signature: each name must be one of its
    parameters, each value its annotated type and range (``width: Annotated[int, Range(ge=1)]``), as config fields
    are; so free-form constructor arguments (``model.params``) fail on load with the key and what it allows."""
    signature = inspect.signature(fn)
    try:
        signature.bind_partial(**kwargs)
    except TypeError as err:
        names = [n for n, p in signature.parameters.items() if p.kind is not p.VAR_KEYWORD]
        raise ConfigError(f"{prefix.rstrip('.')}: {err}; allowed keys: {', '.join(names)}") from None
    hints = typing.get_type_hints(fn.__init__ if isinstance(fn, type) else fn, include_extras=True)
    for name, value in kwargs.items():
        if name in hints:
            _coerce(hints[name], value, f"{prefix}{name}")


# ----------------------------------------------------------------------------------------------
# Loading, merging, overrides


# libyaml's parser where PyYAML was built with it (same safe constructors, ~10x faster on a resolved config.yaml).
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML config, resolving ``_base_`` presets recursively (relative to the file)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path} (pass the path to a YAML file, e.g. configs/fashion_mnist/quickstart.yaml)")
    try:
        raw = yaml.load(path.read_text(), Loader=_YAML_LOADER) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {err}") from err
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level, not {type(raw).__name__}")
    bases = raw.pop("_base_", [])
    merged: dict[str, Any] = {}
    for base in [bases] if isinstance(bases, str) else bases:
        merged = deep_merge(merged, load_yaml(path.parent / base))
    return deep_merge(merged, raw)


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; any other value (lists included) replaces the old one.

    A mapping whose ``name`` changes (e.g. ``method: {name: byol}`` over ``method: {name: vicreg, ...}``)
    replaces the old mapping: the old parameters belong to another component. Likewise a ``backbone`` that changes
    (``model.backbone=resnet50`` over a preset's ``resnet``) drops the old backbone's ``params``.
    """
    out = dict(base)
    if "backbone" in update and update["backbone"] != base.get("backbone"):
        out.pop("params", None)
    for key, value in update.items():
        old = out.get(key)
        if isinstance(value, dict) and isinstance(old, dict) and value.get("name", old.get("name")) == old.get("name"):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """Turn ``["optim.lr=0.1", "views.0.num=4"]`` into a nested mapping (values parsed as YAML)."""
    tree: dict[str, Any] = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. optim.lr=0.01)")
        try:
            value = yaml.safe_load(text) if text else None
        except yaml.YAMLError:
            value = text
        node = tree
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r} conflicts with an earlier override of {part!r}")
        node[parts[-1]] = value
    return tree


def merge_indexed(items: list[Any], update: dict[str, Any], section: str, views: list[Any]) -> list[Any]:
    """``section.<i>.<key>=value`` overrides of a list section (``views``, ``stages``): element ``i`` (a stage may
    also be named) is edited key by key. A stage's ``views.<j>`` edits that stage's views, or the run's ``views``
    that a stage without its own inherits."""
    what = "view specs" if section.endswith("views") else "stages"
    if not isinstance(items, list):
        raise ConfigError(f"{section} in the YAML is {items!r}; give a list of {what} (mappings) to edit")
    items = [dict(v) if isinstance(v, dict) else v for v in items]
    names = [v.get("name") if isinstance(v, dict) else None for v in items]
    for key, change in update.items():
        index = int(key) if str(key).isdigit() else names.index(key) if key in names else -1
        if not 0 <= index < len(items):
            if not items:
                raise ConfigError(f"{section}.{key}: the config has no {section} to edit; give the list in the YAML")
            named = f" or a stage's name ({', '.join(map(str, names))})" if what == "stages" else ""
            raise ConfigError(f"{section}.{key}: there are {len(items)} {what}; use an index in "
                              f"0..{len(items) - 1}{named}")
        if not isinstance(change, dict):
            raise ConfigError(f"{section}.{key} must be overridden key by key, e.g. "
                              f"{section}.{key}.{'num=2' if section.endswith('views') else 'trainer.max_steps=100'}")
        if not isinstance(items[index], dict):
            raise ConfigError(f"{section}.{key} in the YAML is {items[index]!r}; each of the {what} is a mapping "
                              f"(e.g. {'size: 32' if what == 'view specs' else 'name: ct'}) before it can be edited")
        if section == "stages" and isinstance(change.get("views"), dict):
            change = {**change, "views": merge_indexed(items[index].get("views") or views, change["views"],
                                                      f"stages.{key}.views", views)}
        items[index] = deep_merge(items[index], change)
    return items


def read_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read YAML (or the defaults), apply ``key=value`` overrides and validate every section but the method's own
    parameters; :func:`selfsup.load.load_config` (what callers use) checks those too (the methods import this module,
    so this module does not import them)."""
    raw = load_yaml(path) if path is not None else {}
    tree = parse_overrides(overrides or [])
    views = raw.get("views", [dataclasses.asdict(v) for v in Config().views])
    if isinstance(tree.get("views"), dict):  # views.<i>.<key>=value edits one view spec
        tree["views"] = merge_indexed(views, tree["views"], "views", views)
    if isinstance(tree.get("stages"), dict):  # stages.<i or name>.<key>=value edits one stage
        tree["stages"] = merge_indexed(raw.get("stages") or [], tree["stages"], "stages", views)
    return from_dict(Config, deep_merge(raw, tree))


T = typing.TypeVar("T")


def derived(cfg: Config, key: str, source: Any, make: Callable[[], T]) -> T:
    """``make()``, made once per config and kept in ``cfg.derived[key]`` while ``source`` (the part of ``cfg`` it is
    made from) stays equal to what it was made from; so what a run derives from its config (the method section's
    typed config, the stages' configs) is handed down with the config instead of being made again by every reader."""
    kept = cfg.derived.get(key)
    if kept is not None and kept[0] == source:
        return kept[1]
    value = make()
    cfg.derived[key] = (copy.deepcopy(source), value)
    return value


def from_dict(cls: type, data: Any, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, checking keys and value types recursively."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'} must be a mapping, got {data!r}")
    hints = _type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.metadata.get("yaml", True)]
    kwargs = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if key not in names:
            raise ConfigError(f"unknown config key {path!r}; allowed keys here: {', '.join(names)}")
        kwargs[key] = _coerce(hints[key], value, path)
    return cls(**kwargs)


class _BadValue(ConfigError):
    """A value of the wrong type or out of range; ``allowed`` says what the field takes."""

    def __init__(self, path: str, value: Any, allowed: str, wrong_type: bool = False) -> None:
        super().__init__(f"bad value for {path}: {value!r}; {allowed}")
        self.path, self.allowed, self.wrong_type = path, allowed, wrong_type


def _coerce(tp: Any, value: Any, path: str) -> Any:
    """``value`` as type ``tp`` (dataclasses recursively), checking each declared :class:`Range` / :class:`NonEmpty`."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Annotated:
        value = _coerce(args[0], value, path)
        for rule in args[1:]:
            if isinstance(rule, Range) and not rule.allows(value):
                raise _BadValue(path, value, f"use {rule.describe('an integer' if args[0] is int else 'a number')}")
            if isinstance(rule, NonEmpty) and not value:
                kind = "a non-empty string" if isinstance(value, str) else "a list of at least one element"
                raise _BadValue(path, value, f"use {kind}" + (f", e.g. {rule.example}" if rule.example else ""))
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(arg, value, path)
            except ConfigError as err:
                errors.append(err)
        fitting = [e for e in errors if not getattr(e, "wrong_type", False)]
        if len(errors) == 1 or len(fitting) == 1:  # the one type the value has says what is wrong with it
            error = fitting[0] if fitting else errors[0]
            if isinstance(error, _BadValue) and error.path == path and type(None) in args:
                raise _BadValue(path, value, f"{error.allowed}, or null", error.wrong_type)
            raise error
        if all(isinstance(e, _BadValue) and e.path == path for e in errors):  # one message: what each type allows
            allowed = "; or ".join(e.allowed for e in errors) + (", or null" if type(None) in args else "")
            raise _BadValue(path, value, allowed)
        raise ConfigError(f"bad value for {path}: {value!r} ({'; '.join(map(str, errors))})")
    if origin is Literal:
        if not any(value == a and type(value) is type(a) for a in args):  # True is not 1, 1.0 is not 1
            raise _BadValue(path, value, f"allowed values: {', '.join(map(str, args))}", wrong_type=True)
        return value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, prefix=f"{path}.")
    if origin is list:
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list):
            raise _BadValue(path, value, "use a list, e.g. [1, 2]", wrong_type=True)
        return [_coerce(args[0], v, f"{path}.{i}") for i, v in enumerate(value)]
    if origin is tuple:  # tuple[float, float] (a fixed length) or tuple[float, ...]
        if not isinstance(value, (list, tuple)) or (Ellipsis not in args and len(value) != len(args)):
            kind = "a list of numbers, e.g. [0.5]" if Ellipsis in args else f"a list of {len(args)} numbers, e.g. " \
                + str([round(0.5 * (i + 1), 1) for i in range(len(args))])
            raise _BadValue(path, value, f"use {kind}", wrong_type=True)
        kinds = [args[0]] * len(value) if Ellipsis in args else args
        return tuple(_coerce(kind, v, f"{path}.{i}") for i, (kind, v) in enumerate(zip(kinds, value)))
    if origin is dict:
        if not isinstance(value, dict):
            raise _BadValue(path, value, "use a mapping, e.g. {key: value}", wrong_type=True)
        return dict(value)
    if tp is Any:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            value = float(value)
        except OverflowError:  # an integer beyond float's range
            raise _BadValue(path, value, "use a finite number") from None
    if tp is float and isinstance(value, str):  # YAML 1.1 reads "1e-4" as a string
        try:
            value = float(value)
        except ValueError:
            pass
    if tp in (int, float) and isinstance(value, bool) or not isinstance(value, tp):
        kinds = {float: "a number", int: "an integer", bool: "true or false", str: "a string"}
        raise _BadValue(path, value, f"use {kinds.get(tp, tp.__name__)}", wrong_type=True)
    if tp is float and not math.isfinite(value):
        raise _BadValue(path, value, "use a finite number")
    return value


# Trainer keys that one stage cannot change: the processes, their fp32 precision and the run directory are the
# whole run's.
_RUN_WIDE = ("out", "accelerator", "devices", "num_nodes", "strategy", "precision", "tf32", "budget")


@dataclass
class Stage:
    name: str
    cfg: Config  # the run's config with the stage's overrides, trainer.out = RUN_DIR/stages/<i>_<name>
    init_from: str | None = None


def stage_configs(cfg: Config) -> list[Stage]:
    """The stages of a staged config, each a full validated :class:`Config` (``stages: []`` gives none); made once
    per config (every reader gets the same stage configs, and what is derived from them)."""
    whole = to_dict(cfg)
    return list(derived(cfg, "stages", whole, lambda: _make_stages(cfg, whole)))


def _make_stages(cfg: Config, whole: dict[str, Any]) -> list[Stage]:
    base = {k: v for k, v in whole.items() if k != "stages"}
    stages, names = [], set()
    for i, spec in enumerate(cfg.stages, start=1):
        where = f"stages.{i - 1}"
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) \
                or not re.fullmatch(r"[A-Za-z0-9_-]+", spec["name"]) or spec["name"] in names:
            raise ConfigError(f"{where} needs a unique name of letters, digits, _ or - (e.g. name: mae), got "
                              f"{spec.get('name') if isinstance(spec, dict) else spec!r}")
        overrides = {k: v for k, v in spec.items() if k not in ("name", "init_from")}
        for key in overrides:
            if key not in base or key == "eval":
                raise ConfigError(f"unknown key {where}.{key}; a stage overrides method, data, views, model, optim, "
                                  f"trainer or monitor (and may give name and init_from)")
        fixed = [k for k in overrides.get("trainer", {}) if k in _RUN_WIDE]
        if fixed:
            raise ConfigError(f"{where}.trainer.{fixed[0]} cannot change per stage: set trainer.{fixed[0]} for the whole run")
        if "trainer" in overrides and {"epochs", "max_steps"} & set(overrides["trainer"]) == {"epochs"}:
            overrides["trainer"] = {**overrides["trainer"], "max_steps": None}  # a stage's epochs replace the run's max_steps
        merged = deep_merge(base, overrides)
        merged["trainer"] = {**merged["trainer"], "out": str(Path(cfg.trainer.out) / "stages" / f"{i}_{spec['name']}")}
        stage_cfg = from_dict(Config, merged)
        init_from = spec.get("init_from")
        if init_from is not None and not isinstance(init_from, str):
            raise ConfigError(f"bad value for {where}.init_from: {init_from!r}; use the path of a run directory")
        stages.append(Stage(spec["name"], stage_cfg, init_from))
        names.add(spec["name"])
    return stages


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config dict as ``{"section.key": leaf}`` (lists are leaves)."""
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}


def to_dict(cfg: Config) -> dict[str, Any]:
    """The config's YAML sections as plain data (what ``config.yaml`` holds; ``derived`` is no section)."""
    out = dataclasses.asdict(dataclasses.replace(cfg, derived={}))
    del out["derived"]
    return out


def save_config(cfg: Config, path: str | Path) -> None:
    """Write ``cfg`` as YAML atomically: a crash or a full disk mid-write leaves the previous file whole."""
    text = yaml.safe_dump(to_dict(cfg), sort_keys=False)
    atomic_write(Path(path), lambda tmp: Path(tmp).write_text(text))
