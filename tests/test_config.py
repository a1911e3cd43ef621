"""Typed configuration: defaults, YAML ``_base_`` composition, ``key=value`` overrides, errors naming keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from selfsup.config import Config, ConfigError, parse_overrides
from selfsup.load import load_config
from selfsup.methods import METHODS, method_config
from selfsup.methods.byol import BYOLConfig
from selfsup.methods.vicreg import VICReg, VICRegConfig


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_defaults() -> None:
    cfg = load_config()
    assert cfg == Config()
    assert cfg.method == {"name": "vicreg"}
    assert cfg.optim.name == "adamw" and cfg.optim.lr == 1e-3
    assert cfg.trainer.devices == 1 and cfg.trainer.batch_size == 256
    assert [v.num for v in cfg.views] == [1, 1] and cfg.views[0].preset == "simclr"


def test_yaml_with_base_composition(tmp_path: Path) -> None:
    _write(tmp_path / "presets" / "base.yaml", """
optim: {name: sgd, lr: 0.5, momentum: 0.8}
trainer: {epochs: 2, batch_size: 64}
method: {name: byol, momentum: 0.99}
views:
  - {preset: simclr, num: 1}
  - {preset: simclr, num: 1, size: 12}
""")
    _write(tmp_path / "presets" / "data.yaml", "data: {dataset: cifar10, image_size: 32}\n")
    child = _write(tmp_path / "run.yaml", """
_base_: [presets/base.yaml, presets/data.yaml]
optim: {lr: 0.1}
method: {momentum_end: 0.999}
views:
  - {preset: simclr, num: 2}
""")
    cfg = load_config(child)
    assert cfg.optim.name == "sgd" and cfg.optim.lr == 0.1 and cfg.optim.momentum == 0.8  # mappings merge
    assert cfg.trainer.epochs == 2.0 and cfg.trainer.batch_size == 64
    assert cfg.method == {"name": "byol", "momentum": 0.99, "momentum_end": 0.999}
    assert cfg.data.dataset == "cifar10" and cfg.data.image_size == 32
    assert len(cfg.views) == 1 and cfg.views[0].num == 2  # lists replace
    # A single-string _base_ and a chain of bases.
    mid = _write(tmp_path / "mid.yaml", "_base_: presets/base.yaml\ntrainer: {epochs: 5}\n")
    top = _write(tmp_path / "top.yaml", f"_base_: {mid.name}\noptim: {{lr: 0.2}}\n")
    cfg = load_config(top)
    assert (cfg.trainer.epochs, cfg.trainer.batch_size, cfg.optim.lr, cfg.optim.name) == (5.0, 64, 0.2, "sgd")


def test_overrides() -> None:
    cfg = load_config(overrides=["optim.lr=0.1", "views.0.num=4", "trainer.devices=2", "method.name=vicreg",
                                 "data.mean=[0.5]", "trainer.max_steps=null"])
    assert cfg.optim.lr == 0.1 and isinstance(cfg.optim.lr, float)
    assert [v.num for v in cfg.views] == [4, 1]
    assert cfg.trainer.devices == 2
    assert cfg.method["name"] == "vicreg"
    assert cfg.data.mean == [0.5] and cfg.trainer.max_steps is None


def test_overrides_win_over_yaml_and_edit_yaml_views(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.yaml", "optim: {lr: 0.3}\nviews:\n  - {num: 2}\n  - {num: 3, size: 8}\n")
    cfg = load_config(path, ["optim.lr=0.01", "views.1.num=5"])
    assert cfg.optim.lr == 0.01
    assert [(v.num, v.size) for v in cfg.views] == [(2, None), (5, 8)]


def test_parse_overrides_nested() -> None:
    assert parse_overrides(["a.b.c=1", "a.b.d=x", "e=[1, 2]"]) == {"a": {"b": {"c": 1, "d": "x"}}, "e": [1, 2]}
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["optim.lr"])


def test_unknown_key_names_the_key_and_allowed_keys() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["optim.lrr=0.1"])
    msg = str(err.value)
    assert "optim.lrr" in msg and "lr" in msg and "weight_decay" in msg and "lars_eta" in msg
    with pytest.raises(ConfigError, match="'trainr'.*trainer"):
        load_config(overrides=["trainr.epochs=1"])


def test_unknown_key_in_yaml(tmp_path: Path) -> None:
    path = _write(tmp_path / "bad.yaml", "trainer: {epoch: 3}\n")
    with pytest.raises(ConfigError, match="trainer.epoch"):
        load_config(path)


def test_bad_literal_lists_allowed_values() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["optim.name=adamx"])
    msg = str(err.value)
    assert "optim.name" in msg and "adamx" in msg and "adamw, adam, sgd, lars" in msg
    with pytest.raises(ConfigError, match="32-true"):
        load_config(overrides=["trainer.precision=fp8"])


def test_wrong_types() -> None:
    with pytest.raises(ConfigError, match="trainer.epochs"):
        load_config(overrides=["trainer.epochs=abc"])
    with pytest.raises(ConfigError, match="trainer.devices"):
        load_config(overrides=["trainer.devices=1.5"])
    with pytest.raises(ConfigError, match="trainer.devices"):
        load_config(overrides=["trainer.devices=true"])  # a bool is not an int here
    with pytest.raises(ConfigError, match="trainer.max_steps"):
        load_config(overrides=["trainer.max_steps=abc"])
    with pytest.raises(ConfigError, match=r"optim.betas.1"):
        load_config(overrides=["optim.betas=[0.9, x]"])
    with pytest.raises(ConfigError, match="model.params"):
        load_config(overrides=["model.params=3"])


def test_int_accepted_for_float() -> None:
    cfg = load_config(overrides=["trainer.epochs=3", "optim.lr=1"])
    assert cfg.trainer.epochs == 3.0 and type(cfg.trainer.epochs) is float
    assert type(cfg.optim.lr) is float


def test_views_override_index_out_of_range() -> None:
    with pytest.raises(ConfigError, match="views.5"):
        load_config(overrides=["views.5.num=2"])


def test_stage_overrides_edit_one_stage_by_index_or_name() -> None:
    from selfsup.config import stage_configs

    preset = Path(__file__).parents[1] / "configs" / "cifar10" / "laptop" / "mae_ct.yaml"
    cfg = load_config(preset, ["stages.ct.trainer.max_steps=7", "stages.1.optim.lr=0.004", "stages.ct.views.0.size=24",
                               "stages.mae.views.0.size=28"])
    mae, head, ct = (s.cfg for s in stage_configs(cfg))
    assert (head.optim.lr, head.trainer.epochs, head.trainer.max_steps) == (0.004, 0.5, None)
    assert (ct.trainer.max_steps, ct.views[0].size, ct.optim.lr, ct.method["topk"]) == (7, 24, 2e-3, 20)
    assert ct.optim.layer_decay == 0.65 and ct.views[0].num == 2  # the rest of each stage as the YAML has it
    # the mae stage has no views of its own: its edit applies to the run's views, which it inherits
    assert mae.views[0].size == 28 and cfg.views[0].size is None and [v.size for v in head.views] == [None]
    for bad, message in [("stages.3.trainer.max_steps=1", r"there are 3 stages; use an index in 0..2 or a stage's "
                                                          r"name \(mae, head_init, ct\)"),
                         ("stages.cct.trainer.max_steps=1", "stages.cct"),
                         ("stages.ct=3", "stages.ct must be overridden key by key"),
                         ("stages.ct.views.2.num=1", r"stages.ct.views.2: there are 1 view specs")]:
        with pytest.raises(ConfigError, match=message):
            load_config(preset, [bad])
    with pytest.raises(ConfigError, match="the config has no stages to edit"):
        load_config(overrides=["stages.0.trainer.max_steps=1"])


def test_list_overrides_of_a_malformed_yaml_list_are_config_errors(tmp_path: Path) -> None:
    """A ``stages.<i>``/``views.<i>`` override on a YAML whose list (or its element) is not a mapping: one line."""
    for yaml_text, override, message in [
        ("stages: [3]\n", "stages.0.trainer.max_steps=1", r"stages.0 in the YAML is 3; each of the stages is a mapping"),
        ("stages: 3\n", "stages.0.trainer.max_steps=1", "stages in the YAML is 3; give a list of stages"),
        ("views: [4]\n", "views.0.num=2", "views.0 in the YAML is 4; each of the view specs is a mapping"),
        ("views: abc\n", "views.0.num=2", "views in the YAML is 'abc'; give a list of view specs")]:
        with pytest.raises(ConfigError, match=message):
            load_config(_write(tmp_path / "c.yaml", yaml_text), [override])


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(_write(tmp_path / "list.yaml", "- 1\n- 2\n"))
    with pytest.raises(ConfigError, match="not found"):
        load_config(_write(tmp_path / "b.yaml", "_base_: missing.yaml\n"))


def test_method_config_validates_method_params() -> None:
    cls, cfg = method_config({"name": "vicreg", "expander": [32, 32], "sim_weight": 10})
    assert cls is VICReg and cfg == VICRegConfig(expander=[32, 32], sim_weight=10.0)
    _, cfg = method_config({"name": "byol"})
    assert cfg == BYOLConfig()
    with pytest.raises(ConfigError) as err:
        method_config({"name": "vicreg", "foo": 1})
    assert "method.foo" in str(err.value) and "expander" in str(err.value)
    with pytest.raises(ConfigError, match="method.momentum"):
        method_config({"name": "byol", "momentum": "high"})


def test_unknown_method_lists_allowed_methods() -> None:
    with pytest.raises(ConfigError) as err:
        method_config({"name": "swav"})
    msg = str(err.value)
    assert "swav" in msg and all(name in msg for name in METHODS)
    assert {"vicreg", "barlow_twins", "byol"} <= set(METHODS)
    with pytest.raises(ConfigError, match="method.name"):
        method_config({"expander": [8]})


def test_exponent_floats_without_a_dot_are_floats():
    from selfsup.load import load_config

    assert load_config(None, ["optim.weight_decay=1e-4"]).optim.weight_decay == 1e-4


def test_changing_a_named_section_replaces_it():
    from selfsup.config import deep_merge

    base = {"method": {"name": "vicreg", "expander": [8]}, "optim": {"lr": 1.0, "name": "lars"}}
    merged = deep_merge(base, {"method": {"name": "byol", "momentum": 0.99}, "optim": {"lr": 2.0}})
    assert merged["method"] == {"name": "byol", "momentum": 0.99}
    assert merged["optim"] == {"lr": 2.0, "name": "lars"}


def test_another_backbone_drops_the_old_backbones_params():
    """``model.backbone=resnet50`` on a preset of a small ResNet: its params (block, layers, width, ...) were kept and
    then refused by resnet50; a new backbone takes its own parameters. The same backbone keeps them; the model's other
    keys stay."""
    preset = Path(__file__).resolve().parents[1] / "configs" / "cifar10" / "laptop" / "vicreg.yaml"
    assert load_config(preset, ["model.backbone=resnet50"]).model.params == {}
    assert load_config(preset, ["model.backbone=vit_small", "model.params.pos_embed=learned"]).model.params == {
        "pos_embed": "learned"}
    assert load_config(preset, ["model.backbone=resnet"]).model.params == load_config(preset).model.params
    assert load_config(preset, ["model.backbone=resnet50", "model.freeze=null",
                                "model.init_weights=w.pth"]).model.init_weights == "w.pth"


def test_every_shipped_config_loads_and_validates():
    from pathlib import Path

    from selfsup.load import load_config
    from selfsup.launch import validate

    configs = sorted((Path(__file__).parent.parent / "configs").glob("*/*.yaml"))
    assert len(configs) >= 5
    for path in configs:
        validate(load_config(path))


def test_laptop_presets_are_sized_to_their_runs():
    """Every Fashion-MNIST preset (60,000 images), and every stage of a staged one, passes the run-size checks: warm-up at most a quarter of
    the run, no more prototypes than the batch with Sinkhorn; and an EMA horizon, where given, spans steps."""
    from pathlib import Path

    from selfsup.config import stage_configs
    from selfsup.load import load_config
    from selfsup.launch import run_warnings
    from selfsup.train.schedules import run_steps, warmup_steps

    paths = sorted((Path(__file__).parent.parent / "configs" / "fashion_mnist").glob("*.yaml"))
    for path, cfg in [(p, c) for p in paths for c in [load_config(p), *(s.cfg for s in stage_configs(load_config(p)))]]:
        per_epoch = 60_000 // cfg.trainer.batch_size
        total = run_steps(cfg.trainer, per_epoch)
        assert run_warnings(cfg, total, warmup_steps(cfg.optim, total, per_epoch)) == [], path.name
        horizon = cfg.method.get("momentum_horizon")
        assert horizon is None or horizon * total >= 10, path.name


def test_config_yaml_is_written_atomically(tmp_path, monkeypatch) -> None:
    """Issue 50.3: a disk that filled while config.yaml was rewritten left it cut short, and the next resume failed."""
    from selfsup.config import save_config

    path = tmp_path / "config.yaml"
    save_config(load_config(), path)
    before = path.read_bytes()
    real_write_text = Path.write_text

    def disk_fills(self, text, *args, **kwargs):
        real_write_text(self, text[:100], *args, **kwargs)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", disk_fills)
    with pytest.raises(OSError):
        save_config(load_config(overrides=["optim.lr=0.5"]), path)
    monkeypatch.undo()
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["config.yaml"]
