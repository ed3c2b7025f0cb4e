"""Dealing rows of unequal cost to devices or lanes, longest first to the least-loaded one.

The engine deals a round's clients (costs: their step counts) to the devices
of a mesh (engine/sharding.py) and, under the ``packed`` client mapping, to
the lanes of each device (engine/packed_loops.py): one rule for both, traced,
since the costs are known only inside the program.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def balanced_slots(costs, size: int, per: int | None = None):
    """(slots [size * per], slot_of [S]): the S rows dealt to ``size`` devices (or lanes), ``per`` slots each
    (default ``ceil(S / size)``: equal counts; ``per = S``: no limit on a device's count).

    Greedy longest-first: rows in decreasing ``costs``
    each go to the device with the least cost so far among those with a free
    slot. Device d's slots ``d * per ...`` hold its rows in decreasing cost, then
    (when S is less than ``size * per``) repeats of the cheapest row, whose
    results are dropped. ``slot_of[r]`` is row r's slot. Traced: ``costs`` are
    the round's step counts, known only inside the program. Dealing sorted rows
    round-robin or in a snake instead leaves the device with the largest client
    up to that client's cost behind (benchmarks/RESULTS.md, "Clients dealt
    longest first").

    Examples:
        >>> slots, slot_of = balanced_slots(jnp.array([9, 1, 5, 4, 3]), 2)  # 3 slots each, one a repeat
        >>> slots.tolist()  # device 0: rows 0, 4 (costs 9, 3) and a repeat of row 1; device 1: rows 2, 3, 1 (5, 4, 1)
        [0, 4, 1, 2, 3, 1]
        >>> slot_of.tolist()
        [0, 5, 3, 4, 1]
        >>> balanced_slots(jnp.array([9, 1, 5, 4, 3]), 2, per=5)[0].tolist()  # no count limit: lanes of 9+3 and 5+4+1
        [0, 4, 1, 1, 1, 2, 3, 1, 1, 1]
    """
    costs = jnp.asarray(costs, jnp.float32)
    rows = costs.shape[0]
    per = -(-rows // size) if per is None else per
    order = jnp.argsort(-costs, stable=True).astype(jnp.int32)

    def place(j, state):  # rows in decreasing cost: each device's slots fill in that order
        loads, counts, slots, slot_of = state
        r = order[j]
        d = jnp.argmin(jnp.where(counts < per, loads, jnp.inf)).astype(jnp.int32)
        slot = d * per + counts[d]
        return loads.at[d].add(costs[r]), counts.at[d].add(1), slots.at[slot].set(r), slot_of.at[r].set(slot)

    state = (jnp.zeros(size, jnp.float32), jnp.zeros(size, jnp.int32),
             jnp.full(size * per, order[-1], jnp.int32), jnp.zeros(rows, jnp.int32))
    return tuple(jax.lax.fori_loop(0, rows, place, state)[2:])
