"""Argument checks whose errors name the parameter, so a bad input is easy to find."""

from __future__ import annotations

import math
from numbers import Real


def positive(**values: float) -> None:
    """Raise ValueError naming the first parameter that is not a finite number > 0."""
    for name, value in values.items():
        if not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"parameter {name!r} must be a finite number > 0, got {value!r}")


def non_negative(**values: float) -> None:
    """Raise ValueError naming the first parameter that is not a finite number >= 0."""
    for name, value in values.items():
        if not isinstance(value, Real) or not math.isfinite(value) or value < 0:
            raise ValueError(f"parameter {name!r} must be a finite number >= 0, got {value!r}")
