"""TensorBoard event files in the run folder (``--tensorboard`` / ``log.tensorboard=true``).

Each evaluation's numbers (every numeric field of its metrics.jsonl line but
``round``) become scalars under the same names, at step = ``round`` (counted
from 1: the evaluation after that round), written through tensorboardX (the ``tensorboard`` extra).
A resumed run purges the steps it will write again, so TensorBoard shows each
round once. Scalars are stored as float32, as TensorBoard stores them.
"""

from __future__ import annotations

import math
from numbers import Real
from pathlib import Path

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.outputs.metrics_file import flat_record

MISSING = ("--tensorboard (log.tensorboard=true) needs tensorboardX: pip install 'fedjax_pfl[tensorboard]', "
           "or run without it")


def scalars(record: dict) -> dict[str, float]:
    """The fields of a metrics record that TensorBoard shows as scalars (diagnostics as
    ``diagnostics/NAME``: `flat_record`)."""
    return {k: float(v) for k, v in flat_record(record).items()
            if k != "round" and isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(v)}


class TensorBoardLog:
    """Appends one event per evaluation; the writer opens at the first evaluation it sees."""

    def __init__(self, run_dir: Path):
        try:
            from tensorboardX import SummaryWriter  # the optional [tensorboard] extra
        except ImportError:
            raise UserError(MISSING) from None
        self._open = lambda first_step: SummaryWriter(logdir=str(run_dir), purge_step=first_step)
        self._writer = None

    def write(self, record: dict) -> None:
        step = int(record["round"])
        if self._writer is None:
            self._writer = self._open(step)
        for tag, value in scalars(record).items():
            self._writer.add_scalar(tag, value, step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
