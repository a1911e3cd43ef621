"""Values are checked before any work (issue 31, item 4): every numeric config field declares its range with its
type, one validator (``selfsup.config.from_dict``) enforces them on load, and whatever value a user passes for
whatever key, the CLI exits 0 or 2 with exactly one ``error:`` line, never a traceback."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import selfsup.bench
import selfsup.eval.run
import selfsup.launch
from selfsup.cli import main
from selfsup.config import (Config, DataConfig, EvalConfig, ModelConfig, MonitorConfig, NonEmpty, OptimConfig, Range,
                            TrainerConfig, ViewConfig, parse_overrides)
from selfsup.data.augment import AugmentConfig
from selfsup.load import load_config
from selfsup.methods import METHODS
from selfsup.models import ResNet, VisionTransformer
from tiny import QUICK_EVAL, VICREG_8PX, tiny_yaml

CONFIG = tiny_yaml(VICREG_8PX, eval=QUICK_EVAL)

SECTIONS = {"data": DataConfig, "views.0": ViewConfig, "model": ModelConfig, "optim": OptimConfig,
            "trainer": TrainerConfig, "monitor": MonitorConfig, "eval": EvalConfig}
# A ViT run beside the ResNet one, for the ViT's constructor arguments (model.params.vit:<arg>).
VIT = {"patch_size": 4, "embed_dim": 16, "depth": 1, "num_heads": 2}
TINY_VIT = tiny_yaml(data={"image_size": 8}, views=[{"preset": "minimal", "num": 2}],
                     model={"backbone": "vit", "params": VIT}, trainer={"max_steps": 0, "batch_size": 32})
# Every key of every section, every method's section included (method.name=<m> picks the method), and the free-form
# ones: each augmentation parameter (views.0.params.*) and each constructor argument of both backbones (model.params.*).
KEYS = ([f"{section}.{f.name}" for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)]
        + [f"method.{name}:{f.name}" for name, cls in METHODS.items() for f in dataclasses.fields(cls.Config)]
        + ["method.name"] + [f.name for f in dataclasses.fields(Config)]
        + [f"views.0.params.{f.name}" for f in dataclasses.fields(AugmentConfig) if f.name != "size"]
        + [f"model.params.{name}" for name in inspect.signature(ResNet).parameters]
        + [f"model.params.vit:{name}" for name in inspect.signature(VisionTransformer).parameters])
# Boundary and garbage values, as a user types them after key= (parsed as YAML).
GARBAGE = ["0", "-1", "1", "2", "0.5", "-0.5", "1e-12", "1.0", ".nan", "nan", ".inf", "-.inf", "inf", "1e400",
           str(10**12), str(2**70), "1e300", "-1e300", "abc", "''", "[]", "[0]", "[-1]", "[1, 2]", "[.nan]", "[abc]",
           "{}", "{a: 1}", "true", "false", "null", "all", "auto", "~", "[[1]]", "0x10", "1_000"]
# The values every key is swept with (the random test draws from all of the above and more).
BOUNDARY = ["0", "-1", ".nan", ".inf", str(2**70), "abc", "[]", "true"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """The tiny config and a run directory of it (0 steps: the initial backbone exported)."""
    root = tmp_path_factory.mktemp("validation")
    (root / "run.yaml").write_text(CONFIG)
    (root / "vit.yaml").write_text(TINY_VIT)
    assert main(["pretrain", str(root / "run.yaml"), f"trainer.out={root / 'run'}"]) == 0
    return root


def cli(argv: list[str]) -> tuple[int, str]:
    """``selfsup.cli.main`` in process: its exit code and stderr (an uncaught exception propagates: a traceback).
    A call that takes over 30 s is a hang (issue 50's bar): the runs here are at most 2 steps of an 8-pixel model."""
    err = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse
            code = exit_.code
    assert time.perf_counter() - start < 30, (argv, "took over 30 s")
    return code, err.getvalue()


def absurd(value: object) -> bool:
    """A value no key may take: a number that is not finite or beyond every declared bound (2**31 - 1, 1e6), or a
    list or mapping holding one."""
    if isinstance(value, (list, tuple)):
        return any(absurd(v) for v in value)
    if isinstance(value, dict):
        return any(absurd(v) for v in value.values())
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and not (math.isfinite(value) and abs(value) <= 2**31 - 1))


def assert_clean(code: int, err: str, argv: list[str], diverged_ok: bool = False) -> None:
    """Exit 0 with no error line, or 2 (1: training diverged, where allowed) with exactly one; never a traceback. A
    NaN, an infinity or a number beyond every bound is never accepted."""
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert "Traceback" not in err, (argv, err)
    allowed = ((0, 0), (2, 1), (1, 1)) if diverged_ok else ((0, 0), (2, 1))
    assert (code, len(errors)) in allowed, (argv, code, err)
    value = parse_overrides([argv[-1]])  # the drawn override, as the CLI parsed it
    for part in argv[-1].partition("=")[0].split("."):
        value = value[part]
    assert not (code == 0 and absurd(value)), (argv, "accepted")


@contextlib.contextmanager
def checks_only(monkeypatch_ctx):
    """The entry points stop after their checks: pretrain and bench run ``validate`` (what they run first), eval its
    config checks; so an accepted value starts no work."""
    monkeypatch_ctx.setattr(selfsup.launch, "pretrain", lambda cfg, **_: selfsup.launch.validate(cfg))
    monkeypatch_ctx.setattr(selfsup.bench, "bench", lambda cfg, **_: selfsup.launch.validate(cfg) or {})
    monkeypatch_ctx.setattr(selfsup.eval.run, "evaluate_run", lambda *a, **k: {})
    monkeypatch_ctx.setattr(selfsup.eval.run, "run_finetune", lambda *a, **k: {})
    yield


def argv_for(entry: str, key: str, value: str, workdir: Path) -> list[str]:
    method, config = [], workdir / "run.yaml"
    if key.startswith("model.params.vit:"):  # a ViT's argument: a fresh ViT run
        key, config, entry = f"model.params.{key.split(':')[1]}", workdir / "vit.yaml", "bench" if entry == "bench" \
            else "pretrain"
    elif ":" in key:  # method.<name>:<key>
        section_name, field_name = key.split(":")
        method, key = [f"method.name={section_name.split('.')[1]}"], f"method.{field_name}"
    override = [*method, f"{key}={value}"]
    run = str(workdir / "run")
    if entry == "eval":
        return ["eval", "all", run, *override]
    if entry == "resume":
        return ["pretrain", run, *override]
    return [entry, str(config), f"trainer.out={workdir / 'new'}", *override]


ENTRIES = ["pretrain", "resume", "bench", "eval"]


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entry=st.sampled_from(ENTRIES), key=st.sampled_from(KEYS),
       value=st.one_of(st.sampled_from(GARBAGE), st.integers().map(str), st.floats().map(repr),
                       st.text(max_size=6), st.lists(st.integers(-3, 3), max_size=3).map(str)))
def test_any_value_of_any_key_exits_0_or_2_with_one_error_line(workdir, monkeypatch, entry, key, value) -> None:
    argv = argv_for(entry, key, value, workdir)
    with monkeypatch.context() as m, checks_only(m):
        code, err = cli(argv)
    assert_clean(code, err, argv)


# The real runs draw no huge values: an accepted trainer.max_steps=10**12 would train for ever (the stubbed tests
# above draw those).
SMALL = ["0", "-1", "1", "2", "0.5", "-0.5", "1e-12", ".nan", ".inf", "abc", "''", "[]", "[0]", "[1, 2]", "{}", "true",
         "null", "all", "auto"]


@settings(max_examples=20, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from([k for k in KEYS if not k.startswith("eval.")]), value=st.sampled_from(SMALL))
def test_accepted_values_also_run(workdir, tmp_path_factory, monkeypatch, key, value) -> None:
    """No stubs: a few drawn values go through a real run (2 steps, online kNN and collapse monitors every step);
    what the checks accept must then run, and what fails must fail as exit 2 with one line (eval.* keys: the
    evaluation tests below, whose accepted values run for minutes: eval.finetune_batch_size=1). A value
    in range can still make training diverge (method.lambd=1e300): that is exit 1 with one line, never a traceback."""
    out = tmp_path_factory.mktemp("real")
    argv = [*argv_for("pretrain", key, value, workdir)[:2], f"trainer.out={out}", "trainer.max_steps=2",
            "monitor.knn_every_steps=1", "monitor.knn_train_size=200", "monitor.knn_test_size=100",
            "monitor.collapse_every_steps=1", *argv_for("pretrain", key, value, workdir)[3:]]
    monkeypatch.chdir(out)  # a drawn relative trainer.out (trainer.out=-1e300) lands here, not in the checkout
    code, err = cli(argv)
    assert_clean(code, err, argv, diverged_ok=True)


def test_every_key_with_every_boundary_value(workdir, monkeypatch) -> None:
    """The exhaustive sweep beside the random one: each key x each of BOUNDARY, through pretrain (eval keys: eval)."""
    start, rejected = time.perf_counter(), 0
    with monkeypatch.context() as m, checks_only(m):
        for key in KEYS:
            for value in BOUNDARY:
                argv = argv_for("eval" if key.startswith("eval.") else "pretrain", key, value, workdir)
                code, err = cli(argv)
                assert_clean(code, err, argv)
                rejected += code == 2
    assert rejected > len(KEYS) * len(BOUNDARY) * 0.8  # most of it is refused
    assert time.perf_counter() - start < 60


@pytest.mark.parametrize("override, named", [
    ("optim.lr=0", "optim.lr: 0.0; use a number in (0, 1000000], e.g. 0.001"),
    ("optim.lr=nan", "optim.lr: nan; use a finite number"),
    ("optim.lr=.inf", "optim.lr: inf; use a finite number"),
    ("optim.lr=-1", "optim.lr: -1.0; use a number in (0, 1000000]"),
    ("optim.weight_decay=-1", "optim.weight_decay: -1.0; use a number in [0, 1000000]"),
    ("optim.warmup_epochs=-1", "optim.warmup_epochs: -1.0; use a number in [0, 1000000]"),
    ("monitor.knn_k=0", "monitor.knn_k: 0; use an integer in [1, 2147483647]"),
    ("monitor.knn_temperature=0", "monitor.knn_temperature: 0.0; use a number in (0, 100]"),
    ("monitor.knn_train_size=0", "monitor.knn_train_size: 0; use an integer in [1, 2147483647]"),
    ("method.expander=[0]", "method.expander.0: 0"),
    ("trainer.out=''", "trainer.out: ''; use a non-empty string, e.g. runs/my_run"),  # '' was the cwd
])
def test_pretrain_refuses_bad_values_before_any_work(workdir, tmp_path, monkeypatch, override, named) -> None:
    monkeypatch.chdir(tmp_path)  # where trainer.out='' would write
    argv = ["pretrain", str(workdir / "run.yaml"), f"trainer.out={tmp_path / 'run'}", "trainer.max_steps=2",
            "monitor.knn_every_steps=1", override]
    code, err = cli(argv)
    assert_clean(code, err, argv)
    assert code == 2 and f"error: bad value for {named}" in err
    assert not (tmp_path / "run").exists()  # nothing written


def test_a_batch_larger_than_the_dataset_is_refused_before_the_model(workdir, tmp_path) -> None:
    argv = ["pretrain", str(workdir / "run.yaml"), f"trainer.out={tmp_path / 'run'}", "trainer.batch_size=4000"]
    code, err = cli(argv)
    assert_clean(code, err, argv)
    assert code == 2 and "trainer.batch_size: 4000; the training split has only 1500 images" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("kind, override, named", [
    ("knn", "eval.knn_k=0", "eval.knn_k: 0"),
    ("knn", "eval.knn_temperature=0", "eval.knn_temperature: 0.0"),
    ("knn", "eval.batch_size=0", "eval.batch_size: 0"),
    ("linear", "eval.linear_epochs=0", "eval.linear_epochs: 0"),
    ("lowshot", "eval.lowshot_splits=0", "eval.lowshot_splits: 0"),  # an unfillable shot count is dropped (test_run)
    ("cluster", "eval.cluster_n_init=0", "eval.cluster_n_init: 0"),
])
def test_eval_refuses_bad_values_before_any_work(workdir, monkeypatch, kind, override, named) -> None:
    def no_features(*args, **kwargs):
        raise AssertionError("features extracted before the check")

    monkeypatch.setattr(selfsup.eval.run, "extract_view_averaged_features", no_features)
    argv = ["eval", kind, str(workdir / "run"), override]
    code, err = cli(argv)
    assert_clean(code, err, argv)
    assert code == 2 and f"error: bad value for {named}" in err


def test_every_numeric_field_and_argument_declares_both_bounds() -> None:
    """The mechanism covers every section, the method sections, the augmentation parameters (views.*.params) and the
    backbones' constructor arguments (model.params): a numeric field without a declared range is a field no check
    sees, and one without an upper bound accepts 1e300 (issue 50.7)."""
    import typing

    from selfsup.data.augment import AugmentConfig
    from selfsup.models import ResNet, VisionTransformer

    def bounded(tp) -> bool:
        if typing.get_origin(tp) is typing.Annotated:
            ranges = [r for r in typing.get_args(tp)[1:] if isinstance(r, Range)]
            if typing.get_args(tp)[0] in (int, float):
                return any((r.ge is not None or r.gt is not None) and (r.le is not None or r.lt is not None)
                           for r in ranges)
            return bounded(typing.get_args(tp)[0])
        if tp in (int, float):
            return False
        return all(bounded(a) for a in typing.get_args(tp) if a is not type(None) and a is not Ellipsis
                   and typing.get_origin(tp) is not typing.Literal)

    hints = {f"{cls.__name__}.{f.name}": typing.get_type_hints(cls, include_extras=True)[f.name]
             for cls in [*SECTIONS.values(), AugmentConfig, *(c.Config for c in METHODS.values())]
             for f in dataclasses.fields(cls)}
    hints.update({f"{cls.__name__}({name})": tp for cls in (ResNet, VisionTransformer)
                  for name, tp in typing.get_type_hints(cls.__init__, include_extras=True).items() if name != "return"})
    assert len(hints) > 150
    assert [name for name, tp in hints.items() if not bounded(tp)] == []


def test_ranges_hold_for_configs_built_in_python() -> None:
    from selfsup.config import ConfigError
    from selfsup.methods.msn import MSNConfig

    with pytest.raises(ConfigError, match="method.anchor_temperature: 0"):
        MSNConfig(anchor_temperature=0)
    assert load_config(overrides=["optim.lr=1e-4"]).optim.lr == 1e-4


@pytest.mark.parametrize("override, code", [("optim.lr=nan", 2), ("optim.lr=1e-9", 0)])
def test_a_subprocess_sample_never_prints_a_traceback(workdir, tmp_path, override, code) -> None:
    """A sample through a real process (no stubs): an accepted boundary value runs (0 steps), a bad one exits 2.
    (A bad value found only once the data is read, trainer.batch_size=4000, is checked in process below.)"""
    proc = subprocess.run([sys.executable, "-m", "selfsup.cli", "pretrain", str(workdir / "run.yaml"),
                           f"trainer.out={tmp_path / 'run'}", override], capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr and proc.returncode == code, proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.startswith("error:")]) == (code == 2)


def test_too_few_views_for_the_method_are_refused_on_load(workdir, tmp_path) -> None:
    """Found by test_accepted_values_also_run: views.0.num=1 for VICReg was a traceback at the first step."""
    argv = ["pretrain", str(workdir / "run.yaml"), f"trainer.out={tmp_path / 'run'}", "views.0.num=1"]
    code, err = cli(argv)
    assert_clean(code, err, argv)
    assert code == 2 and "method vicreg needs at least 2 views per image but the config makes 1" in err


@pytest.mark.parametrize("override, named", [
    (f"trainer.max_steps={10**12}", "trainer.max_steps: 1000000000000; use an integer in [0, 10000000]"),
    ("trainer.epochs=1e12", "trainer.epochs: 1000000000000.0; use a number in [0, 100000]"),
    ("optim.schedule_stretch=1e12", "optim.schedule_stretch: 1000000000000.0; use a number in [1, 4]"),
    ("optim.min_lr=0.1", "optim.min_lr: 0.1; the cosine ends at min_lr, so it must not exceed optim.lr (0.001)"),
    ("eval.finetune_lr=1e30", "eval.finetune_lr: 1e+30; use a number in (0, 10]"),
    (f"eval.linear_epochs={10**12}", "eval.linear_epochs: 1000000000000; use an integer in [1, 10000]"),
    (f"eval.lowshot_splits={10**12}", "eval.lowshot_splits: 1000000000000; use an integer in [1, 100]"),
    (f"eval.cluster_n_init={10**12}", "eval.cluster_n_init: 1000000000000; use an integer in [1, 1000]"),
])
def test_sizes_that_would_run_for_ever_or_fill_memory_are_refused(workdir, tmp_path, override, named) -> None:
    """Issue 50.7: these were accepted, then allocated terabytes of schedule (max_steps, schedule_stretch), raised
    FloatingPointError (finetune_lr) or evaluated for ever (linear_epochs, lowshot_splits, cluster_n_init)."""
    argv = (["eval", "all", str(workdir / "run"), override] if override.startswith("eval.") else
            ["pretrain", str(workdir / "run.yaml"), f"trainer.out={tmp_path / 'run'}", override])
    code, err = cli(argv)
    assert_clean(code, err, argv)
    assert code == 2 and f"error: bad value for {named}" in err, err
    assert not (tmp_path / "run").exists()


def test_a_run_of_more_steps_than_any_schedule_holds_is_refused() -> None:
    from selfsup.config import ConfigError, TrainerConfig
    from selfsup.train.schedules import run_steps

    assert run_steps(TrainerConfig(epochs=10_000), 1000) == 10**7
    with pytest.raises(ConfigError, match=r"trainer.epochs: 10001; 10001 epochs of 1000 steps are 1e\+07 steps"):
        run_steps(TrainerConfig(epochs=10_001), 1000)
