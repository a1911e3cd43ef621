"""benchmarks/sweep.py: one pretrain + eval per value of a key, one JSON list; spectra in each run directory."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from labelled_photos import class_image_folder
from selfsup.config import ConfigError

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
import sweep  # noqa: E402

TINY_MULTIVIEW = """
method: {name: barlow_twins, projector: 16, lambd: auto}
data: {dataset: digits}
views:
  - {preset: minimal, num: 3, params: {crop_scale: [0.5, 1.0]}}
model:
  backbone: resnet
  params: {block: basic, layers: [1, 1], width: 8, small_stem: true}
optim: {name: adam, lr: 0.001, schedule: constant}
trainer: {max_steps: 3, batch_size: 64, log_every_steps: 1, checkpoint_every_steps: 100, progress: false}
monitor: {collapse_every_steps: 1}
eval: {linear_epochs: 2, linear_lrs: [0.01], linear_weight_decays: [0.0], linear_views: 2}
"""


def test_split_values_and_run_directories(tmp_path: Path) -> None:
    assert sweep.split_values("0.01, 1e-3,[1, 2],{a: 1}") == ["0.01", "1e-3", "[1, 2]", "{a: 1}"]
    with pytest.raises(ConfigError, match="balanced"):
        sweep.split_values("[1,2")
    config = tmp_path / "c.yaml"
    config.write_text(TINY_MULTIVIEW)
    runs = sweep.sweep_runs(str(config), "method.lambd=auto,1e-3", [f"trainer.out={tmp_path}/run"])
    assert [(key, value) for key, value, _ in runs] == [("method.lambd", "auto"), ("method.lambd", 0.001)]
    assert runs[1][2][-1] == f"trainer.out={tmp_path}/run-method.lambd=1e-3"
    with pytest.raises(ConfigError, match="method.lambd"):  # every value is validated before any run
        sweep.sweep_runs(str(config), "method.lambd=0.01,large", [])
    with pytest.raises(ConfigError, match="KEY=V1,V2"):
        sweep.sweep_runs(str(config), "method.lambd", [])


def test_sweep_prints_one_result_per_value_and_runs_keep_spectra(tmp_path: Path, monkeypatch, capsys) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(TINY_MULTIVIEW)
    monkeypatch.setattr(sys, "argv", ["sweep.py", str(config), "views.0.num=2,3", f"trainer.out={tmp_path}/run",
                                      "--compare", "", "--evals", "knn,linear"])
    sweep.main()
    results = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(r["key"], r["value"]) for r in results] == [("views.0.num", 2), ("views.0.num", 3)]
    for r in results:
        assert 0 < r["knn_top1"] <= 100 and 0 < r["linear_top1"] <= 100
        run = tmp_path / f"run-views.0.num={r['value']}"
        with np.load(run / "spectra.npz") as spectra:
            assert spectra["steps"].tolist() == [1, 2, 3]
            assert spectra["eigenvalues"].shape == (3, 16) and np.allclose(spectra["eigenvalues"].sum(1), 1)
        assert (run / "plots" / "eigenspectrum.png").is_file()


TINY_VIT = """
method: {name: vicreg, expander: [32, 32]}
data: {dataset: digits}
views:
  - {preset: minimal, num: 2}
model: {backbone: vit_custom, params: {patch_size: 2, embed_dim: 16, depth: 1, num_heads: 2, pos_embed: learned}}
optim: {name: adamw, lr: 0.001}
trainer: {max_steps: 2, batch_size: 32, progress: false, channels_last: false}
"""


def test_masking_robustness_is_one_without_masking_and_below_one_with_it(tmp_path: Path, monkeypatch,
                                                                          capsys) -> None:
    import masking_robustness

    from selfsup.load import load_config
    from selfsup.launch import pretrain

    config = tmp_path / "vit.yaml"
    config.write_text(TINY_VIT)
    run = pretrain(load_config(str(config), [f"trainer.out={tmp_path}/run"]))
    monkeypatch.setattr(sys, "argv", ["masking_robustness.py", str(run), "--ratios", "0,0.5,0.9", "--limit", "50"])
    masking_robustness.main()
    (result,) = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["images"] == 50
    assert result["mask_ratio_0.0"] == pytest.approx(1.0, abs=1e-4)  # nothing dropped: identical features
    assert result["mask_ratio_0.5"] < 1.0 and result["mask_ratio_0.9"] < 1.0
    again = masking_robustness.masked_similarities(run, [0.5], limit=50)  # seeded masks: reproducible
    assert again["mask_ratio_0.5"] == result["mask_ratio_0.5"]


def test_plot_runs_reads_epochs_and_training_minutes(tmp_path: Path, monkeypatch, capsys) -> None:
    import plot_runs

    for name, rows in {"m2": [(0.5, 30, ""), (1.0, 60, 80.0), (2.0, 120, 82.5)], "m4": [(1.0, 120, 83.0)]}.items():
        (tmp_path / name).mkdir()
        lines = ["step,epoch,train_time_s,knn_top1"] + [f"{i},{e},{t},{v}" for i, (e, t, v) in enumerate(rows)]
        (tmp_path / name / "metrics.csv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "fig.png"
    monkeypatch.setattr(sys, "argv", ["plot_runs.py", str(out), f"{tmp_path / 'm2'}=M = 2", str(tmp_path / "m4")])
    plot_runs.main()
    finals = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert finals == {"M = 2": {"epoch": 2.0, "minutes": 2.0, "knn_top1": 82.5},
                      "m4": {"epoch": 1.0, "minutes": 2.0, "knn_top1": 83.0}}
    assert out.stat().st_size > 0
    assert plot_runs.read_curve(tmp_path / "m2", "knn_top1") == [(1.0, 1.0, 80.0), (2.0, 2.0, 82.5)]
    with pytest.raises(SystemExit, match="logged no 'linear'"):
        plot_runs.read_curve(tmp_path / "m2", "linear")


def test_plot_runs_spectra_match_the_training_effective_rank(tmp_path: Path, monkeypatch, capsys) -> None:
    import plot_runs

    from selfsup.train.monitors import collapse_stats, effective_rank, eigenspectrum

    embeddings = torch.randn(64, 16) @ torch.diag(torch.linspace(0.1, 2.0, 16))
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        spectra = np.stack([np.full(16, 1 / 16), eigenspectrum(embeddings).numpy()])
        np.savez(tmp_path / name / "spectra.npz", steps=np.array([1, 2]), eigenvalues=spectra)
    out = tmp_path / "spectra.png"
    monkeypatch.setattr(sys, "argv", ["plot_runs.py", str(out), f"{tmp_path / 'a'}=p = 256", str(tmp_path / "b"),
                                      "--spectra"])
    plot_runs.main()
    ranks = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["effective_rank"]
    expected = collapse_stats(embeddings)["effective_rank"]
    assert ranks == {"p = 256": pytest.approx(expected, abs=0.01), "b": pytest.approx(expected, abs=0.01)}
    assert out.stat().st_size > 0
    assert effective_rank(torch.full((16,), 1 / 16).sqrt()) == pytest.approx(16.0)


def test_accuracy_per_minute_sizes_the_run_to_the_budget_and_evaluates_snapshots(tmp_path: Path, monkeypatch,
                                                                                  capsys) -> None:
    import accuracy_per_minute

    config = tmp_path / "c.yaml"
    config.write_text(TINY_MULTIVIEW)
    out = tmp_path / "budget"
    monkeypatch.setattr(sys, "argv", ["accuracy_per_minute.py", str(config),
                                      "--cpu-minutes", "0.02", "--points", "3", "--calibration-steps", "8",
                                      "--holdout", "0.2", "--out", str(out)])
    accuracy_per_minute.main()
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["eval_set"] == "held-out 0.2 of train"  # settings are chosen without the test split
    per_step = result["calibration_cpu_s_per_step"]
    # the JSON rounds the CPU-s per step to 4 decimals; the run was sized with the unrounded value
    low, high = (max(3, int(0.02 * 60 / (per_step + d))) for d in (5e-5, -5e-5))
    assert per_step > 0 and low <= result["steps"] <= high and result["run_cpu_s_per_step"] > 0
    steps = [p["step"] for p in result["curve"]]
    every = -(-result["steps"] // 3)  # ceil: 3 points, the last one the final export
    assert steps == [*range(every, result["steps"], every), result["steps"]]
    minutes = [p["cpu_min"] for p in result["curve"]]
    assert minutes == sorted(minutes) and minutes[-1] > 0
    assert all(0 < p["knn_top1"] <= 100 and 0 < p["linear_top1"] <= 100 for p in result["curve"])
    assert result["raw"]["knn_top1"] > 90 and result["cpu_model"]
    assert json.loads((out / "curve.json").read_text()) == result and (out / "curve.png").is_file()


def test_accuracy_per_minute_trains_a_fixed_number_of_steps_without_calibrating(tmp_path: Path, monkeypatch,
                                                                               capsys) -> None:
    import accuracy_per_minute

    config = tmp_path / "c.yaml"
    config.write_text(TINY_MULTIVIEW)
    out = tmp_path / "steps"
    monkeypatch.setattr(sys, "argv", ["accuracy_per_minute.py", str(config), "--steps", "4", "--points", "2",
                                      "--evals", "knn", "--holdout", "0.2", "--no-raw", "--out", str(out)])
    accuracy_per_minute.main()
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["raw"] is None  # --no-raw: a screen's arms share one raw-pixel score
    assert result["steps"] == 4 and [p["step"] for p in result["curve"]] == [2, 4]
    assert result["cpu_minutes_budget"] is None and result["calibration_cpu_s_per_step"] is None
    assert not (out / "calibration").exists()
    assert result["run_cpu_s_per_step"] == pytest.approx(result["curve"][-1]["cpu_min"] * 60 / 4, abs=1e-3)
    for bad in (["--steps", "0"], ["--steps", "4", "--cpu-minutes", "1"], []):  # one length, and a positive one
        monkeypatch.setattr(sys, "argv", ["accuracy_per_minute.py", str(config), *bad])
        with pytest.raises(SystemExit):
            accuracy_per_minute.main()


def test_accuracy_per_minute_warns_when_the_run_is_off_its_calibration(tmp_path: Path, monkeypatch, capsys) -> None:
    import accuracy_per_minute

    config = tmp_path / "c.yaml"
    config.write_text(TINY_MULTIVIEW)
    # A calibration 100x too slow: the machine "sped up" after it, so the run uses a fraction of its budget.
    monkeypatch.setattr(accuracy_per_minute, "cpu_seconds_per_step", lambda run_dir: 100.0)
    result = accuracy_per_minute.budget_curve(str(config), [], 0.2, tmp_path / "out", points=1, evals="knn",
                                              calibration_steps=4)
    assert result["steps"] == 1 and result["calibration_cpu_s_per_step"] == 100.0
    assert result["run_cpu_s_per_step"] < 100.0
    assert "--steps 1" in capsys.readouterr().err


def test_anchors_impl_builders_run_selfsup_steps() -> None:
    """benchmarks/anchors_impl.py (for ../shared/anchors-bench): every builder makes a step that trains."""
    import anchors_impl

    tiny = dict(batch=4, img=8, patch=4)  # ViT-Tiny on 4 tokens: fast
    for cfg in (dict(method="msn", mask=0.5, focal=1, focal_img=4, **tiny),
                dict(method="extrema", mask=0.5, num_masks=2, **tiny)):
        step, info = anchors_impl.IMPLS["selfsup"][cfg["method"]](cfg, None)
        losses = [step(), step()]
        assert all(np.isfinite(losses)) and info["params_M"] > 5, cfg["method"]  # ViT-Tiny + heads


def test_throughput_measures_each_variant(tmp_path: Path, capsys, monkeypatch) -> None:
    import throughput

    config = tmp_path / "c.yaml"
    config.write_text(TINY_MULTIVIEW)
    monkeypatch.setattr(sys, "argv", ["throughput.py", str(config), "--steps", "1", "--warmup", "0",
                                      "--variant", "trainer.batch_size=32", "--variant", "trainer.batch_size=16 views.0.num=2"])
    throughput.main()
    results = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(r["variant"], r["batch_size"], r["views"]) for r in results] == [
        ("trainer.batch_size=32", 32, 3), ("trainer.batch_size=16 views.0.num=2", 16, 2)]
    assert all(r["train_images_per_s"] > 0 for r in results)


def test_laptop_suite_trains_each_preset_once_and_writes_table_and_plot(tmp_path: Path, capsys) -> None:
    import laptop_suite

    data = class_image_folder(tmp_path / "cifar")
    out = tmp_path / "suite"
    argv = ["--data", str(data), "--cpu-minutes", "0.02", "--methods", "vicreg,barlow_twins", "--out", str(out),
            "--points", "2", "--calibration-steps", "4", "--evals", "knn,linear,lowshot,cluster",
            "trainer.batch_size=16", "eval.linear_epochs=2", "eval.linear_lrs=[0.01]", "eval.linear_weight_decays=[0]",
            "eval.lowshot_shots=[1,5]", "eval.knn_k=5",
            "model.params.stage_widths=[4,8,8,16]"]
    suite = laptop_suite.main(argv)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == suite
    assert list(suite["methods"]) == ["vicreg", "barlow_twins"] and suite["holdout"] == 0.1
    for name, result in suite["methods"].items():
        steps = [point["step"] for point in result["curve"]]  # the snapshots, then the final export
        assert len(steps) >= 2 and steps == sorted(steps) and steps[-1] == result["steps"] >= 2
        for scores in (result["curve"][-1], result["random"]):
            assert 0 < scores["knn_top1"] <= 100 and 0 < scores["lowshot_5shot_mean"] <= 100
    assert set(suite["raw"]) >= {"knn_top1", "linear_top1", "lowshot_1shot_mean", "cluster_acc"}
    table = (out / "suite.md").read_text()
    assert "| vicreg |" in table and "| raw pixels |" in table and "| barlow_twins (random) |" in table
    assert (out / "suite.png").stat().st_size > 0
    # Resumable: a finished method is not retrained (its run directory is left untouched).
    checkpoint = out / "vicreg" / "run" / "backbone.safetensors"
    stamp = checkpoint.stat().st_mtime_ns
    again = laptop_suite.main(argv)
    assert checkpoint.stat().st_mtime_ns == stamp
    assert "not retrained" in capsys.readouterr().err
    assert again["methods"]["vicreg"]["curve"] == suite["methods"]["vicreg"]["curve"]
    # Run one method at a time: the table still holds every preset finished in --out (in the suite's order) ...
    one = [*argv[:5], "barlow_twins", *argv[6:]]
    alone = laptop_suite.main(one)
    assert list(alone["methods"]) == ["vicreg", "barlow_twins"] and alone["methods"] == suite["methods"]
    assert "| vicreg |" in (out / "suite.md").read_text()
    # ... but not a run made from another version of its preset: here every preset's lr differs from vicreg's run.
    changed = laptop_suite.main([*one, "optim.lr=0.2"])
    assert list(changed["methods"]) == ["barlow_twins"]
    assert "vicreg: its run in" in capsys.readouterr().err and "| vicreg |" not in (out / "suite.md").read_text()


def test_laptop_suite_killed_after_training_does_not_retrain(tmp_path: Path, monkeypatch, capsys) -> None:
    """A kill right after the budgeted run and its evaluations (before the suite's own bookkeeping) loses nothing:
    curve.json is written once, with the random network's scores, so the next invocation reuses it."""
    import laptop_suite

    data = class_image_folder(tmp_path / "cifar")
    out = tmp_path / "suite"
    argv = ["--data", str(data), "--cpu-minutes", "0.01", "--methods", "vicreg", "--out", str(out), "--points", "1",
            "--calibration-steps", "4", "--evals", "knn", "trainer.batch_size=16", "eval.knn_k=5",
            "model.params.stage_widths=[4,8,8,16]"]
    real = laptop_suite.budget_curve

    def killed(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(laptop_suite, "budget_curve", killed)
    with pytest.raises(KeyboardInterrupt):
        laptop_suite.main(argv)
    monkeypatch.setattr(laptop_suite, "budget_curve", real)
    stamp = (out / "vicreg" / "run" / "backbone.safetensors").stat().st_mtime_ns
    suite = laptop_suite.main(argv)
    assert "not retrained" in capsys.readouterr().err
    assert (out / "vicreg" / "run" / "backbone.safetensors").stat().st_mtime_ns == stamp
    assert 0 < suite["methods"]["vicreg"]["random"]["knn_top1"] <= 100


def test_laptop_suite_retrains_a_method_whose_preset_changed(tmp_path: Path, capsys) -> None:
    """A finished run is reused only for the preset it was trained from: another lr is retrained, the old run kept;
    another preset length is not retrained (the suite sizes the run itself)."""
    import laptop_suite

    data = class_image_folder(tmp_path / "cifar")
    out = tmp_path / "suite"
    argv = ["--data", str(data), "--cpu-minutes", "0.01", "--methods", "vicreg", "--out", str(out), "--points", "1",
            "--calibration-steps", "4", "--evals", "knn", "trainer.batch_size=16", "eval.knn_k=5",
            "model.params.stage_widths=[4,8,8,16]"]
    first = laptop_suite.main(argv)["methods"]["vicreg"]
    assert laptop_suite.main(argv)["methods"]["vicreg"] == first and "not retrained" in capsys.readouterr().err
    # The preset's own length is not what the suite trains (it sizes the run to the budget): no retraining.
    assert laptop_suite.main([*argv, "trainer.epochs=3"])["methods"]["vicreg"] == first
    assert "not retrained" in capsys.readouterr().err
    second = laptop_suite.main([*argv, "optim.lr=0.2"])["methods"]["vicreg"]
    err = capsys.readouterr().err
    assert "changed since" in err and "not retrained" not in err
    assert second["preset_sha256"] != first["preset_sha256"]
    aside = out / f"vicreg.replaced-{first['preset_sha256']}"
    assert json.loads((aside / "curve.json").read_text()) == first and (aside / "run" / "backbone.safetensors").is_file()
    assert (out / "vicreg" / "run" / "config.yaml").read_text().count("lr: 0.2") == 1


def test_laptop_suite_fits_a_staged_preset_into_the_budget(tmp_path: Path, capsys) -> None:
    """MAE-CT at a budget: every stage calibrated, and all scaled by one factor so that the whole costs the budget."""
    import laptop_suite

    data = class_image_folder(tmp_path / "cifar")
    out = tmp_path / "suite"
    budget = 0.1  # CPU-minutes
    argv = ["--data", str(data), "--cpu-minutes", str(budget), "--methods", "mae_ct", "--out", str(out),
            "--points", "2", "--calibration-steps", "4", "--evals", "knn", "trainer.batch_size=16", "eval.knn_k=5",
            "model.params.depth=3", "model.params.embed_dim=32", "model.params.img_size=16",
            "stages.head_init.method.queue_size=32", "stages.ct.method.queue_size=32",  # below the 72 images
            "stages.head_init.trainer.max_steps=3", "stages.ct.trainer.epochs=2"]  # 4 steps an epoch here
    suite = laptop_suite.main(argv)
    assert list(suite["methods"]) == ["mae_ct"] and not (out / "mae").exists()  # no separate MAE run
    ct = suite["methods"]["mae_ct"]
    sizes = ct["stage_sizes"]
    # The preset's lengths: MAE 6.5 epochs of 4 steps, the head 3 steps, the tuning 2 epochs.
    assert {n: s["preset_steps"] for n, s in sizes.items()} == {"mae": 26, "head_init": 3, "ct": 8}
    calibrated = json.loads((out / "mae_ct" / "stages.json").read_text())
    assert {n: s["cpu_s_per_step"] for n, s in sizes.items()} == {n: c["cpu_s_per_step"] for n, c in calibrated.items()}
    priced = sum(s["preset_steps"] * s["cpu_s_per_step"] for s in sizes.values()) / 60
    assert ct["scale"] == pytest.approx(budget / priced, rel=1e-3)
    for stage in sizes.values():  # one factor for every stage, so the preset's proportions hold
        assert stage["steps"] == max(1, round(stage["preset_steps"] * budget / priced))
        assert stage["cpu_min"] == pytest.approx(stage["steps"] * stage["cpu_s_per_step"] / 60, abs=1e-3)
    assert sum(s["cpu_min"] for s in sizes.values()) == pytest.approx(budget, abs=0.02)
    first = json.loads((out / "mae_ct" / "first" / "curve.json").read_text())
    assert first["steps"] == sizes["mae"]["steps"] == ct["first_stage"]["steps"]
    assert [s["stage"] for s in ct["stages"]] == ["mae", "head_init", "ct"]
    assert [s["steps"] for s in ct["stages"]] == [sizes[n]["steps"] for n in ("mae", "head_init", "ct")]
    assert ct["curve"][:-1] == first["curve"]
    end = ct["curve"][-1]
    assert end["step"] == sum(s["steps"] for s in sizes.values())
    assert end["cpu_min"] == pytest.approx(sum(s["cpu_time_s"] for s in ct["stages"]) / 60, abs=1e-3)
    assert 0 < end["knn_top1"] <= 100 and 0 < ct["random"]["knn_top1"] <= 100
    # The tuning started from the sized MAE run's own weights: stage 1 is a copy of it.
    assert (out / "mae_ct" / "run" / "stages" / "1_mae" / "backbone.safetensors").read_bytes() == \
        (out / "mae_ct" / "first" / "run" / "backbone.safetensors").read_bytes()
    # Resumable as a whole; killed before its end, the staged run is taken up again from the kept calibrations,
    # without retraining the first stage.
    assert laptop_suite.main(argv)["methods"]["mae_ct"] == ct and "not retrained" in capsys.readouterr().err
    (out / "mae_ct" / "curve.json").unlink()
    stamp = (out / "mae_ct" / "first" / "curve.json").stat().st_mtime_ns
    assert laptop_suite.main(argv)["methods"]["mae_ct"]["stage_sizes"] == sizes
    assert (out / "mae_ct" / "first" / "curve.json").stat().st_mtime_ns == stamp
    # The first stage is reused only for the same evaluations (and length and hold-out).
    assert laptop_suite.main([*argv, "--evals", "knn,cluster"])["methods"]["mae_ct"]["curve"][0]["cluster_acc"] > 0


def test_laptop_suite_refuses_unknown_presets_and_missing_data(tmp_path: Path) -> None:
    import laptop_suite

    with pytest.raises(SystemExit, match="train/ folder"):
        laptop_suite.main(["--data", str(tmp_path)])
    (tmp_path / "train").mkdir()
    with pytest.raises(SystemExit, match="no laptop preset .*swav"):
        laptop_suite.main(["--data", str(tmp_path), "--methods", "vicreg,swav"])


def test_suite_trends_plots_each_complete_comparison_and_prints_the_gains(tmp_path: Path, capsys) -> None:
    import suite_trends

    suite = tmp_path / "suite"
    for method, curve in {"mae": [(100, 3.0, 40.0, 45.0), (200, 6.0, 44.0, 47.5)],
                          "mae_ct": [(100, 3.0, 40.0, 45.0), (200, 6.0, 44.0, 47.5), (260, 6.9, 49.25, 50.0)],
                          "vicreg": [(300, 10.0, 48.0, 52.0)]}.items():
        points = [{"step": s, "cpu_min": c, "knn_top1": k, "linear_top1": lin} for s, c, k, lin in curve]
        points[-1].update(lowshot_1shot_mean=20.0 if method == "mae" else 22.5, cluster_acc=25.0)
        (suite / method).mkdir(parents=True)
        (suite / method / "curve.json").write_text(json.dumps({"curve": points}))
    (suite / "raw.json").write_text(json.dumps({"scores": {"knn_top1": 35.0, "linear_top1": 40.0,
                                                           "lowshot_1shot_mean": 16.0, "cluster_acc": 20.0}}))
    out = tmp_path / "figures"
    result = suite_trends.main(["--suite", str(suite), "--out", str(out)])
    assert json.loads(capsys.readouterr().out) == result
    assert list(result) == ["mae_ct"]  # mast, multiview and vit lack runs
    assert [p.name for p in out.iterdir()] == ["cifar10_mae_ct.png"]
    assert result["mae_ct"]["minus_mae"]["mae_ct"] == {"cpu_min": 0.9, "knn_top1": 5.25, "linear_top1": 2.5,
                                                       "lowshot_1shot_mean": 2.5, "cluster_acc": 0.0}
    assert result["mae_ct"]["ends"]["mae_ct"]["step"] == 260
    with pytest.raises(SystemExit, match="no <method>/curve.json"):
        suite_trends.main(["--suite", str(tmp_path / "empty")])


def test_plot_arms_groups_seeds_from_arm_files_and_curves(tmp_path: Path, capsys) -> None:
    import plot_arms

    def point(knn: float, one_shot: float) -> dict:
        return {"step": 10, "knn_top1": knn, "linear_top1": 50.0, "lowshot_1shot_mean": one_shot}

    arms = tmp_path / "arms.jsonl"
    arms.write_text("\n".join(json.dumps(row) for row in [
        {"arm": "a_s1", "rc": 0, "result": {"curve": [point(1.0, 1.0), point(44.0, 19.0)]}},
        {"arm": "b", "rc": 0, "result": {"curve": [point(40.0, 17.0)]}},
        {"arm": "dead", "rc": 124, "result": None}]) + "\n")
    (tmp_path / "curve.json").write_text(json.dumps({"curve": [point(46.0, 21.0)]}))
    out = tmp_path / "arms.png"
    summary = plot_arms.main([str(out), f"A={tmp_path / 'curve.json'}", f"A={arms}:a_s1", f"B={arms}:b",
                              "--line", "1-shot=19.93"])
    assert json.loads(capsys.readouterr().out) == summary
    assert out.stat().st_size > 0
    assert list(summary) == ["A", "B"]  # in the order given
    assert summary["A"]["runs"] == 2 and summary["B"]["runs"] == 1
    assert summary["A"]["20-NN"] == {"mean": 45.0, "std": 1.41}  # each run's last point: 46 and 44
    assert summary["A"]["1-shot"] == {"mean": 20.0, "std": 1.41}
    assert summary["B"]["1-shot"] == {"mean": 17.0, "std": None}
    assert "5-shot" not in summary["A"]
    with pytest.raises(SystemExit, match="'dead' .*no result .*124"):
        plot_arms.main([str(out), f"A={arms}:dead"])
    with pytest.raises(SystemExit, match="no arm 'c'"):
        plot_arms.main([str(out), f"A={arms}:c"])
    with pytest.raises(SystemExit):
        plot_arms.main([str(out), f"A={arms}:b", "--line", "recall=3"])


def test_mutation_report_counts_classified_survivors_apart(monkeypatch, tmp_path, capsys):
    import mutation_report

    rows = [("selfsup.methods.byol.xǁBYOLǁforward__mutmut_1", "selfsup/methods/byol.py", "killed"),
            ("selfsup.methods.byol.xǁBYOLǁforward__mutmut_2", "selfsup/methods/byol.py", "timeout"),
            ("selfsup.methods.byol.xǁBYOLǁforward__mutmut_3", "selfsup/methods/byol.py", "survived"),
            ("selfsup.methods.byol.xǁBYOLǁforward__mutmut_4", "selfsup/methods/byol.py", "survived"),
            ("selfsup.methods.byol.xǁBYOLǁforward__mutmut_5", "selfsup/methods/byol.py", "survived"),
            ("selfsup.methods.byol.xǁBYOLǁforward__mutmut_6", "selfsup/methods/byol.py", "timeout"),
            ("selfsup.losses.byol.x_byol_loss__mutmut_1", "selfsup/losses/byol.py", "not checked")]
    monkeypatch.setattr(mutation_report, "results", lambda: rows)
    classes = tmp_path / "classes.tsv"
    classes.write_text("# comment\nselfsup.methods.byol.xǁBYOLǁforward__mutmut_3\tequivalent\tsame default\n"
                       "selfsup.methods.byol.xǁBYOLǁforward__mutmut_4\tmessage\twording\n"
                       "selfsup.methods.byol.xǁBYOLǁforward__mutmut_6\tmessage\ta time-out that survived when re-run\n")
    monkeypatch.setattr(sys, "argv", ["mutation_report.py", "--classes", str(classes), "--prefix", "selfsup.methods."])
    mutation_report.main()
    out = capsys.readouterr().out
    # 6 mutants: 1 killed + 1 timed out = 2 killed; 1 equivalent leaves 5 that count; the message mutants count
    assert "| `selfsup/methods/byol.py` | 6 | 1 | 1 | 1 | 1 | 0 | 2 | 33.3 % | 40.0 % |" in out
    assert "1 survivors without a class:\nselfsup.methods.byol.xǁBYOLǁforward__mutmut_5" in out
    assert "losses" not in out  # outside the prefix
    classes.write_text("selfsup.methods.byol.xǁBYOLǁforward__mutmut_3\tboring\tx\n")
    with pytest.raises(SystemExit, match="unknown class 'boring'"):
        mutation_report.main()


def test_mast_masks_counts_each_masks_dimensions_and_finds_variance_piled_on_them(tmp_path: Path, monkeypatch,
                                                                                 capsys) -> None:
    import mast_masks
    from tiny import MAST_RUN, tiny_yaml

    from selfsup.load import load_config
    from selfsup.launch import pretrain

    config = tmp_path / "mast.yaml"
    config.write_text(tiny_yaml(MAST_RUN))
    run = pretrain(load_config(str(config), [f"trainer.out={tmp_path}/run", "trainer.max_steps=2"]))
    # Plant the degenerate state of docs/reproductions.md by hand: mask k keeps dimensions 0..k+2 at weight 1 (the
    # rest at 0.1), and the variance head's last bias makes the variance of dimensions 0..5 large.
    ckpt = run / "checkpoints" / "last.pt"
    state = torch.load(ckpt, weights_only=True, map_location="cpu")
    masks = torch.full((32, 4), 0.1)
    for k in range(4):
        masks[: k + 3, k] = 1.0
    state["model"]["mask_params"] = masks
    state["model"]["projector.fc_var.weight"] = torch.zeros_like(state["model"]["projector.fc_var.weight"])
    state["model"]["projector.fc_var.bias"] = torch.zeros(32)
    state["model"]["projector.fc_var.bias"][:6] = 8.0  # variance softplus(8) ~ 8 there, softplus(0) ~ 0.69 elsewhere
    torch.save(state, ckpt)
    monkeypatch.setattr(sys, "argv", ["mast_masks.py", str(run), "--fraction", "0.1", "--top", "3"])
    mast_masks.main()
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["ops"] == ["color_jitter", "blur", "flip", "crop"]
    assert result["dims_above_half_max"] == [3, 4, 5, 6]
    assert result["mask_mean"] == pytest.approx((4 * 0.1 * 32 + 0.9 * (3 + 4 + 5 + 6)) / 128, abs=1e-4)
    assert result["images"] == 150  # 10 % of the digits training split (1,500 images)
    # mask weight per dimension: 4.0 on 0..2, then 3.1, 2.2, 1.3, then 0.4; variance 8.0003 on 0..5, 0.6931 after
    weight = np.array([4.0] * 3 + [3.1, 2.2, 1.3] + [0.4] * 26)
    variance = np.array([np.log1p(np.exp(8.0))] * 6 + [np.log(2.0)] * 26)
    assert result["corr_mask_weight_variance"] == pytest.approx(np.corrcoef(weight, variance)[0, 1], abs=1e-3)
    assert result["top_dims_variance_ratio"] == pytest.approx(variance[:3].mean() / variance.mean(), abs=0.01)


def _gpu_check_out(root: Path) -> Path:
    """An OUT_DIR of benchmarks/gpu_check.sh, written by hand: MSN 1.5x the authors' (exactly the goal), MAE
    1.25x; MSN's bf16 3000 against fp32 1000 images/s, MAE's 5000 against 5500 (bf16 slower); the loader 1.1x the
    step; MAE's MFU 41 %; MAST's bf16 bench out of memory."""
    root.mkdir()
    (root / "env.txt").write_text("NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04\ncores 16\n")
    peak = "datasheet NVIDIA H100 SXM bf16 dense"

    def step(name: str, config: str, precision: str, images_per_s: float, mfu: float) -> dict:
        return {"name": name, "config": config, "precision": precision, "batch_size": 128, "data": "synthetic",
                "train_images_per_s": images_per_s, "gflops_per_image": 81.34, "tflops_per_s": 244.0, "mfu": mfu,
                "peak_memory_mib": 12345.6, "peak_source": peak}

    bench = [step("bench_msn_vit_s16_bf16", "msn_vit_s16", "bf16-mixed", 3000.0, 0.247),
             step("bench_mae_vit_b16_bf16", "mae_vit_b16", "bf16-mixed", 5000.0, 0.41),
             {"name": "bench_mast5_resnet50_bf16", "config": "mast5_resnet50",
              "error": "torch.OutOfMemoryError: CUDA out of memory"},
             {**step("loader_msn_vit_s16_bf16", "msn_vit_s16", "bf16-mixed", 3000.0, 0.25), "data": "streamed",
              "loader_workers": 14, "loader_images_per_s": 3300.0, "loader_to_train_ratio": 1.1,
              "decode_ms_per_image": 4.5, "bottleneck": "step"},
             step("bench_msn_vit_s16_fp32", "msn_vit_s16", "32-true", 1000.0, 0.5),
             step("bench_mae_vit_b16_fp32", "mae_vit_b16", "32-true", 5500.0, 0.6)]

    def side(impl: str, config: str, seconds: float, **extra: float) -> dict:
        return {"impl": impl, "config": config, "precision": "bf16-mixed", "batch": 64, "step_s_mean": seconds,
                "images_per_s": 64 / seconds, "gflops_per_step": 5206.0, "mfu": 0.1, "peak_memory_mib": 9000.0,
                **extra}

    sbs = [side("authors", "msn_vit_s16", 0.15), side("selfsup", "msn_vit_s16", 0.1, speed_vs_authors=1.5),
           side("authors", "mae_vit_b16", 0.1), side("selfsup", "mae_vit_b16", 0.08, speed_vs_authors=1.25)]
    (root / "bench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bench))
    (root / "sbs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sbs))
    return root


def test_gpu_table_prints_each_goal_with_its_verdict_and_the_failures(tmp_path: Path, capsys) -> None:
    """benchmarks/gpu_table.py on a hand-made OUT_DIR: the ratios worked out by hand, each goal met or missed."""
    import gpu_table

    out = _gpu_check_out(tmp_path / "out")
    gpu_table.main([str(out)])
    text = capsys.readouterr().out
    assert text.startswith("GPU: **NVIDIA H100 80GB HBM3 (81559 MiB, 580.159.04)**")
    # bf16 / fp32: 3000 / 1000 = 3.00 for MSN, 5000 / 5500 = 0.909 for MAE
    assert "| MSN ViT-S/16 (`msn_vit_s16.yaml`) | 1,000 | 3,000 | 3.00x |" in text
    assert "| MAE ViT-B/16 (`mae_vit_b16.yaml`) | 5,500 | 5,000 | 0.91x |" in text
    assert "| MSN ViT-S/16 (`msn_vit_s16.yaml`) | bf16-mixed | 128 | 3,000 | 81.3 | 244.0 | 24.7 % | 12,346 |" in text
    assert "| 14 | 3,300 | 3,000 | 1.10x | 4.50 | step |" in text
    assert "| selfsup | 64 | 0.1000 | 640 | 5,206.0 | 10.0 % | 9,000 | 1.50x |" in text
    goals = [line for line in text.splitlines() if line.startswith("| ") and line.endswith(("| met |", "| missed |",
                                                                                           "| not measured |"))]
    assert goals == [
        "| MSN ViT-S/16 step >= 1.5x the authors' (bf16-mixed) | 1.50x | met |",  # exactly at the goal
        "| MAE ViT-B/16 step >= 1.5x the authors' (bf16-mixed) | 1.25x | missed |",
        "| MFU >= 40% for MAE ViT-B/16 in bf16-mixed | 41.0 % | met |",
        "| bf16-mixed faster than fp32 for every config (the slowest ratio) | 0.91x | missed |",
        "| loader >= 1.2x the step's images/s for ViT-S/16 | 1.10x | missed |",
    ]
    assert "- bench_mast5_resnet50_bf16: torch.OutOfMemoryError: CUDA out of memory" in text
    (out / "sbs.jsonl").unlink()
    assert "| MSN ViT-S/16 step >= 1.5x the authors' (bf16-mixed) |  | not measured |" in gpu_table.tables(out)
    with pytest.raises(SystemExit):
        gpu_table.main([str(tmp_path)])  # no bench.jsonl nor sbs.jsonl
    assert "OUT_DIR of benchmarks/gpu_check.sh" in capsys.readouterr().err


def test_anchors_cuda_arguments_and_a_clear_stop_without_the_authors_code(tmp_path: Path, capsys) -> None:
    """benchmarks/anchors_cuda.py parses its arguments without the authors' code; asked for the authors' step
    without it, it stops (exit 2) naming gpu_pack.sh, which unpacks that code."""
    import anchors_cuda

    with pytest.raises(SystemExit) as stop:
        anchors_cuda.main(["--help"])
    assert stop.value.code == 0 and "CPU numbers (--device cpu) test the script" in capsys.readouterr().out
    missing = str(tmp_path / "no_authors")
    with pytest.raises(SystemExit) as stop:
        anchors_cuda.parse_args(["--authors", missing, "--configs", "mae_vit_b16"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "bash benchmarks/gpu_pack.sh" in err and f"{missing}/mae" in err
    opts = anchors_cuda.parse_args(["--authors", missing, "--impls", "selfsup", "--precisions", "32-true,bf16-mixed",
                                    "--device", "cpu"])
    assert (opts.impl_list, opts.config_list, opts.precision_list) == (
        ["selfsup"], ["msn_vit_s16", "mae_vit_b16"], ["32-true", "bf16-mixed"])
    present = tmp_path / "authors"  # what gpu_pack.sh unpacks, as far as the check looks
    for name in ("msn/src/msn_train.py", "mae/models_mae.py"):
        (present / name).parent.mkdir(parents=True)
        (present / name).touch()
    assert anchors_cuda.parse_args(["--impls", "selfsup,authors", "--authors", str(present)]).impl_list == [
        "authors", "selfsup"]  # the authors' step first: the other lines' speed is against it
    for bad in (["--precisions", "16-mixed"], ["--image-size", "40"], ["--batch", "0"], ["--device", "mps"]):
        with pytest.raises(SystemExit) as stop:
            anchors_cuda.parse_args([*bad, "--impls", "selfsup"])
        assert stop.value.code == 2, bad
    with pytest.raises(SystemExit):
        anchors_cuda.parse_args(["--impls", "theirs"])
    assert "each must be one of authors, authors-sdpa, selfsup" in capsys.readouterr().err
    # speed against the authors' line of the same config and precision: 0.3 s / 0.15 s = 2.0
    authors = {"impl": "authors", "step_s_mean": 0.3}
    assert anchors_cuda.with_ratio({"impl": "selfsup", "step_s_mean": 0.15}, authors)["speed_vs_authors"] == 2.0
    assert "speed_vs_authors" not in anchors_cuda.with_ratio({"impl": "selfsup", "step_s_mean": 0.15},
                                                             {**authors, "error": "out of memory"})


def test_anchors_cuda_refuses_authors_settings_that_differ_from_the_config() -> None:
    """Both sides must do the same work: the authors' MSN settings (their msn_vits16.yaml) against
    configs/imagenet/msn_vit_s16.yaml; a different mask ratio or head stops the comparison."""
    import anchors_cuda

    opts = anchors_cuda.parse_args(["--impls", "selfsup", "--device", "cpu"])
    theirs = {"mask_ratio": 0.15, "shared_mask": True, "num_prototypes": 1024, "projector": [2048, 2048, 256]}
    anchors_cuda.same_work("msn_vit_s16", opts, theirs)
    with pytest.raises(ValueError, match=r"mask_ratio theirs 0.3 ours 0.15, projector theirs \[1024, 1024, 256\]"):
        anchors_cuda.same_work("msn_vit_s16", opts, {**theirs, "mask_ratio": 0.3, "projector": [1024, 1024, 256]})


@pytest.mark.parametrize("compare, expected", [("none", ["none"]), ("raw", ["none", "raw"]),
                                               ("raw,random", ["none", "raw", "random"])])
def test_pretrain_eval_scores_the_backbone_once_and_each_baseline_once(monkeypatch, tmp_path, compare, expected):
    """`--compare none` evaluates the backbone alone, not twice (each pass rebuilds every feature)."""
    import pretrain_eval

    scored = []
    monkeypatch.setattr(pretrain_eval, "load_config", lambda config, overrides: None)
    monkeypatch.setattr(pretrain_eval, "pretrain", lambda cfg: tmp_path)
    monkeypatch.setattr(pretrain_eval, "run_config", lambda run_dir, overrides: None)
    monkeypatch.setattr(pretrain_eval, "evaluate_run",
                        lambda run_dir, cfg, evals, baseline, progress: scored.append(baseline) or {"knn_top1": 1.0})
    result = pretrain_eval.pretrain_and_evaluate("cfg.yaml", [], compare=compare, evals="knn")
    assert scored == expected
    assert result["knn_top1"] == 1.0 and ("raw_knn_top1" in result) == ("raw" in expected)
