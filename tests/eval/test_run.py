"""Evaluation of a run directory: test-time view averaging for the linear probe, label smoothing wiring."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from selfsup.checkpoint import export_backbone
from selfsup.config import ConfigError, load_config, save_config
from selfsup.data.datasets import load_dataset
from selfsup.eval import run as eval_run
from selfsup.eval.features import raw_pixel_features
from selfsup.models import build_backbone

PARAMS = {"block": "basic", "layers": [1], "width": 4, "small_stem": True, "in_channels": 1}


def _run_dir(tmp_path: Path, preset: str) -> tuple[Path, object]:
    """A run directory as ``selfsup pretrain`` leaves it: config.yaml + an exported (random) backbone on digits."""
    cfg = load_config(None, ["data.dataset=digits", f"views=[{{preset: {preset}, num: 2}}]", "eval.batch_size=1000"])
    save_config(cfg, tmp_path / "config.yaml")
    torch.manual_seed(0)
    export_backbone(tmp_path, build_backbone("resnet", **PARAMS), {
        "backbone": "resnet", "params": PARAMS, "image_size": 8, "channels": 1, "mean": [0.3], "std": [0.4], "seed": 0})
    return tmp_path, cfg


def test_views_of_augmentation_none_equal_the_plain_features(tmp_path: Path) -> None:
    run_dir, cfg = _run_dir(tmp_path, "none")
    plain = eval_run.compute_features(run_dir, cfg, progress=False)
    averaged = eval_run.compute_features(run_dir, cfg, progress=False, views=3)
    torch.testing.assert_close(averaged.train, plain.train)
    torch.testing.assert_close(averaged.test, plain.test)
    assert torch.equal(averaged.test_labels, plain.test_labels)
    with pytest.raises(ConfigError, match="eval.linear_views"):
        eval_run.compute_features(run_dir, cfg, progress=False, views=0)


def test_views_use_the_runs_first_view_preset_also_for_raw_pixels(tmp_path: Path) -> None:
    run_dir, cfg = _run_dir(tmp_path, "minimal")
    raw = eval_run.compute_features(run_dir, cfg, baseline="raw", progress=False)
    # within one rounding of the division by 255 (CUDA divides by multiplying with the reciprocal)
    torch.testing.assert_close(raw.train, raw_pixel_features(load_dataset("digits", "train").images), rtol=0, atol=1e-7)
    raw_views = eval_run.compute_features(run_dir, cfg, baseline="raw", progress=False, views=2)
    assert (raw_views.train - raw.train).abs().max() > 0.05  # random crops moved the pixels
    assert raw_views.train.min() >= 0 and raw_views.train.max() <= 1  # raw pixels are not normalised


def test_only_the_linear_probe_reads_view_averaged_features(tmp_path: Path, monkeypatch) -> None:
    run_dir, _ = _run_dir(tmp_path, "minimal")
    cfg = eval_run.run_config(run_dir, ["eval.linear_views=3"])
    computed: list[int] = []
    seen: list[tuple[str, int]] = []
    monkeypatch.setattr(eval_run, "compute_features", lambda *a, views=1, **k: computed.append(views) or views)
    monkeypatch.setattr(eval_run, "evaluate", lambda kind, feats, cfg, progress=False: seen.append((kind, feats)) or {kind: 1.0})
    result = eval_run.evaluate_run(run_dir, cfg, ["knn", "linear", "cluster"], progress=False)
    assert result == {"knn": 1.0, "linear": 1.0, "cluster": 1.0}
    assert seen == [("knn", 1), ("linear", 3), ("cluster", 1)]
    assert computed == [1, 3]  # each feature set computed once


def test_linear_label_smoothing_reaches_the_probe(tmp_path: Path, monkeypatch) -> None:
    run_dir, _ = _run_dir(tmp_path, "minimal")
    calls: list[dict] = []
    monkeypatch.setattr(eval_run, "linear_probe", lambda *a, **k: calls.append(k) or {
        "top1": 0.0, "top5": 0.0, "val_top1": 0.0, "best_lr": 0.0, "best_wd": 0.0})
    feats = eval_run.Features(torch.zeros(2, 3), torch.tensor([0, 1]), torch.zeros(2, 3), torch.tensor([0, 1]))
    for smoothing in (0.0, 0.1):
        eval_run.evaluate("linear", feats, eval_run.run_config(run_dir, [f"eval.linear_label_smoothing={smoothing}"]))
        assert calls[-1]["label_smoothing"] == smoothing


def test_holdout_evaluates_on_a_stratified_part_of_the_training_split(tmp_path: Path) -> None:
    """eval.holdout: model selection without the test set. The held-out part comes from the train split only,
    is disjoint from the labelled part, keeps every class, and the features are the same network's."""
    run_dir, _ = _run_dir(tmp_path, "minimal")
    plain = eval_run.compute_features(run_dir, eval_run.run_config(run_dir, []), progress=False)
    held = eval_run.compute_features(run_dir, eval_run.run_config(run_dir, ["eval.holdout=0.2"]), progress=False)
    n = len(plain.train)
    assert len(held.train) + len(held.test) == n
    assert abs(len(held.test) - 0.2 * n) <= 10  # one rounding per class
    assert set(held.test_labels.tolist()) == set(plain.train_labels.tolist())
    rows = {tuple(r) for r in plain.train.round(decimals=4).tolist()}  # every held-out row is a training image's
    both = torch.cat([held.train, held.test]).round(decimals=4).tolist()
    assert len({tuple(r) for r in both}) == len(rows) and all(tuple(r) in rows for r in both)
    with pytest.raises(ConfigError, match="eval.holdout"):  # a bad value fails when the config is read
        eval_run.run_config(run_dir, ["eval.holdout=1.5"])
    with pytest.raises(ConfigError, match="eval.holdout"):
        load_config(None, ["eval.holdout=0"])
