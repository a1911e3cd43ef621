"""The package's modules import each other one way: no module of ``selfsup`` reaches itself through imports.

Every import statement counts, those inside functions included (a function-level import only hides a circle until
the function runs). Importing ``a.b.c`` also runs the packages ``a.b`` above it, except those above the importer
itself (Python's own package layout: ``selfsup.methods`` imports its submodules, which are inside it). A package's
lazy attributes (``importlib.import_module`` in its ``__getattr__``, PEP 562: ``selfsup.pretrain``,
``selfsup.report.build_report``) are not imports of the package: they run when a user of the attribute asks for it.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "selfsup"


def module_names(root: Path = PACKAGE) -> dict[str, Path]:
    """``{"selfsup.methods": .../methods/__init__.py, "selfsup.config": .../config.py, ...}``."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` (at ``path``) imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from . import x, from ..a import b
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets.add(base)
            targets.update(f"{base}.{alias.name}" for alias in node.names)  # from pkg import submodule
    edges = set()
    for target in targets:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):  # the module and the packages above it, which run first
            candidate = ".".join(parts[:i])
            if candidate in modules and candidate != name and not name.startswith(candidate + "."):
                edges.add(candidate)
    return edges


def import_cycles(modules: dict[str, Path]) -> list[list[str]]:
    """One import circle per strongly connected set of modules (Tarjan), as the path that closes it."""
    graph = {name: imported(name, path, modules) for name, path in modules.items()}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(closing_path(graph, sorted(group)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def closing_path(graph: dict[str, set[str]], group: list[str]) -> list[str]:
    """A path inside ``group`` from its first module back to itself (breadth first), for the failure message."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    return group


def test_no_import_cycle_inside_the_package() -> None:
    modules = module_names()
    assert {"selfsup.config", "selfsup.methods", "selfsup.methods.vicreg", "selfsup.launch"} <= set(modules)
    cycles = import_cycles(modules)
    assert cycles == [], "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_cycle_check_sees_function_level_and_package_imports(tmp_path: Path) -> None:
    """The check itself: a circle closed by an import inside a function, or through a package's __init__, is found;
    a package importing its own submodules (which sit inside it) is none."""
    pkg = tmp_path / "selfsup"
    (pkg / "methods").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "config.py").write_text("def check():\n    from selfsup.methods import METHODS\n")
    (pkg / "methods" / "__init__.py").write_text("from .vicreg import VICReg\nMETHODS = {}\n")
    (pkg / "methods" / "vicreg.py").write_text("from selfsup.config import check\nclass VICReg: ...\n")
    (pkg / "api.py").write_text("import selfsup.cli\n")
    (pkg / "cli.py").write_text("def main():\n    from . import api\n")
    cycles = import_cycles(module_names(pkg))
    assert sorted(map(tuple, cycles)) == [("selfsup.api", "selfsup.cli", "selfsup.api"),
                                         ("selfsup.config", "selfsup.methods", "selfsup.methods.vicreg",
                                          "selfsup.config")]
    (pkg / "config.py").write_text("def check():\n    pass\n")
    (pkg / "cli.py").write_text("def main():\n    pass\n")
    assert import_cycles(module_names(pkg)) == []
