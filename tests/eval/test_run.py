"""Evaluation of a run directory: test-time view averaging for the linear probe, label smoothing wiring; labels from
a CSV, the evaluation split resolved (data.eval_split=auto), shot counts a class cannot fill dropped."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from labelled_photos import CLASSES, COLOURS, IMAGES, LABELLED, image_numbers, labelled_run, make_photos
from selfsup.checkpoint import export_backbone
from selfsup.config import ConfigError, save_config
from selfsup.load import load_config
from selfsup.data.datasets import AUTO_HOLDOUT, load_dataset, resolve_eval_split
from selfsup.data.stream import StreamedSplit, open_split
from selfsup.eval import run as eval_run
from selfsup.eval.monitor import build_knn_monitor
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


# ----------------------------------------------------------------------------------------------
# A user's folder: labels from a CSV, the evaluation split resolved, shot counts dropped


def _class_tree(root: Path, splits: dict[str, int]) -> Path:
    """``root/<split>/<a|b>/N.png``: ``count`` gray 4x4 PNGs per class of each split."""
    for split, count in splits.items():
        for cls, value in (("a", 40), ("b", 200)):
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                image = Image.fromarray(np.full((4, 4), value + i, dtype=np.uint8), mode="L")
                image.save(root / split / cls / f"{i}.png")
    return root


def _folder_cfg(root: Path, *overrides: str):
    return load_config(None, ["data.dataset=imagefolder", f"data.root={root}", "data.image_size=4", *overrides])


def test_csv_labels_evaluate_exactly_the_labelled_images_of_a_flat_folder(tmp_path: Path, caplog) -> None:
    """60 photos loose in one folder, 30 labelled in a CSV (an absolute path, a ./path, a header): pretraining reads
    all 60 unlabelled, evaluation exactly the 30 with the CSV's classes, on a stratified 20 % hold-out (no val or
    test split: 2 of each class's 10 held out)."""
    run, root, labels = labelled_run(tmp_path)
    cfg = eval_run.run_config(run, [])
    pretraining = open_split(cfg.data, "train", image_size=8, progress=False)
    assert len(pretraining) == IMAGES and pretraining.labels is None  # the CSV changes nothing there
    with caplog.at_level(logging.INFO, logger="selfsup"):
        raw = eval_run.compute_features(run, cfg, baseline="raw", progress=False)
    assert f"data.eval_split=auto: {labels} labels no image of a val or test split; evaluating on a stratified " \
           f"hold-out of 20% of the images it labels" in caplog.text
    numbers = image_numbers(raw.train) + image_numbers(raw.test)
    assert sorted(numbers) == list(range(LABELLED))
    assert len(raw.test) == 6 and torch.bincount(raw.test_labels).tolist() == [2, 2, 2]
    expected = [CLASSES.index(COLOURS[n % 3]) for n in numbers]
    assert torch.cat([raw.train_labels, raw.test_labels]).tolist() == expected
    streamed = open_split(dataclasses.replace(cfg.data, stream=True, num_workers=0), "train", image_size=8,
                          progress=False, labelled=True)  # the streaming path reads the same labelled subset
    assert isinstance(streamed, StreamedSplit) and len(streamed) == LABELLED
    assert streamed.source.classes == CLASSES and torch.bincount(streamed.labels).tolist() == [10, 10, 10]


def test_auto_evaluates_on_val_then_test_then_a_holdout(tmp_path: Path, caplog) -> None:
    root = _class_tree(tmp_path / "tree", {"train": 5})
    cfg = _folder_cfg(root)
    choice = resolve_eval_split(cfg.data)
    assert (choice.name, choice.holdout) == (None, AUTO_HOLDOUT)
    assert choice.why.startswith("data.eval_split=auto: imagefolder has no val or test split; evaluating on a "
                                 "stratified hold-out of 20% of the labelled training images")
    _class_tree(root, {"test": 3})
    assert resolve_eval_split(cfg.data).name == "test"
    _class_tree(root, {"val": 2})
    with caplog.at_level(logging.INFO, logger="selfsup"):
        _, splits = eval_run.labelled_splits(cfg, 4, 1, progress=False)
    assert f"data.eval_split=auto: evaluating on imagefolder/val ({root / 'val'})" in caplog.text
    assert [len(s) for s in splits] == [10, 4]
    choice = resolve_eval_split(cfg.data, holdout=0.3)  # eval.holdout set wins
    assert (choice.name, choice.holdout) == (None, 0.3) and choice.why.startswith("eval.holdout=0.3: ")
    assert resolve_eval_split(_folder_cfg(root, "data.eval_split=test").data).name == "test"  # named: kept

    # With a CSV, a split counts when the CSV labels images in it.
    flat = make_photos(tmp_path / "csv_root" / "train")
    for split in ("val", "test"):
        make_photos(tmp_path / "csv_root" / split, count=6)
    csv = tmp_path / "labels.csv"
    rows = [f"train/img_{i:02d}.png,{COLOURS[i % 3]}" for i in range(12)]
    csv.write_text("\n".join(rows) + "\n")
    cfg = _folder_cfg(flat.parent, f"data.labels={csv}")
    assert resolve_eval_split(cfg.data).name is None  # val/ and test/ hold images, none labelled
    csv.write_text("\n".join(rows + [f"test/img_{i:02d}.png,{COLOURS[i % 3]}" for i in range(6)]) + "\n")
    assert resolve_eval_split(cfg.data).name == "test"
    csv.write_text(csv.read_text() + "".join(f"val/img_{i:02d}.png,{COLOURS[i % 3]}\n" for i in range(3)))
    _, (train, val) = eval_run.labelled_splits(cfg, 8, 3, progress=False)
    assert resolve_eval_split(cfg.data).name == "val" and (len(train), len(val)) == (12, 3)
    assert train.classes == val.classes == CLASSES


def test_built_in_datasets_resolve_auto_to_test_when_its_files_exist(tmp_path: Path) -> None:
    assert resolve_eval_split(load_config(None, ["data.dataset=digits"]).data).name == "test"
    cifar = tmp_path / "cifar" / "cifar-10-batches-py"
    cifar.mkdir(parents=True)
    (cifar / "batches.meta").write_bytes(b"")
    cfg = load_config(None, ["data.dataset=cifar10", f"data.root={cifar.parent}"])
    assert resolve_eval_split(cfg.data).holdout == AUTO_HOLDOUT  # the training batches only
    (cifar / "test_batch").write_bytes(b"")
    assert resolve_eval_split(cfg.data).name == "test"
    fashion = tmp_path / "fashion"
    fashion.mkdir()
    cfg = load_config(None, ["data.dataset=fashion_mnist", f"data.root={fashion}"])
    (fashion / "t10k-images-idx3-ubyte.gz").write_bytes(b"")
    assert resolve_eval_split(cfg.data).name is None  # the labels file is missing
    (fashion / "t10k-labels-idx1-ubyte").write_bytes(b"")
    assert resolve_eval_split(cfg.data).name == "test"


def test_a_run_saved_with_eval_split_test_still_evaluates_on_test(tmp_path: Path, caplog) -> None:
    """Runs saved before auto existed store eval_split: test (and no data.labels key): they evaluate on test, though
    a new run of the same folder evaluates on val."""
    root = _class_tree(tmp_path / "tree", {"train": 4, "val": 2, "test": 3})
    (tmp_path / "run").mkdir()
    run_dir, _ = _run_dir(tmp_path / "run", "minimal")  # a digits run's config and a gray backbone: edited below
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    saved["data"] = {k: v for k, v in saved["data"].items() if k != "labels"}
    saved["data"].update(dataset="imagefolder", root=str(root), eval_split="test", image_size=4)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(saved))
    with caplog.at_level(logging.INFO, logger="selfsup"):
        old = eval_run.compute_features(run_dir, eval_run.run_config(run_dir, []), baseline="raw", progress=False)
    assert len(old.test) == 6 and "data.eval_split=test: evaluating on imagefolder/test" in caplog.text
    new = eval_run.compute_features(run_dir, eval_run.run_config(run_dir, ["data.eval_split=auto"]), baseline="raw",
                                    progress=False)
    assert len(new.test) == 4  # val


def test_lowshot_drops_the_counts_the_smallest_class_cannot_fill(tmp_path: Path, caplog) -> None:
    """26 labelled photos: red 9, green 9, blue 8; the 20 % hold-out takes 2 of each (round(1.8), round(1.6)), so
    blue keeps 6 images to fit: 7-shot is dropped with one line naming blue and 6; 1-, 2- and 6-shot (all of blue's
    images) run."""
    run, _, _ = labelled_run(tmp_path, "eval.lowshot_shots=[1, 2, 6, 7]", "eval.lowshot_percents=[]", rows=range(26))
    cfg = eval_run.run_config(run, [])
    with caplog.at_level(logging.INFO, logger="selfsup"):
        result = eval_run.evaluate_run(run, cfg, ["knn", "lowshot"], baseline="raw", progress=False)
    lines = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert lines == ["eval lowshot: 7-shot dropped: the smallest class of the labelled train split, 'blue', has 6 "
                     "images (low-shot runs 1-shot, 2-shot, 6-shot)"]
    assert {k for k in result if k.startswith("lowshot_")} == {f"lowshot_{k}shot_{s}" for k in (1, 2, 6)
                                                               for s in ("mean", "std", "splits")}
    assert result["lowshot_1shot_mean"] > 50  # red, green, blue pixels: one image per class nearly suffices


def test_lowshot_with_nothing_left_is_skipped_or_refused_before_any_feature(tmp_path: Path, caplog,
                                                                             monkeypatch) -> None:
    run, _, _ = labelled_run(tmp_path, "eval.lowshot_shots=[50]", "eval.lowshot_percents=[]")
    cfg = eval_run.run_config(run, [])
    with caplog.at_level(logging.INFO, logger="selfsup"):
        result = eval_run.evaluate_run(run, cfg, ["knn", "lowshot"], baseline="raw", progress=False)
    assert "knn_top1" in result and not [k for k in result if k.startswith("lowshot")]
    assert "eval lowshot: 50-shot dropped: the smallest class of the labelled train split, 'blue', has 8 images " \
           "(low-shot runs nothing: skipped)" in caplog.text

    def no_features(*args, **kwargs):
        raise AssertionError("features extracted before the check")

    monkeypatch.setattr(eval_run, "extract_view_averaged_features", no_features)
    with pytest.raises(ConfigError, match=r"eval.lowshot_shots: \[50\]; 50-shot splits need 50 labelled images of "
                                          r"every class, but the smallest .* 'blue', has 8 images; use shots of at "
                                          r"most 8, e.g. eval.lowshot_shots=\[1, 2, 5\]"):
        eval_run.evaluate_run(run, cfg, ["lowshot"], progress=False)


def test_a_holdout_too_small_to_test_on_is_a_config_error(tmp_path: Path) -> None:
    """One labelled image per class: a hold-out takes none (each class keeps one to fit). With two per class, each
    class gives one (a few labels are still evaluated)."""
    run, _, _ = labelled_run(tmp_path, rows=range(3))
    with pytest.raises(ConfigError, match="the 3 labelled training images leaves none to test on: every class has a "
                                          "single labelled image"):
        eval_run.compute_features(run, eval_run.run_config(run, []), baseline="raw", progress=False)


def test_knn_monitor_reads_the_csv_labels_and_the_resolved_holdout(tmp_path: Path, caplog) -> None:
    """Pretraining data of a CSV-labelled folder has no labels: the online kNN monitor takes its gallery and queries
    from the 30 labelled images, as evaluation does: disjoint parts (the 20 % hold-out: 6 queries, 24 gallery)."""
    run, _, labels = labelled_run(tmp_path)
    cfg = eval_run.run_config(run, [])
    pretraining = open_split(cfg.data, "train", image_size=8, progress=False)
    with caplog.at_level(logging.INFO, logger="selfsup"):
        monitor = build_knn_monitor(cfg, pretraining, [0.4] * 3, [0.3] * 3, channels=3, image_size=8)
    gallery = {int(n) for n in monitor.train_images[:, 0, 0, 0]}  # each image's number, in its top-left pixel
    queries = {int(n) for n in monitor.test_images[:, 0, 0, 0]}
    assert len(queries) == 6 and gallery | queries == set(range(LABELLED)) and not gallery & queries
    assert monitor.train_labels.tolist() == [CLASSES.index(COLOURS[n % 3]) for n in monitor.train_images[:, 0, 0, 0]]
    assert f"kNN monitor: data.eval_split=auto: {labels} labels no image of a val or test split" in caplog.text


def test_two_labelled_images_per_class_are_evaluated_on_one_of_each(tmp_path: Path) -> None:
    run, _, _ = labelled_run(tmp_path, rows=range(6))
    feats = eval_run.compute_features(run, eval_run.run_config(run, []), baseline="raw", progress=False)
    assert len(feats.test_labels) == 3 and sorted(feats.test_labels.tolist()) == [0, 1, 2]
    assert len(feats.train_labels) == 3
