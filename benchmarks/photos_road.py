"""The README's "Your own photos" road, measured: a flat folder of unlabelled photos plus a CSV labelling a few hundred,
pretrained with a photo preset to a time budget, then evaluated with those labels beside raw pixels.

No labelled photo collection above 32 px is at hand on these machines, so the stand-in is CIFAR-10's training JPEGs
(``../shared/data/cifar10/train/<class>/*.jpg``) laid out as one flat folder under names that do not give the class
away (symlinks, so nothing is copied), and a class-balanced CSV labelling ``--labelled`` of them. The commands are the
README's, with ``data.image_size=32`` (these photos are 32 px: the stem follows, ``small_stem: auto``).

Prints one JSON object: the budget against the time the run took (``budget.json``: calibration to export), the steps
and epochs it bought, and the scores of ``selfsup eval all --compare raw`` (the evaluation split is resolved as the
run does it: a stratified hold-out of the labelled images).

    python benchmarks/photos_road.py --budget 4min --out /tmp/photos_road
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CIFAR = ROOT.parent / "shared" / "data" / "cifar10" / "train"


def build_folder(out: Path, labelled: int, seed: int) -> tuple[Path, Path, int]:
    """``out/photos/<hash>.jpg`` for every CIFAR-10 training image (symlinks) and ``out/labels.csv`` for ``labelled``
    of them, the same number per class; returns the folder, the CSV and the number of images."""
    photos = out / "photos"
    photos.mkdir(parents=True, exist_ok=True)
    classes = sorted(d.name for d in CIFAR.iterdir() if d.is_dir())
    rng = random.Random(seed)
    rows, count = [], 0
    for name in classes:
        files = sorted((CIFAR / name).glob("*.jpg"))
        chosen = set(rng.sample(range(len(files)), labelled // len(classes)))
        for i, path in enumerate(files):
            link = photos / (hashlib.sha1(f"{name}/{path.name}".encode()).hexdigest()[:16] + ".jpg")
            if not link.exists():
                os.symlink(path, link)
            count += 1
            if i in chosen:
                rows.append(f"{link.name},{name}")
    rng.shuffle(rows)
    labels = out / "labels.csv"
    labels.write_text("path,label\n" + "\n".join(rows) + "\n")
    return photos, labels, count


def selfsup(*args: str) -> str:
    """``selfsup ARGS`` (this checkout's), its stdout; stderr goes to the terminal."""
    done = subprocess.run([sys.executable, "-m", "selfsup.cli", *args], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                          check=True)
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="configs/photos/vicreg.yaml")
    parser.add_argument("--budget", default="4min")
    parser.add_argument("--labelled", type=int, default=500, help="labelled images in the CSV (a multiple of 10)")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("/tmp/photos_road"))
    args = parser.parse_args()

    photos, labels, count = build_folder(args.out, args.labelled, args.seed)
    run = args.out / f"run_{Path(args.preset).stem}_{args.budget}"
    started = time.perf_counter()
    selfsup("pretrain", args.preset, f"data.root={photos}", f"data.labels={labels}",
            f"data.image_size={args.image_size}", f"trainer.budget={args.budget}", f"trainer.out={run}")
    wall = time.perf_counter() - started
    scores = json.loads(selfsup("eval", "all", str(run), "--compare", "raw").strip().splitlines()[-1])
    budget = json.loads((run / "budget.json").read_text())
    keep = ("knn_top1", "linear_top1", "lowshot_1shot_mean", "lowshot_5shot_mean", "lowshot_10shot_mean", "cluster_nmi")
    print(json.dumps({
        "preset": args.preset, "images": count, "labelled": args.labelled, "image_size": args.image_size,
        "budget": args.budget, "budget_s": budget["share_s"], "elapsed_s": budget["elapsed_s"],
        "elapsed_over_budget": round(budget["elapsed_s"] / budget["share_s"], 3),
        "command_wall_s": round(wall, 1), "seconds_per_step": budget["seconds_per_step"], "steps": budget["steps"],
        "epochs": budget["epochs"], "cpu": budget["cpu"], "threads": budget["threads"],
        "scores": {k: round(v, 2) for k, v in scores.items() if k.removeprefix("raw_") in keep},
    }, indent=1))


if __name__ == "__main__":
    main()
