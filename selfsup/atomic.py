"""Files written whole or not at all: a temporary sibling, synced, then renamed over the target.

Below every other module (it imports none of the package's), so the config, the checkpoints and the logs all
write through it (:mod:`selfsup.checkpoint` re-exports it, as before).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

TMP_SUFFIX = ".tmp"


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Create ``path`` through ``write(tmp)`` on a temporary sibling, synced to disk, then renamed.

    A crash at any point leaves either the old file or the new one, never a mix; a temporary left by
    a killed process is removed by :func:`selfsup.checkpoint.remove_stale_temporaries`. Permissions follow the umask.
    """
    atomic_write_all([(path, write)])


def atomic_write_all(files: list[tuple[Path, Callable[[str], None]]]) -> None:
    """:func:`atomic_write` for files that describe each other (an array and the list of its rows): every one is
    written to its temporary and synced before the first is renamed, so a failed write (a full disk, a name that
    cannot be encoded) leaves all of them as they were."""
    temporaries: list[tuple[str, Path]] = []
    try:
        for path, write in files:
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
            os.close(fd)
            temporaries.append((tmp, path))
            write(tmp)
            os.chmod(tmp, 0o666 & ~_umask())
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        for tmp, path in temporaries:
            os.replace(tmp, path)
            _fsync_dir(path.parent)
    finally:
        for tmp, _ in temporaries:
            if os.path.exists(tmp):
                os.unlink(tmp)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some platforms cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


__all__ = ["TMP_SUFFIX", "atomic_write", "atomic_write_all"]
