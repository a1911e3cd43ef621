"""The streaming data path's bars, measured on a generated folder of JPEGs (made here, never committed).

    python benchmarks/streaming.py [--data DIR] [--images 20000] [--subset 2000] [--steps 40] [--workers 2]
    python benchmarks/streaming.py --layouts    # folder vs tar shards, JPEG draft mode on vs off

1. Memory does not grow with the dataset: peak memory of the same streaming pretraining run (the
   quick-start model on 64 px crops, ``--steps`` steps of 64) on ``--subset`` images (``data.fraction``)
   and on all ``--images``. Memory is sampled every 50 ms over the whole process tree (the trainer
   and its loader workers) from /proc: the sum of PSS (proportional set size: pages shared by the
   forked workers counted once) and the trainer's own peak RSS (VmHWM). Linux only.
2. Loader speed: ``selfsup bench`` on the folder with ``--workers`` loader workers: images/s of
   reading + decoding + cropping, the decode cost per image in one process, and the training
   step's images/s on the same crops.
3. Coverage under DDP: 2 gloo processes read one epoch through the training loader (global batch
   100, so no incomplete last batch is dropped): every image exactly once, none twice.

``--layouts`` measures the choices instead: the folder converted by ``selfsup shard`` (time, size),
and the loader (``selfsup bench``, in this process, one after the other) reading the folder, the
shards, and the folder with JPEG draft mode switched off (every image decoded at full size).

Prints one JSON object. The folder (``--data``, default $TMPDIR/selfsup-stream-bench) is reused
when it already holds the images; JPEGs are 300-500 px a side, smooth random colour fields with
noise (so that JPEG sizes, ~30-60 KB, resemble photographs'), in 10 class folders.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np

QUICKSTART = Path(__file__).resolve().parent.parent / "configs" / "fashion_mnist" / "quickstart.yaml"
CLASSES = 10


def _write(job: tuple[Path, int]) -> None:
    root, i = job
    from PIL import Image

    rng = np.random.default_rng(i)
    width, height = (int(v) for v in rng.integers(300, 501, 2))
    small = rng.integers(0, 256, (height // 24 + 2, width // 24 + 2, 3), dtype=np.uint8)
    image = np.asarray(Image.fromarray(small).resize((width, height), Image.Resampling.BICUBIC), dtype=np.int16)
    image = np.clip(image + rng.integers(-12, 13, image.shape), 0, 255).astype(np.uint8)
    path = root / f"class{i % CLASSES}" / f"{i:06d}.jpg"
    Image.fromarray(image).save(path, quality=90)


def make_folder(root: Path, count: int) -> dict:
    """``count`` JPEGs under root/classK/ (kept when already there); returns the folder's size."""
    have = sum(1 for _ in root.glob("class*/*.jpg")) if root.is_dir() else 0
    start = time.perf_counter()
    if have < count:
        for k in range(CLASSES):
            (root / f"class{k}").mkdir(parents=True, exist_ok=True)
        with Pool(os.cpu_count()) as pool:
            pool.map(_write, [(root, i) for i in range(count)], chunksize=64)
    size = sum(p.stat().st_size for p in root.glob("class*/*.jpg"))
    return {"images": count, "bytes": size, "mean_kib": round(size / count / 1024, 1),
            "generated_s": round(time.perf_counter() - start, 1) if have < count else 0.0}


def _tree(pid: int) -> list[int]:
    children = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children.extend(int(c) for c in f.read().split())
    except OSError:
        pass
    return [pid, *(p for c in children for p in _tree(c))]


def _kib(path: str, key: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_with_memory(cmd: list[str]) -> dict:
    """Run ``cmd``; the peak over its lifetime of the summed PSS of its process tree, and its own peak RSS."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = {"tree_pss_mib": 0.0, "trainer_rss_mib": 0.0, "processes": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            pids = _tree(proc.pid)
            pss = sum(_kib(f"/proc/{p}/smaps_rollup", "Pss:") for p in pids) / 1024
            peak["tree_pss_mib"] = max(peak["tree_pss_mib"], pss)
            peak["trainer_rss_mib"] = max(peak["trainer_rss_mib"], _kib(f"/proc/{proc.pid}/status", "VmHWM:") / 1024)
            peak["processes"] = max(peak["processes"], len(pids))
            time.sleep(0.05)

    thread = threading.Thread(target=sample, daemon=True)
    start = time.perf_counter()
    thread.start()
    _, err = proc.communicate()
    done.set()
    thread.join()
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err[-3000:]}")
    return {**{k: round(v, 1) for k, v in peak.items()}, "wall_s": round(time.perf_counter() - start, 1)}


def _epoch(rank: int, world: int, root: str, batch: int, out: str) -> None:
    import torch.distributed as dist

    from selfsup.data.formats.folder import folder_source
    from selfsup.data.sampler import StepSampler
    from selfsup.data.stream import crop_batches
    from selfsup.data.views import CropSpec

    dist.init_process_group("gloo", init_method=f"file://{out}.store", rank=rank, world_size=world)
    source = folder_source(Path(root))
    sampler = StepSampler(len(source), batch, seed=0, rank=rank, world_size=world)
    spec = CropSpec(64, (0.08, 1.0), (3 / 4, 4 / 3), 0.5, 1)
    read = [i for b in crop_batches(source, sampler, [spec], 3, 0, 0, sampler.steps_per_epoch, workers=1)
            for i in b.indices.tolist()]
    np.save(f"{out}.rank{rank}.npy", np.array(read))
    dist.barrier()
    dist.destroy_process_group()


def coverage(root: Path, batch: int = 100) -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "epoch")
        start = time.perf_counter()
        mp.start_processes(_epoch, args=(2, str(root), batch, out), nprocs=2, join=True, start_method="fork")
        reads = [np.load(f"{out}.rank{r}.npy") for r in range(2)]
    every = np.concatenate(reads)
    total = sum(1 for _ in root.glob("class*/*.jpg"))
    return {"processes": 2, "global_batch": batch, "images": total, "read_per_process": [len(r) for r in reads],
            "distinct": int(len(np.unique(every))), "read_twice": int(len(every) - len(np.unique(every))),
            "every_image_once": bool(len(every) == total and len(np.unique(every)) == total),
            "wall_s": round(time.perf_counter() - start, 1)}


def layouts(root: Path, common: list[str]) -> dict:
    import selfsup.data.decode as decode
    from selfsup.load import load_config
    from selfsup.bench import bench

    shards = root.with_name(root.name + "-shards")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "selfsup.cli", "shard", str(root), str(shards)], check=True,
                   capture_output=True)
    out: dict = {"shard_s": round(time.perf_counter() - start, 1),
                 "shard_bytes": sum(p.stat().st_size for p in (shards / "train").glob("*.tar"))}
    keys = ("loader_images_per_s", "decode_ms_per_image", "train_images_per_s", "loader_to_train_ratio")

    def measure(*overrides: str) -> dict:
        result = bench(load_config(common[0], [*common[1:], *overrides]), steps=20, warmup=2)
        return {k: result[k] for k in keys}

    out["folder"] = measure()
    out["shards"] = measure("data.dataset=shards", f"data.root={shards}")
    draft = decode._draft_reduction
    decode._draft_reduction = lambda crops: 1
    try:
        out["folder_without_draft"] = measure()
    finally:
        decode._draft_reduction = draft
    out["shards_to_folder"] = round(out["shards"]["loader_images_per_s"] / out["folder"]["loader_images_per_s"], 2)
    out["draft_speedup"] = round(out["folder"]["loader_images_per_s"]
                                 / out["folder_without_draft"]["loader_images_per_s"], 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "selfsup-stream-bench"))
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--subset", type=int, default=2_000)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--layouts", action="store_true", help="compare folder / shards / no JPEG draft mode")
    args = parser.parse_args()
    root = Path(args.data)
    result: dict = {"cpu": _cpu_model(), "date": time.strftime("%Y-%m-%d"), "folder": make_folder(root, args.images)}

    common = [str(QUICKSTART), "data.dataset=imagefolder", f"data.root={root}", "data.image_size=64", "data.channels=3",
              "data.stream=true", f"data.num_workers={args.workers}", "data.mean=[0.5,0.5,0.5]",
              "data.std=[0.25,0.25,0.25]", "trainer.batch_size=64", f"trainer.max_steps={args.steps}",
              "trainer.progress=false", "monitor.knn_every_steps=0"]
    if args.layouts:
        print(json.dumps({**result, "layouts": layouts(root, common)}))
        return
    memory = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, fraction in (("subset", args.subset / args.images), ("all", 1.0)):
            cmd = [sys.executable, "-m", "selfsup.cli", "pretrain", *common, f"data.fraction={fraction}",
                   f"trainer.out={tmp}/{name}"]
            memory[name] = {"images": round(fraction * args.images), **run_with_memory(cmd)}
    memory["pss_ratio_all_to_subset"] = round(memory["all"]["tree_pss_mib"] / memory["subset"]["tree_pss_mib"], 3)
    memory["rss_ratio_all_to_subset"] = round(memory["all"]["trainer_rss_mib"] / memory["subset"]["trainer_rss_mib"], 3)
    memory["within_1_5x"] = memory["pss_ratio_all_to_subset"] <= 1.5 and memory["rss_ratio_all_to_subset"] <= 1.5
    result["memory"] = memory

    bench = subprocess.run([sys.executable, "-m", "selfsup.cli", "bench", *common, "--steps", "20"],
                           capture_output=True, text=True)
    if bench.returncode:
        raise SystemExit(bench.stderr[-3000:])
    result["loader"] = json.loads(bench.stdout.strip().splitlines()[-1])
    result["ddp_coverage"] = coverage(root)
    print(json.dumps(result))


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown"


if __name__ == "__main__":
    main()
