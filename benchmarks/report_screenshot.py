"""Render a `selfsup report` page in headless Chromium, screenshot it and check that it rendered.

    python benchmarks/report_screenshot.py RUN_DIR [--out shot.png] [--width 1280] [--height 7000]
    python benchmarks/report_screenshot.py --tiny      # builds a tiny digits run and its report first

Checks (printed as one JSON object, exit 1 if one fails): every <img> of the page decoded in the browser
(a copy of the page with a 3-line script counts ``naturalWidth > 0``), the screenshot exists, is not blank
(pixel spread) and shows the header's colour at the top. Needs Chromium (Debian: ``apt-get install -y chromium``);
exits 0 with ``{"skipped": ...}`` when no browser is found. LOOK at the PNG too.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
HEADER_RGB = (0x23, 0x39, 0x5D)
TINY = """
method: {name: vicreg, expander: [64, 64]}
data: {dataset: digits}
views:
  - {preset: minimal, num: 1, params: {crop_scale: [0.5, 1.0]}}
  - {preset: minimal, num: 1, params: {crop_scale: [0.5, 1.0]}}
model:
  backbone: resnet
  params: {block: basic, layers: [1, 1], width: 8, small_stem: true}
optim: {name: adamw, lr: 0.002, warmup_epochs: 0.5}
trainer: {max_steps: 40, batch_size: 64, log_every_steps: 5, progress: false}
monitor: {knn_every_steps: 10, collapse_every_steps: 10}
eval: {linear_epochs: 5, lowshot_shots: [1, 5], lowshot_splits: 2, cluster_n_init: 1}
"""


def browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def chromium(exe: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--allow-file-access-from-files",
             "--virtual-time-budget=5000"]
    return subprocess.run([exe, *flags, *args], capture_output=True, text=True, timeout=timeout)


def tiny_run(folder: Path) -> Path:
    from selfsup import api

    config = folder / "tiny.yaml"
    config.write_text(TINY)
    run = api.pretrain(config, f"trainer.out={folder / 'run'}")
    api.evaluate(run, "knn", compare=["raw", "random"])
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", nargs="?")
    parser.add_argument("--tiny", action="store_true", help="build a tiny digits run (and its kNN eval) first")
    parser.add_argument("--out", default=None, help="screenshot PNG (default RUN_DIR/report.png)")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=7000)
    args = parser.parse_args()
    exe = browser()
    if exe is None:
        print(json.dumps({"skipped": "no Chromium found (apt-get install -y chromium)"}))
        return 0
    from selfsup.report import build_report

    work = Path(tempfile.mkdtemp(prefix="selfsup_report_"))
    run_dir = tiny_run(work) if args.tiny or not args.run_dir else Path(args.run_dir)
    start = time.perf_counter()
    page = build_report(run_dir)
    report_s = time.perf_counter() - start
    text = page.read_text()
    # A copy that reports how many images the browser decoded, in its title.
    probe = work / "probe.html"
    probe.write_text(text.replace("</body>", "<script>document.title='decoded ' + Array.from(document.images)"
                                             ".filter(i => i.complete && i.naturalWidth > 0).length + ' of ' + "
                                             "document.images.length;</script></body>"))
    dom = chromium(exe, "--dump-dom", probe.as_uri()).stdout
    decoded = dom.split("<title>", 1)[-1].split("</title>", 1)[0] if "<title>" in dom else "no DOM"
    shot = Path(args.out) if args.out else run_dir / "report.png"
    chromium(exe, f"--screenshot={shot}", f"--window-size={args.width},{args.height}", page.as_uri())
    checks: dict[str, object] = {"report": str(page), "report_kib": round(len(text) / 1024, 1),
                                 "report_s": round(report_s, 1), "screenshot": str(shot), "browser": exe,
                                 "images_decoded": decoded}
    ok = decoded.startswith("decoded ") and decoded.split()[1] == decoded.split()[3] and decoded.split()[1] != "0"
    if shot.is_file():
        pixels = np.asarray(Image.open(shot).convert("RGB"))
        # crop the empty page below the report (the window is taller than the page)
        rows = np.nonzero((np.abs(pixels.astype(int) - pixels[-1, -1].astype(int)).sum(2) > 0).any(1))[0]
        if len(rows) and rows[-1] + 20 < len(pixels):
            pixels = pixels[:rows[-1] + 20]
            Image.fromarray(pixels).save(shot)
        top = pixels[5:40, 5:200].reshape(-1, 3)
        header = bool((np.abs(top.astype(int) - HEADER_RGB).sum(1) < 30).mean() > 0.5)
        spread = float(pixels.std())
        checks.update(size=list(pixels.shape[1::-1]), pixel_std=round(spread, 1), header_rendered=header)
        ok = ok and header and spread > 20
    else:
        ok = False
        checks["screenshot"] = "not written"
    checks["ok"] = ok
    probe.unlink()
    if args.out:  # the screenshot is kept elsewhere: remove the scratch folder (and a --tiny run in it)
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(checks))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
