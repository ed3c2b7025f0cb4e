"""Progress from inside a compiled round: local steps and finished clients, reported as they happen.

With ``EngineConfig.progress`` on, the single-round calls of `Engine.run_rounds`
carry host callbacks (`jax.debug.callback`): every `STEP_STRIDE`-th local
step and batch of a statistics pass of a client (kernels/local_training.py
calls its ``loops.report``, the engine's `Progress.report_step`, while
tracing) and each finished client send an `Event` to the function its engine's
`Progress` holds while `listening` (each engine its own: no global). Clients trained
side by side under ``vmap`` report once, as one event counting them
(`jax.custom_batching.custom_vmap`: the batch is reduced to its furthest
client), so a vmapped round sends no more callbacks than one client does. On several
devices (`jax.shard_map` over the client axis) each device reports its own
clients; a row repeated to fill a device's last slot reports too.
Fused calls of several rounds carry none (they are short by construction:
runs/call_planner.py). The callbacks only read scalars the round computes
anyway; they change no value (tests/test_round_progress.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax import custom_batching

# A client reports every STEP_STRIDE-th local step: each report is a host callback, whose cost is then a
# small share of that many steps (benchmarks/RESULTS.md, "In-round progress on and off").
STEP_STRIDE = 64


@dataclasses.dataclass(frozen=True)
class Event:
    """``kind`` 'step': ``width`` clients side by side reached local step ``done`` of ``total``;
    'pass': batch ``done`` of ``total`` of a statistics pass (Fisher traces, class means, ...);
    'client': ``width`` clients finished their local update."""

    kind: str
    done: int
    total: int
    width: int


KINDS = ("step", "pass", "client")


def _furthest(values, in_batched):
    """Each value reduced over the batch axis (max) where it has one."""
    return [jnp.max(v) if batched else v for v, batched in zip(values, in_batched)]


def _depends_on(tree):
    """A float32 scalar that waits for one element of every numeric leaf of ``tree``."""
    numbers = [leaf for leaf in jax.tree.leaves(tree) if jnp.issubdtype(leaf.dtype, jnp.number) and leaf.size]
    return sum((jnp.ravel(leaf)[0].astype(jnp.float32) for leaf in numbers), jnp.float32(0))


class Progress:
    """One engine's in-round progress: the reporters its compiled rounds call (`report_step`, `report_client`)
    and the listener their host callbacks deliver to, set with `listening` (read when a callback runs)."""

    def __init__(self):
        self.listener: Callable[[Event], None] | None = None

        @custom_batching.custom_vmap
        def local_step(kind, done, total, width, after):
            numbers = jnp.stack([kind, done, total, width])
            jax.lax.cond(done % STEP_STRIDE == 0,
                         lambda: jax.debug.callback(self._deliver, numbers, after, ordered=False), lambda: None)
            return after

        @local_step.def_vmap
        def _local_step_batched(axis_size, in_batched, kind, done, total, width, after):
            kind_, done_, total_, width_, after_ = _furthest((kind, done, total, width, after), in_batched)
            local_step(kind_, done_, total_, width_ * axis_size, after_)  # (itself batched again under an outer vmap)
            return after, in_batched[4]

        @custom_batching.custom_vmap
        def client_finished(width, after):
            jax.debug.callback(self._deliver, jnp.stack([jnp.int32(KINDS.index("client")), jnp.int32(0),
                                                         jnp.int32(0), width]), after, ordered=False)
            return after

        @client_finished.def_vmap
        def _client_finished_batched(axis_size, in_batched, width, after):
            width_, after_ = _furthest((width, after), in_batched)
            client_finished(width_ * axis_size, after_)
            return after, in_batched[1]

        # Clients side by side under vmap report once, as one event counting them: the batch is reduced to its
        # furthest client (``after``: a value of the work reported, so that the report follows it)
        self._local_step, self._client_finished = local_step, client_finished

    @contextlib.contextmanager
    def listening(self, listener: Callable[[Event], None]) -> Iterator[None]:
        """Deliver the events of the rounds run inside this block to ``listener`` (called on a runtime thread)."""
        previous, self.listener = self.listener, listener
        try:
            yield
        finally:
            self.listener = previous

    def _deliver(self, numbers, after) -> None:
        """(host) ``after`` is only there to order the callback after the computation it reports."""
        listener = self.listener
        if listener is not None:
            kind, done, total, width = np.asarray(numbers).tolist()  # one transfer for the four numbers
            listener(Event(KINDS[kind], done, total, width))

    def report_client(self, update):
        """Report one client whose update (any pytree of arrays) is ``update``; returns it unchanged."""
        self._client_finished(jnp.int32(1), _depends_on(update))
        return update

    def report_step(self, kind: str, done, total, value) -> None:
        """Report step or batch ``done`` of ``total`` (traced) of ``kind`` 'step' or 'pass'; ``value``: what
        that step computed (any pytree), so the report follows it (a `Loops.report`)."""
        self._local_step(jnp.int32(KINDS.index(kind)), jnp.asarray(done, jnp.int32), jnp.asarray(total, jnp.int32),
                         jnp.int32(1), _depends_on(value))
