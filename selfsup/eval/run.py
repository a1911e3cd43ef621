"""Evaluate a run directory's exported backbone (or a raw-pixel / random-init baseline).

Reads only ``backbone.json`` + ``backbone.safetensors`` and the run's data config: evaluation
never imports a training method.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from selfsup.checkpoint import CheckpointError, load_backbone, read_backbone_meta
from selfsup.config import Config, ConfigError, check_method_sections, deep_merge, from_dict, load_yaml, parse_overrides
from selfsup.data.augment import Augment, augment_config
from selfsup.data.imagedata import ImageData
from selfsup.data.stream import StreamedSplit, open_split
from selfsup.eval.clustering import kmeans_cluster
from selfsup.eval.finetune import finetune, labelled_subset
from selfsup.eval.features import extract_view_averaged_features
from selfsup.eval.knn import knn_classify
from selfsup.eval.linear import linear_probe, stratified_holdout
from selfsup.eval.lowshot import lowshot_logistic

log = logging.getLogger("selfsup")

EVALUATIONS = ("knn", "linear", "lowshot", "cluster")
Baseline = Literal["none", "raw", "random"]


@dataclass
class Features:
    train: torch.Tensor
    train_labels: torch.Tensor
    test: torch.Tensor
    test_labels: torch.Tensor


def run_config(run_dir: Path, overrides: list[str]) -> Config:
    """The run's resolved config with ``key=value`` overrides (e.g. ``eval.knn_k=10 data.root=...``).

    ``run_dir`` may also be one of the run's ``snapshots/step_N`` folders (``trainer.export_every_steps``).
    """
    run_dir = Path(run_dir)
    path = run_dir / "config.yaml"
    if not path.is_file() and run_dir.parent.name == "snapshots":  # RUN_DIR/snapshots/step_N: the run's config
        path = run_dir.parent.parent / "config.yaml"
    if not path.is_file():
        raise CheckpointError(f"{run_dir} is not a run directory (no config.yaml); pass the trainer.out of a "
                              f"`selfsup pretrain` run")
    saved = load_yaml(path)
    missing = [key for key in ("method", "data", "model", "trainer") if not isinstance(saved.get(key), dict)] \
        if isinstance(saved, dict) else ["all"]
    if missing:  # a resolved config holds every section; an empty one would evaluate the defaults' dataset
        raise CheckpointError(f"{path} is not a run's resolved config (no {', '.join(missing)} section); restore it, "
                              f"or re-run `selfsup pretrain` with the run's config and trainer.out={run_dir}")
    cfg = from_dict(Config, deep_merge(saved, parse_overrides(overrides)))
    check_method_sections(cfg)  # as load_config: an override of the method section is checked, not ignored
    return cfg


def device_for(name: str | None = None) -> torch.device:
    return torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))


def labelled_splits(cfg: Config, image_size: int | None, channels: int | None,
                    progress: bool) -> tuple[str, list[ImageData | StreamedSplit]]:
    """The labelled training split's name, and the splits evaluation reads: [train, eval], or [train] alone
    with ``eval.holdout`` (the held-out part then comes out of the training split)."""
    d = cfg.data
    train_split = d.train_split if d.train_split not in ("unlabeled", "train+unlabeled") else "train"
    splits = []
    for split in (train_split,) if cfg.eval.holdout is not None else (train_split, d.eval_split):
        data = open_split(d, split, image_size=image_size, channels=channels, progress=progress)
        if data.labels is None:
            raise ConfigError(f"{d.dataset}/{split} has no labels; evaluation needs labelled train and eval splits "
                              f"(set data.train_split / data.eval_split)")
        classes = torch.unique(data.labels)
        if len(classes) < 2:
            raise ConfigError(f"{d.dataset}/{split} holds images of {len(classes)} class only; kNN, linear, low-shot "
                              f"and clustering accuracies need at least 2 classes (with one, every image is "
                              f"'right': 100 % that says nothing); evaluate on labelled splits of several classes "
                              f"(data.root, data.train_split / data.eval_split)")
        splits.append(data)
    return train_split, splits


def first_view_augment(cfg: Config, size: int, mean: tuple | None, std: tuple | None, purpose: str,
                       device: torch.device) -> Augment:
    """The run's first view spec (``views.0``: preset and overrides) at ``size`` px, normalising with mean/std."""
    view = cfg.views[0]
    try:
        aug_cfg = augment_config(view.preset, size, mean=mean, std=std, **view.params)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"views.0 ({purpose}): {err}") from err
    return Augment(aug_cfg).to(device)


def check_shots(cfg: Config, labels: torch.Tensor, split: str) -> None:
    """Every class of the labelled training set (``labels``, after ``eval.holdout``) holds at least the largest of
    ``eval.lowshot_shots`` images: checked once the labels are read, before any feature is extracted."""
    shots = max(cfg.eval.lowshot_shots, default=0)
    classes, counts = torch.unique(labels, return_counts=True)
    short = {int(c): int(n) for c, n in zip(classes, counts) if n < shots}
    if short:
        fewest = min(short.values())
        example = [k for k in (1, 2, 5, 10) if k <= fewest] or [fewest]
        raise ConfigError(f"bad value for eval.lowshot_shots: {cfg.eval.lowshot_shots}; {shots}-shot splits need "
                          f"{shots} labelled images of every class, but {len(short)} class(es) of the labelled "
                          f"{split} split have fewer (class: count {dict(list(short.items())[:5])}); use shots of "
                          f"at most {fewest}, e.g. eval.lowshot_shots={example}")


def compute_features(run_dir: Path, cfg: Config, baseline: Baseline = "none", progress: bool = True,
                     views: int = 1, lowshot: bool = False) -> Features:
    """Features of the labelled train and eval splits: backbone output, raw pixels, or a random-init backbone.

    ``views > 1``: each image's feature is the mean over the clean image and ``views - 1`` copies
    augmented with the run's first view spec (``views.0``: preset and overrides, at the stored
    image size), for both splits (Ghosh et al. 2024's probe; see ``extract_view_averaged_features``).
    ``lowshot``: check ``eval.lowshot_shots`` against the labels (:func:`check_shots`) before extracting.
    """
    if isinstance(views, bool) or not isinstance(views, int) or views < 1:
        raise ConfigError(f"bad value for eval.linear_views: {views!r}; use 1 (plain features) or more "
                          f"(views averaged per image; Ghosh et al. 2024 use 16)")
    d = cfg.data
    holdout = cfg.eval.holdout  # checked by EvalConfig
    device = device_for()
    # The backbone first (a bad export fails before any data is read); images are read as it was trained:
    # with the channels and size recorded in backbone.json.
    meta = None
    if baseline != "raw":
        model, meta = load_backbone(run_dir, random_init=baseline == "random")
        model.to(device)
    elif (Path(run_dir) / "backbone.json").is_file():
        meta = read_backbone_meta(run_dir)
    channels, image_size = (meta["channels"], meta["image_size"]) if meta else (d.channels, d.image_size)
    train_split, splits = labelled_splits(cfg, image_size, channels, progress)
    train = splits[0]
    if lowshot:
        labels = train.labels if holdout is None else \
            train.labels[torch.from_numpy(stratified_holdout(train.labels.numpy(), holdout, cfg.eval.seed)[0])]
        check_shots(cfg, labels, train_split)
    if baseline == "raw":  # raw pixels in [0, 1], flattened
        model, mean_std, normalize = nn.Flatten(), (None, None), None
    else:
        mean_std = (tuple(meta["mean"]), tuple(meta["std"]))
        mean = torch.tensor(meta["mean"], device=device).view(1, -1, 1, 1)
        std = torch.tensor(meta["std"], device=device).view(1, -1, 1, 1)

        def normalize(x: torch.Tensor) -> torch.Tensor:
            return (x - mean) / std

    augment = None
    if views > 1:
        size = train.image_size if isinstance(train, StreamedSplit) else train.images.shape[-1]
        augment = first_view_augment(cfg, size, *mean_std, "the augmentation of eval.linear_views", device)

    def embed(split) -> tuple[torch.Tensor, torch.Tensor]:
        """Features and labels of a split (a streamed one read from its files, unreadable images left out)."""
        streamed = isinstance(split, StreamedSplit)
        feats = extract_view_averaged_features(model, split if streamed else split.images, views, augment,
                                               seed=cfg.eval.seed, batch_size=cfg.eval.batch_size, device=device,
                                               transform=normalize, progress=progress)
        if streamed:
            return feats[split.readable], split.labels[split.readable]
        return feats, split.labels

    if holdout is None:
        return Features(*embed(train), *embed(splits[1]))
    feats, labels = embed(train)
    fit, held_out = (torch.from_numpy(i) for i in stratified_holdout(labels.numpy(), holdout, cfg.eval.seed))
    log.info("eval.holdout=%s: evaluating on %d held-out %s images, %d labelled for training", holdout,
             len(held_out), train_split, len(fit))
    return Features(feats[fit], labels[fit], feats[held_out], labels[held_out])


def evaluate(kind: str, feats: Features, cfg: Config, progress: bool = False) -> dict[str, float]:
    """Run one evaluation on precomputed features; accuracies in percent."""
    e = cfg.eval
    if kind == "knn":
        r = knn_classify(feats.train, feats.train_labels, feats.test, feats.test_labels, k=e.knn_k,
                         temperature=e.knn_temperature)
        return {"knn_top1": r["top1"], "knn_top5": r["top5"]}
    if kind == "linear":
        r = linear_probe(feats.train, feats.train_labels, feats.test, feats.test_labels, lrs=e.linear_lrs,
                         weight_decays=e.linear_weight_decays, epochs=e.linear_epochs,
                         label_smoothing=e.linear_label_smoothing, seed=e.seed, device=device_for(), progress=progress)
        return {"linear_top1": r["top1"], "linear_top5": r["top5"], "linear_val_top1": r["val_top1"],
                "linear_lr": r["best_lr"], "linear_wd": r["best_wd"]}
    if kind == "lowshot":
        r = lowshot_logistic(feats.train, feats.train_labels, feats.test, feats.test_labels, shots=e.lowshot_shots,
                             percents=e.lowshot_percents, num_splits=e.lowshot_splits, seed=e.seed, progress=progress)
        return {f"lowshot_{k}": v for k, v in r.items()}
    if kind == "cluster":
        r = kmeans_cluster(feats.test, feats.test_labels, n_init=e.cluster_n_init, seed=e.seed, progress=progress)
        return {f"cluster_{k}": v for k, v in r.items()}
    raise ValueError(f"unknown evaluation {kind!r}; choose one of {', '.join(EVALUATIONS)} or all")


def run_finetune(run_dir: Path, cfg: Config, baseline: Baseline = "none", progress: bool = True) -> dict[str, float]:
    """``selfsup eval finetune``: the backbone (or, ``baseline="random"``, the same architecture from scratch) fine-tuned
    end to end with a linear head on the labelled split (``eval.finetune_*``), tested on the eval split."""
    import inspect

    from selfsup.models import BACKBONES

    if baseline == "raw":
        raise ConfigError("fine-tuning trains a backbone: use --baseline random (the same network from scratch), "
                          "not raw pixels")
    e = cfg.eval
    meta = read_backbone_meta(run_dir)
    accepts = inspect.signature(BACKBONES[meta["backbone"]]).parameters
    extra = {"drop_path_rate": e.finetune_drop_path} if "drop_path_rate" in accepts else {}
    model, meta = load_backbone(run_dir, random_init=baseline == "random", extra_params=extra)
    train_split, splits = labelled_splits(cfg, meta["image_size"], meta["channels"], progress)
    if any(isinstance(data, StreamedSplit) for data in splits):
        raise ConfigError(f"fine-tuning reads {cfg.data.dataset} in memory; set data.stream=false (a split this "
                          f"large is fine-tuned with the pretraining engine, not this evaluation)")
    train = splits[0]
    if e.holdout is None:
        test_images, test_labels = splits[1].images, splits[1].labels
        fit = torch.arange(len(train))
    else:
        fit, held_out = (torch.from_numpy(i) for i in stratified_holdout(train.labels.numpy(), e.holdout, e.seed))
        test_images, test_labels = train.images[held_out], train.labels[held_out]
    try:
        subset = labelled_subset(train.labels[fit].numpy(), e.finetune_fraction, e.finetune_per_class, e.seed)
    except ValueError as err:
        raise ConfigError(f"eval.finetune_per_class={e.finetune_per_class} / eval.finetune_fraction="
                          f"{e.finetune_fraction}: {err}") from err
    chosen = fit[torch.from_numpy(subset)]
    device = device_for()
    mean = torch.tensor(meta["mean"], device=device).view(1, -1, 1, 1)
    std = torch.tensor(meta["std"], device=device).view(1, -1, 1, 1)
    augment = first_view_augment(cfg, meta["image_size"], tuple(meta["mean"]), tuple(meta["std"]),
                                 "the fine-tuning augmentation", device)
    log.info("fine-tuning %s on %d labelled %s images (%s), testing on %d", "a random-init backbone"
             if baseline == "random" else "the backbone", len(chosen), train_split, cfg.views[0].preset,
             len(test_labels))
    result = finetune(model, train.images[chosen], train.labels[chosen], test_images, test_labels,
                      augment, lambda x: (x - mean) / std, epochs=e.finetune_epochs,
                      batch_size=min(e.finetune_batch_size, len(chosen)), lr=e.finetune_lr,
                      layer_decay=e.finetune_layer_decay, weight_decay=e.finetune_weight_decay,
                      warmup_fraction=e.finetune_warmup, label_smoothing=e.finetune_label_smoothing, seed=e.seed,
                      device=device, progress=progress)
    return {"finetune_top1": result["top1"], "finetune_top5": result["top5"], "finetune_labels": float(len(chosen))}


def evaluate_run(run_dir: Path, cfg: Config, kinds: list[str], baseline: Baseline = "none",
                 progress: bool = True) -> dict[str, float]:
    """Run the evaluations ``kinds`` on one backbone (or baseline); the linear probe reads features
    averaged over ``eval.linear_views`` views, the others plain features (each set computed once)."""
    features: dict[int, Features] = {}
    result: dict[str, float] = {}
    lowshot = "lowshot" in kinds  # checked with the first features, before any work
    name = "backbone" if baseline == "none" else baseline
    for kind in kinds:
        views = cfg.eval.linear_views if kind == "linear" else 1
        if views not in features:
            log.info("features: %s%s", name, f" (mean over {views} views)" if views > 1 else "")
            features[views] = compute_features(run_dir, cfg, baseline=baseline, progress=progress, views=views,
                                               lowshot=lowshot and not features)
        log.info("eval %s (%s)", kind, name)
        result.update(evaluate(kind, features[views], cfg, progress=progress))
    return result
