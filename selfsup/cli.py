"""Command-line interface::

    selfsup pretrain CONFIG.yaml|RUN_DIR [key=value ...]
    selfsup eval knn|linear|lowshot|cluster|all|finetune RUN_DIR [key=value ...] [--baseline raw|random] [--compare raw,random]
    selfsup embed RUN_DIR IMAGES_DIR OUT.npy
    selfsup bench CONFIG.yaml [key=value ...] [--steps N] [--synthetic]
    selfsup shard IMAGES_DIR OUT_DIR [--splits train,val] [--max-count N] [--max-mb M]
    selfsup export RUN_DIR --format torchscript|onnx|timm|torchvision|state_dict [--out FILE]
    selfsup report RUN_DIR [--out FILE.html] [--max-train N] [--tsne N] [key=value ...]

``eval``, ``embed``, ``bench``, ``shard``, ``export`` and ``report`` print one JSON object as their last stdout line.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import sys
from pathlib import Path

from selfsup.checkpoint import CheckpointError
from selfsup.config import ConfigError, stage_configs
from selfsup.load import load_config
from selfsup.export import FORMATS

log = logging.getLogger("selfsup")


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)


def cmd_pretrain(args: argparse.Namespace) -> None:
    from selfsup.api import pretrain

    pretrain(args.config, *args.overrides, allow_optim_change=args.allow_optim_change)


def cmd_eval(args: argparse.Namespace) -> None:
    from selfsup.api import evaluate

    baselines = [args.baseline] + [b for b in (args.compare.split(",") if args.compare else []) if b]
    # Also written to RUN_DIR/eval/<kind>.json (what `selfsup report` shows).
    result = evaluate(args.run_dir, args.kind, *args.overrides, baseline=args.baseline, compare=baselines[1:],
                      progress=sys.stderr.isatty())
    print_table(result, baselines)  # stderr, for a person: stdout holds the JSON line alone, for scripts
    print(json.dumps(rounded(result)))


def rounded(value, digits: int = 4):
    """Round floats (also inside lists and dicts) for readable JSON."""
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, list):
        return [rounded(v, digits) for v in value]
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    return value


def print_table(result: dict[str, float], baselines: list[str], file=None) -> None:
    """The scores as a table a person reads, on stderr (``file``): one row per metric (accuracies in percent, 2
    decimals), one column for the backbone (or the ``--baseline``) and one per compared baseline. The chosen
    hyperparameters, per-split lists and label counts stay in the JSON line."""
    file = sys.stderr if file is None else file
    names = ["backbone" if b == "none" else b for b in baselines]
    prefixes = ["" if b == "none" else f"{b}_" for b in baselines]
    first, others = prefixes[0], [p for p in prefixes[1:] if p]  # a compared baseline's keys are its column
    metrics = [k[len(first):] for k, v in result.items() if k.startswith(first)
               and not any(k.startswith(p) for p in others) and isinstance(v, (int, float))
               and not k.endswith(("_lr", "_wd", "_splits", "_labels"))]
    width = max([len("metric"), *map(len, metrics)]) + 2
    print(f"{'metric':<{width}}" + "".join(f"{n:>12}" for n in names), file=file)
    for key in metrics:
        cells = [result.get(p + key) for p in prefixes]
        print(f"{key:<{width}}" + "".join(f"{c:>12.2f}" if isinstance(c, (int, float)) else f"{'-':>12}"
                                          for c in cells), file=file)


def check_writable(folder: Path) -> None:
    """``folder`` exists (made if need be) and this process may create files in it; else a ConfigError naming it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"cannot create the output folder {folder}: {err.strerror}; choose another path") from err
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"the output folder {folder} is not writable; choose another path or fix its permissions")


def cmd_embed(args: argparse.Namespace) -> None:
    import numpy as np

    from selfsup.api import Preprocess, embed_folder
    from selfsup.checkpoint import atomic_write_all, load_backbone
    from selfsup.eval.run import device_for

    backbone, meta = load_backbone(Path(args.run_dir))
    out = Path(args.out)
    out = out if out.suffix == ".npy" else out.with_name(out.name + ".npy")  # as np.save names it
    check_writable(out.parent)  # before the features are computed, not after
    device = device_for()
    # Streamed from the files by loader workers: a folder of any size is embedded in constant memory.
    found = embed_folder(backbone.to(device), Preprocess.from_meta(meta), Path(args.images_dir).expanduser(),
                         device=device, workers=args.workers, progress=sys.stderr.isatty())
    feats = found.features
    # Row i of the array is the i-th file listed here (paths relative to IMAGES_DIR); files not used are not rows:
    # OUT.skipped.txt lists them as `name<TAB>reason`. A name that is not valid UTF-8 is written as its bytes
    # (surrogateescape), so every listed name opens its file.
    files, skipped = out.with_suffix(".files.txt"), out.with_suffix(".skipped.txt")
    listed = "".join(name + "\n" for name in found.files).encode("utf-8", "surrogateescape")
    not_listed = "".join(f"{name}\t{why}\n" for name, why in found.skipped).encode("utf-8", "surrogateescape")

    def save_features(tmp: str) -> None:
        with open(tmp, "wb") as f:  # a file object: np.save adds no second .npy to the temporary's name
            np.save(f, feats.numpy())

    # All written before any is replaced: a failure leaves the previous output as it was.
    atomic_write_all([(out, save_features), (files, lambda tmp: Path(tmp).write_bytes(listed)),
                      *([(skipped, lambda tmp: Path(tmp).write_bytes(not_listed))] if found.skipped else [])])
    if not found.skipped:
        skipped.unlink(missing_ok=True)  # it listed the previous output's unused files
    print(json.dumps({"out": str(out), "files": str(files), "num_images": feats.shape[0], "dim": feats.shape[1],
                      "skipped": len(found.skipped), **({"skipped_files": str(skipped)} if found.skipped else {})}))


def cmd_bench(args: argparse.Namespace) -> None:
    from selfsup.bench import bench

    cfg = load_config(args.config, args.overrides)
    if cfg.stages:  # each stage's step (MAE-CT: MAE, head initialisation on a frozen encoder, contrastive tuning)
        stages = [{"stage": s.name, **bench(s.cfg, steps=args.steps, warmup=args.warmup, synthetic=args.synthetic)}
                  for s in stage_configs(cfg)]
        print(json.dumps({"stages": stages}))
    else:
        print(json.dumps(bench(cfg, steps=args.steps, warmup=args.warmup, synthetic=args.synthetic)))


def cmd_shard(args: argparse.Namespace) -> None:
    from selfsup.data.datasets import DataError
    from selfsup.data.formats.folder import folder_source, reference_classes, split_dir
    from selfsup.data.formats.shards import write_shards

    root = Path(args.images_dir).expanduser()
    if not root.is_dir():
        raise DataError(f"{root} is not a directory; pass an image folder (root/<class>/*.jpg, or root/<split>/...)")
    splits = (args.splits.split(",") if args.splits
              else ["train", *(s for s in ("val", "validation", "test") if (root / s).is_dir())])
    result = {}
    for split in splits:
        # The split as data.dataset=imagefolder reads it, labels included (other splits use train's classes).
        source = folder_source(split_dir(root, split), reference_classes(root, split))
        out = Path(args.out_dir).expanduser() / split
        log.info("sharding %s/%s: %d images into %s", root, split, len(source), out)
        index = write_shards(source, out, max_count=args.max_count, max_bytes=int(args.max_mb * 2**20),
                             progress=sys.stderr.isatty())
        written = sum(entry["nsamples"] for entry in index["shardlist"])  # skipped also counts files that are not read
        result[split] = {"images": written, "shards": len(index["shardlist"]), "out": str(out),
                         "classes": len(source.classes or []), "skipped": len(index["skipped"])}
    print(json.dumps(result))


def cmd_export(args: argparse.Namespace) -> None:
    from selfsup.export import export

    print(json.dumps(export(args.run_dir, args.format, args.out)))


def cmd_report(args: argparse.Namespace) -> None:
    from selfsup.report import build_report

    out = build_report(args.run_dir, args.out, overrides=args.overrides, max_train=args.max_train,
                       tsne_points=args.tsne, progress=sys.stderr.isatty())
    print(json.dumps({"out": str(out)}))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="selfsup", description="Label-efficient self-supervised pretraining.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("pretrain", help="pretrain a backbone; re-running on a run directory resumes it")
    p.add_argument("config", help="YAML config, or an existing run directory to resume")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. trainer.epochs=5 optim.lr=0.002")
    p.add_argument("--allow-optim-change", action="store_true",
                   help="resume a run with changed optim.* settings (e.g. a lower lr after a divergence); "
                        "the changes are logged and appended to RUN_DIR/config_changes.log")
    p.set_defaults(func=cmd_pretrain)

    p = sub.add_parser("eval", help="evaluate a run's exported backbone; last stdout line is JSON")
    p.add_argument("kind", choices=["knn", "linear", "lowshot", "cluster", "all", "finetune"])
    p.add_argument("run_dir")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. eval.knn_k=10")
    p.add_argument("--baseline", default="none", choices=["none", "raw", "random"],
                   help="evaluate raw pixels or a randomly initialised backbone instead of the trained one")
    p.add_argument("--compare", default="", help="comma-separated baselines to evaluate beside it, e.g. raw,random")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("embed", help="embed a folder of images with a run's backbone into a .npy file")
    p.add_argument("run_dir")
    p.add_argument("images_dir")
    p.add_argument("out")
    p.add_argument("--workers", type=int, default=None, help="image decoding processes (default: one per core, "
                                                              "at most 8; 0 decodes in this process)")
    p.set_defaults(func=cmd_embed)

    p = sub.add_parser("bench", help="images/s of the training step, of augmentation and of a streamed loader, the "
                                     "step's FLOPs and MFU (fraction of the device's peak), and peak memory",
                       description="Times a config's training step and prints one JSON object: images/s of the step "
                                   "and of the augmentation (or of the streaming loader) and which is slower "
                                   "(bottleneck), the FLOPs of one step's forward and backward (gflops_per_step, "
                                   "gflops_per_image), TFLOP/s achieved and MFU against the device's peak for the "
                                   "run's precision (a datasheet figure for H100, H200, A100; else a matrix multiply "
                                   "measured here: peak_source), and peak memory.")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before them (default 2)")
    p.add_argument("--synthetic", action="store_true",
                   help="random images instead of the data (none is read; the loader is not measured): a streamed "
                        "config (data.stream=true) gets random crops of each view's size, as its loader would hand "
                        "the step; any other (data.stream=auto included: the data's size is unknown) random images "
                        "of data.image_size (unset: the dataset's stored size, e.g. 32 for cifar10), augmented as "
                        "usual")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("shard", help="convert an image folder into WebDataset tar shards (data.dataset=shards)")
    p.add_argument("images_dir", help="an image folder as data.dataset=imagefolder reads it")
    p.add_argument("out_dir", help="written as OUT_DIR/<split>/shard-NNNNNN.tar + index.json; then use "
                                   "data.dataset=shards data.root=OUT_DIR")
    p.add_argument("--splits", default="", help="comma-separated splits (default: train, and val/validation/test "
                                                "when IMAGES_DIR has them)")
    p.add_argument("--max-count", type=int, default=10_000, help="images per shard at most (default 10000)")
    p.add_argument("--max-mb", type=float, default=1024, help="MiB per shard at most (default 1024)")
    p.set_defaults(func=cmd_shard)

    p = sub.add_parser("export", help="write a run's backbone as TorchScript, ONNX or a state dict in timm's, "
                                      "torchvision's or selfsup's names")
    p.add_argument("run_dir")
    p.add_argument("--format", required=True, choices=list(FORMATS),
                   help="torchscript (torch.jit.load), onnx (ONNX Runtime; the onnx extra), timm (a ViT's weights "
                        "named as timm's VisionTransformer, + the kwargs in FILE.json), torchvision (a ResNet's "
                        "weights in torchvision's names), state_dict (selfsup's names); the last three are "
                        "safetensors files that model.init_weights starts a run from")
    p.add_argument("--out", default=None, help="output file (default RUN_DIR/export/backbone.pt|.onnx, "
                                               "backbone_timm|torchvision|state_dict.safetensors); FILE.json "
                                               "beside it")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("report", help="one self-contained HTML page about a run (curves, evaluations, embeddings)")
    p.add_argument("run_dir")
    p.add_argument("overrides", nargs="*", help="key=value overrides of the data read, e.g. data.root=...")
    p.add_argument("--out", default=None, help="output file (default RUN_DIR/report.html)")
    p.add_argument("--max-train", type=int, default=2000, help="training images sampled for the maps, the "
                                                                "spectrum and the retrieval gallery (default 2000)")
    p.add_argument("--tsne", type=int, default=500, help="points in the t-SNE map (default 500; 0: PCA only)")
    p.set_defaults(func=cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a command; exit codes: 0 done, 1 training diverged, 2 bad input (config, data, run directory),
    128 + N stopped by signal N (130 Ctrl-C, 143 SIGTERM) after checkpointing the last whole step."""
    from selfsup.data.datasets import DataError
    from selfsup.train.signals import TrainingDiverged, TrainingInterrupted

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may also follow an option (`pretrain RUN --allow-optim-change optim.lr=1e-4`).
    if extra and (not hasattr(args, "overrides") or any(a.startswith("-") or "=" not in a for a in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    _setup_logging()
    try:
        args.func(args)
    except (ConfigError, CheckpointError, DataError) as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    except OSError as err:  # a file-system fault: a missing or unwritable path, a full disk
        print(f"error: {os_error_line(err)}", file=sys.stderr)
        return 2
    except TrainingDiverged as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 1
    except TrainingInterrupted as err:
        print(f"stopped: {err}", file=sys.stderr)
        return 128 + err.signum
    except KeyboardInterrupt:
        return 130
    return 0


# What to do about a file-system fault, by its errno.
OS_ERROR_FIXES = {
    errno.ENOSPC: "free space on that disk and run the command again (the files it had are kept)",
    errno.EDQUOT: "free space within your quota and run the command again (the files it had are kept)",
    errno.EIO: "check the disk and its free space, and run the command again (the files it had are kept)",
    errno.EACCES: "make it writable or choose another path", errno.EPERM: "make it writable or choose another path",
    errno.EROFS: "the file system is read-only: choose a path on a writable one",
    errno.EEXIST: "a file stands where a folder is needed: choose another path",
    errno.ENOTDIR: "a file stands where a folder is needed: choose another path",
    errno.ENAMETOOLONG: "a name in the path is too long (255 bytes at most): choose a shorter one",
}


def os_error_line(err: OSError) -> str:
    """An OSError as one line naming the path and the fix (the library's own carry their message)."""
    if not err.strerror:
        return one_line(err)
    where = f"{err.filename}: " if err.filename else ""
    fix = OS_ERROR_FIXES.get(err.errno, "check the path and run the command again")
    return f"{where}{err.strerror} (errno {err.errno}); {fix}"


def one_line(err: Exception) -> str:
    """The message of ``err`` on one line (a YAML or decoder message may span several)."""
    return " ".join(str(err).split())


if __name__ == "__main__":
    sys.exit(main())
