"""How a per-client function is mapped over the selected clients.

The per-client function is written once; the mapping is an engine setting:
- ``vmap``: all clients at once (default on GPU/TPU);
- ``map``: ``lax.map``, one client at a time inside the same jit (default on
  CPU, where per-client convolution weights vmap into slow kernels);
- ``chunked``: ``lax.map`` over chunks of ``chunk_size`` vmapped clients
  (bounds memory for hundreds of clients). The engine hands the clients over
  sorted by their step count, so each chunk runs to its own largest client.
All three compute the same numbers (tests/test_engine.py). Under ``chunked``
the engine also streams the round where the method allows it (`scan_chunks`):
each chunk's state is gathered, trained and scattered back in turn, so that
only the uploads are held for every selected client.

Local training loops run each client's own trip count; under ``vmap`` a chunk
runs to its largest member. `executed_steps` counts what a mapping computes,
so that padding efficiency (real / executed client-steps) can be reported.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

MAPPINGS = ("vmap", "map", "chunked")


def default_mapping(backend: str | None = None) -> str:
    """The measured default for a backend (benchmarks/RESULTS.md)."""
    backend = backend or jax.default_backend()
    return "map" if backend == "cpu" else "vmap"


def resolve(mapping: str) -> str:
    if mapping == "auto":
        return default_mapping()
    if mapping not in MAPPINGS:
        raise ValueError(f"client mapping must be 'auto' or one of {MAPPINGS}, got {mapping!r}")
    return mapping


def map_clients(fn, mapping: str, chunk_size: int = 8):
    """Return ``g(*stacked_args)`` applying ``fn`` to each client's slice."""
    mapping = resolve(mapping)
    if mapping == "vmap":
        return jax.vmap(fn)
    batch = None if mapping == "map" else chunk_size
    return lambda *args: jax.lax.map(lambda a: fn(*a), args, batch_size=batch)


def sorts_clients(mapping: str) -> bool:
    """Whether clients should reach this mapping sorted by cost (only chunks gain from it)."""
    return resolve(mapping) == "chunked"


def executed_steps(steps, mapping: str, chunk_size: int = 8):
    """Client-steps a mapping computes for per-client trip counts ``steps`` [S]
    (already in the order the mapping sees them): ``map`` runs each client's own
    count, ``vmap`` every client to the largest, ``chunked`` each chunk (and the
    remainder, as ``lax.map``'s ``batch_size`` does) to its own largest."""
    mapping = resolve(mapping)
    steps = jnp.asarray(steps, jnp.int32)
    count = steps.shape[0]
    if mapping == "map":
        return steps.sum()
    if mapping == "vmap" or count <= chunk_size:
        return count * steps.max()
    full = (count // chunk_size) * chunk_size
    chunks = steps[:full].reshape(-1, chunk_size).max(axis=1).sum() * chunk_size
    rest = steps[full:]
    return chunks + (rest.shape[0] * rest.max() if rest.shape[0] else 0)


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
