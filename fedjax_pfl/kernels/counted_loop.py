"""A loop with its own trip count per client, which the engine may run in packed lanes.

A client's local training and its statistics passes (kernels/local_training.py)
are loops of the client's own trip count, written with `counted_loop`. By
itself it is ``jax.lax.fori_loop`` and adds nothing to the program. The engine's
``packed`` client mapping (engine/packed_loops.py) installs a runner with
`runner` while it traces the round: every `counted_loop` vmapped over the
round's clients then runs as one loop over W lanes, each training its queue
of clients back to back. Kernels never import the engine; the engine hands
the loop its runner from above.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import jax

# trace time: the runner in force (innermost last); None: loops run as plain fori_loops
_runners: list[Callable | None] = []


@contextlib.contextmanager
def runner(run: Callable | None) -> Iterator[None]:
    """While tracing inside this block, `counted_loop(body, count, init)` is ``run(body, count, init)``
    (``None``: a plain ``fori_loop``, as outside any block).

    Examples:
        >>> def twice(body, count, init):  # a runner that runs every loop twice as long
        ...     return jax.lax.fori_loop(0, 2 * count, body, init)
        >>> with runner(twice):
        ...     int(counted_loop(lambda i, acc: acc + 1, 3, 0))
        6
    """
    _runners.append(run)
    try:
        yield
    finally:
        _runners.pop()


def counted_loop(body: Callable, count, init):
    """``body(i, carry)`` for ``i = 0 .. count - 1`` from ``init``: ``lax.fori_loop``, or the engine's runner.

    Examples:
        >>> int(counted_loop(lambda i, acc: acc * 2, 3, jax.numpy.int32(1)))
        8
    """
    run = _runners[-1] if _runners else None
    if run is None:
        return jax.lax.fori_loop(0, count, body, init)
    return run(body, count, init)
