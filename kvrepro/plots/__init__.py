"""Figures: one function per figure id, a shared theme, and one way to save.

Plot functions take tidy DataFrames and return a matplotlib Figure; they never save or show.
Notebooks call `save_figure(fig, figures_dir, "A6-kv-capacity")`, which writes PNG and SVG.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from kvrepro import _checks


def require_columns(df: pd.DataFrame, columns: list[str], figure: str) -> None:
    """`kvrepro._checks.require_columns` naming the figure ("figure A2: data lacks ..."),
    before plotting half a figure."""
    _checks.require_columns(df, columns, f"figure {figure}")


TIER_COLORS = {"baseline": "#7f7f7f", "dram": "#1f77b4", "flash": "#d62728"}


def set_theme() -> None:
    """Shared look: readable at slide size, light grid, colour-blind palette."""
    sns.set_theme(context="talk", style="whitegrid", palette="colorblind",
                  rc={"figure.figsize": (10, 6), "axes.titleweight": "bold",
                      "axes.titlesize": 18, "savefig.bbox": "tight", "savefig.dpi": 120,
                      "svg.fonttype": "none", "svg.hashsalt": "kvrepro"})


def save_figure(fig: plt.Figure, figures_dir: str | Path, name: str) -> list[Path]:
    """Write `name`.png and `name`.svg into `figures_dir` and return both paths."""
    out = Path(figures_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.svg"]
    for path in paths:
        # No timestamp in the files, so an unchanged figure stays byte-identical in git.
        fig.savefig(path, metadata={"Date": None} if path.suffix == ".svg" else None)
    return paths


set_theme()
