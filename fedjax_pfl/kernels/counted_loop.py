"""A loop with its own trip count per client, which the engine may run in packed lanes.

A client's local training and its statistics passes (kernels/local_training.py)
are loops of the client's own trip count, written with `counted_loop`. How
such a loop runs is handed down with it, a `Loops` record, never held in a
global: by itself it is ``jax.lax.fori_loop`` and adds nothing to the program;
under the engine's ``packed`` client mapping (engine/packed_loops.py) the
engine passes a runner that trains every row's loop in W lanes, each lane
training its queue of clients back to back, and with in-round progress on
(engine/round_progress.py) a reporter that hears each step. Kernels never
import the engine; the engine hands the loop its runner from above.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax


@dataclasses.dataclass(frozen=True)
class Loops:
    """How a client's counted loops run: ``run(body, count, init)`` in place of ``lax.fori_loop`` (None: that
    loop), and ``report(kind, done, total, value)``, called while tracing each step (``kind`` 'step') or batch
    of a statistics pass ('pass') with what it computed (None: nothing reported)."""

    run: Callable | None = None
    report: Callable | None = None


PLAIN = Loops()  # plain fori_loops, nothing reported


def counted_loop(body: Callable, count, init, loops: Loops = PLAIN):
    """``body(i, carry)`` for ``i = 0 .. count - 1`` from ``init``: ``lax.fori_loop``, or ``loops.run``.

    Examples:
        >>> int(counted_loop(lambda i, acc: acc * 2, 3, jax.numpy.int32(1)))
        8
        >>> def twice(body, count, init):  # a runner that runs every loop twice as long
        ...     return jax.lax.fori_loop(0, 2 * count, body, init)
        >>> int(counted_loop(lambda i, acc: acc + 1, 3, 0, Loops(run=twice)))
        6
    """
    if loops.run is None:
        return jax.lax.fori_loop(0, count, body, init)
    return loops.run(body, count, init)
