"""Learning rate by round index: the factor that multiplies ``train.lr`` in round ``t``.

A pure function of the (traced) round index, evaluated inside the compiled
round, so fused calls and resumed runs see the same learning rates:

- ``exponential``: ``decay ** t`` (decay 1.0, the default, is a constant lr;
  PFAKD's authors decay the local lr by 0.9 per round);
- ``cosine``: ``(1 + cos(pi * t / rounds)) / 2``, from 1 at round 0 towards 0
  at the last round.

The factor applies to the client optimizer's learning rate (``train.lr``) and
to the methods that take SGD steps by hand with it; learning rates a method
sets itself (e.g. FedPAC's head lr, APFL's alpha lr) are not scheduled.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class LrSchedule:
    """train.lr_schedule, train.lr_decay and train.rounds (runs/config.py declares and checks them)."""

    kind: str  # 'exponential' | 'cosine'
    decay: float  # exponential factor per round
    rounds: int  # the run's length (cosine)

    @property
    def constant(self) -> bool:
        return self.kind == "exponential" and self.decay == 1.0

    def factor(self, round_index):
        """float32 multiplier of the base learning rate in round ``round_index`` (0-based)."""
        t = jnp.asarray(round_index, jnp.float32)
        if self.kind == "cosine":
            return 0.5 * (1.0 + jnp.cos(math.pi * t / max(self.rounds, 1)))
        return jnp.asarray(self.decay, jnp.float32) ** t
