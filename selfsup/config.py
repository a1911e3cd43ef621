"""Typed run configuration: YAML files + ``key=value`` overrides, validated before any work.

A config is a tree of dataclasses. Every leaf has a type (and, for choices, a ``Literal``), so an
unknown key or a bad value fails at load time with a message naming the key and what is allowed.
Method-, backbone- and view-specific parameters live in free-form mappings that are validated by
the component that owns them (``selfsup.methods``, ``selfsup.models``, ``selfsup.data.augment``),
also before training starts.

A YAML file may start with ``_base_: other.yaml`` (a path relative to the file, or a list of
paths) to compose presets; later files and overrides win, mappings merge key by key.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    """A configuration key or value is invalid; the message names it and what is allowed."""


@dataclass
class DataConfig:
    dataset: str = "fashion_mnist"
    root: str | None = None
    train_split: str = "train"
    eval_split: str = "test"
    image_size: int | None = None  # None keeps the stored size
    channels: int | None = None  # None keeps the stored channels
    fraction: float = 1.0  # seeded subset of the pretraining split
    fraction_seed: int = 0
    mean: list[float] | None = None  # per-channel normalisation; None = measured on the data
    std: list[float] | None = None
    # Image folders and shards: decode them into memory (false), or stream them from the files with the crops
    # taken at full resolution in loader workers (true); auto streams when the decoded split would pass 4 GiB.
    stream: bool | Literal["auto"] = "auto"
    num_workers: int | None = None  # streaming loader processes; null = one per CPU core, at most 8


@dataclass
class ViewConfig:
    """``num`` crops made with one augmentation preset (plus overrides) at ``size`` pixels."""

    preset: str = "simclr"
    num: int = 1
    size: int | None = None  # None = data.image_size (or the stored size)
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
    freeze: int | Literal["all"] | None = None


@dataclass
class OptimConfig:
    name: Literal["adamw", "adam", "sgd", "lars"] = "adamw"
    lr: float = 1e-3  # base learning rate, scaled by batch_size / 256 when lr_scaling == "linear"
    lr_scaling: Literal["none", "linear"] = "none"
    min_lr: float = 0.0
    warmup_epochs: float = 0.0
    warmup_fraction: float | None = None  # warm-up as a fraction of the run's steps (instead of warmup_epochs)
    schedule: Literal["cosine", "constant"] = "cosine"
    weight_decay: float = 1e-6
    weight_decay_end: float | None = None  # cosine weight-decay schedule end value (MSN 0.04 -> 0.4)
    schedule_stretch: float = 1.0  # lr and wd schedules computed over stretch x steps and cut (MSN code: 1.25)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    momentum: float = 0.9  # SGD and LARS
    lars_eta: float = 0.02
    clip_grad: float | None = None
    # Layer-wise lr decay (BEiT; MAE-CT 0.65): encoder block i of L gets lr * decay^(L - i) (0-indexed), the
    # stem decay^(L + 1), what follows the blocks (final norm) and the heads lr. 1 = off.
    layer_decay: float = 1.0
    head_lr: float | None = None  # lr of the parameters outside the encoder (heads); null = optim.lr
    head_weight_decay: float | None = None  # their weight decay (MAE-CT 1e-5 against 0.05); null = optim.weight_decay


@dataclass
class TrainerConfig:
    out: str = "runs/default"
    epochs: float = 10.0
    max_steps: int | None = None  # overrides epochs when set
    batch_size: int = 256  # global batch (images); each process gets batch_size / world_size
    accelerator: Literal["auto", "cpu", "cuda", "gpu", "mps"] = "auto"
    devices: int = 1
    num_nodes: int = 1
    strategy: Literal["auto", "ddp", "ddp_spawn"] = "auto"
    precision: Literal["32-true", "bf16-mixed", "16-mixed", "bf16-true"] = "32-true"
    sync_batchnorm: bool = True  # convert BatchNorm to SyncBatchNorm when world size > 1
    channels_last: bool = True  # NHWC memory format: 2-4x faster convolutions on CPU (oneDNN)
    seed: int = 0
    num_threads: int | None = None  # torch intra-op threads on CPU; None = torch default
    log_every_steps: int = 20
    checkpoint_every_steps: int = 200
    export_every_steps: int = 0  # also export the backbone to snapshots/step_NNNNNN/ every N steps (0 = off)
    progress: bool = True
    # Experiment loggers: csv (metrics.csv, always written), tensorboard, wandb (offline), mlflow (local file store);
    # each but csv needs its extra: pip install 'selfsup[tensorboard]' (see selfsup.train.loggers)
    loggers: list[str] = field(default_factory=lambda: ["csv"])


@dataclass
class MonitorConfig:
    knn_every_steps: int = 0  # 0 disables the online kNN monitor
    knn_train_size: int = 5000
    knn_test_size: int = 1000
    knn_k: int = 20
    knn_temperature: float = 0.07
    collapse_every_steps: int = 100  # per-dimension std and effective rank of the embeddings


@dataclass
class EvalConfig:
    batch_size: int = 512
    knn_k: int = 20
    knn_temperature: float = 0.07
    linear_epochs: int = 30
    linear_lrs: list[float] = field(default_factory=lambda: [1e-3, 3e-3, 1e-2])
    linear_weight_decays: list[float] = field(default_factory=lambda: [0.0, 1e-4])
    # Features averaged over 1 clean + (n - 1) views augmented with views.0's preset (Ghosh et al. 2024: 16).
    linear_views: int = 1
    linear_label_smoothing: float = 0.0  # Ghosh et al. 2024's probe: 0.1
    lowshot_shots: list[int] = field(default_factory=lambda: [1, 2, 5, 10])
    lowshot_percents: list[float] = field(default_factory=lambda: [1.0])
    lowshot_splits: int = 3
    cluster_n_init: int = 3
    # Fine-tuning (selfsup eval finetune): AdamW, warm-up (a fraction of the steps) + cosine, layer-wise lr decay,
    # label smoothing, drop path (ViTs), the run's views.0 augmentation; on all the labels, a fraction of each class
    # (MAE / ExtreMA: 0.01, 0.1) or a number per class.
    finetune_epochs: int = 10
    finetune_batch_size: int = 128
    finetune_lr: float = 1.0e-3
    finetune_layer_decay: float = 0.65
    finetune_weight_decay: float = 0.05
    finetune_warmup: float = 0.1
    finetune_label_smoothing: float = 0.1
    finetune_drop_path: float = 0.1
    finetune_fraction: float = 1.0
    finetune_per_class: int | None = None
    seed: int = 0
    # Model selection without the test set: hold out this class-stratified, seeded fraction of the labelled
    # training split and evaluate on it instead of data.eval_split (the rest is the labelled training set).
    holdout: float | None = None

    def __post_init__(self) -> None:
        if self.holdout is not None and not 0.0 < self.holdout < 1.0:
            raise ConfigError(f"bad value for eval.holdout: {self.holdout!r}; use a fraction in (0, 1), e.g. 0.1, "
                              f"or null to evaluate on data.eval_split")


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


# ----------------------------------------------------------------------------------------------
# Loading, merging, overrides


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML config, resolving ``_base_`` presets recursively (relative to the file)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path} (pass the path to a YAML file, e.g. configs/fashion_mnist/vicreg.yaml)")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
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
    replaces the old mapping: the old parameters belong to another component.
    """
    out = dict(base)
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


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load YAML (or the defaults), apply ``key=value`` overrides and validate everything."""
    raw = load_yaml(path) if path is not None else {}
    tree = parse_overrides(overrides or [])
    views_override = tree.get("views")
    if isinstance(views_override, dict):  # views.<i>.<key>=value edits one list element
        views = [dict(v) for v in raw.get("views", [dataclasses.asdict(v) for v in Config().views])]
        for key, update in views_override.items():
            index = int(key) if str(key).isdigit() else -1
            if not 0 <= index < len(views):
                raise ConfigError(f"views.{key}: there are {len(views)} view specs; use an index in 0..{len(views) - 1}")
            if not isinstance(update, dict):
                raise ConfigError(f"views.{index} must be overridden key by key, e.g. views.{index}.num=2")
            views[index] = deep_merge(views[index], update)
        tree["views"] = views
    return from_dict(Config, deep_merge(raw, tree))


def from_dict(cls: type, data: Any, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, checking keys and value types recursively."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if key not in names:
            raise ConfigError(f"unknown config key {path!r}; allowed keys here: {', '.join(names)}")
        kwargs[key] = _coerce(hints[key], value, path)
    return cls(**kwargs)


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(arg, value, path)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if len(errors) == 1 else f"bad value for {path}: {value!r} ({'; '.join(errors)})")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"bad value for {path}: {value!r}; allowed values: {', '.join(map(str, args))}")
        return value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, prefix=f"{path}.")
    if origin is list:
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list):
            raise ConfigError(f"bad value for {path}: expected a list, got {value!r}")
        return [_coerce(args[0], v, f"{path}.{i}") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"bad value for {path}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is Any:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):  # YAML 1.1 reads "1e-4" as a string
        try:
            return float(value)
        except ValueError:
            pass
    if tp in (int, float) and isinstance(value, bool) or not isinstance(value, tp):
        raise ConfigError(f"bad value for {path}: expected {tp.__name__}, got {value!r}")
    return value


# Trainer keys that one stage cannot change: the processes and the run directory are the whole run's.
_RUN_WIDE = ("out", "accelerator", "devices", "num_nodes", "strategy", "precision")


@dataclass
class Stage:
    name: str
    cfg: Config  # the run's config with the stage's overrides, trainer.out = RUN_DIR/stages/<i>_<name>
    init_from: str | None = None


def stage_configs(cfg: Config) -> list[Stage]:
    """The stages of a staged config, each a full validated :class:`Config` (``stages: []`` gives none)."""
    base = {k: v for k, v in to_dict(cfg).items() if k != "stages"}
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


def to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
