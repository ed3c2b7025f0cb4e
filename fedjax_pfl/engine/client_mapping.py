"""How a per-client function is mapped over the selected clients.

The per-client function is written once; the mapping is an engine setting:
- ``vmap``: all clients at once (default on GPU/TPU);
- ``map``: ``lax.map``, one client at a time inside the same jit (default on
  CPU, where per-client convolution weights vmap into slow kernels);
- ``chunked``: ``lax.map`` over chunks of ``chunk_size`` vmapped clients
  (bounds memory for hundreds of clients). The engine hands the clients over
  sorted by their step count, so each chunk runs to its own largest client;
- ``packed:W``: W lanes under one ``vmap``, each training a queue of clients
  back to back (engine/packed_loops.py): every loop of the client update
  runs about max(largest client, total / W) steps of W lanes, so padding
  efficiency stays near 1 for any W up to total / largest. ``packed`` alone
  takes W from the data (`packed_width`, set by the engine).
All compute the same numbers (tests/test_engine.py, tests/test_packed_lanes.py). A mapping travels as a
`ClientMapping`, made once from its setting (`of`; ``packed`` gets its W from the data, `ClientMapping.settled`). Under ``chunked``
the engine also streams the round where the method allows it (`scan_chunks`):
each chunk's state is gathered, trained and scattered back in turn, so that
only the uploads are held for every selected client.

Local training loops run each client's own trip count; under ``vmap`` a chunk
runs to its largest member, under ``packed`` each lane to its summed load. `executed_steps` counts what a mapping computes,
so that padding efficiency (real / executed client-steps) can be reported.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.engine import dealing, packed_loops
from fedjax_pfl.kernels.counted_loop import PLAIN

AUTO = "auto"  # this backend's measured default (`default_mapping`); train.client_mapping=auto times the candidates
MAPPINGS = ("vmap", "map", "chunked", "packed")
PACKED = "packed"
# The values `parse` accepts, in words: the one list that the setting's help, its error and the docs show.
ALLOWED = f"{AUTO}, {', '.join(MAPPINGS[:-1])}, {PACKED} or {PACKED}:W (W lanes, a whole number >= 1)"
# The most lanes `packed_width` gives: on a CPU a few cores share the lanes' work; on an accelerator a step of
# 128 lanes of B >= 16 samples is a batch of 2,048 or more, past which wider lanes only add padding.
MAX_LANES = {"cpu": 8}
MAX_LANES_ACCELERATOR = 128


def default_mapping(backend: str | None = None, federations: int = 1) -> str:
    """The measured default for a backend (benchmarks/RESULTS.md): ``map`` on a CPU; elsewhere ``vmap`` for one
    federation, ``packed`` for several (their rows share the lanes: engine/rows.py)."""
    if (backend or jax.default_backend()) == "cpu":
        return "map"
    return "vmap" if federations == 1 else PACKED


def parse(mapping: str) -> tuple[str, int | None]:
    """(name, lanes): ('packed', W) for 'packed:W', (mapping, None) for the others; a one-line UserError for
    anything else (the setting's check; `of` makes the typed value).

    Examples:
        >>> parse("packed:24"), parse("packed"), parse("map")
        (('packed', 24), ('packed', None), ('map', None))
    """
    name, colon, width = str(mapping).partition(":")
    if name not in (AUTO, *MAPPINGS) or (colon and name != PACKED):
        raise UserError(f"unknown client mapping {mapping!r}; choose {ALLOWED}")
    if not colon:
        return name, None
    if not width.strip().isdigit() or int(width) < 1:
        raise UserError(f"client mapping {mapping!r}: W in packed:W must be a whole number >= 1 (lanes), "
                        f"got {width!r}; or give packed alone for W from the data")
    return name, int(width)


@dataclasses.dataclass(frozen=True)
class ClientMapping:
    """A client mapping, made once from its setting (`of`) and passed as it is: ``kind`` one of `MAPPINGS`;
    ``lanes`` W of ``packed:W`` (None: not yet settled from the data, `settled`); ``chunk_size`` the clients a
    chunk under ``chunked`` (None for the others). ``str()`` writes it as the setting does ('packed:4')."""

    kind: str
    lanes: int | None = None
    chunk_size: int | None = None

    def __post_init__(self):
        if self.kind not in MAPPINGS:
            raise ValueError(f"unknown client mapping kind {self.kind!r}; one of {', '.join(MAPPINGS)}")
        if self.kind == "chunked" and not self.chunk_size:
            raise ValueError("the chunked mapping needs chunk_size (train.chunk_size)")

    def __str__(self) -> str:
        return f"{PACKED}:{self.lanes}" if self.packed and self.lanes else self.kind

    @property
    def packed(self) -> bool:
        return self.kind == PACKED

    @property
    def sorts_clients(self) -> bool:
        """Whether clients should reach this mapping sorted by cost (only chunks gain from it; packed lanes deal
        them themselves)."""
        return self.kind == "chunked"

    def settled(self, counts, rows: int, devices: int = 1) -> "ClientMapping":
        """The mapping to run: a bare 'packed' gets its width from the trip ``counts`` of the rows, ``rows`` of
        them a round on ``devices`` (`packed_width`); any other as it is."""
        if self.packed and self.lanes is None:
            return dataclasses.replace(self, lanes=packed_width(counts, rows, devices))
        return self

    def for_pass(self, counts, rows: int, devices: int = 1) -> "ClientMapping":
        """The mapping of a pass over ``rows`` rows of trip ``counts`` (evaluation, a step on every client): this
        training mapping, its lanes from these counts when it is packed."""
        return dataclasses.replace(self, lanes=None).settled(counts, rows, devices) if self.packed else self


MAP = ClientMapping("map")
VMAP = ClientMapping("vmap")


def of(setting: str, chunk_size: int | None = None, federations: int = 1) -> ClientMapping:
    """The typed mapping of a train.client_mapping ``setting`` ('auto': this backend's default for
    ``federations``, `default_mapping`), with ``chunk_size`` for ``chunked``; a one-line UserError for a bad
    setting (`parse`).

    Examples:
        >>> str(of("packed:24")), of("chunked", 4)
        ('packed:24', ClientMapping(kind='chunked', lanes=None, chunk_size=4))
    """
    name, lanes = parse(default_mapping(federations=federations) if setting == AUTO else setting)
    return ClientMapping(name, lanes, chunk_size if name == "chunked" else None)


def packed_width(counts, clients: int, devices: int = 1, backend: str | None = None) -> int:
    """W* for ``clients`` of trip counts drawn from ``counts`` (every client's, host numbers) per round on
    ``devices``: about (each device's expected total) / (the largest count), at least 1, at most each device's
    clients and `MAX_LANES` of the backend. Past it the largest client caps every lane's load.

    Examples:
        >>> packed_width([580, 300, 100, 100, 50, 10, 0, 60], clients=8)  # total 1200 / largest 580
        2
        >>> packed_width([5] * 100, clients=100, backend="gpu")  # equal clients: as wide as the device allows
        100
    """
    counts = np.asarray(counts, np.int64)
    per_device = -(-clients // devices)
    largest = int(counts.max()) if counts.size else 0
    cap = MAX_LANES.get(backend or jax.default_backend(), MAX_LANES_ACCELERATOR)
    if largest == 0:
        return 1
    total = counts.sum() * clients / counts.size / devices
    return int(max(1, min(math.floor(total / largest), per_device, cap)))


def map_clients(fn, mapping: ClientMapping):
    """Return ``g(*stacked_args)`` applying ``fn(loops, *row)`` to each client's slice, ``loops`` saying how that
    client's counted loops run (kernels/counted_loop.py: in lanes under ``packed``, else plainly)."""
    if mapping.packed:
        if mapping.lanes is None:
            raise ValueError("'packed' needs its width here: the engine sets packed:W from the data (settled)")
        return packed_loops.in_lanes(fn, mapping.lanes)
    if mapping.kind == "vmap":
        return jax.vmap(functools.partial(fn, PLAIN))
    return lambda *args: jax.lax.map(lambda a: fn(PLAIN, *a), args, batch_size=mapping.chunk_size)


def executed_steps(steps, mapping: ClientMapping, devices: int = 1):
    """Client-steps a mapping computes for per-client trip counts ``steps`` [S]
    (already in the order the mapping sees them): ``map`` runs each client's own
    count, ``vmap`` every client to the largest, ``chunked`` each chunk (and the
    remainder, as ``lax.map``'s ``batch_size`` does) to its own largest,
    ``packed:W`` W lanes to the longest lane's load, on each of ``devices``
    (clients dealt to them as `sharding.split_over_devices` deals them, the
    spare slots repeating the cheapest client; the other mappings are counted
    as on one device).

    Examples:
        >>> steps = jnp.array([10, 9, 4, 4, 1])
        >>> [int(executed_steps(steps, of(m, 2))) for m in ("map", "vmap", "chunked", "packed:2")]
        [28, 50, 29, 28]
    """
    return step_counts(steps, mapping, devices)[1]


def sequential_steps(steps, mapping: ClientMapping, devices: int = 1):
    """Steps a mapping takes one after another for per-client trip counts ``steps`` [S] (as `executed_steps`):
    ``map`` the sum, ``vmap`` the largest, ``chunked`` the sum of the chunks' largest, ``packed:W`` the
    longest lane's load (the longest on any device). A round's time is about this many steps of its width.

    Examples:
        >>> steps = jnp.array([10, 9, 4, 4, 1])
        >>> [int(sequential_steps(steps, of(m, 2))) for m in ("map", "vmap", "chunked", "packed:2")]
        [28, 10, 15, 14]
    """
    return step_counts(steps, mapping, devices)[0]


def step_counts(steps, mapping: ClientMapping, devices: int = 1):
    """(`sequential_steps`, `executed_steps`) in one pass.

    Examples:
        >>> [int(c) for c in step_counts(jnp.array([10, 9, 4, 4, 1]), of("packed:2"))]
        [14, 28]
    """
    chunk_size = mapping.chunk_size
    steps = jnp.asarray(steps, jnp.int32)
    count = steps.shape[0]
    if mapping.kind == "map":
        return steps.sum(), steps.sum()
    if mapping.packed:
        lanes = mapping.lanes
        per_device = steps[None] if devices == 1 else steps[dealing.balanced_slots(steps, devices)[0]].reshape(
            devices, -1)
        width = min(lanes, per_device.shape[1])
        loads = jax.vmap(lambda c: packed_loops.lane_queues(c, width)[2].max())(per_device)
        return loads.max(), width * loads.sum()
    if mapping.kind == "vmap" or count <= chunk_size:
        return steps.max(), count * steps.max()
    full = (count // chunk_size) * chunk_size
    maxima = steps[:full].reshape(-1, chunk_size).max(axis=1)
    rest = steps[full:]
    if not rest.shape[0]:
        return maxima.sum(), maxima.sum() * chunk_size
    return maxima.sum() + rest.max(), maxima.sum() * chunk_size + rest.shape[0] * rest.max()


# A batch's fixed cost counted in rows (the loop's trip, slicing the batch): what makes one batch of 2B rows
# cheaper than two of B in `pass_batch_size`.
BATCH_COST_ROWS = 8


def pass_batch_size(sizes, mapping: ClientMapping, largest: int) -> int:
    """The batch size, at most ``largest``, of one pass over clients of ``sizes`` samples in the order the
    pass maps them (evaluation: every client's test set once, its last batch masked) that computes the fewest
    rows under ``mapping``, each batch counted with `BATCH_COST_ROWS` more; ties to the larger batch. Under
    ``map`` a client computes ceil(n/B) batches of B rows; under ``vmap`` and ``chunked`` each chunk computes
    its largest client's for every member; ``packed`` is counted as ``map`` (its lanes are filled).

    Examples:
        >>> pass_batch_size([100] * 20 + [130], MAP, 256)  # 20 clients in one batch of 100 each
        100
        >>> pass_batch_size([100] * 20 + [130], VMAP, 256)  # every client runs the largest one's
        130
        >>> pass_batch_size([5000, 10], MAP, 256)  # large test sets: 25 batches of 200, not 20 of 250
        200
    """
    sizes = np.asarray(sizes, np.int64)
    how = "map" if mapping.packed else mapping.kind
    # ceil(n / B) grows with n, so a chunk computes ceil(its largest / B) batches for each member: the pass is
    # a weighted sum over (largest, members) groups, whatever B is
    if how == "map":
        largest_of, members = np.unique(sizes, return_counts=True)
    else:
        width = sizes.size if how == "vmap" else mapping.chunk_size
        starts = np.arange(0, sizes.size, width)
        largest_of, members = np.maximum.reduceat(sizes, starts), np.diff(np.append(starts, sizes.size))
    top = int(max(1, min(largest, sizes.max(initial=1))))
    batches = np.arange(1, top + 1)
    executed = (-(-largest_of[None, :] // batches[:, None]) * members[None, :]).sum(axis=1)
    rows = executed * (batches + BATCH_COST_ROWS)
    return int(batches[::-1][np.argmin(rows[::-1])])  # the largest of the cheapest


def scan_chunks(step, carry, count: int, chunk_size: int):
    """``step(carry, positions)`` over positions 0..count-1, ``chunk_size`` at a time
    -> (carry, outputs stacked [count, ...]).

    The chunks are `lax.map`'s with ``batch_size=chunk_size`` (a loop over the
    full chunks, then the remainder), so a per-client function vmapped inside
    ``step`` computes what ``chunked`` computes. ``step`` returns (carry,
    outputs [len(positions), ...]); each chunk's outputs go straight into one
    [count, ...] buffer, so nothing else is held for all ``count`` positions.
    """
    full = count // chunk_size * chunk_size
    out_shape = jax.eval_shape(step, carry, jnp.arange(min(count, chunk_size)))[1]
    outputs = jax.tree.map(lambda s: jnp.zeros((count,) + s.shape[1:], s.dtype), out_shape)

    def run(carry, outputs, start, size):
        carry, out = step(carry, start + jnp.arange(size))
        return carry, jax.tree.map(lambda buf, o: jax.lax.dynamic_update_slice_in_dim(buf, o, start, 0), outputs, out)

    if full:
        carry, outputs = jax.lax.fori_loop(
            0, full // chunk_size, lambda i, c: run(*c, i * chunk_size, chunk_size), (carry, outputs))
    if count > full:
        carry, outputs = run(carry, outputs, full, count - full)
    return carry, outputs
