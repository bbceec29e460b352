"""Argument checks whose errors name the parameter (or the frame and its missing columns), so
a bad input is easy to find."""

from __future__ import annotations

import math
from collections.abc import Iterable
from numbers import Real
from typing import Any


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


def require_columns(df: Any, columns: Iterable[str], what: str) -> None:
    """Raise ValueError "`what`: data lacks column(s) [...]" naming every missing column.

    `df` is a DataFrame (or anything with `.columns`); checking first fails early with the
    caller's name (a function, a figure, a file) instead of a KeyError deep inside pandas.
    """
    present = set(df.columns)
    missing = [c for c in columns if c not in present]
    if missing:
        raise ValueError(f"{what}: data lacks column(s) {missing}")
