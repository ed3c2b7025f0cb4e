"""Counted loops of many clients packed into W lanes, each lane training its queue of clients back to back.

A client's local training and its statistics passes are loops with the
client's own trip count (kernels/local_training.py). Under ``vmap`` a loop
runs to the largest count of the vmapped clients. Under the ``packed``
client mapping (engine/client_mapping.py) the engine maps the per-client
function with `in_lanes`: each row's function is handed a `Loops` record whose
runner is this module's, tied to the row's position in the engine's vmap, and
every loop written with `counted_loop` is then run as one loop over W lanes
instead: the S clients are dealt, longest first, to the least-loaded lane
(`lane_queues`, the rule `engine/dealing.balanced_slots` uses across
devices), and each lane trains its queue back to back. A lane that finishes a
client writes that client's carry out and, in the same compiled step, starts
its next client from that client's own initial carry and its own loop inputs
(data rows, key schedule, closed-over per-client values). Every step is the
same branch-free code (a masked write-out and a select, no ``lax.cond``: a
conditional's pass-through branch copied every lane's state at every step),
and the loop runs exactly max over lanes of the lane's summed counts, close
to max(largest count, total / W), as fixed-length inner loops (`run_steps`:
on XLA:GPU no host read of a predicate per step): the lane-steps past a
lane's own load (W x that - total) are the only padding.

The mechanism is general: whatever a loop's body closes over is traced once
(`jax.make_jaxpr`) and the per-client values among it are handed to the
lanes explicitly (`jax.custom_batching.custom_vmap` sees them stacked), so a
method written for one client packs without knowing it, phase by phase: a
client update made of several loops (FedAS's class means, alignment,
training and Fisher pass; FedRep's head then body; Ditto's two models) packs
each loop in turn, and the straight-line code between loops stays vmapped
over the S clients. A loop inside a packed loop's body, or one vmapped over
another axis than the engine's clients (a method's own vmap over models), runs
as a plain ``vmap`` of ``lax.fori_loop``: the runner packs a loop only where
the row position it was handed is batched, i.e. under the engine's own vmap.
Results equal the unpacked loop's: each client runs exactly its own steps on
its own inputs. Every other mapping hands the rows `PLAIN` loops, plain
``fori_loop``s.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.extend as jex
import jax.numpy as jnp

from fedjax_pfl.engine.dealing import balanced_slots
from fedjax_pfl.kernels.counted_loop import Loops, counted_loop

CHUNK_STEPS = 16  # steps of one fixed-length inner loop of a packed loop (`run_steps`)


def in_lanes(fn: Callable, lanes: int) -> Callable:
    """``fn(loops, *row)`` vmapped over the rows of its arguments (a leading axis of S), each row's counted loops
    run in ``lanes`` lanes shared by all S rows.

    Examples:
        >>> def client(loops, n):  # sum of 1..n: a loop of the client's own count
        ...     return counted_loop(lambda i, acc: acc + i + 1, n, jnp.int32(0), loops)
        >>> in_lanes(client, lanes=2)(jnp.array([3, 0, 1, 4])).tolist()
        [6, 0, 1, 10]
    """
    def row(position, *args):
        return fn(Loops(run=functools.partial(_packed_loop, int(lanes), position)), *args)

    return lambda *rows: jax.vmap(row)(jnp.arange(jax.tree.leaves(rows)[0].shape[0]), *rows)


def lane_queues(counts, lanes: int):
    """(queue [W, S], lengths [W], loads [W]): the S clients of trip counts ``counts`` dealt to W lanes.

    Longest first to the least-loaded lane (`balanced_slots` with no limit on
    a lane's count). Lane l trains ``queue[l, :lengths[l]]`` in that order,
    its clients in decreasing count; clients with count 0 are in no queue (they
    take no step); ``loads[l]`` is the lane's summed count, so a packed loop
    runs ``max(loads)`` steps of W lanes.

    Examples:
        >>> queue, lengths, loads = lane_queues(jnp.array([9, 1, 5, 0, 4, 3]), 2)
        >>> [queue[l, :lengths[l]].tolist() for l in range(2)], loads.tolist()
        ([[0, 5], [2, 4, 1]], [12, 10])
    """
    counts = jnp.asarray(counts, jnp.int32)
    rows = counts.shape[0]
    slots, slot_of = balanced_slots(counts, lanes, per=rows)
    queue = slots.reshape(lanes, rows)
    dealt = jnp.zeros(lanes * rows, bool).at[slot_of].set(True).reshape(lanes, rows)  # not a filler repeat
    queued = dealt & (counts[queue] > 0)  # a prefix of each lane: its clients come in decreasing count
    return queue, queued.sum(axis=1), jnp.where(queued, counts[queue], 0).sum(axis=1)


def _packed_loop(lanes: int, position, body: Callable, count, init):
    """A counted loop of the row at ``position`` (traced under the engine's vmap of `in_lanes`): lanes when that
    vmap batches it, a plain loop under any other (a method's own vmap over models, the lanes' vmap)."""
    count = jnp.asarray(count, jnp.int32)
    closed = jax.make_jaxpr(body)(jnp.int32(0), init)
    consts = list(closed.consts)
    # a loop inside this one's body was handed the same position: each lane passes it whole, not per lane, so
    # that inner loop runs plainly
    whole = [c is position for c in consts]
    treedef = jax.tree.structure(init)

    def step(i, carry, consts):
        out = jex.core.jaxpr_as_fun(closed.replace(consts=list(consts)))(i, *jax.tree.leaves(carry))
        return jax.tree.unflatten(treedef, out)

    def plain(count, init, consts, position):
        return jax.lax.fori_loop(0, count, lambda i, carry: step(i, carry, consts), init)

    loop = jax.custom_batching.custom_vmap(plain)

    @loop.def_vmap
    def rule(axis_size, in_batched, count, init, consts, position):
        if not in_batched[3]:  # not the engine's vmap of rows: no packing
            axes = jax.tree.map(lambda b: 0 if b else None, in_batched)
            return jax.vmap(plain, in_axes=axes)(count, init, consts, position), jax.tree.map(lambda _: True, init)
        batched = (in_batched[0], in_batched[1], [b and not w for b, w in zip(in_batched[2], whole)])
        return _run_lanes(step, min(lanes, axis_size), axis_size, batched, count, init, consts)

    return loop(count, init, consts, position)


def _rows(a, rows):
    """``a[rows]`` for in-bounds ``rows`` (no negative-index arithmetic: a smaller program)."""
    return a.at[rows.astype(jnp.uint32)].get(mode="promise_in_bounds")


def _set_rows(tree, rows, values):
    """``tree`` with row ``rows[l]`` of each leaf set to ``values``' row l, the out-of-bounds rows' writes dropped
    (a scatter: in place, only the rows written are touched)."""
    rows = rows.astype(jnp.uint32)
    return jax.tree.map(lambda a, v: a.at[rows].set(v, mode="drop"), tree, values)


def run_steps(one_step: Callable, total, state, chunk: int = CHUNK_STEPS):
    """``one_step`` applied ``total`` (traced) times to ``state``: ``total // chunk`` loops of ``chunk`` steps,
    then the ``total % chunk`` left. Each inner loop has a fixed trip count, so XLA:GPU runs it without reading
    a predicate on the host at every step; the host reads one per ``chunk`` steps and per step of the rest.

    Examples:
        >>> int(run_steps(lambda s: s + 1, jnp.int32(37), jnp.int32(0), chunk=8))
        37
    """
    total = jnp.asarray(total, jnp.int32)

    def steps(state, count):
        return jax.lax.fori_loop(0, count, lambda _, s: one_step(s), state)

    state = jax.lax.fori_loop(0, total // chunk, lambda _, s: steps(s, chunk), state)
    return steps(state, total % chunk)


def _run_lanes(step, lanes: int, clients: int, in_batched, count, init, consts):
    """The packed loop of `counted_loop` over ``clients`` stacked rows -> (outputs [S, ...], all batched).

    Every step is the same straight-line code (no branch): the lanes whose client took its last step in the
    step before take their next client's initial carry (a select); every lane takes a step of its client,
    reading that client's loop inputs by its row; the lanes whose client has just taken its last step write the
    carry to the client's row of the outputs (a scatter whose other lanes' writes are dropped). In that order
    the carry is read for the outputs only after it is written, so XLA updates it in place (no copy of any
    lane's state). The loop runs exactly the longest lane's load (`lane_queues`), in fixed-length inner loops
    (`run_steps`)."""
    count_batched, init_batched, consts_batched = in_batched
    counts = count if count_batched else jnp.broadcast_to(count, (clients,))
    queue, lengths, loads = lane_queues(counts, lanes)
    last = queue.shape[1] - 1
    lane = jnp.arange(lanes, dtype=jnp.uint32)
    own = [j for j, b in enumerate(consts_batched) if b]  # per-client inputs: read by each lane's client row

    def client_at(position):
        return queue.at[lane, jnp.minimum(position, last).astype(jnp.uint32)].get(mode="promise_in_bounds")

    def initial(rows):
        return jax.tree.map(lambda a, b: _rows(a, rows) if b else jnp.broadcast_to(a, (lanes,) + jnp.shape(a)),
                            init, init_batched)

    def lane_step(i, carry, client):
        merged = list(consts)
        for j in own:
            merged[j] = _rows(consts[j], client)
        return step(i, carry, merged)

    def one_step(state):
        position, within, carry, out = state
        done = (position < lengths) & (within == _rows(counts, client_at(position)))  # in the step before
        position = position + done
        client = client_at(position)
        carry = _set_rows(carry, jnp.where(done, lane, lanes), initial(client))  # row W: dropped
        within = jnp.where(done, 0, within)
        active = position < lengths
        carry = jax.vmap(lane_step)(within, carry, client)  # an idle lane's carry is never written out
        within = within + active
        finished = active & (within == _rows(counts, client))
        out = _set_rows(out, jnp.where(finished, client, clients), carry)  # row S: dropped
        return position, within, carry, out

    out = jax.tree.map(lambda a, b: a if b else jnp.broadcast_to(a, (clients,) + jnp.shape(a)), init, init_batched)
    zeros = jnp.zeros(lanes, jnp.int32)
    out = run_steps(one_step, loads.max(), (zeros, zeros, initial(queue[:, 0]), out))[-1]
    return out, jax.tree.map(lambda _: True, init)
