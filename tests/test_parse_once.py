"""The ``method:`` section is parsed into its typed config once per run and handed down with the config: the
loader's check, the launcher's checks (batch, data size, warnings), the size check, the budget and the build all read
the same parse. Counted by the method configs' one parser (``from_dict`` as :mod:`selfsup.methods` calls it)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import selfsup.methods
from selfsup.cli import main
from test_stages import STAGED
from tiny import VICREG_8PX, tiny_yaml


@pytest.fixture
def parses(monkeypatch) -> Counter:
    """The method configs parsed so far, by class name."""
    counts: Counter = Counter()
    parse = selfsup.methods.from_dict

    def counting(cls, data, prefix=""):
        counts[cls.__name__] += 1
        return parse(cls, data, prefix)

    monkeypatch.setattr(selfsup.methods, "from_dict", counting)
    return counts


def test_a_run_parses_its_method_section_once_and_so_does_its_resume(parses, tmp_path: Path) -> None:
    config, run = tmp_path / "run.yaml", tmp_path / "run"
    config.write_text(tiny_yaml(VICREG_8PX))
    assert main(["pretrain", str(config), f"trainer.out={run}", "trainer.max_steps=2"]) == 0
    assert (run / "backbone.safetensors").is_file()
    assert parses == {"VICRegConfig": 1}
    parses.clear()
    assert main(["pretrain", str(run)]) == 0  # the run directory, resumed from its config.yaml (finished: left as is)
    assert parses == {"VICRegConfig": 1}


def test_a_staged_run_parses_each_method_section_once(parses, tmp_path: Path) -> None:
    """Four sections: the run's own (MAE) and its three stages' (MAE, then NNCLR twice); the stages' configs are
    made once too, so every reader of them (the checks, the stage loop) gets the same parses."""
    config, run = tmp_path / "staged.yaml", tmp_path / "run"
    config.write_text(STAGED)
    assert main(["pretrain", str(config), f"trainer.out={run}", "trainer.max_steps=1",
                 "stages.head.trainer.max_steps=1", "stages.ct.trainer.max_steps=1"]) == 0
    assert (run / "backbone.safetensors").is_file()
    assert parses == {"MAEConfig": 2, "NNCLRConfig": 2}


def test_a_changed_section_is_parsed_again(parses) -> None:
    """What a config carries is the parse of its sections as they are: a section changed since (in place, or in a
    copy made by ``dataclasses.replace``) is parsed anew, and saved config files never hold the parse."""
    import dataclasses

    from selfsup.config import stage_configs, to_dict
    from selfsup.load import load_config
    from selfsup.methods import method_of

    cfg = load_config(None, ["method.name=vicreg", "method.sim_weight=10"])
    assert method_of(cfg)[1].sim_weight == 10 and parses == {"VICRegConfig": 1}
    cfg.method["sim_weight"] = 5
    assert method_of(cfg)[1].sim_weight == 5 and parses == {"VICRegConfig": 2}
    other = dataclasses.replace(cfg, method={"name": "byol"})
    assert type(method_of(other)[1]).__name__ == "BYOLConfig" and method_of(cfg)[1].sim_weight == 5
    assert parses == {"VICRegConfig": 2, "BYOLConfig": 1}
    cfg.stages = [{"name": "a"}]
    assert stage_configs(cfg)[0].name == "a"
    cfg.stages[0]["name"] = "b"
    assert stage_configs(cfg)[0].name == "b"
    assert "derived" not in to_dict(cfg) and cfg.derived
