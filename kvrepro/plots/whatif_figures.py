"""What-if sweeps on the simulator: where each tier saturates as one knob changes."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from kvrepro.plots import require_columns


def whatif_saturation(df: pd.DataFrame) -> plt.Figure:
    """One panel per swept knob: peak and late throughput per value, fill time annotated."""
    require_columns(df, ["knob", "value", "peak_tok_s", "late_tok_s", "fill_min"],
                    "whatif-saturation")
    knobs = list(dict.fromkeys(df.knob))
    ncols = min(2, len(knobs))
    nrows = -(-len(knobs) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(7 * ncols, 5 * nrows),
                             layout="constrained", squeeze=False)
    for ax in axes.flat[len(knobs):]:
        ax.set_visible(False)
    for ax, knob in zip(axes.flat, knobs, strict=False):
        part = df[df.knob == knob]
        x = np.arange(len(part))
        ax.bar(x - 0.2, part.peak_tok_s / 1000, 0.4, label="peak", color="#9ecae1")
        ax.bar(x + 0.2, part.late_tok_s / 1000, 0.4, label="last third", color="#1f77b4")
        for xi, fill in zip(x, part.fill_min, strict=True):
            text = "never full" if np.isnan(fill) else f"full at {fill:.0f} min"
            ax.text(xi, 1, text, rotation=90, ha="center", va="bottom", fontsize=13,
                    color="black")
        ax.set_xticks(x, part.value)
        ax.set(xlabel=knob, ylabel="total throughput (K tok/s)", title=knob)
        ax.legend(fontsize=11)
    fig.suptitle("What-if: where the offload tier saturates", fontweight="bold")
    return fig
