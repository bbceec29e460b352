"""Figures: one function per figure id, a shared theme, and one way to save.

Plot functions take tidy DataFrames and return a matplotlib Figure; they never save or show.
Notebooks call `save_figure(fig, figures_dir, "A6-kv-capacity")`, which writes PNG and SVG.
"""

from __future__ import annotations

import warnings
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


MEASURED_HERE = "this-machine"
"""The sub-folder of `figures_dir` for figures of what a run measures on the machine it runs
on (fio on its drive): they change with every run, so they are kept out of the tracked
`figures/` (git ignores `figures/this-machine/`) and a fresh clone's report names a clean
commit; the report shows them as measured on this machine."""


def save_figure(fig: plt.Figure, figures_dir: str | Path, name: str,
                measured_here: bool = False) -> list[Path]:
    """Write `name`.png and `name`.svg into `figures_dir` (into its `MEASURED_HERE` folder
    when the figure shows a measurement of this machine) and return both paths. The figure
    is checked for text over text and text cut off first (`legibility.check_legible`): a
    warning, or an error where `KVREPRO_STRICT_FIGURES=1` (the notebooks under `make test`)."""
    from kvrepro.plots.legibility import check_legible

    for problem in check_legible(fig, name):
        warnings.warn(f"figure {name}: {problem}", stacklevel=2)
    out = Path(figures_dir) / (MEASURED_HERE if measured_here else "")
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.svg"]
    for path in paths:
        # No timestamp in the files, so an unchanged figure stays byte-identical in git.
        fig.savefig(path, metadata={"Date": None} if path.suffix == ".svg" else None)
    return paths


set_theme()
