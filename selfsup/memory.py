"""The memory a process may still take, and the check that refuses a size that cannot fit before allocating it.

A size in range can still be far beyond the machine (``data.image_size=8192`` on 1,797 images is 360 GB of pixels):
each place that allocates by a user's size estimates what it needs first and, when that exceeds what is free, stops
with a :class:`~selfsup.config.ConfigError` (exit 2) naming the sizes and the setting to change, instead of an
allocator's traceback or the system's out-of-memory killer. The estimates are lower bounds: a size that passes may
still not fit, one that fails cannot.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from selfsup.config import ConfigError

__all__ = ["available_bytes", "check_fits", "gib"]

# cgroup limits above this are "no limit" (cgroup v1 reports 2**63 rounded down to a page).
_NO_LIMIT = 2**60


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:  # other POSIX systems: the physical pages not in use
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_available() -> int | None:
    """What the process's memory cgroup (a container's limit) still allows: limit - usage, or None without one."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            text = Path(limit_file).read_text().strip()
            if text == "max" or int(text) >= _NO_LIMIT:
                return None
            return max(0, int(text) - int(Path(usage_file).read_text()))
        except (OSError, ValueError):
            continue
    return None


def available_bytes(device: torch.device | str | None = None) -> int | None:
    """Bytes free for this process: on a CUDA device its free memory, otherwise the host's available memory (within
    a container's limit). None where it cannot be known (then nothing is refused)."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    known = [b for b in (_meminfo_available(), _cgroup_available()) if b is not None]
    return min(known) if known else None


def gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:,.1f} GiB"


def check_fits(what: str, need: int, fix: str, device: torch.device | str | None = None) -> None:
    """Refuse ``need`` bytes for ``what`` (e.g. "the training step") when more than is free, naming ``fix``."""
    free = available_bytes(device)
    if free is not None and need > free:
        where = f"on {device}" if device is not None and torch.device(device).type != "cpu" else "in this machine's memory"
        raise ConfigError(f"{what} needs at least {gib(need)} but {gib(free)} is free {where}; {fix}")
