"""One self-contained HTML page about a run: what a person wants to see before trusting a backbone.

Sections (``id`` attributes, in this order): ``summary``, ``config``, ``data`` (the dataset and a sample of the
training images as each view spec augments them), ``curves`` (every metrics.csv column against the step, stages
marked), ``evaluation`` (the JSON ``selfsup eval`` saves in ``RUN_DIR/eval/``, the backbone beside raw pixels and a
random network; without one, a kNN the report computes on its sample), ``spectrum`` (eigenvalues of the embedding
covariance, beside a random network and raw pixels; the training-time spectra of ``spectra.npz``), ``pictures``
(the method's own PNGs in ``plots/``), ``embedding-map`` (PCA and t-SNE of the embeddings coloured by label),
``retrieval`` (query images and their nearest training images) and ``stages`` (each stage of a staged run).

A run whose training split has no labels (a folder of loose photos) gets every section that needs none: the map in
one colour, retrieval by similarity alone, and one note in ``data`` saying what labels would add (class colours,
the report's kNN, same-class marks).

Images are PNGs drawn with matplotlib and inlined as base64 ``data:`` URIs; the page has no external CSS or
JavaScript and opens without a network.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger("selfsup")

__all__ = ["SECTIONS", "build_report"]

SECTIONS = ("summary", "config", "data", "curves", "evaluation", "spectrum", "pictures", "embedding-map",
            "retrieval", "stages")
TITLES = {"summary": "Summary", "config": "Config", "data": "Data", "curves": "Training curves",
          "evaluation": "Evaluation", "spectrum": "Embedding eigenspectrum", "pictures": "The method's pictures",
          "embedding-map": "Embedding map", "retrieval": "Retrieval", "stages": "Stages"}
# metrics.csv columns that are not curves (x axes, bookkeeping)
_NOT_CURVES = {"step", "epoch", "stage", "train_time_s", "cpu_time_s"}
_QUERIES, _NEIGHBOURS = 6, 8

_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#23395d;color:#fff;padding:14px 28px}header h1{margin:0;font-size:22px}
header p{margin:4px 0 0;opacity:.85;font-size:14px}
nav{padding:8px 28px;background:#e8edf4;font-size:14px;position:sticky;top:0;z-index:1}
nav a{margin-right:14px;color:#23395d;text-decoration:none}
main{padding:0 28px 40px;max-width:1200px}
section{background:#fff;border:1px solid #dde3ea;border-radius:6px;margin:18px 0;padding:6px 20px 16px}
h2{font-size:18px;color:#23395d;border-bottom:1px solid #eee;padding-bottom:6px}
h3{font-size:15px;margin:14px 0 6px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
td,th{border:1px solid #dde3ea;padding:3px 10px;text-align:right}th{background:#f1f4f8}
td:first-child,th:first-child{text-align:left}
table.kv td{text-align:left}table.kv td:first-child{color:#555;white-space:nowrap}
pre{background:#f6f8fa;border:1px solid #e1e4e8;padding:8px;font-size:12px;overflow:auto;max-height:420px}
img{max-width:100%;height:auto;display:block;margin:6px 0}
.note{color:#666;font-size:13px}.best{font-weight:bold}
.pics{display:flex;flex-wrap:wrap;gap:16px}.pics figure{margin:0;max-width:560px}
figcaption{font-size:12px;color:#555}
"""


# ----------------------------------------------------------------------------------------------- small helpers
def _esc(value: Any) -> str:
    return html.escape(str(value))


def _subplots(nrows: int = 1, ncols: int = 1, **kwargs: Any):
    """A figure and its axes without pyplot: no global figure state, the caller's backend left alone."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=kwargs.pop("figsize", None))
    return fig, fig.subplots(nrows, ncols, **kwargs)


def _figure_uri(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _file_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _img(uri: str, alt: str) -> str:
    return f'<img src="{uri}" alt="{_esc(alt)}">'


def _note(text: str) -> str:
    return f'<p class="note">{_esc(text)}</p>'


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _facts(rows: Sequence[tuple[str, str]]) -> str:
    """A two-column key/value table (values already escaped)."""
    return '<table class="kv">' + "".join(f"<tr><td>{_esc(k)}</td><td>{v}</td></tr>" for k, v in rows) + "</table>"


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) >= 0.01 or value == 0 else f"{value:.2e}"
    return _esc(value)


def _show(images: torch.Tensor):
    """uint8 (C, H, W) -> what imshow takes, gray as a gray colormap."""
    array = images.permute(1, 2, 0).numpy()
    return (array[:, :, 0], {"cmap": "gray", "vmin": 0, "vmax": 255}) if array.shape[2] == 1 else (array, {})


# --------------------------------------------------------------------------------------------- run directory
def _read_metrics(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    if not path.is_file():
        return [], []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def _float(text: str | None) -> float:
    try:
        return float(text) if text not in (None, "") else math.nan
    except ValueError:
        return math.nan


def _stage_dirs(run_dir: Path) -> list[Path]:
    stages = run_dir / "stages"
    return sorted((p for p in stages.iterdir() if p.is_dir()), key=lambda p: (len(p.name.split("_")[0]), p.name)) \
        if stages.is_dir() else []


def _method_pictures(plots: Path, metric_names: set[str]) -> list[Path]:
    """PNGs in ``plots/`` other than the per-metric curves (those are redrawn in the curves section)."""
    if not plots.is_dir():
        return []
    return sorted(p for p in plots.glob("*.png") if p.stem not in metric_names)


def _read_evals(run_dir: Path) -> list[dict[str, Any]]:
    records = []
    for path in sorted((run_dir / "eval").glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            log.warning("report: skipping %s (%s)", path, err)
            continue
        if isinstance(record, dict) and isinstance(record.get("result"), dict):
            record["file"] = str(path.relative_to(run_dir))
            records.append(record)
    return records


# ---------------------------------------------------------------------------------------------------- sections
def _summary(run_dir: Path, meta: dict[str, Any] | None, columns: list[str], rows: list[dict[str, str]]) -> str:
    facts = [("run directory", _esc(run_dir.resolve()))]
    if meta:
        facts += [("method", _esc(meta.get("method", "?"))), ("backbone", _esc(meta.get("backbone"))),
                  ("backbone parameters", _esc(json.dumps(meta.get("params")))),
                  ("input", _esc(f"{meta['channels']} x {meta['image_size']} x {meta['image_size']}")),
                  ("dataset", _esc(meta.get("dataset", "?"))), ("steps", _esc(meta.get("steps", "?"))),
                  ("training time",
                   _esc(f"{meta.get('train_time_s', '?')} s wall, {meta.get('cpu_time_s', '?')} s CPU"))]
    else:
        facts.append(("backbone", "no exported backbone (backbone.json) yet: finish the run first"))
    if rows:
        last = rows[-1]
        shown = [c for c in columns if c not in _NOT_CURVES and last.get(c) not in (None, "")][:8]
        facts.append(("last logged step", _esc(", ".join(f"{c}={_number(_float(last[c]))}" for c in shown))))
    return _facts(facts)


def _config_section(run_dir: Path) -> str:
    path = run_dir / "config.yaml"
    if not path.is_file():
        return _note("no config.yaml in the run directory")
    return f"<p>Resolved config (<code>config.yaml</code>: defaults filled in, normalisation measured):</p>" \
           f"<pre>{_esc(path.read_text())}</pre>"


def _curves(columns: list[str], rows: list[dict[str, str]]) -> str:
    names = [c for c in columns if c not in _NOT_CURVES
             and any(not math.isnan(_float(r.get(c))) for r in rows)]
    if not names:
        return _note("metrics.csv holds no logged rows yet")
    # x: the step, counted on across stages (each stage's step starts again at its own 1)
    stages = [r.get("stage") or "" for r in rows]
    x, offset, last_stage, last_step, boundaries = [], 0, stages[0], 0, []
    for row, stage in zip(rows, stages):
        step = _float(row.get("step"))
        if stage != last_stage:
            offset += last_step
            boundaries.append((offset, stage))
            last_stage = stage
        last_step = step
        x.append(offset + step)
    order = sorted(names, key=lambda n: (0 if n == "loss" else 2 if n in ("lr", "wd", "weight_decay")
                                         else 3 if n.startswith("knn") else 4 if n == "images_per_s" else 1))
    ncols = min(4, len(order))
    nrows = -(-len(order) // ncols)
    fig, axes = _subplots(nrows, ncols, figsize=(3.6 * ncols, 2.6 * nrows), squeeze=False)
    for ax, name in zip(axes.flat, order):
        y = np.array([_float(r.get(name)) for r in rows])
        ok = ~np.isnan(y)
        ax.plot(np.array(x)[ok], y[ok], marker="." if ok.sum() < 30 else None, lw=1.4, color="#23395d")
        for at, stage in boundaries:
            ax.axvline(at, color="#c0392b", ls="--", lw=0.8)
        ax.set_title(name, fontsize=10)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(order):]:
        ax.axis("off")
    fig.supxlabel("step" + (" (stages one after the other; dashed: a stage starts)" if boundaries else ""),
                  fontsize=9)
    fig.tight_layout()
    text = f"<p>Every column of <code>metrics.csv</code> ({len(rows)} logged rows): loss and its terms, " \
           f"learning rate, online kNN and collapse statistics where logged.</p>"
    if boundaries:
        text += _note("stages: " + ", ".join(dict.fromkeys(stages)))
    return text + _img(_figure_uri(fig), "training curves")


def _eval_tables(records: list[dict[str, Any]]) -> str:
    parts = []
    for record in records:
        result, columns = record["result"], record.get("baselines") or ["backbone"]
        prefixes = {"backbone": "", "raw": "raw_", "random": "random_"}
        keys = [k for k in result if not any(k.startswith(p) for p in ("raw_", "random_"))
                and isinstance(result[k], (int, float)) and not k.endswith(("_lr", "_wd", "_splits", "_labels"))]
        rows = []
        for key in keys:
            values = [result.get(prefixes.get(c, f"{c}_") + key) for c in columns]
            numeric = [v for v in values if isinstance(v, (int, float))]
            best = max(numeric) if numeric and not key.endswith("_std") else None
            rows.append([_esc(key)] + [("<span class='best'>" if v == best and len(numeric) > 1 else "<span>")
                                       + (_number(float(v)) if isinstance(v, (int, float)) else "-") + "</span>"
                                       for v in values])
        over = " ".join(record.get("overrides") or []) or "none"
        parts.append(f"<h3>{_esc(record.get('kind', '?'))} <span class='note'>({_esc(record['file'])}, "
                     f"{_esc(record.get('time', ''))}; overrides: {_esc(over)})</span></h3>"
                     + _table(["metric", *columns], rows))
    return "".join(parts)


# --------------------------------------------------------------------------------------------- data sections
class _Sample:
    """A seeded sample of the labelled splits and its features: backbone, random network, raw pixels."""

    def __init__(self, run_dir: Path, meta: dict[str, Any], overrides: list[str], max_train: int, max_query: int,
                 progress: bool) -> None:
        from selfsup.data.stream import pixels_and_labels
        from selfsup.eval.run import evaluation_split, holdout_rows, labelled_splits, run_config

        self.cfg = run_config(run_dir, overrides)
        choice = evaluation_split(self.cfg)  # as `selfsup eval` resolves data.eval_split
        self.train_split, splits = labelled_splits(self.cfg, meta["image_size"], meta["channels"], progress, choice)
        generator = torch.Generator().manual_seed(self.cfg.eval.seed)
        train = splits[0]
        order = torch.randperm(len(train), generator=generator)
        if len(splits) > 1:
            self.query_split = choice.name
            train_idx = order[:max_train].sort().values
            query_source, query_idx = splits[1], torch.randperm(len(splits[1]), generator=generator)[:max_query]
        else:  # a hold-out: the queries come from the rows evaluation holds out, the gallery from the others
            self.query_split = f"{self.train_split} (held out)"
            fit, held_out = holdout_rows(train.labels, choice.holdout, self.cfg.eval.seed)
            query_idx = held_out[torch.randperm(len(held_out), generator=generator)[:max_query]]
            train_idx = fit[torch.randperm(len(fit), generator=generator)[:max_train]].sort().values
            query_source = train
        self.train_images, self.train_labels = pixels_and_labels(train, train_idx)
        self.query_images, self.query_labels = pixels_and_labels(query_source, query_idx.sort().values)
        self.train_size, self.query_size = len(train), len(query_source)
        self.classes = train.classes

    def name(self, label: int) -> str:
        return str(self.classes[label]) if self.classes and 0 <= label < len(self.classes) else str(label)

    # Set by _UnlabelledSample: why there are no labels, said once on the page (None: the sample is labelled).
    labels_note: str | None = None


class _UnlabelledSample(_Sample):
    """A seeded sample of a training split without labels (e.g. a folder of loose photos): the first
    ``min(max_query, 6, n // 2)`` images of a seeded order are the retrieval queries, the next ``max_train`` the gallery
    of the retrieval grid, the maps and the spectra; the label tensors are None. The split is listed for streaming
    where the dataset allows, so only the sampled images are decoded."""

    def __init__(self, cfg: Any, train: Any, max_train: int, max_query: int, why: str) -> None:
        from selfsup.data.stream import pixels_and_labels

        self.cfg, self.train_split, self.classes = cfg, cfg.data.train_split, None
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(cfg.eval.seed))
        queries = min(max_query, _QUERIES, len(train) // 2)
        self.query_split = f"{self.train_split} (held out of the sample)"
        gallery = order[queries:queries + max_train].sort().values
        self.train_images, self.train_labels = pixels_and_labels(train, gallery)
        self.query_images, self.query_labels = pixels_and_labels(train, order[:queries].sort().values)
        self.train_size, self.query_size = len(train), len(train)
        self.labels_note = f"This run's data has no labels ({why}). Labels would add the class colours of the " \
                           f"embedding map, a kNN accuracy in the evaluation and the same-class marks of the " \
                           f"retrieval grid; every other section is drawn without them."

    @staticmethod
    def open_training_split(cfg: Any, meta: dict[str, Any], progress: bool) -> Any | None:
        """The run's pretraining split (``data.train_split``) when it has no labels; None when it has."""
        import dataclasses

        from selfsup.data.datasets import STREAMABLE
        from selfsup.data.stream import open_split

        d = dataclasses.replace(cfg.data, stream=True) if cfg.data.dataset in STREAMABLE else cfg.data
        train = open_split(d, d.train_split, image_size=meta["image_size"], channels=meta["channels"],
                           progress=progress)
        return train if train.labels is None else None


def _read_sample(run_dir: Path, meta: dict[str, Any], overrides: list[str], max_train: int, max_query: int,
                 progress: bool) -> _Sample:
    """The labelled sample (:class:`_Sample`); when the labelled splits cannot be read because the run's training
    split has no labels, an :class:`_UnlabelledSample` of that split (any other error is raised)."""
    from selfsup.config import ConfigError
    from selfsup.eval.run import run_config

    try:
        return _Sample(run_dir, meta, overrides, max_train, max_query, progress)
    except ConfigError as err:
        cfg = run_config(run_dir, overrides)
        train = _UnlabelledSample.open_training_split(cfg, meta, progress)
        if train is None:
            raise
        return _UnlabelledSample(cfg, train, max_train, max_query, " ".join(str(err).split()))


def _features(run_dir: Path, images: torch.Tensor, random_init: bool = False) -> torch.Tensor:
    from selfsup.api import load_backbone
    from selfsup.eval.features import extract_features

    model, preprocess = load_backbone(run_dir, random_init=random_init)
    return extract_features(model, images, batch_size=256, device="cpu", transform=preprocess.normalize)


def _data_section(sample: _Sample, meta: dict[str, Any]) -> str:
    from selfsup.data.augment import Augment, augment_config

    d = sample.cfg.data
    labelled = sample.labels_note is None
    evaluation = f"{sample.query_split}: {sample.query_size} images" if labelled else \
        f"none: the {len(sample.query_images)} retrieval queries are held out of the training sample"
    facts = [("dataset", _esc(d.dataset)), ("root", _esc(d.root or "(default)")),
             ("training split", _esc(f"{sample.train_split}: {sample.train_size} "
                                     + ("labelled images" if labelled else "images, no labels")
                                     + (f", a fraction {d.fraction} trained on" if d.fraction < 1 else ""))),
             ("evaluation split", _esc(evaluation)),
             ("image size, channels", _esc(f"{meta['image_size']} px, {meta['channels']}")),
             ("normalisation", _esc(f"mean {meta['mean']}, std {meta['std']}")),
             ("classes", _esc(", ".join(map(str, sample.classes)) if sample.classes else
                              "unnamed" if labelled else "none (no labels)")),
             ("views", _esc("; ".join(f"{v.num} x {v.preset}" + (f" at {v.size} px" if v.size else "")
                                      + (f" {v.params}" if v.params else "") for v in sample.cfg.views)))]
    count = min(12, len(sample.train_images))
    shown = torch.randperm(len(sample.train_images), generator=torch.Generator().manual_seed(1))[:count]
    images = sample.train_images[shown]
    rows: list[tuple[str, torch.Tensor]] = [("images", images)]
    torch.manual_seed(0)
    for i, view in enumerate(sample.cfg.views):
        try:
            aug = Augment(augment_config(view.preset, view.size or meta["image_size"], **view.params))
            out = aug(images.float() / 255).clamp(0, 1)
        except Exception as err:  # noqa: BLE001 - a view this report cannot draw (e.g. MAST's labelled pipeline)
            log.info("report: views.%d (%s) not drawn: %s", i, view.preset, err)
            continue
        rows.append((f"views.{i}: {view.preset}", (out * 255).round().to(torch.uint8)))
    fig, axes = _subplots(len(rows), count, figsize=(1.1 * count, 1.25 * len(rows)), squeeze=False)
    for r, (label, batch) in enumerate(rows):
        for c in range(count):
            ax = axes[r, c]
            array, kw = _show(batch[c])
            ax.imshow(array, interpolation="nearest", **kw)
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0 and labelled:
                ax.set_title(sample.name(int(sample.train_labels[shown[c]])), fontsize=8)
        axes[r, 0].set_ylabel(label, fontsize=8, rotation=0, ha="right", va="center")
    fig.tight_layout()
    return (_note(sample.labels_note) if sample.labels_note else "") + _facts(facts) \
        + "<h3>Training images and the views the method saw</h3>" \
        + _img(_figure_uri(fig), "training images and augmented views")


def _spectrum(values: torch.Tensor) -> np.ndarray:
    """The covariance's eigenvalues, largest first, as fractions of their sum. With fewer samples than dimensions (raw
    pixels of photos: 12,288 at 64 px) they come from the n x n Gram matrix, which has the same nonzero eigenvalues
    (an eigendecomposition of 12,288 x 12,288 took ~50 s)."""
    centred = values.double() - values.double().mean(0)
    gram = centred @ centred.T if len(values) < values.shape[1] else centred.T @ centred
    eig = torch.linalg.eigvalsh(gram / max(len(values) - 1, 1)).flip(0).clamp_min(0).numpy()
    return eig / max(eig.sum(), 1e-30)


def _effective_rank(p: np.ndarray) -> float:
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


def _spectrum_section(run_dir: Path, feats: dict[str, torch.Tensor]) -> str:
    fig, ax = _subplots(figsize=(6.5, 3.6))
    rows = []
    for name, values in feats.items():
        p = _spectrum(values)
        shown = p[p > 1e-7 * p[0]] if p[0] > 0 else p[:1]  # leave out numerically-zero directions
        ax.loglog(np.arange(1, len(shown) + 1), shown, label=f"{name} (d={values.shape[1]}, {len(shown)} nonzero)")
        rows.append([_esc(name), str(values.shape[1]), f"{_effective_rank(p):.1f}",
                     f"{100 * p[:max(1, len(p) // 10)].sum():.1f} %"])
    ax.set_xlabel("component (sorted)")
    ax.set_ylabel("share of the variance")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    text = "<p>Eigenvalues of the covariance of the embeddings of the training sample (a collapsed embedding " \
           "puts its variance in a few directions).</p>" + _img(_figure_uri(fig), "eigenspectrum") + \
           _table(["features", "dim", "effective rank", "variance in top 10 % of directions"], rows)
    path = run_dir / "spectra.npz"
    if path.is_file():
        with np.load(path) as saved:
            steps, eig = saved["steps"], saved["eigenvalues"]
        if len(steps):
            fig, ax = _subplots(figsize=(6.5, 3.6))
            picks = sorted(set(np.linspace(0, len(steps) - 1, min(6, len(steps))).round().astype(int).tolist()))
            for i in picks:
                p = eig[i] / max(eig[i].sum(), 1e-30)
                p = p[p > 1e-7 * p.max()] if p.max() > 0 else p[:1]
                ax.loglog(np.arange(1, len(p) + 1), p, label=f"step {int(steps[i])}")
            ax.set_xlabel("component (sorted)")
            ax.set_ylabel("share of the variance")
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3)
            fig.tight_layout()
            text += "<h3>During training (spectra.npz, the monitored embeddings)</h3>" + \
                    _img(_figure_uri(fig), "eigenspectra during training")
    return text


def _map_section(sample: _Sample, feats: torch.Tensor, tsne_points: int) -> str:
    from sklearn.decomposition import PCA
    from sklearn.manifold import TSNE

    x = feats.numpy().astype(np.float64)
    if len(x) < 3:
        return _note(f"{len(x)} training image(s) in the sample: too few for a map")
    labels = None if sample.train_labels is None else sample.train_labels.numpy()
    maps = [("PCA", PCA(n_components=2, random_state=0).fit_transform(x))]
    tsne_n = min(len(x), tsne_points)
    if tsne_n >= 10:  # the first points of a seeded sample: a seeded subset
        perplexity = float(min(30, max(2, (tsne_n - 1) // 4)))
        maps.append((f"t-SNE ({tsne_n} points)", TSNE(n_components=2, init="pca", random_state=0, max_iter=500,
                                                       perplexity=perplexity).fit_transform(x[:tsne_n])))
    fig, axes = _subplots(1, len(maps), figsize=(5.4 * len(maps), 4.6), squeeze=False)
    from matplotlib import colormaps

    cmap = colormaps["tab10" if labels is None or labels.max() < 10 else "tab20"]
    classes = np.unique(labels) if labels is not None else []
    for ax, (title, xy) in zip(axes[0], maps):
        if labels is None:  # one colour: nothing says which points belong together but their places
            ax.scatter(xy[:, 0], xy[:, 1], s=6, color="#23395d")
        for c in classes:
            keep = labels[:len(xy)] == c
            ax.scatter(xy[keep, 0], xy[keep, 1], s=6, color=cmap(int(c) % cmap.N), label=sample.name(int(c)))
        ax.set_title(title, fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
    if 0 < len(classes) <= 20:
        axes[0, -1].legend(fontsize=7, markerscale=2.5, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    how = ", coloured by their label" if labels is not None else ""
    return f"<p>{len(x)} training images' embeddings in two dimensions{how}: " \
        f"{' and '.join(title for title, _ in maps)}.</p>" + \
        _img(_figure_uri(fig), "embedding map")


def _retrieval_section(sample: _Sample, train_feats: torch.Tensor, query_feats: torch.Tensor) -> str:
    queries = min(_QUERIES, len(query_feats))
    k = min(_NEIGHBOURS, len(train_feats))
    if not queries or not k:
        return _note(f"{queries} query and {k} gallery image(s): too few for a retrieval grid")
    gallery = torch.nn.functional.normalize(train_feats, dim=1)
    q = torch.nn.functional.normalize(query_feats[:queries], dim=1)
    sims, idx = (q @ gallery.T).topk(k, dim=1)
    fig, axes = _subplots(queries, k + 1, figsize=(1.3 * (k + 1), 1.5 * queries), squeeze=False)
    labelled = sample.query_labels is not None and sample.train_labels is not None
    hits = 0
    for r in range(queries):
        if labelled:
            query_label = int(sample.query_labels[r])
            cells = [(sample.query_images[r], f"query {sample.name(query_label)}", "#23395d")]
            for j in range(k):
                label = int(sample.train_labels[idx[r, j]])
                hits += label == query_label
                cells.append((sample.train_images[idx[r, j]], f"{sample.name(label)} {sims[r, j]:.3f}",
                              "#2e8b57" if label == query_label else "#c0392b"))
        else:  # by similarity alone: the neighbours' cosine similarities, no marks
            cells = [(sample.query_images[r], "query", "#23395d")]
            cells += [(sample.train_images[idx[r, j]], f"{sims[r, j]:.3f}", "#7f8c8d") for j in range(k)]
        for c, (image, title, colour) in enumerate(cells):
            ax = axes[r, c]
            array, kw = _show(image)
            ax.imshow(array, interpolation="nearest", **kw)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(title, fontsize=8, color=colour)
            for spine in ax.spines.values():
                spine.set_edgecolor(colour)
                spine.set_linewidth(3 if c else 2)
    fig.tight_layout()
    marks = f"green: same label, red: another; {hits} of {queries * k} match" if labelled else \
        "the cosine similarity above each"
    return (f"<p>{queries} query images from {_esc(sample.query_split)} (left) and their {k} nearest training "
            f"images by cosine similarity of the embeddings ({marks}).</p>" + _img(_figure_uri(fig), "retrieval grid"))


def _stages_section(run_dir: Path, meta: dict[str, Any] | None) -> str:
    stage_dirs = _stage_dirs(run_dir)
    if not stage_dirs:
        return _note("a single-stage run (no stages/ folder)")
    info = {s.get("stage"): s for s in (meta or {}).get("stages", []) if isinstance(s, dict)}
    parts = []
    for folder in stage_dirs:
        name = folder.name.split("_", 1)[-1]
        columns, rows = _read_metrics(folder / "metrics.csv")
        stage_meta = info.get(name, {})
        facts = ", ".join(f"{k} {v}" for k, v in stage_meta.items() if k != "stage") or "not finished"
        parts.append(f"<h3>{_esc(folder.name)}</h3>" + _note(facts))
        if (folder / "config.yaml").is_file():  # what the stage trained: its method and views
            import yaml

            try:
                stage_cfg = yaml.safe_load((folder / "config.yaml").read_text()) or {}
            except yaml.YAMLError:
                stage_cfg = {}
            method = stage_cfg.get("method") or {}
            views = "; ".join(f"{v.get('num')} x {v.get('preset')}" + (f" {v['params']}" if v.get("params") else "")
                              for v in stage_cfg.get("views") or [] if isinstance(v, dict))
            parts.append(_facts([("method", _esc(json.dumps(method))), ("views", _esc(views)),
                                 ("frozen", _esc((stage_cfg.get("model") or {}).get("freeze") or "nothing"))]))
        pictures = _method_pictures(folder / "plots", set(columns))
        if pictures:
            parts.append('<div class="pics">' + "".join(
                f"<figure>{_img(_file_uri(p), p.name)}<figcaption>{_esc(p.name)}</figcaption></figure>"
                for p in pictures) + "</div>")
        evals = _read_evals(folder)
        if evals:
            parts.append(_eval_tables(evals))
    return "".join(parts)


def _quick_knn(sample: _Sample, feats: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> str:
    from selfsup.eval.knn import knn_classify

    k, temperature = sample.cfg.eval.knn_k, sample.cfg.eval.knn_temperature
    cells = []
    for name, (train, query) in feats.items():
        r = knn_classify(train, sample.train_labels, query, sample.query_labels, k=min(k, len(train)),
                         temperature=temperature)
        cells.append(r["top1"])
    best = max(cells)
    row = ["knn_top1 (report's sample)"] + [("<span class='best'>" if c == best else "<span>") + f"{c:.2f}</span>"
                                            for c in cells]
    return _note(f"No saved evaluation in eval/: run `selfsup eval all RUN_DIR --compare raw,random` for the "
                 f"full protocols. Below, a {k}-NN on the report's sample ({len(sample.train_labels)} training, "
                 f"{len(sample.query_labels)} query images).") + _table(["metric", *feats], [row])


# -------------------------------------------------------------------------------------------------- the page
def build_report(run_dir: str | Path, out: str | Path | None = None, overrides: Sequence[str] = (),
                 max_train: int = 2000, max_query: int = 500, tsne_points: int = 500, progress: bool = False) -> Path:
    """Write ``out`` (default ``RUN_DIR/report.html``): one HTML file, every image inlined; returns its path.

    The data sections read a seeded sample of the run's labelled splits (``max_train`` training images, the
    gallery of the retrieval grid and of the maps; ``max_query`` evaluation images; ``tsne_points`` of the training
    sample in the t-SNE map, 0: PCA only, t-SNE costs ~20 CPU-s for 500 points); ``overrides`` are
    ``key=value`` settings of the data read (e.g. ``data.root=...``). When the data or the backbone cannot be
    read, those sections say why and the rest of the page is still written. A run whose training split has no
    labels is sampled from that split alone (:class:`_UnlabelledSample`).
    """
    from selfsup.checkpoint import CheckpointError, atomic_write, read_backbone_meta
    from selfsup.config import ConfigError
    from selfsup.data.imagedata import DataError

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file() and not (run_dir / "backbone.json").is_file():
        raise CheckpointError(f"{run_dir} is not a run directory (no config.yaml); pass the trainer.out of a "
                              f"`selfsup pretrain` run")
    out = Path(out) if out is not None else run_dir / "report.html"
    try:
        meta: dict[str, Any] | None = read_backbone_meta(run_dir)
    except CheckpointError as err:
        meta, meta_error = None, str(err)
    columns, rows = _read_metrics(run_dir / "metrics.csv")
    body: dict[str, str] = {
        "summary": _summary(run_dir, meta, columns, rows),
        "config": _config_section(run_dir),
        "curves": _curves(columns, rows) if rows else _note("no metrics.csv rows yet"),
        "pictures": "", "stages": _stages_section(run_dir, meta),
    }
    pictures = _method_pictures(run_dir / "plots", set(columns))
    body["pictures"] = ('<div class="pics">' + "".join(
        f"<figure>{_img(_file_uri(p), p.name)}<figcaption>plots/{_esc(p.name)}</figcaption></figure>"
        for p in pictures) + "</div>") if pictures else _note("the run's plots/ folder holds no pictures besides "
                                                              "the metric curves")
    evals = _read_evals(run_dir)
    data_error = None if meta else meta_error
    sample = None
    if meta is not None:
        try:
            sample = _read_sample(run_dir, meta, list(overrides), max_train, max_query, progress)
        except (ConfigError, DataError, CheckpointError, FileNotFoundError, OSError) as err:
            data_error = f"the run's data could not be read ({' '.join(str(err).split())}); pass data.root=... " \
                         f"to point at it"
    if sample is not None:
        log.info("report: embedding %d training and %d query images", len(sample.train_images),
                 len(sample.query_images))
        train_feats = _features(run_dir, sample.train_images)
        query_feats = _features(run_dir, sample.query_images)
        random_train = _features(run_dir, sample.train_images, random_init=True)
        raw_train = sample.train_images.flatten(1).float() / 255
        body["data"] = _data_section(sample, meta)
        body["spectrum"] = _spectrum_section(run_dir, {"backbone": train_feats, "random network": random_train,
                                                       "raw pixels": raw_train})
        body["embedding-map"] = _map_section(sample, train_feats, tsne_points)
        body["retrieval"] = _retrieval_section(sample, train_feats, query_feats)
        if evals:
            body["evaluation"] = _eval_tables(evals)
        elif sample.labels_note:
            body["evaluation"] = _note("no saved evaluation in eval/ (the Data section says what labels would add)")
        else:
            random_query = _features(run_dir, sample.query_images, random_init=True)
            raw_query = sample.query_images.flatten(1).float() / 255
            pairs = {"backbone": (train_feats, query_feats), "raw": (raw_train, raw_query),
                     "random": (random_train, random_query)}
            body["evaluation"] = _quick_knn(sample, pairs)
    else:
        for name in ("data", "spectrum", "embedding-map", "retrieval"):
            body[name] = _note(data_error or "no data")
        body["evaluation"] = _eval_tables(evals) if evals else _note("no saved evaluation in eval/")
    title = f"selfsup report: {run_dir.resolve().name}"
    subtitle = " · ".join(str(x) for x in ((meta or {}).get("method"), (meta or {}).get("backbone"),
                                            (meta or {}).get("dataset")) if x)
    nav = "".join(f'<a href="#{s}">{TITLES[s]}</a>' for s in SECTIONS)
    sections = "".join(f'<section id="{s}"><h2>{TITLES[s]}</h2>{body[s]}</section>' for s in SECTIONS)
    page = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title>'
            f"<style>{_CSS}</style></head><body><header><h1>{_esc(title)}</h1><p>{_esc(subtitle)}</p></header>"
            f"<nav>{nav}</nav><main>{sections}</main></body></html>\n")
    atomic_write(out, lambda tmp: Path(tmp).write_text(page, encoding="utf-8"))
    return out
