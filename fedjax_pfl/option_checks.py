"""One-line checks of method options (``method.<name>=value``) that raise UserError."""

from __future__ import annotations

import math

from fedjax_pfl.errors import UserError


def check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise UserError(f"method.{name} must be one of {', '.join(choices)}, got {value!r}")


def check_finite(name: str, value, minimum: float = 0.0, strict: bool = False) -> None:
    """A finite number >= minimum (> minimum when ``strict``)."""
    ok = math.isfinite(value) and (value > minimum if strict else value >= minimum)
    if not ok:
        raise UserError(f"method.{name} must be a finite number {'>' if strict else '>='} {minimum:g}, got {value}")


def check_interval(name: str, value, low: float, high: float) -> None:
    if not low <= value <= high:
        raise UserError(f"method.{name} must be in [{low:g}, {high:g}], got {value}")
