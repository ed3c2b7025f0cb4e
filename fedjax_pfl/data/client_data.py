"""Stacked, padded per-client arrays: the data side of the engine's core contract.

`ClientData(x [N, n_max, ...], y [N, n_max], n [N])`: client i's samples sit in
rows 0..n[i]-1 of x[i] and y[i]; rows past n[i] are zero padding (label 0) and
must be masked by whoever reads them, using `n`. This module only builds,
moves and slices these arrays; partitions live in `partition.py` and batching
and masking in the engine.
"""

from __future__ import annotations

import gc
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pfl.core.errors import UserError


class ClientData(NamedTuple):
    """Padded client samples (a pytree; every leaf has the client axis first).

    x: [N, n_max, ...] features, dtype of the pool (uint8 images stay uint8).
    y: int32 [N, n_max] labels, 0 in padding rows.
    n: int32 [N] number of real samples per client (may be 0).
    """
    x: jax.Array
    y: jax.Array
    n: jax.Array

    @property
    def num_clients(self) -> int:
        return self.n.shape[0]


GATHER_BYTES = 64 << 20  # the most sample bytes `padded_arrays` copies through a temporary at once


def stack_clients(x_pool: np.ndarray, y_pool: np.ndarray, indices_per_client: Sequence[np.ndarray],
                  pad_to: int | None = None) -> ClientData:
    """Gather each client's samples (in the given index order) and zero-pad to n_max.

    n_max = pad_to if given, else the largest client (at least 1, so a client
    with 0 samples, or all of them, still yields valid shapes). The result is
    placed on the default device; see `device_put` to shard it. The host arrays
    are `padded_arrays`' (no copy of the whole pool on the way).
    """
    host = padded_arrays(x_pool, y_pool, indices_per_client, pad_to)
    placed = ClientData(*map(jnp.asarray, host))
    if sum(a.nbytes for a in host) > GATHER_BYTES:  # jax holds host arrays it copied in a reference cycle
        jax.block_until_ready(placed)
        del host
        gc.collect()  # (large ones freed now, not at the next cycle)
    return placed


def padded_arrays(x_pool: np.ndarray, y_pool: np.ndarray, indices_per_client: Sequence[np.ndarray],
                  pad_to: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`stack_clients`' arrays on the host: (x [N, n_max, ...], y int32 [N, n_max], n int32 [N]).

    Clients whose samples already lie in order, one after another, all of size n_max (a generator's own
    clients of fixed size) are views of the pool, no copy; otherwise the padded arrays are filled a block of
    clients at a time (at most `GATHER_BYTES` of samples through a temporary), never through a gathered copy
    of the whole pool.
    """
    x_pool, y_pool = np.asarray(x_pool), np.asarray(y_pool)
    if x_pool.shape[0] != y_pool.shape[0]:
        raise UserError(f"x has {x_pool.shape[0]} samples but y has {y_pool.shape[0]}.")
    idx = [np.asarray(i, np.int64).reshape(-1) for i in indices_per_client]
    if not idx:
        raise UserError("stack_clients needs at least one client.")
    sizes = np.array([i.size for i in idx], np.int64)
    flat = np.concatenate(idx)
    if flat.size and (flat.min() < 0 or flat.max() >= x_pool.shape[0]):
        raise UserError(f"client indices must lie in [0, {x_pool.shape[0]}) for this pool.")
    n_max = max(int(sizes.max()), 1)
    if pad_to is not None:
        if pad_to < sizes.max():
            raise UserError(f"pad_to={pad_to} is below the largest client ({sizes.max()} samples).")
        n_max = int(pad_to)
    num = len(idx)
    counts = sizes.astype(np.int32)
    start = int(flat[0]) if flat.size else 0
    if flat.size == num * n_max and np.array_equal(flat, np.arange(start, start + flat.size)):
        shape = (num, n_max)
        return (x_pool[start:start + flat.size].reshape(shape + x_pool.shape[1:]),
                y_pool[start:start + flat.size].astype(np.int32, copy=False).reshape(shape), counts)
    x = np.zeros((num, n_max) + x_pool.shape[1:], x_pool.dtype)
    y = np.zeros((num, n_max), np.int32)
    ends = np.cumsum(sizes)
    row_bytes = max(x_pool[:1].nbytes, 1)
    per_block = max(1, int(GATHER_BYTES // (row_bytes * n_max)))
    for first in range(0, num, per_block):
        last = min(first + per_block, num)
        lo, hi = int(ends[first] - sizes[first]), int(ends[last - 1])
        block = sizes[first:last]
        rows = np.repeat(np.arange(first, last), block)
        cols = np.arange(hi - lo) - np.repeat(np.cumsum(block) - block, block)
        x[rows, cols] = x_pool[flat[lo:hi]]
        y[rows, cols] = y_pool[flat[lo:hi]]
    return x, y, counts


def device_put(data: ClientData, sharding: jax.sharding.Sharding | None = None) -> ClientData:
    """Move every leaf with `jax.device_put` (e.g. a NamedSharding over the client axis)."""
    return jax.device_put(data, sharding)


def select_clients(data: ClientData, idx) -> ClientData:
    """The clients `idx` (array of client ids, or a slice), as a smaller ClientData."""
    return ClientData(*(a[idx] for a in data))


def unpad(data: ClientData, i: int) -> tuple[np.ndarray, np.ndarray]:
    """Client i's real samples (x, y) as NumPy arrays, padding removed."""
    n = int(data.n[i])
    return np.asarray(data.x[i, :n]), np.asarray(data.y[i, :n])


def padding_efficiency(n, batch_size: int, epochs: int = 1) -> float:
    """Real steps over padded steps: sum_i ceil(n_i/B) / (N * max_i ceil(n_i/B)).

    1.0 means no wasted steps (and is returned when no client has data). The
    ratio does not depend on `epochs`, kept for call-site clarity.
    """
    steps = epochs * -(-np.asarray(n, np.int64) // batch_size)
    longest = steps.max(initial=0)
    return 1.0 if longest == 0 else float(steps.sum() / (steps.size * longest))
