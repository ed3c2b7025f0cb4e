"""A paper's published numbers as a table file gives them (``paper_results``), and how ours compare.

Per row, either a mapping ``{setting name: value}`` or a list with one value
per setting in the table's column order (``null`` where the paper gives no
number; only the cells given are transcribed). A value is a percentage, or
``"mean +- std"`` (``±`` also reads) where the paper prints a spread::

    paper_results:
      fedas: [89.92, 90.60, null, 91.03]
      diversifed: {cifar10: "88.04 +- 0.72"}

Nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
import math
import re

from fedjax_pfl.core.errors import UserError

FLAG_POINTS = 1.5  # a cell whose mean is further than this (percentage points) from the paper's is flagged
_SPREAD = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(?:\+-|±)\s*([0-9]+(?:\.[0-9]+)?)\s*$")


@dataclasses.dataclass(frozen=True)
class PaperNumber:
    """A published accuracy in percent, with its printed std when the paper gives one."""
    mean: float
    std: float | None = None

    def __str__(self) -> str:
        return f"{self.mean:.2f}" + ("" if self.std is None else f" ± {self.std:.2f}")


def parse_number(value, where: str) -> PaperNumber | None:
    """``88.04``, ``"88.04 +- 0.72"`` or null -> PaperNumber / None; UserError for anything else."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 100:
        return PaperNumber(float(value))
    match = _SPREAD.match(value) if isinstance(value, str) else None
    if match and 0 <= float(match[1]) <= 100:
        return PaperNumber(float(match[1]), float(match[2]))
    raise UserError(f"{where} must be a percentage from 0 to 100, \"mean +- std\" or null; got {value!r}")


def parse_row(value, settings: list[str], where: str) -> dict[str, PaperNumber]:
    """One row of ``paper_results`` -> {setting name: PaperNumber} for the cells given."""
    if isinstance(value, list):
        if len(value) != len(settings):
            raise UserError(f"{where} lists {len(value)} values for {len(settings)} settings "
                            f"({', '.join(settings)}); write null where the paper gives no number")
        value = dict(zip(settings, value))
    if not isinstance(value, dict) or set(value) - set(settings):
        unknown = ", ".join(sorted(set(value) - set(settings))) if isinstance(value, dict) else repr(value)
        raise UserError(f"{where} must map setting names ({', '.join(settings)}) to percentages, or list one "
                        f"per setting; got {unknown}")
    numbers = {s: parse_number(v, f"{where}.{s}") for s, v in value.items()}
    return {s: n for s, n in numbers.items() if n is not None}


def difference(ours_mean: float, paper: PaperNumber | None) -> float | None:
    """Ours minus the paper's, in percentage points (``ours_mean`` is a fraction); None without both."""
    if paper is None or not math.isfinite(ours_mean):
        return None
    return 100 * ours_mean - paper.mean


def flagged(diff: float | None) -> bool:
    """Whether a cell is more than FLAG_POINTS from the paper's number (as printed, to 2 decimals)."""
    return diff is not None and abs(round(diff, 2)) > FLAG_POINTS
