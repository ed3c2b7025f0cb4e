"""What a run's client data must fit, checked before the arrays are made: the host's memory, and the batch.

- Memory: `available_bytes` is the smaller of the kernel's estimate of
  memory that new allocations can take without swapping (``MemAvailable`` of
  /proc/meminfo) and what the process's cgroup (a container's or a batch
  job's limit) still allows; None where neither can be read (then nothing is
  refused). `check_fits` refuses in one line giving the estimate, what is
  available and what to change, instead of the kernel's out-of-memory killer;
  `resident_bytes` is this process's resident memory now. A run's whole
  estimate (client arrays, state, copies per device) is
  engine/memory_estimate.py's.
- The batch: `check_batch_size` refuses a batch larger than every client.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from fedjax_pfl.core.errors import UserError

MEMINFO = Path("/proc/meminfo")
CGROUP_V2 = Path("/sys/fs/cgroup")  # memory.max, memory.current (cgroup v2, unified)
CGROUP_V1 = Path("/sys/fs/cgroup/memory")  # memory.limit_in_bytes, memory.usage_in_bytes


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _meminfo_available() -> int | None:
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_left() -> int | None:
    for limit, usage in ((CGROUP_V2 / "memory.max", CGROUP_V2 / "memory.current"),
                         (CGROUP_V1 / "memory.limit_in_bytes", CGROUP_V1 / "memory.usage_in_bytes")):
        cap, used = _read_int(limit), _read_int(usage)
        if cap is not None and used is not None and cap < 1 << 60:  # 'max' or a huge v1 number: no limit
            return max(cap - used, 0)
    return None


def available_bytes() -> int | None:
    """Bytes new allocations can take now (see the module docstring), or None when the system does not say."""
    known = [v for v in (_meminfo_available(), _cgroup_left()) if v is not None]
    return min(known) if known else None


def resident_bytes() -> int:
    """This process's resident memory now (/proc/self/statm; else its peak so far, from getrusage)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def shown(n: float) -> str:
    """Bytes in words: '512 MB', '4.9 TB' (powers of 1000)."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} bytes"


def check_fits(need: int, what: str, fix: str, available: int | None = None) -> None:
    """UserError when ``need`` bytes (for ``what``) exceed what is ``available`` (default: `available_bytes` now);
    ``fix``: what to change, in the user's words."""
    available = available_bytes() if available is None else available
    if available is not None and need > available:
        raise UserError(f"{what} would take {shown(need)} of memory, more than the {shown(available)} available on "
                        f"this machine; {fix}")


def check_batch_size(batch_size: int, train_sizes) -> None:
    """A batch larger than every client's train data: each client would train on its whole data in one batch
    padded to ``batch_size`` rows; refused, naming the largest client."""
    largest = int(np.max(np.asarray(train_sizes), initial=0))
    if largest and batch_size > largest:
        raise UserError(f"train.batch_size {batch_size} is larger than every client (the largest holds {largest} "
                        f"train samples); use --batch-size {largest} or less")
