"""What this machine's memory allows: the bound a size read from a config, an option or a file is checked against
before anything of that size is allocated (an allocation past it would swap or be killed, not fail cleanly).

`available_bytes()` is the memory a new allocation can take now: the kernel's MemAvailable (free memory plus the
page cache it can drop), capped by this process's cgroup limit less its usage (a container, a SLURM job), as the
out-of-memory killer counts it.
"""

from __future__ import annotations

import os
from pathlib import Path

MEMINFO = Path("/proc/meminfo")
# cgroup v2's limit and usage, then v1's
CGROUP_FILES = (
    (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory.current")),
    (Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"), Path("/sys/fs/cgroup/memory/memory.usage_in_bytes")),
)
SHARE = 0.5  # of the available memory, at most, for one allocation a command sizes from its input


def available_bytes() -> int:
    """The bytes a new allocation can take now (see the module's docstring)."""
    available = [meminfo_available(), *cgroup_room()]
    known = [value for value in available if value is not None]
    if known:
        return min(known)
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")  # no /proc: free pages only


def allowed_bytes() -> int:
    """The most one allocation sized from a command's input may take: `SHARE` of `available_bytes()`."""
    return int(SHARE * available_bytes())


def meminfo_available() -> int | None:
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def cgroup_room() -> list[int]:
    """The room left under this process's cgroup memory limit (none listed: no limit, or no cgroup files)."""
    for limit_path, usage_path in CGROUP_FILES:
        try:
            limit, usage = limit_path.read_text().strip(), int(usage_path.read_text().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 1 << 60:  # unlimited (v1 writes a huge number)
            return []
        return [max(int(limit) - usage, 0)]
    return []


def in_gib(size: float) -> str:
    return f"{size / 2**30:.1f} GiB"
