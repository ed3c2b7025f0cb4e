"""A run's peak memory, estimated before its client arrays are made: printed, and refused when it does not fit.

The estimate is a sum of named parts for each of the two phases of a run,
and its peak the larger of the two:

- making the data: the process as it stood before the data were read (its
  resident size then: Python, JAX and its backend), the dataset's samples
  (features, labels, client ids; twice while a pool of train and test samples
  is partitioned as one), the partition's index arrays (`INDEX_BYTES` a
  sample) and summary, the clients' padded arrays [N, n_max, ...] on the
  default device, and the host copy of the largest part while it is made
  (none where the clients' rows lie in the pool as they are:
  data/client_data.py);
- training: the same process plus `WORKSPACE` (XLA compiling and running
  the round, evaluation, the figures), `PER_CLIENT` bytes of records a
  client (`PER_RUN` a run folder), the samples (but generated
  ones, freed once partitioned), the padded arrays once per CPU device (held
  whole by each host device, engine/sharding.py; once more when the clients
  are padded to a multiple of the devices) and the clients' state [N, ...]
  (the method's init shapes) twice: on the device, the state and the round's
  output; on the host (engine/host_clients.py), the store and the initial
  state it is copied from, or only the latter where memory-mapped files hold
  the state and the data (``mapped``: then only a cohort's rows of them are
  read into memory).

On an accelerator the client arrays and state are the device's part, and
the host keeps the samples and the process. `RunMemory` estimates a run
(its `RunPlan`) in two steps: before any sample is read (generated data,
whose client sizes are known then: exact for their own clients, the natural
partition; a lower bound for another partition, which pads to a largest
client not drawn yet), and once the partition gives every client's size,
before the arrays are made. Either refuses in one line when the estimate
exceeds what is available (data/client_limits.py), naming only changes that
fit in `SUGGESTED_SHARE` of it by the same estimate: client state on the host,
the generator's own clients of a fixed size, fewer clients, each alone or
with one host device.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import numpy as np

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.data import client_limits, synthetic
from fedjax_pfl.data.client_limits import shown
from fedjax_pfl.engine import host_clients

WORKSPACE = 400 << 20  # XLA compiling and running a round, evaluation, the figures (measured: RESULTS.md)
PER_CLIENT = 2 << 10  # a client's records: partition.json's and clients.csv's rows, its evaluation
INDEX_BYTES = 32  # a sample's share of the partition's index arrays (int64 positions, owners, orders)
PER_RUN = 1 << 20  # a run folder's writers and records beside the others of a sweep (measured: 200 seeds)
DEVICE_WORKSPACE = 256 << 20  # an accelerator's: the round's buffers beside the client arrays and state
FIXED_SIZE = 50  # the client size suggested for generated data (the smallest of the FedProx sizes)
SUGGESTED_SHARE = 0.8  # a suggested change fits in this share of the memory available (room for the unforeseen)


@dataclasses.dataclass(frozen=True)
class Shape:
    """What the estimate reads of a run."""

    clients: int
    part_rows: tuple[int, ...]  # n_max of each client array (train, test, val)
    row_bytes: int  # one sample: its features and int32 label
    pool_bytes: int  # the dataset's samples, labels and client ids
    pool_copies: int = 1  # 2 while a pool of train and test samples is partitioned as one
    keeps_pool: bool = True  # the samples stay for the run (False: generated data, freed once partitioned)
    in_place: bool = False  # the clients' rows are views of the pool (no host copy while they are made)
    state_bytes: int = 0  # the method's server and [N, ...] client state
    devices: int = 1  # CPU host devices, each holding the client arrays whole
    on_host: bool = False  # client state kept on the host (engine/host_clients.py)
    accelerator: bool = False
    exact: bool = True  # False: the arrays' rows are a lower bound (the partition is not drawn yet)
    mapped: bool = False  # host-kept state and client data in memory-mapped files
    records: bool = True  # a run's records and figures (a benchmark keeps none)
    runs: int = 1  # runs whose state is held at once (a sweep's runs in one program)
    folders: int = 1  # runs writing their folders (a sweep's points)


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Peak bytes by part: ``host`` (the larger phase's parts) and ``device`` (an accelerator's; {} on CPU)."""

    host: dict
    device: dict
    phase: str  # which phase ``host`` is: 'making the data' or 'training'
    exact: bool = True

    @property
    def host_bytes(self) -> int:
        return sum(self.host.values())

    @property
    def device_bytes(self) -> int:
        return sum(self.device.values())

    def parts(self, device: bool = False) -> str:
        """The host's (or the device's) parts in words: 'samples 1.2 GB, client arrays 2.4 GB'."""
        return ", ".join(f"{k} {shown(v)}" for k, v in (self.device if device else self.host).items() if v)

    def line(self) -> str:
        """One line for the run's log: the peak and its parts."""
        text = (f"memory estimate: {'' if self.exact else 'at least '}{shown(self.host_bytes)} of host memory at "
                f"the peak, {self.phase} ({self.parts()})")
        if self.device:
            text += f"; {shown(self.device_bytes)} of device memory ({self.parts(device=True)})"
        return text


def array_bytes(shape: Shape) -> int:
    """The padded client arrays once, their rows rounded up to a multiple of the host devices."""
    rows = -(-shape.clients // shape.devices) * shape.devices
    return rows * sum(shape.part_rows) * shape.row_bytes


def estimate(shape: Shape, process: int) -> Estimate:
    """The peak of a run of ``shape`` in a process of ``process`` resident bytes before its data."""
    arrays = array_bytes(shape)
    largest = max(shape.part_rows) * shape.clients * shape.row_bytes
    split = shape.devices > 1 and not shape.on_host
    copies = shape.devices + (shape.clients % shape.devices != 0) if split else 1
    on_device = shape.accelerator
    state = shape.state_bytes * shape.runs * (1 if shape.mapped else 2)  # (mapped: once while made, then in files)
    if shape.mapped:  # only the cohort's rows are read into memory
        arrays = largest = 0
    indices = INDEX_BYTES * shape.pool_bytes // max(shape.row_bytes, 1)  # a few int64 index arrays per sample
    making = {"process": process, "samples": shape.pool_bytes * shape.pool_copies,
              "partition": (PER_CLIENT * shape.clients + indices) * shape.records,
              "client arrays": 0 if on_device else arrays, "host copy": 0 if shape.in_place else largest}
    training = {"process": process, "compiling and running": WORKSPACE,
                "client records": (PER_CLIENT * shape.clients + PER_RUN) * shape.records * shape.folders,
                "samples": shape.pool_bytes * shape.keeps_pool, "client arrays": 0 if on_device else arrays * copies,
                "client state": 0 if on_device and not shape.on_host else state}
    host, phase = max((making, "making the data"), (training, "training"), key=lambda p: sum(p[0].values()))
    device = ({"client arrays": arrays, "client state": 0 if shape.on_host else state, "workspace": DEVICE_WORKSPACE}
              if on_device else {})
    return Estimate(host, device, phase, shape.exact)


def device_available() -> int | None:
    """Bytes an accelerator can still take (its memory_stats' limit less what is in use), None on CPU."""
    device = jax.local_devices()[0]
    if device.platform == "cpu":
        return None
    stats = device.memory_stats() or {}
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)) if "bytes_limit" in stats else None


def fits(est: Estimate, host: int | None, device: int | None) -> bool:
    """Whether ``est`` fits ``host`` and ``device`` bytes (None: not known, taken as fitting)."""
    return (host is None or est.host_bytes <= host) and (device is None or est.device_bytes <= device)


def host_devices() -> int:
    """How many copies of the client data the engine keeps: one per host device of this process when there are
    several (engine/sharding.py's `place_client_data`), else one."""
    devices = jax.local_devices()
    return len(devices) if jax.process_count() == 1 and len(devices) > 1 and devices[0].platform == "cpu" else 1


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What the estimate reads of a run's configuration, each field named as its setting's flag."""

    dataset: str
    partition: str  # partition.scheme
    num_clients: int
    data_seed: int
    samples_per_client: int | None  # data.synthetic_samples_per_client
    size_factor: int  # data.synthetic_size_factor
    client_state: str  # train.client_state
    all_clients_train: bool
    cpu_devices: int  # host devices holding the client data (`host_devices`)

    @classmethod
    def of(cls, cfg, data_seed: int) -> RunPlan:
        """The plan of a run configuration (runs/config.py's RunConfig) with its data seed."""
        return cls(cfg.data.name, cfg.partition.scheme, cfg.partition.num_clients, data_seed,
                   cfg.data.synthetic_samples_per_client, cfg.data.synthetic_size_factor, cfg.train.client_state,
                   cfg.train.all_clients_train, host_devices())


FLAGS = {"cpu_devices": "--cpu-devices {}", "client_state": "--client-state {}", "partition": "--partition {}",
         "num_clients": "--num-clients {}", "samples_per_client": "data.synthetic_samples_per_client={}"}


def flags(change: dict) -> str:
    """A change of a `RunPlan` as the command line says it."""
    return " ".join(FLAGS[k].format(v) for k, v in change.items())


class RunMemory:
    """The memory of one run (``plan``), estimated in two steps (module docstring). Made before the data are
    read: ``process`` is the process's resident size then (default: measured now)."""

    def __init__(self, plan: RunPlan, process: int | None = None):
        self.plan = plan
        self.process = client_limits.resident_bytes() if process is None else process
        self.accelerator = jax.local_devices()[0].platform != "cpu"
        self.state_bytes: Callable[[int], int] = lambda n: 0
        self.method = None
        self.estimate: Estimate | None = None
        self.checked: Shape | None = None  # the shape of the last check

    def with_method(self, method) -> None:
        """Size the client state by ``method``'s init shapes: exact at the plan's client count, linear from one
        and two clients at another."""
        one, two = host_clients.state_bytes(method, 1), host_clients.state_bytes(method, 2)
        exact = {self.plan.num_clients: host_clients.state_bytes(method, self.plan.num_clients)}
        self.state_bytes = lambda n: exact.get(n, one + (two - one) * (n - 1))
        self.method = method

    @functools.cached_property
    def host_support(self) -> str | None:
        """Why the method cannot keep client state on the host (None: it can; `host_clients.why_not_on_host`)."""
        if self.method is None:
            return "its method is not known yet"
        return host_clients.why_not_on_host(self.method, self.plan.all_clients_train, False, 2)

    # ------------------------------------------------------------------ the shapes
    def _on_host(self, plan: RunPlan, needed: int) -> bool:
        """Whether the run keeps client state on the host (train.client_state; 'auto': `host_clients.choose`'s
        rule, on one device and for a method that can)."""
        if plan.client_state != "auto":
            return plan.client_state == "host"
        if plan.cpu_devices > 1:
            return False
        available = device_available() if self.accelerator else client_limits.available_bytes()
        return host_clients.choose("auto", needed, available)[0] and self.host_support is None

    def shape(self, plan: RunPlan, part_rows, clients: int, row_bytes: int, pool_bytes: int, pool_copies: int = 1,
              in_place: bool = False, exact: bool = True) -> Shape:
        state = self.state_bytes(clients)
        on_host = self._on_host(plan, state + clients * sum(part_rows) * row_bytes)
        return Shape(clients, tuple(part_rows), row_bytes, pool_bytes, pool_copies, plan.dataset != "synthetic",
                     in_place, state, 1 if self.accelerator else plan.cpu_devices, on_host, self.accelerator, exact)

    def synthetic_shape(self, plan: RunPlan) -> Shape:
        """Generated data (data/synthetic.py) before a sample is drawn: exact for the natural partition; for
        another, the arrays of equal clients holding the pool (a lower bound)."""
        train, test = synthetic.planned_sizes(plan.num_clients, plan.data_seed, plan.samples_per_client,
                                              size_factor=plan.size_factor)
        row = synthetic.DIMENSION * 4 + 4
        samples = int(train.sum() + test.sum())
        natural = plan.partition == "natural"
        rows = (int(train.max()), int(test.max())) if natural else (-(-samples // len(train)),)
        return self.shape(plan, rows, len(train), row, samples * (row + 4), 1 if natural else 2,
                          natural and bool(plan.samples_per_client), exact=natural)

    # ------------------------------------------------------------------ the checks
    def check_before_loading(self, method=None) -> None:
        """Refuse a run of generated data that cannot fit, before a sample is drawn (module docstring); ``method``:
        the run's, sized on a sample of its data (`with_method`)."""
        if method is not None:
            self.with_method(method)
        if self.plan.dataset == "synthetic":
            self._check(self.synthetic_shape(self.plan))

    def check_arrays(self, sizes: dict, dataset, pool_copies: int, in_place: bool) -> Estimate:
        """The estimate once the partition gave every client's size (``sizes``: part -> counts) of ``dataset``'s
        samples, before the arrays are made; refused when it does not fit. ``in_place``: the clients lie in the
        pool in order (their own clients), views of it where they are all of one size. -> the estimate (kept
        as ``estimate``)."""
        x = dataset.x_train
        row = int(np.prod(x.shape[1:], dtype=np.int64)) * x.dtype.itemsize + 4
        rows = [max(int(np.max(n, initial=0)), 1) for n in sizes.values()]
        in_place = in_place and all(np.size(n) and int(np.min(n)) == r for n, r in zip(sizes.values(), rows))
        self.checked = self.shape(self.plan, rows, len(sizes["train"]), row, dataset.nbytes, pool_copies, in_place)
        self.estimate = self._check(self.checked)
        return self.estimate

    def for_runs(self, at_once: int, folders: int) -> Estimate:
        """The estimate of a sweep of ``folders`` runs of this shape, ``at_once`` in one program (their state held
        together)."""
        return estimate(dataclasses.replace(self.checked, runs=at_once, folders=folders), self.process)

    def _check(self, shape: Shape) -> Estimate:
        est = estimate(shape, self.process)
        host, device = client_limits.available_bytes(), device_available() if self.accelerator else None
        if fits(est, host, device):
            return est
        over = (f"{shown(est.host_bytes)} of host memory, more than the {shown(host)} available"
                if host is not None and est.host_bytes > host else
                f"{shown(est.device_bytes)} of device memory, more than the {shown(device)} available")
        changes = self.fitting_changes(shape, host, device)
        fix = ("it fits with " + "; or ".join(f"{flags(change)} (about {shown(e.host_bytes)})" for change, e in changes)
               if changes else "fewer clients, client state on the host or fewer host devices do not make it fit")
        raise UserError(f"this run would take {'' if shape.exact else 'at least '}{over} ({est.phase}: "
                        f"{est.parts()}); {fix}")

    # ------------------------------------------------------------------ what fits instead
    def fitting_changes(self, shape: Shape, host: int | None, device: int | None) -> list[tuple[dict, Estimate]]:
        """Up to three changes of the plan, each with its estimate, that fit in `SUGGESTED_SHARE` of what is
        available (module docstring)."""
        plan, found = self.plan, []
        room = [None if b is None else int(SUGGESTED_SHARE * b) for b in (host, device)]

        def offer(change, shape_of: Callable[[RunPlan], Shape]) -> None:
            """``change`` (a dict, or a function of a plan giving one or None), alone or with one host device."""
            for devices in dict.fromkeys((plan.cpu_devices, 1)):
                base = dataclasses.replace(plan, cpu_devices=devices)
                asked = change(base) if callable(change) else change
                if asked is None:
                    continue
                asked = ({} if devices == plan.cpu_devices else {"cpu_devices": 1}) | asked
                candidate = shape_of(dataclasses.replace(plan, **asked))
                est = estimate(candidate, self.process)
                if candidate.exact and fits(est, *room):
                    found.append((asked, est))
                    return

        def same_clients(changed: RunPlan) -> Shape:
            return self.shape(changed, shape.part_rows, shape.clients, shape.row_bytes, shape.pool_bytes,
                              shape.pool_copies, shape.in_place, shape.exact)

        offer({}, same_clients)
        if self.host_support is None and not shape.on_host and not found:
            offer({"client_state": "host"}, same_clients)
        if plan.dataset == "synthetic":
            natural = {} if plan.partition == "natural" else {"partition": "natural"}
            if natural:
                offer(natural, self.synthetic_shape)
            if not plan.samples_per_client:
                offer(natural | {"samples_per_client": FIXED_SIZE}, self.synthetic_shape)

            def fewer(base: RunPlan) -> dict | None:
                most = self.most_clients(dataclasses.replace(base, **natural), *room)
                return None if most is None else natural | {"num_clients": most}

            offer(fewer, self.synthetic_shape)
        return found[:3]

    def most_clients(self, plan: RunPlan, host, device) -> int | None:
        """The most clients (fewer than ``plan``'s, at least 2) of generated data that fit, or None."""
        lo, hi, best = 2, plan.num_clients - 1, None
        while lo <= hi:
            mid = (lo + hi) // 2
            changed = dataclasses.replace(plan, num_clients=mid, cpu_devices=min(plan.cpu_devices, mid))
            if fits(estimate(self.synthetic_shape(changed), self.process), host, device):
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
        return best
