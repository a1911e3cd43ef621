"""WebDataset tar shards: the format for clusters and object storage.

A split is a folder of POSIX tar files. Each sample is a group of members sharing a key, WebDataset's
convention: ``<key>.jpg`` (or .png, .webp, ...: the original encoded bytes, never re-encoded) and
``<key>.cls`` (the label as ASCII digits). The folder's ``index.json`` is a ``wids`` shard index
(``shardlist`` of ``{url, nsamples, filesize}``; indexes written before ``filesize`` was added still read)
plus the class names, so the shards also work with the ``webdataset``/``wids`` readers and any tar tool.
Opening a folder checks every shard against its index: a shard holding fewer whole samples than
``nsamples`` (a copy cut short) is an error naming it, or with ``allow_incomplete`` a warning with the
number of samples lost. ``index.npz`` caches where each image lies inside
its shard; without it (shards written by other tools), the shards' headers are scanned once.

Why tar shards and not Lightning's litdata: tar needs no dependency to write or read, works on any
file system or object store that serves byte ranges, and is what the ImageNet-scale SSL codebases
ship (WebDataset); litdata's chunk format is readable only by litdata. Random access by byte range
lets one sampler serve every layout, so streaming from shards keeps the in-memory path's exact
per-step batches, DDP split and resume.
"""

from __future__ import annotations

import io
import json
import logging
import os
import tarfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from selfsup.data.decode import DecodeWarnings
from selfsup.data.formats.folder import IMAGE_EXTENSIONS, FolderSource
from selfsup.data.imagedata import DataError, report_decode_warnings, report_skipped
from selfsup.progress import Progress

log = logging.getLogger("selfsup")

__all__ = ["ShardSource", "shard_source", "write_shards"]

INDEX = "index.json"
OFFSETS = "index.npz"
_IMAGE_SUFFIXES = {ext.lstrip(".") for ext in IMAGE_EXTENSIONS}


def _split_member(name: str) -> tuple[str, str]:
    """WebDataset's rule: the key is the path up to the first dot of the file name; the rest is the suffix."""
    folder, base = os.path.split(name)
    stem, _, suffix = base.partition(".")
    return os.path.join(folder, stem), suffix.lower()


def _members(tar: tarfile.TarFile) -> Iterable[tarfile.TarInfo]:
    """The members of ``tar``; a file cut short ends the listing after its last header (the last member's data may
    be cut: the callers check the bytes against the file's size) instead of raising."""
    while True:
        try:
            member = tar.next()
        except tarfile.ReadError as err:
            if "unexpected end of data" not in str(err):
                raise
            return
        if member is None:
            return
        yield member


def scan_shard(path: Path) -> tuple[list[str], list[int], list[int], list[int]]:
    """Member names, data offsets, sizes and labels (-1: none) of the images in one tar shard (a shard cut short:
    the samples whose headers are there; :func:`shard_source` compares them with the index)."""
    names, offsets, sizes, labels, keys = [], [], [], [], {}
    try:
        with tarfile.open(path, "r:") as tar:
            for member in _members(tar):
                if not member.isfile():
                    continue
                key, suffix = _split_member(member.name)
                if suffix in _IMAGE_SUFFIXES:
                    keys[key] = len(names)
                    names.append(member.name)
                    offsets.append(member.offset_data)
                    sizes.append(member.size)
                    labels.append(-1)
                elif suffix == "cls" and key in keys:
                    try:
                        text = tar.extractfile(member).read()
                    except tarfile.ReadError:  # the file ends inside the label: its image stays unlabelled (lost)
                        break
                    labels[keys[key]] = int(text.strip() or -1)
    except (tarfile.TarError, OSError, ValueError) as err:
        raise DataError(f"{path}: not a readable tar shard ({err}); re-create it with `selfsup shard`") from err
    return names, offsets, sizes, labels


class ShardSource:
    """The images of one shard folder as an :class:`~selfsup.data.decode.ImageSource`, read by byte range.

    Per-sample arrays (shard number, offset, size, label, member name) are numpy; open file handles
    are per process and never pickled, so the source can be sent to DataLoader workers.
    """

    def __init__(self, root: Path, shards: list[str], shard_of: np.ndarray, offsets: np.ndarray, sizes: np.ndarray,
                 members: np.ndarray, labels: np.ndarray | None, classes: list[str] | None) -> None:
        self.root = Path(root)
        self.shards = shards
        self._shard, self._offset, self._size, self._member = shard_of, offsets, sizes, members
        self.labels = labels
        self.classes = classes
        self._handles: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._offset)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_handles": {}}

    def __del__(self) -> None:
        for fd in getattr(self, "_handles", {}).values():
            os.close(fd)

    def name(self, index: int) -> str:
        return f"{self.shards[self._shard[index]]}:{os.fsdecode(self._member[index])}"

    def size(self, index: int) -> int:
        """The image's size in bytes, from the index."""
        return int(self._size[index])

    def open(self, index: int) -> io.BytesIO:
        shard = int(self._shard[index])
        fd = self._handles.get(shard)
        if fd is None:
            fd = self._handles[shard] = os.open(self.root / self.shards[shard], os.O_RDONLY)
        size = int(self._size[index])
        data = os.pread(fd, size, int(self._offset[index]))
        if len(data) != size:
            raise OSError(f"{self.name(index)}: the shard ends inside this image (truncated file)")
        return io.BytesIO(data)


def _read_index(folder: Path) -> dict:
    path = folder / INDEX
    try:
        index = json.loads(path.read_text())
        shards = [entry["url"] for entry in index["shardlist"]]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DataError(f"{path}: not a shard index ({err}); re-create the shards with `selfsup shard`") from err
    return {**index, "urls": shards}


def shard_source(folder: Path, allow_incomplete: bool = False) -> ShardSource:
    """Open a shard folder: ``index.json`` (+ the ``index.npz`` cache), or every ``*.tar`` in it, scanned.

    Each shard is checked against the index (:func:`_check_complete`): fewer whole samples than it lists is a
    :class:`DataError`, or, with ``allow_incomplete`` (``data.allow_incomplete_shards``), a warning naming the
    shards and the number of samples lost.
    """
    listed: list[dict] = []
    if (folder / INDEX).is_file():
        index = _read_index(folder)
        shards, classes, listed = index["urls"], index.get("classes"), index["shardlist"]
    else:
        shards, classes = sorted(p.name for p in folder.glob("*.tar")), None
        if not shards:
            raise DataError(f"{folder} holds neither {INDEX} nor *.tar shards; create them with "
                            f"`selfsup shard IMAGES_DIR {folder.parent if folder.name == 'train' else folder}`")
    missing = [s for s in shards if not (folder / s).is_file()]
    if missing:
        raise DataError(f"{folder}: {len(missing)} shard(s) listed in {INDEX} are missing ({', '.join(missing[:3])}); "
                        f"copy them or re-create the shards")
    sizes_now = [(folder / s).stat().st_size for s in shards]
    cache = folder / OFFSETS
    arrays = None
    if cache.is_file():
        with np.load(cache, allow_pickle=False) as npz:
            if npz["shard_bytes"].tolist() == sizes_now:
                arrays = {k: npz[k] for k in ("shard", "offset", "size", "member", "label")}
    if arrays is None:
        arrays = _scan(folder, shards)
    arrays = _check_complete(folder, shards, listed, arrays, np.array(sizes_now, dtype=np.int64), allow_incomplete)
    labels = arrays["label"]
    if len(labels) == 0:
        raise DataError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) found in the shards of {folder}")
    if (labels < 0).any():
        labels = None
    elif classes is None:
        classes = [str(i) for i in range(int(labels.max()) + 1)]
    return ShardSource(folder, shards, arrays["shard"], arrays["offset"], arrays["size"], arrays["member"],
                       labels, classes)


def _check_complete(folder: Path, shards: list[str], listed: list[dict], arrays: dict[str, np.ndarray],
                    sizes_now: np.ndarray, allow_incomplete: bool) -> dict[str, np.ndarray]:
    """Compare each shard's whole samples (header found and bytes inside the file) with its index entry's
    ``nsamples`` (and ``filesize``, when the index has it). A shortfall raises a DataError naming the shards and the
    counts, or, with ``allow_incomplete``, warns with the number lost; returns the arrays of the whole samples."""
    whole = arrays["offset"] + arrays["size"] <= sizes_now[arrays["shard"]]  # a cut inside an image loses it
    if (arrays["label"] >= 0).any():  # labelled shards: a sample whose label was cut off is lost too
        whole &= arrays["label"] >= 0
    found = np.bincount(arrays["shard"][whole], minlength=len(shards))
    short = []
    for i, shard in enumerate(shards):
        entry = listed[i] if i < len(listed) and isinstance(listed[i], dict) else {}
        expected = entry.get("nsamples")
        if not isinstance(expected, int) or isinstance(expected, bool):  # no index (other tools): headers scanned
            expected = int(np.count_nonzero(arrays["shard"] == i))
        if found[i] < expected:
            size = entry.get("filesize")
            bytes_note = f", {sizes_now[i]:,} of its {size:,} bytes" if isinstance(size, int) else ""
            short.append((shard, int(found[i]), expected, bytes_note))
    if not short:
        return arrays
    lost = sum(expected - got for _, got, expected, _ in short)
    total = int(whole.sum())
    details = "; ".join(f"{shard} holds {got} of the {expected} samples {INDEX} lists{note}"
                        for shard, got, expected, note in short[:5]) + ("; ..." if len(short) > 5 else "")
    if not allow_incomplete:
        raise DataError(f"{folder}: {len(short)} shard(s) are incomplete ({details}): {lost} samples would be lost. "
                        f"Copy the shards again or re-create them with `selfsup shard`; or set "
                        f"data.allow_incomplete_shards=true to read the {total} samples present")
    log.warning("%s: %d incomplete shard(s) (%s): reading %d samples, %d lost (data.allow_incomplete_shards=true)",
                folder, len(short), details, total, lost)
    return {key: value[whole] for key, value in arrays.items()}


def _scan(folder: Path, shards: list[str]) -> dict[str, np.ndarray]:
    parts = [scan_shard(folder / s) for s in shards]
    return {
        "shard": np.concatenate([np.full(len(p[0]), i, dtype=np.int32) for i, p in enumerate(parts)]),
        "offset": np.array([o for p in parts for o in p[1]], dtype=np.int64),
        "size": np.array([s for p in parts for s in p[2]], dtype=np.int64),
        "member": np.array([os.fsencode(n) for p in parts for n in p[0]], dtype=np.bytes_),
        "label": np.array([lab for p in parts for lab in p[3]], dtype=np.int64),
    }


def _unreadable(source: FolderSource, caught: DecodeWarnings) -> list[tuple[int, str]]:
    """``(sample, reason)`` of each file that does not decode as training reads it (:func:`upright`), checked in
    threads; JPEGs are decoded at their smallest draft scale (1/8), which reads the whole file but costs little."""
    from PIL import Image

    from selfsup.data.decode import unreadable_reason, upright

    def check(i: int) -> str | None:
        try:
            with caught.file(source.name(i)), Image.open(source.open(i)) as image:
                image.draft(image.mode, (1, 1))
                image.load()
                upright(image, "RGB")
        except Exception as err:  # any unreadable or malformed file
            return unreadable_reason(source, i, err)
        return None

    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
        reasons = list(pool.map(check, range(len(source))))
    return [(i, why) for i, why in enumerate(reasons) if why is not None]


def _chunks(source: FolderSource, samples: list[int], max_count: int, max_bytes: int) -> Iterable[list[int]]:
    """Consecutive sample numbers, cut where a shard would exceed ``max_count`` images or ``max_bytes``."""
    chunk, total = [], 0
    for i in samples:
        size = os.path.getsize(source.open(i))
        if chunk and (len(chunk) >= max_count or total + size > max_bytes):
            yield chunk
            chunk, total = [], 0
        chunk.append(i)
        total += size
    if chunk:
        yield chunk


def write_shards(source: FolderSource, out: Path, max_count: int = 10_000, max_bytes: int = 1 << 30,
                 progress: bool = True) -> dict:
    """Write ``source`` (one folder split) as tar shards of at most ``max_count`` images / ``max_bytes`` into ``out``.

    Images keep their encoded bytes. A file that does not decode, and every file of the folder that is not read
    (see :func:`~selfsup.data.formats.folder.not_read_reason`), is left out and named (by its path under
    ``source.root``) in one log line and in the returned index's ``skipped``, with its reason in
    ``skipped_reasons`` (name -> reason). Every shard is written
    under a temporary name and renamed when complete, and the index last, so an interrupted conversion never
    leaves a folder that reads as complete. Returns the index.
    """
    if max_count < 1 or max_bytes < 1:
        raise DataError(f"shards need max_count >= 1 and max_bytes >= 1; got {max_count}, {max_bytes}")
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.tar"):
        stale.unlink()
    (out / INDEX).unlink(missing_ok=True)
    (out / OFFSETS).unlink(missing_ok=True)
    digits = max(8, len(str(len(source))))
    bar = Progress(f"sharding {source.root.name}", len(source), unit="images", enabled=progress)
    shards = []
    with DecodeWarnings() as caught:
        unreadable = _unreadable(source, caught)
    bad = {i for i, _ in unreadable}
    readable = [i for i in range(len(source)) if i not in bad]
    unused = source.unused()
    skipped = unused + [(source.name(i), why) for i, why in unreadable]
    report_skipped(skipped, f"of {len(source) + len(unused)} in {source.root} (not written to the shards)")
    report_decode_warnings(caught.notes, f"in {source.root}")
    for number, chunk in enumerate(_chunks(source, readable, max_count, max_bytes)):
        name = f"shard-{number:06d}.tar"
        tmp = out / (name + ".tmp")
        with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in chunk:
                key = f"{i:0{digits}d}"
                suffix = os.path.splitext(source.name(i))[1].lower()
                members = [(key + suffix, Path(source.open(i)).read_bytes())]
                if source.labels is not None:
                    members.append((key + ".cls", str(int(source.labels[i])).encode()))
                for member, data in members:
                    info = tarfile.TarInfo(member)
                    info.size, info.mtime, info.mode = len(data), int(time.time()), 0o444
                    tar.addfile(info, io.BytesIO(data))
                bar.advance()
        os.replace(tmp, out / name)
        shards.append((name, len(chunk)))
    bar.close()
    arrays = _scan(out, [s for s, _ in shards])
    np.savez(out / OFFSETS, shard_bytes=np.array([(out / s).stat().st_size for s, _ in shards], dtype=np.int64),
             **arrays)
    index = {"__kind__": "wids-shard-index-v1", "wids_version": 1, "name": source.root.name,
             "shardlist": [{"url": s, "nsamples": n, "filesize": (out / s).stat().st_size} for s, n in shards],
             "classes": source.classes, "skipped": [name for name, _ in skipped],
             "skipped_reasons": dict(skipped)}
    tmp = out / (INDEX + ".tmp")
    tmp.write_text(json.dumps(index, indent=1))
    os.replace(tmp, out / INDEX)
    return index
