"""What a run's client data must fit, checked before the arrays are made: the host's memory, and the batch.

- Memory: `available_bytes` is the smaller of the kernel's estimate of
  memory that new allocations can take without swapping (``MemAvailable`` of
  /proc/meminfo) and what the process's cgroup (a container's or a batch
  job's limit) still allows; None where neither can be read (then nothing is
  refused). `check_fits` refuses in one line giving the estimate, what is
  available and what to change, instead of the kernel's out-of-memory killer.
  The clients' arrays are padded to the largest client ([N, n_max, ...],
  data/client_data.py) and, on several host devices, padded to a multiple of
  the device count and held once per device (engine/sharding.py):
  `check_client_arrays_fit` checks them once the partition gives the sizes
  (generated data are checked before a sample is drawn: data/synthetic.py).
- The batch: `check_batch_size` refuses a batch larger than every client.
"""

from __future__ import annotations

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


SYNTHETIC_FIX = ("use fewer clients (--num-clients), or clients of a fixed size "
                 "(data.synthetic_samples_per_client=K)")


def _row_bytes(sample_shape, dtype) -> int:
    return int(np.prod(sample_shape, dtype=np.int64)) * np.dtype(dtype).itemsize + 4  # + the int32 label


def _copies(num_clients: int, devices: int) -> tuple[int, int]:
    """(client rows, copies held): N rounded up to a multiple of the devices, one copy per device."""
    return -(-num_clients // devices) * devices, devices


def check_synthetic_fits(train: np.ndarray, test: np.ndarray, features: int, scheme: str, devices: int = 1) -> None:
    """Generated Synthetic data against the memory available, from the per-client ``train`` and ``test`` sizes
    the generator will draw (data/synthetic.py's `planned_sizes`; ``features`` float32 each) before a sample is
    drawn: its samples, and for the natural partition the clients' padded arrays exactly; for another
    partition (``scheme``) at least the samples once more (the pool split over clients)."""
    num_clients = len(train)
    row = _row_bytes((features,), np.float32)
    total = int(train.sum() + test.sum())
    pool = total * (row + 4)  # + the client id
    if scheme == "natural":
        rows, copies = _copies(num_clients, devices)
        arrays = copies * rows * (int(train.max()) + int(test.max())) * row
        held = f", one copy on each of {copies} host devices)" if copies > 1 else ")"
        what = (f"data.name=synthetic with {num_clients} clients: its {total:,} samples and the clients' arrays "
                f"padded to the largest client (train [{rows}, {int(train.max())}, {features}], test "
                f"[{rows}, {int(test.max())}, {features}] float32{held}")
    else:
        arrays = devices * pool
        what = (f"data.name=synthetic with {num_clients} clients: its {total:,} samples, and at least as much again "
                f"for the clients' arrays ({scheme} partition, padded to the largest client),")
    check_fits(pool + arrays, what, SYNTHETIC_FIX + (", or fewer host devices (--cpu-devices)" if devices > 1 else ""))


def check_client_arrays_fit(sizes: dict[str, np.ndarray], sample_shape, dtype, synthetic_data: bool,
                            devices: int = 1) -> None:
    """The padded client arrays of the parts in ``sizes`` (name -> per-client sample counts: train, test, val)
    against the memory available, before they are made: one copy per host device, and the largest part once
    more while it moves to the device."""
    num_clients = len(next(iter(sizes.values())))
    rows, copies = _copies(num_clients, devices)
    row = _row_bytes(sample_shape, dtype)
    parts = {name: rows * max(int(np.max(n, initial=0)), 1) * row for name, n in sizes.items()}
    need = copies * sum(parts.values()) + max(parts.values())
    train = np.asarray(sizes["train"])
    shape = "x".join(str(s) for s in sample_shape)
    what = (f"the arrays of {num_clients} clients, padded to the largest ({int(train.max())} train samples of "
            f"{shape} {np.dtype(dtype).name}; the mean client has {train.mean():.0f})"
            + (f" and held once on each of {copies} host devices" if copies > 1 else ""))
    fix = (SYNTHETIC_FIX if synthetic_data else
           "use fewer clients (--num-clients), or a partition whose clients are closer in size")
    check_fits(need, what, fix + (", or fewer host devices (--cpu-devices)" if copies > 1 else ""))


def check_batch_size(batch_size: int, train_sizes) -> None:
    """A batch larger than every client's train data: each client would train on its whole data in one batch
    padded to ``batch_size`` rows; refused, naming the largest client."""
    largest = int(np.max(np.asarray(train_sizes), initial=0))
    if largest and batch_size > largest:
        raise UserError(f"train.batch_size {batch_size} is larger than every client (the largest holds {largest} "
                        f"train samples); use --batch-size {largest} or less")
