"""The docs site (mkdocs.yml, docs/) builds with warnings as errors, and has what issue 54 asks of it: a page per
method, linked from the README, and an API reference generated from the docstrings.

The build is one subprocess (`mkdocs build --strict`, about 2 s): a broken link or anchor, a page left out of the nav, a
docstring mkdocstrings cannot render fails here. The site's examples are run by tests/test_doc_examples.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from selfsup.methods import METHODS

REPO = Path(__file__).resolve().parents[1]


def nav_pages(nav) -> list[str]:
    """Every page file the nav lists, depth first."""
    pages: list[str] = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages.extend(nav_pages(value) if isinstance(value, list) else [value])
    return pages


def mkdocs_config() -> dict:
    # mkdocs.yml names a slugify function with a python tag; the nav is all this file reads.
    loader = type("Loader", (yaml.SafeLoader,), {})
    loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *_: None)
    return yaml.load((REPO / "mkdocs.yml").read_text(), Loader=loader)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    try:
        import mkdocs  # noqa: F401
    except ImportError:
        pytest.fail("mkdocs is not installed: pip install -e '.[docs]' (make test installs it)")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about its successor, not a build warning
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
                           "-d", str(out)], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    return out


def test_the_site_builds_with_warnings_as_errors(site) -> None:
    assert (site / "index.html").is_file()
    # the lab notebook, unedited, under its own section
    assert (site / "benchmarks" / "index.html").is_file() and (site / "reproductions" / "index.html").is_file()


def test_every_method_has_a_page_in_the_nav_and_the_readme_links_it(site) -> None:
    pages = nav_pages(mkdocs_config()["nav"])
    readme = (REPO / "README.md").read_text()
    for name in METHODS:
        page = f"methods/{name}.md"
        assert page in pages, f"{page} is not in mkdocs.yml's nav"
        assert f"docs/{page}" in readme, f"the README does not link docs/{page}"
        assert (site / "methods" / name / "index.html").is_file()


def test_the_api_reference_is_generated_from_the_docstrings(site) -> None:
    html = (site / "api" / "index.html").read_text()
    for name in ("load_backbone", "embed", "pretrain", "evaluate", "Preprocess", "register_backbone"):
        assert re.search(rf'id="selfsup\.[\w.]*{name}"', html), name
    # a sentence of load_backbone's docstring, rendered
    assert "gives <code>(B, model.num_features)</code> features" in html


def test_the_readmes_links_into_the_docs_resolve() -> None:
    """The README is not part of the site, so mkdocs does not check its links: each relative link names a file that
    exists, and each #anchor a heading of that file (slugged as GitHub and the site slug it)."""
    from pymdownx.slugs import slugify

    slug = slugify(case="lower")
    readme = (REPO / "README.md").read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", readme) + re.findall(r"^\[[\w-]+\]: (\S+)$", readme, re.M)
    assert len(targets) > 20
    for target in targets:
        if "://" in target:
            continue
        path, _, anchor = target.partition("#")
        assert (REPO / path).exists(), target
        if anchor:
            headings = re.findall(r"^#+ (.+)$", (REPO / path).read_text(), re.M)
            assert anchor in {slug(h, "-") for h in headings}, target
