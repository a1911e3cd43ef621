"""Evaluate a run directory's exported backbone (or a raw-pixel / random-init baseline).

Reads only ``backbone.json`` + ``backbone.safetensors`` and the run's data config: evaluation
never imports a training method.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from selfsup.checkpoint import CheckpointError, load_backbone, read_backbone_meta
from selfsup.config import Config, ConfigError, DataConfig, deep_merge, from_dict, load_yaml, parse_overrides
from selfsup.data.augment import Augment, augment_config
from selfsup.data.datasets import EvalSplit, resolve_eval_split
from selfsup.data.imagedata import ImageData
from selfsup.data.stream import StreamedSplit, open_split
from selfsup.eval.clustering import kmeans_cluster
from selfsup.eval.finetune import finetune, labelled_subset
from selfsup.eval.features import extract_view_averaged_features
from selfsup.eval.knn import LIGHTLY_K, LIGHTLY_TEMPERATURE, knn_classify_many
from selfsup.eval.linear import linear_probe, stratified_holdout
from selfsup.eval.lowshot import lowshot_logistic
from selfsup.methods import check_method_sections

log = logging.getLogger("selfsup")

EVALUATIONS = ("knn", "linear", "lowshot", "cluster")
Baseline = Literal["none", "raw", "random"]


@dataclass
class Features:
    train: torch.Tensor
    train_labels: torch.Tensor
    test: torch.Tensor
    test_labels: torch.Tensor
    # eval.lowshot_shots that every class of the labelled training set fills (None: not checked)
    lowshot_shots: list[int] | None = None


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


def evaluation_split(cfg: Config) -> EvalSplit:
    """The split evaluation tests on, or the hold-out fraction of the labelled training split (``data.eval_split``
    with ``auto`` resolved, ``eval.holdout`` winning): :func:`~selfsup.data.datasets.resolve_eval_split`."""
    return resolve_eval_split(cfg.data, cfg.eval.holdout)


def labelled_train_split(d: DataConfig) -> str:
    """The training split whose labels evaluation reads: ``data.train_split``, but ``train`` for STL-10's unlabelled
    pretraining splits."""
    return d.train_split if d.train_split not in ("unlabeled", "train+unlabeled") else "train"


def holdout_rows(labels: torch.Tensor, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (fit, held-out) rows of a labelled split: ``stratified_holdout``, with too few images to hold any out a
    ConfigError naming the fix (a traceback before: every class keeps one image to fit)."""
    try:
        fit, held_out = stratified_holdout(labels.numpy(), fraction, seed)
    except ValueError as err:
        raise ConfigError(f"a hold-out of the {len(labels)} labelled training images leaves none to test on: every "
                          f"class has a single labelled image, which it keeps to fit; label at least two images of "
                          f"a class, or name an evaluation split (data.eval_split=val)") from err
    return torch.from_numpy(fit), torch.from_numpy(held_out)


def labelled_splits(cfg: Config, image_size: int | None, channels: int | None, progress: bool,
                    choice: EvalSplit | None = None) -> tuple[str, list[ImageData | StreamedSplit]]:
    """The labelled training split's name, and the splits evaluation reads: [train, eval], or [train] alone
    for a hold-out (``eval.holdout``, or ``data.eval_split=auto`` without val or test: the held-out part then
    comes out of the training split). ``choice``: :func:`evaluation_split`, resolved here when None; one log line
    says which. With ``data.labels``, the splits are the CSV's labelled images."""
    d = cfg.data
    choice = choice or evaluation_split(cfg)
    log.info("%s", choice.why)
    train_split = labelled_train_split(d)
    splits = []
    for split in (train_split,) if choice.name is None else (train_split, choice.name):
        data = open_split(d, split, image_size=image_size, channels=channels, progress=progress, labelled=True)
        if data.labels is None:
            hint = " (class folders, or data.labels=CSV of path,label rows)" if d.dataset == "imagefolder" else ""
            raise ConfigError(f"{d.dataset}/{split} has no labels; evaluation needs labelled train and eval "
                              f"splits{hint} (set data.train_split / data.eval_split)")
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


def lowshot_shots(cfg: Config, labels: torch.Tensor, split: str, classes: list[str] | None = None,
                  alone: bool = False) -> list[int]:
    """The counts of ``eval.lowshot_shots`` that every class of the labelled training set (``labels``, after a
    hold-out) can fill: checked once the labels are read, before any feature is extracted. A count that the
    smallest class cannot fill is dropped with one log line naming the class and its size. ``alone`` (low-shot is
    all that was asked): nothing left of low-shot (no count, no ``eval.lowshot_percents``) is a ConfigError."""
    shots = cfg.eval.lowshot_shots
    ids, counts = torch.unique(labels, return_counts=True)
    fewest = int(counts.min())
    smallest = int(ids[counts.argmin()])
    name = classes[smallest] if classes and 0 <= smallest < len(classes) else str(smallest)
    kept, dropped = [k for k in shots if k <= fewest], [k for k in shots if k > fewest]
    if not dropped:
        return kept
    counts_text = ", ".join(f"{k}-shot" for k in dropped)
    why = f"the smallest class of the labelled {split} split, {name!r}, has {fewest} image{'s' * (fewest != 1)}"
    if not kept and not cfg.eval.lowshot_percents and alone:
        example = [k for k in (1, 2, 5, 10) if k <= fewest]
        raise ConfigError(f"bad value for eval.lowshot_shots: {shots}; {max(shots)}-shot splits need {max(shots)} "
                          f"labelled images of every class, but {why}; use shots of at most {fewest}, e.g. "
                          f"eval.lowshot_shots={example}")
    left = [f"{k}-shot" for k in kept] + [f"{p:g}%" for p in cfg.eval.lowshot_percents]
    log.info("eval lowshot: %s dropped: %s (low-shot runs %s)", counts_text, why,
             ", ".join(left) if left else "nothing: skipped")
    return kept


def compute_features(run_dir: Path, cfg: Config, baseline: Baseline = "none", progress: bool = True,
                     views: int = 1, lowshot: bool = False, lowshot_alone: bool = False) -> Features:
    """Features of the labelled train and eval splits: backbone output, raw pixels, or a random-init backbone.

    ``views > 1``: each image's feature is the mean over the clean image and ``views - 1`` copies
    augmented with the run's first view spec (``views.0``: preset and overrides, at the stored
    image size), for both splits (Ghosh et al. 2024's probe; see ``extract_view_averaged_features``).
    ``lowshot``: check ``eval.lowshot_shots`` against the labels (:func:`lowshot_shots`) before extracting; the
    counts kept are the result's ``lowshot_shots`` (``lowshot_alone``: low-shot is the only evaluation asked).
    The test features are those of the evaluation split, or of a hold-out (:func:`evaluation_split`).
    """
    if isinstance(views, bool) or not isinstance(views, int) or views < 1:
        raise ConfigError(f"bad value for eval.linear_views: {views!r}; use 1 (plain features) or more "
                          f"(views averaged per image; Ghosh et al. 2024 use 16)")
    d = cfg.data
    choice = evaluation_split(cfg)
    holdout = choice.holdout  # eval.holdout's (checked by EvalConfig) or auto's
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
    train_split, splits = labelled_splits(cfg, image_size, channels, progress, choice)
    train = splits[0]
    shots = None
    if lowshot:
        labels = train.labels if holdout is None else \
            train.labels[holdout_rows(train.labels, holdout, cfg.eval.seed)[0]]
        shots = lowshot_shots(cfg, labels, train_split, train.classes, alone=lowshot_alone)
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
        return Features(*embed(train), *embed(splits[1]), shots)
    feats, labels = embed(train)
    fit, held_out = holdout_rows(labels, holdout, cfg.eval.seed)
    log.info("hold-out %s: evaluating on %d held-out %s images, %d labelled for training", holdout,
             len(held_out), train_split, len(fit))
    return Features(feats[fit], labels[fit], feats[held_out], labels[held_out], shots)


def evaluate(kind: str, feats: Features, cfg: Config, progress: bool = False) -> dict[str, float]:
    """Run one evaluation on precomputed features; accuracies in percent."""
    e = cfg.eval
    if kind == "knn":
        # lightly's k = 200, T = 0.1 beside it, from the same similarities; on 200 training images or fewer it would
        # be a vote of the whole set, not lightly's number: left out with a log line.
        lightly = e.knn_lightly and len(feats.train) > LIGHTLY_K
        if e.knn_lightly and not lightly:
            log.info("eval knn: knn200_top1 (lightly's k = %d) left out: it needs more than %d labelled training "
                     "images, there are %d", LIGHTLY_K, LIGHTLY_K, len(feats.train))
        settings = [(e.knn_k, e.knn_temperature)] + ([(LIGHTLY_K, LIGHTLY_TEMPERATURE)] if lightly else [])
        r = knn_classify_many(feats.train, feats.train_labels, feats.test, feats.test_labels, settings)
        out = {"knn_top1": r[0]["top1"], "knn_top5": r[0]["top5"]}
        if lightly:
            out["knn200_top1"] = r[1]["top1"]
        return out
    if kind == "linear":
        r = linear_probe(feats.train, feats.train_labels, feats.test, feats.test_labels, lrs=e.linear_lrs,
                         weight_decays=e.linear_weight_decays, epochs=e.linear_epochs, min_steps=e.linear_min_steps,
                         label_smoothing=e.linear_label_smoothing, seed=e.seed, device=device_for(), progress=progress)
        return {"linear_top1": r["top1"], "linear_top5": r["top5"], "linear_val_top1": r["val_top1"],
                "linear_lr": r["best_lr"], "linear_wd": r["best_wd"]}
    if kind == "lowshot":
        shots = e.lowshot_shots if feats.lowshot_shots is None else feats.lowshot_shots
        r = lowshot_logistic(feats.train, feats.train_labels, feats.test, feats.test_labels, shots=shots,
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
    choice = evaluation_split(cfg)
    train_split, splits = labelled_splits(cfg, meta["image_size"], meta["channels"], progress, choice)
    if any(isinstance(data, StreamedSplit) for data in splits):
        raise ConfigError(f"fine-tuning reads {cfg.data.dataset} in memory; set data.stream=false (a split this "
                          f"large is fine-tuned with the pretraining engine, not this evaluation)")
    train = splits[0]
    if choice.holdout is None:
        test_images, test_labels = splits[1].images, splits[1].labels
        fit = torch.arange(len(train))
    else:
        fit, held_out = holdout_rows(train.labels, choice.holdout, e.seed)
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
    averaged over ``eval.linear_views`` views, the others plain features (each set computed once).
    Low-shot runs the shot counts that every class fills (:func:`lowshot_shots`); with none left and no
    ``eval.lowshot_percents``, it is skipped (an error when it is the only evaluation asked)."""
    features: dict[int, Features] = {}
    result: dict[str, float] = {}
    lowshot = "lowshot" in kinds  # checked with the first features, before any work
    name = "backbone" if baseline == "none" else baseline
    for kind in kinds:
        views = cfg.eval.linear_views if kind == "linear" else 1
        if views not in features:
            log.info("features: %s%s", name, f" (mean over {views} views)" if views > 1 else "")
            features[views] = compute_features(run_dir, cfg, baseline=baseline, progress=progress, views=views,
                                               lowshot=lowshot and not features, lowshot_alone=kinds == ["lowshot"])
        feats = features[views]
        if kind == "lowshot":
            shots = next(iter(features.values())).lowshot_shots  # checked with the first features
            if not shots and not cfg.eval.lowshot_percents:
                continue  # nothing left of it (lowshot_shots said so)
            feats = dataclasses.replace(feats, lowshot_shots=shots)
        log.info("eval %s (%s)", kind, name)
        result.update(evaluate(kind, feats, cfg, progress=progress))
    return result
