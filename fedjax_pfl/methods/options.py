"""Checks of method options (the ``method.<name>=value`` dataclasses).

Each check raises a `UserError` whose one line names the option, the allowed
values and the value given.
"""

from __future__ import annotations

import math

from fedjax_pfl.core.errors import UserError


def require_number(name: str, value, low: float = 0.0, *, strict: bool = False, high: float | None = None):
    """``value`` finite and >= low (> low when ``strict``), and <= high when given."""
    ok = math.isfinite(value) and (value > low if strict else value >= low) and (high is None or value <= high)
    if not ok:
        bound = f"in [{low}, {high}]" if high is not None else f"{'>' if strict else '>='} {low}"
        raise UserError(f"method.{name} must be a finite number {bound}, got {value}")


def require_choice(name: str, value, choices):
    if value not in choices:
        raise UserError(f"method.{name} must be one of {', '.join(choices)}, got {value!r}")
