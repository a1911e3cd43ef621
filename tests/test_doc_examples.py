"""Every fenced code block of the README and of docs/ runs here (issue 54: examples that cannot rot), so a renamed
flag, a removed config key or a changed function fails CI. The dated lab notebook (docs/benchmarks.md,
docs/reproductions.md) records what was run on a date and is left out.

A small collector of our own, not mktestdocs or pytest-examples: those run a block as written, and ours must be made
tiny first (a preset trains 30 CPU-minutes on data CI does not have). Each page runs top to bottom in a folder of its
own, like a reader's shell and Python session:

- ``bash`` blocks: each ``selfsup`` command goes through ``selfsup.cli.main`` with overrides appended that make it
  tiny (:func:`shrink`: two steps of 16 images, the data roots pointed at small stand-ins, cheap evaluation). The
  stand-ins are where the commands look: ``~/photos`` (HOME is a temporary folder), ``../shared/data/cifar10``,
  Fashion-MNIST through ``data.root``. A run directory a command reads but no earlier command of the page made is a
  copy of one tiny run trained once for the whole module.
- ``python`` blocks: executed, the blocks of a page in one namespace; ``selfsup.pretrain`` and ``selfsup.evaluate`` get
  the same appended overrides, and a ``"runs/NAME"`` the block names that does not exist is a copy of the tiny run.
- ``yaml`` blocks: configs, loaded and validated (``_base_`` relative to the repository).
- ``text`` blocks: output and file listings, not run; a CLI synopsis (lines starting ``selfsup``) is checked against
  the parser, both ways.
- A bash block after ``<!-- exits 2: TEXT -->`` shows a command failing: each must exit 2 with one ``error:`` line
  holding TEXT (docs/troubleshooting.md).
- A block that cannot run in CI (GPUs, SLURM, ``pip install``, a 30-minute benchmark) is marked in the markdown by an
  HTML comment on the line before it, ``<!-- not run: why -->``. Its ``selfsup`` commands are still parsed by the real
  CLI parser and their configs and overrides validated as ``selfsup pretrain`` validates them (the loader and
  ``launch.validate``, as tests/test_suggestions.py checks the README's overrides); ``make`` targets, ``pip`` extras
  and ``benchmarks/`` scripts and their flags must exist; any other program is refused unless listed in
  :data:`OTHER_TOOLS`.
"""

from __future__ import annotations

import dataclasses
import gzip
import re
import shlex
import shutil
import struct
import tomllib
import typing
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml

import selfsup
import selfsup.api
from labelled_photos import class_image_folder, make_photos, write_labels
from selfsup.api import pretrain_config
from selfsup.cli import build_parser, main
from selfsup.config import Config, parse_overrides
from selfsup.launch import validate
from selfsup.load import load_config

REPO = Path(__file__).resolve().parents[1]
LAB_NOTEBOOK = {"docs/benchmarks.md", "docs/reproductions.md"}
PAGES = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md")
                             if str(p.relative_to(REPO)) not in LAB_NOTEBOOK)]
LANGUAGES = {"bash", "python", "yaml", "text"}
NOT_RUN = re.compile(r"<!--\s*not run:\s*(\S.*?)\s*-->")
EXITS_2 = re.compile(r"<!--\s*exits 2:\s*(\S.*?)\s*-->")  # each command fails with this in its error: line
# Programs a not-run block may name besides selfsup, make, pip and python (none of them is run).
OTHER_TOOLS = {"cd", ".", "git", "apt-get", "torchrun", "srun", "sbatch", "tensorboard", "wandb", "mlflow", "export"}

# What makes a command tiny. Appended after the page's own overrides, so these win.
TINY_TRAIN = ["trainer.budget=null", "trainer.max_steps=2", "trainer.batch_size=16", "trainer.progress=false",
              "trainer.num_threads=1", "monitor.knn_every_steps=0", "monitor.collapse_every_steps=0",
              "data.num_workers=0"]
TINY_EVAL = ["eval.linear_epochs=1", "eval.linear_min_steps=0", "eval.linear_lrs=[0.01]",
             "eval.linear_weight_decays=[0]", "eval.lowshot_shots=[1]", "eval.lowshot_splits=1",
             "eval.cluster_n_init=1", "eval.finetune_epochs=1", "eval.finetune_batch_size=16", "eval.batch_size=64", "data.num_workers=0"]
TINY_OPTIONS = {"embed": ["--workers", "0"], "report": ["--max-train", "40", "--tsne", "0"],
                "bench": ["--steps", "1", "--warmup", "0"]}


@dataclass
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    not_run: str | None  # the reason given in <!-- not run: ... -->, or None: the block runs
    error: str | None  # <!-- exits 2: TEXT -->: each command exits 2 with TEXT in its error line

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: str) -> list[Block]:
    """The fenced code blocks of a markdown file (fences of 3+ backticks, indented or not)."""
    lines = (REPO / page).read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = re.match(r"^(\s*)(`{3,})\s*([\w-]*)(.*)$", lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, language = opening.group(1), opening.group(2), opening.group(3)
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence), None)
        assert end is not None, f"{page}:{i + 1}: a code fence that is never closed"
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker, error = NOT_RUN.search(before), EXITS_2.search(before)
        text = "\n".join(line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[i + 1:end])
        found.append(Block(page, i + 1, language, text + "\n", marker.group(1) if marker else None,
                           error.group(1) if error else None))
        i = end + 1
    return found


def commands(text: str) -> list[list[str]]:
    """A bash block's commands as argument lists: continuation lines joined, comments dropped, variable
    assignments in front of a command (``VAR=1 torchrun ...``) removed."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
            words = words[1:]
        if words:
            out.append(words)
    return out


def tilde(word: str) -> str:
    """The shell's tilde expansion of one word (HOME at the start only; ``data.root=~/x`` is left to selfsup)."""
    return str(Path(word).expanduser()) if word.startswith("~") else word


# ----------------------------------------------------------------------------- the stand-ins the commands find


def write_idx(path: Path, array: np.ndarray, magic: int) -> None:
    payload = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()
    with gzip.open(f"{path}.gz", "wb") as f:
        f.write(payload)


def fashion_mnist(root: Path) -> Path:
    """Fashion-MNIST's four IDX files in miniature: 64 training and 32 test images of 28 x 28, 10 classes."""
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 64), ("t10k", 32)):
        labels = (np.arange(n) % 10).astype(np.uint8)
        images = rng.integers(0, 60, (n, 28, 28), dtype=np.uint8)
        for i, label in enumerate(labels):  # a bright band whose row is the class, so there is something to learn
            images[i, 2 * label:2 * label + 6] += 150
        write_idx(root / f"{prefix}-images-idx3-ubyte", images, 2051)
        write_idx(root / f"{prefix}-labels-idx1-ubyte", labels, 2049)
    return root


@dataclass
class World:
    """A reader's machine in a temporary folder: the working directory (the repository's configs linked in), HOME
    with ~/photos (and ~/photos_labels.csv), ~/fashion-mnist, and ../shared/data/cifar10."""

    cwd: Path
    fashion_mnist: Path
    tiny_run: Path

    def shrink(self, cfg: Config) -> list[str]:
        """Overrides that make a training of ``cfg`` tiny: two steps of 16 images, Fashion-MNIST from the stand-in, a
        queue (NNCLR, ExtreMA) below the stand-ins' 64 images."""
        extra = list(TINY_TRAIN)
        if cfg.data.dataset in ("fashion_mnist", "mnist"):
            extra.append(f"data.root={self.fashion_mnist}")
        elif cfg.data.dataset not in ("imagefolder", "shards"):  # these read the page's own folders
            raise AssertionError(f"no stand-in for data.dataset={cfg.data.dataset}: mark the block <!-- not run: ... -->")
        if cfg.method.get("queue_size"):
            extra.append("method.queue_size=32")
        for i, stage in enumerate(cfg.stages):  # a stage's own length or queue wins over the top level's
            if (stage.get("method") or {}).get("queue_size"):
                extra.append(f"stages.{i}.method.queue_size=32")
            if stage.get("trainer"):
                extra.append(f"stages.{i}.trainer.max_steps=2")
        return extra


def make_world(base: Path, tiny_run: Path | None = None) -> World:
    cwd = base / "work"
    cwd.mkdir(parents=True)
    (cwd / "configs").symlink_to(REPO / "configs")
    class_image_folder(base / "shared" / "data" / "cifar10", classes=4, per_class=16, size=32, suffix=".png")
    home = base / "home"
    photos = make_photos(home / "photos")
    write_labels(home / "photos_labels.csv", photos)
    return World(cwd, fashion_mnist(home / "fashion-mnist"), tiny_run or base / "tiny_run")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """One tiny pretrained run (the quick-start's config, 2 steps on the Fashion-MNIST stand-in) that every command
    reading a run directory no earlier command made gets a copy of."""
    base = tmp_path_factory.mktemp("tiny_run")
    world = make_world(base)
    config = REPO / "configs/fashion_mnist/quickstart.yaml"
    run = base / "run"
    argv = [str(config), f"trainer.out={run}"]
    assert main(["pretrain", *argv, *world.shrink(load_config(config, argv[1:]))]) == 0
    return run


# ----------------------------------------------------------------------------- checks of commands that do not run


def schema_key(key: str) -> bool:
    """Whether a dotted override key names a config field (free-form sections: method, model.params, views, stages)."""
    node: typing.Any = Config
    for part in key.split("."):
        if not (isinstance(node, type) and dataclasses.is_dataclass(node)):
            return True  # inside a free-form mapping or list
        fields = {f.name: f for f in dataclasses.fields(node)}
        if part not in fields or fields[part].metadata.get("yaml") is False:
            return False
        hints = typing.get_type_hints(node)
        node = hints[part] if dataclasses.is_dataclass(hints[part]) else None
    return True


def check_selfsup(argv: list[str], where: str) -> None:
    """``selfsup ARGS`` as the CLI parses it; a pretrain's config and overrides loaded and validated."""
    args, extra = build_parser().parse_known_args(argv)
    overrides = [*getattr(args, "overrides", []), *extra]
    assert all("=" in o and not o.startswith("-") for o in overrides), f"{where}: unrecognised arguments {extra}"
    if args.command == "pretrain" and args.config.endswith(".yaml"):
        validate(load_config(REPO / args.config, overrides))
    else:
        bad = [o for o in overrides if not schema_key(o.partition("=")[0])]
        assert not bad, f"{where}: unknown config keys in {bad}"
        parse_overrides(overrides)


def selfsup_argv(argv: list[str]) -> list[str] | None:
    """The selfsup arguments inside a command (``selfsup ...``, ``python -m selfsup.cli ...``, torchrun/srun ...)."""
    for i, word in enumerate(argv):
        if word == "selfsup":
            return argv[i + 1:]
        if word == "selfsup.cli" and i and argv[i - 1] == "-m":
            return argv[i + 1:]
    return None


def check_not_run(argv: list[str], where: str) -> None:
    inner = selfsup_argv(argv)
    if inner is not None:
        check_selfsup(inner, where)
    elif argv[0] == "make":
        targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))
        for target in (a for a in argv[1:] if "=" not in a):
            assert target in targets, f"{where}: make {target}: no such target in the Makefile"
    elif argv[0] == "pip":
        extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
        for word in argv[2:]:
            for named in re.findall(r"\[([\w,-]+)\]", word):
                assert set(named.split(",")) <= extras, f"{where}: pip extra [{named}] is not in pyproject.toml"
    elif argv[0] in ("python", "python3") and len(argv) > 1 and argv[1].startswith("benchmarks/"):
        script = REPO / argv[1]
        assert script.is_file(), f"{where}: {argv[1]} does not exist"
        source = script.read_text()
        for flag in (a.split("=")[0] for a in argv[2:] if a.startswith("--")):
            assert f'"{flag}"' in source, f"{where}: {argv[1]} has no option {flag}"
    elif argv[0] in ("python", "python3") and argv[1:3] == ["-m", "venv"]:
        pass
    else:
        assert argv[0] in OTHER_TOOLS, f"{where}: {argv[0]} is not a command this test knows; add it to OTHER_TOOLS"


def check_synopsis(block: Block) -> None:
    """A ``text`` block of ``selfsup CMD ...`` lines: each line's options exist, and every command and option of
    the parser is shown."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    shown = {}
    for line in block.text.splitlines():
        words = line.split("#")[0].split()
        assert words[0] == "selfsup" and words[1] in sub, f"{block.where}: {line}"
        shown.setdefault(words[1], set()).update(w.strip("[]").split("=")[0] for w in words if w.strip("[").startswith("--"))
    assert set(shown) == set(sub), f"{block.where}: the synopsis lacks {set(sub) - set(shown)}"
    for name, options in shown.items():
        known = {o for a in sub[name]._actions for o in a.option_strings} - {"-h", "--help"}
        assert options == known, f"{block.where}: selfsup {name}: shown {sorted(options)}, the parser has {sorted(known)}"


# ----------------------------------------------------------------------------- running a page


class Session:
    """One page's bash and Python blocks, run in order in its world."""

    def __init__(self, world: World, monkeypatch, capsys) -> None:
        self.world, self.capsys = world, capsys
        self.namespace: dict[str, typing.Any] = {"__name__": "__doc_example__"}
        monkeypatch.chdir(world.cwd)
        monkeypatch.setenv("HOME", str(world.cwd.parent / "home"))
        real_pretrain, real_evaluate = selfsup.api.pretrain, selfsup.api.evaluate

        def pretrain(config, *overrides, **kwargs):
            if isinstance(config, (str, Path)) and str(config).endswith(".yaml"):
                overrides = (*overrides, *world.shrink(load_config(config, list(overrides))))
            else:  # a dict or a Config: what it trains is read from it
                overrides = (*overrides, *TINY_TRAIN)
            return real_pretrain(config, *overrides, **kwargs)

        def evaluate(run_dir, kind="all", *overrides, **kwargs):
            return real_evaluate(run_dir, kind, *overrides, *TINY_EVAL, **kwargs)

        for module in (selfsup, selfsup.api):
            monkeypatch.setattr(module, "pretrain", pretrain)
            monkeypatch.setattr(module, "evaluate", evaluate)

    def run_selfsup(self, argv: list[str], where: str) -> None:
        check_selfsup(argv, where)  # what a not-run block gets, first
        args, _ = build_parser().parse_known_args(argv)
        extra: list[str] = []
        if args.command == "bench":
            extra = self.world.shrink(load_config(args.config, list(args.overrides)))
        if args.command == "pretrain":  # a YAML file, or a run directory (resumed, or the base of a new run)
            extra = self.world.shrink(pretrain_config(Path(args.config), list(args.overrides)))
        if args.command in ("eval", "report"):
            extra = list(TINY_EVAL)
        if args.command in ("eval", "embed", "export", "report"):
            self.existing_run(Path(tilde(args.run_dir)))
        code = main([tilde(a) for a in argv] + extra + TINY_OPTIONS.get(args.command, []))
        assert code == 0, f"{where}: selfsup {' '.join(argv)} exited {code}"

    def existing_run(self, run: Path) -> None:
        """A run directory the page reads but none of its commands made: a copy of the module's tiny run."""
        if not run.exists():
            shutil.copytree(self.world.tiny_run, run)

    def fails(self, argv: list[str], error: str, where: str) -> None:
        """A command shown failing: exit 2 with one error line holding ``error``. A pretrain gets a length and the
        Fashion-MNIST stand-in appended, so that if it ever stopped failing it would end in seconds."""
        args, _ = build_parser().parse_known_args(argv)
        bound = ["trainer.max_steps=2", f"data.root={self.world.fashion_mnist}"] if args.command == "pretrain" else []
        self.capsys.readouterr()
        code = main([tilde(a) for a in argv] + bound)
        lines = [line for line in self.capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert code == 2 and len(lines) == 1 and error in lines[0], (
            f"{where}: selfsup {' '.join(argv)} should exit 2 with {error!r}; it exited {code}: {lines}")

    def run(self, block: Block) -> None:
        if block.language == "bash" and block.error is not None:
            for argv in commands(block.text):
                assert argv[0] == "selfsup", f"{block.where}: only selfsup commands can be shown failing"
                self.fails(argv[1:], block.error, block.where)
        elif block.language == "python":
            for name in re.findall(r"""["'](runs/[\w.-]+)""", block.text):
                self.existing_run(Path(name))
            code = compile(block.text, block.where, "exec")
            exec(code, self.namespace)  # noqa: S102 - the docs' own example
        elif block.language == "bash":
            for argv in commands(block.text):
                assert argv[0] == "selfsup", (f"{block.where}: `{' '.join(argv)}` cannot run in the tests: mark the "
                                              f"block <!-- not run: why --> or make it a selfsup command")
                self.run_selfsup(argv[1:], block.where)


def check_yaml(block: Block, tmp_path: Path) -> None:
    data = yaml.safe_load(block.text)
    if "_base_" in data:
        data["_base_"] = str(REPO / data["_base_"])
    path = tmp_path / f"block_{block.line}.yaml"
    path.write_text(yaml.safe_dump(data))
    validate(load_config(path))


@pytest.mark.parametrize("page", PAGES)
def test_every_code_block_of_the_page_runs(page, tmp_path, monkeypatch, capsys, tiny_run) -> None:
    found = blocks(page)
    world = make_world(tmp_path, tiny_run)
    session = Session(world, monkeypatch, capsys)
    for block in found:
        assert block.language in LANGUAGES, (f"{block.where}: a ```{block.language or ''} block; use one of "
                                             f"{sorted(LANGUAGES)} (text: output, not run)")
        if block.language == "yaml":
            check_yaml(block, tmp_path)
        elif block.language == "text":
            if block.text.startswith("selfsup "):
                check_synopsis(block)
        elif block.not_run is not None:
            assert block.language == "bash", f"{block.where}: only bash blocks may be marked not run"
            for argv in commands(block.text):
                check_not_run(argv, block.where)
        else:
            session.run(block)
