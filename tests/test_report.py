"""`selfsup report`: one self-contained HTML page with every section, every image inlined as a data: URI."""

from __future__ import annotations

import base64
import io
import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from selfsup.cli import main
from selfsup.report import SECTIONS, build_report
from tiny import ADAMW, QUICK_EVAL, tiny_yaml

TINY = tiny_yaml(optim=ADAMW, trainer={"max_steps": 10, "log_every_steps": 5}, monitor={"knn_every_steps": 5},
                 eval=QUICK_EVAL)

STAGED = """
method: {name: mae, decoder_dim: 16, decoder_depth: 1, decoder_heads: 2, mask_ratio: 0.5}
data: {dataset: digits}
views:
  - {preset: minimal, num: 1, params: {crop_scale: [0.5, 1.0]}}
model:
  backbone: vit
  params: {img_size: 8, patch_size: 2, embed_dim: 16, depth: 1, num_heads: 2}
optim: {name: adamw, lr: 0.002}
trainer: {max_steps: 4, batch_size: 32, log_every_steps: 2, progress: false}
stages:
  - name: mae
  - name: ct
    method: {name: nnclr, projector: [16, 16], predictor: [16, 16], queue_size: 64, temperature: 0.15}
    views:
      - {preset: minimal, num: 2, params: {crop_scale: [0.35, 1.0]}}
"""


UNLABELLED = tiny_yaml(method={"name": "vicreg", "expander": [16, 16]},
                       data={"dataset": "imagefolder", "image_size": 16, "num_workers": 0}, optim=ADAMW,
                       trainer={"max_steps": 3, "batch_size": 16, "log_every_steps": 1})


class Page(HTMLParser):
    """Section ids, <img> sources (and the section of each), and every external reference (src/href/link/script)
    of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.images: list[str] = []
        self.image_sections: list[str | None] = []
        self.external: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self.sections.append(attrs.get("id"))
        if tag == "img":
            self.images.append(attrs.get("src") or "")
            self.image_sections.append(self.sections[-1] if self.sections else None)
        if tag in ("script", "link", "iframe", "object", "embed"):
            self.external.append(f"<{tag}>")
        for key in ("src", "href"):
            value = attrs.get(key) or ""
            if value and not value.startswith(("data:", "#")):
                self.external.append(value)

    def handle_data(self, data):
        self.text.append(data)


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def check_self_contained(page: Page) -> None:
    assert page.sections == list(SECTIONS)
    assert page.images and not page.external
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        image = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1])))
        assert image.format == "PNG" and min(image.size) > 10


def test_report_of_a_run_with_saved_evaluations(tmp_path, capsys):
    (tmp_path / "tiny.yaml").write_text(TINY)
    run = tmp_path / "run"
    assert main(["pretrain", str(tmp_path / "tiny.yaml"), f"trainer.out={run}"]) == 0
    assert main(["eval", "knn", str(run), "--compare", "raw,random"]) == 0
    assert json.loads((run / "eval" / "knn.json").read_text())["baselines"] == ["backbone", "raw", "random"]
    # a picture the method drew, as MAST / MAE / MSN runs hold
    Image.new("RGB", (40, 30), (200, 10, 10)).save(run / "plots" / "mast_masks.png")
    capsys.readouterr()
    assert main(["report", str(run), "--max-train", "300", "--tsne", "60"]) == 0
    out = Path(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["out"])
    assert out == run / "report.html"
    page = parse(out)
    check_self_contained(page)
    text = " ".join(page.text)
    for expected in ("knn_top1", "raw", "random", "mast_masks.png", "t-SNE (60 points)", "PCA", "query",
                     "effective rank", "single-stage run", "2 x minimal", "metrics.csv"):
        assert expected in text, expected
    # curves + views + spectrum + the method's picture + map + retrieval
    assert len(page.images) == 6


def test_report_of_a_staged_run_without_evaluations_and_without_its_data(tmp_path, capsys):
    (tmp_path / "staged.yaml").write_text(STAGED)
    run = tmp_path / "staged"
    assert main(["pretrain", str(tmp_path / "staged.yaml"), f"trainer.out={run}"]) == 0
    out = build_report(run, tmp_path / "page.html", max_train=200, max_query=50, tsne_points=0)
    page = parse(out)
    check_self_contained(page)
    text = " ".join(page.text)
    for expected in ("1_mae", "2_ct", "mae_reconstruction.png", "knn_top1 (report's sample)", "stages: mae, ct",
                     "nnclr", "2 x minimal"):
        assert expected in text, expected
    # the data unreadable: the page is still written, the data sections say why
    shutil.copy(run / "config.yaml", tmp_path / "config.yaml")
    assert main(["report", str(run), "data.dataset=imagefolder", f"data.root={tmp_path / 'missing'}",
                 "--out", str(tmp_path / "nodata.html")]) == 0
    page = parse(tmp_path / "nodata.html")
    assert page.sections == list(SECTIONS)
    assert "could not be read" in " ".join(page.text)


def test_report_of_an_unlabelled_run_draws_every_section_that_needs_no_labels(tmp_path, capsys):
    """A folder of loose photos (no class folders): samples and views, curves, eigenspectrum, an uncoloured map and
    a retrieval grid by similarity alone; what labels would add is said once."""
    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(0)
    for i in range(40):  # two kinds of picture: dark and bright, with noise
        base = 40 if i % 2 else 200
        Image.fromarray((base + rng.integers(-30, 30, size=(20, 24, 3))).astype(np.uint8)).save(photos / f"{i}.png")
    (tmp_path / "unlabelled.yaml").write_text(UNLABELLED)
    run = tmp_path / "run"
    assert main(["pretrain", str(tmp_path / "unlabelled.yaml"), f"trainer.out={run}", f"data.root={photos}"]) == 0
    capsys.readouterr()
    assert main(["report", str(run), "--tsne", "20"]) == 0
    page = parse(run / "report.html")
    check_self_contained(page)
    assert page.image_sections == ["data", "curves", "spectrum", "embedding-map", "retrieval"]
    text = " ".join(page.text)
    assert "could not be read" not in text
    assert text.count("Labels would add") == 1 and "has no labels" in text
    for expected in ("40 images, no labels", "2 x minimal", "effective rank", "PCA and t-SNE (20 points)",
                     "6 query images", "34 training images' embeddings", "the cosine similarity above each",
                     "no saved evaluation"):
        assert expected in text, expected
    for label_only in ("coloured by their label", "same label", "knn_top1"):
        assert label_only not in text, label_only
    # the map's points are drawn, in the one colour of an unlabelled map (#23395d)
    src = page.images[page.image_sections.index("embedding-map")]
    pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))).convert("RGB")).astype(int)
    assert (np.abs(pixels - [0x23, 0x39, 0x5D]).sum(axis=2) < 40).sum() > 34 * 4


def test_report_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err


@pytest.mark.slow  # ~2 min: a tiny run, its report, two Chromium renders
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs headless Chromium (apt-get install chromium)")
def test_report_renders_in_chromium(tmp_path):
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "report_screenshot.py"
    proc = subprocess.run([sys.executable, str(script), "--tiny", "--out", str(tmp_path / "shot.png")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["header_rendered"]


def test_the_spectrum_of_fewer_samples_than_dimensions_is_the_covariance_spectrum():
    """Raw pixels of photos have more dimensions than the report has images: their spectrum comes from the Gram
    matrix (n x n), which must give the covariance's (d x d) nonzero eigenvalues."""
    import numpy as np
    import torch

    from selfsup.report.build import _spectrum

    values = torch.randn(30, 200, generator=torch.Generator().manual_seed(0)) * torch.linspace(3, 0.1, 200)
    centred = values.double() - values.double().mean(0)
    reference = torch.linalg.eigvalsh(centred.T @ centred / 29).flip(0).clamp_min(0).numpy()
    reference /= reference.sum()
    got = _spectrum(values)
    np.testing.assert_allclose(got, reference[:len(got)], atol=1e-12)
    assert len(got) == 30 and reference[30:].max() < 1e-12
