"""What an error message or the README tells a new user to type works (issue 31, item 8)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from selfsup.cli import main
from selfsup.load import load_config
from selfsup.launch import validate
from tiny import VICREG_8PX, tiny_yaml

REPO = Path(__file__).resolve().parents[1]

CONFIG = tiny_yaml(VICREG_8PX)


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    return line


def test_every_config_path_the_code_suggests_exists() -> None:
    """Error messages and hints name configs (configs/...): each must be there."""
    suggested = {m for path in (REPO / "selfsup").rglob("*.py")
                 for m in re.findall(r"configs/[A-Za-z0-9_./-]*[A-Za-z0-9_/]", path.read_text())}
    assert suggested  # the scan finds them
    assert [p for p in sorted(suggested) if not (REPO / p).exists()] == []


def test_a_missing_config_suggests_one_that_exists(capsys, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    assert main(["pretrain", "configs/fashion_mnist/nope.yaml"]) == 2
    line = error_line(capsys)
    [suggestion] = re.findall(r"e\.g\. (configs/\S+\.yaml)", line)
    assert (REPO / suggestion).is_file()
    assert load_config(REPO / suggestion)  # and it loads


def test_embed_on_a_folder_that_is_not_a_run_suggests_no_failing_command(tmp_path, capsys) -> None:
    folder, images = tmp_path / "photos", tmp_path / "images"
    folder.mkdir()
    images.mkdir()
    assert main(["embed", str(folder), str(images), str(tmp_path / "out.npy")]) == 2
    line = error_line(capsys)
    assert "is not a run directory" in line and f"selfsup pretrain {folder}" not in line
    assert main(["embed", str(tmp_path / "missing"), str(images), str(tmp_path / "out.npy")]) == 2
    assert "does not exist" in error_line(capsys)


def test_embed_on_an_unfinished_run_suggests_the_command_that_finishes_it(tmp_path, capsys) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(CONFIG)
    run = tmp_path / "run"
    assert main(["pretrain", str(config), f"trainer.out={run}"]) == 0
    for name in ("backbone.json", "backbone.safetensors"):  # as a run killed before its export leaves it
        (run / name).unlink()
    images = tmp_path / "images"
    images.mkdir()
    capsys.readouterr()
    assert main(["embed", str(run), str(images), str(tmp_path / "out.npy")]) == 2
    [command] = re.findall(r"`selfsup ([^`]+)`", error_line(capsys))
    assert main(shlex.split(command)) == 0  # the suggested command works...
    assert (run / "backbone.json").is_file()  # ...and fixes it


def test_the_readme_override_examples_survive_a_shell() -> None:
    """Each override the README shows, split as a shell splits it, is one argument that the config accepts."""
    readme = (REPO / "README.md").read_text()
    sentence = readme[readme.index("`optim.lr=0.002`"):]
    sentence = sentence[:sentence.index("An unknown key")]
    examples = re.findall(r"`([^`]+)`", sentence)
    assert "'model.params={width: 32}'" in examples
    for example in examples:
        args = shlex.split(example)
        assert len(args) == 1, example
        config = "mae_ct.yaml" if example.startswith("stages.") else "quickstart.yaml"  # a staged config's stages
        validate(load_config(REPO / "configs/fashion_mnist" / config, args))
