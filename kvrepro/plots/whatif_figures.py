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
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.2 * ncols, 4.6 * nrows),
                             layout="constrained", squeeze=False)
    for ax in axes.flat[len(knobs):]:
        ax.set_visible(False)
    for ax, knob in zip(axes.flat, knobs, strict=False):
        part = df[df.knob == knob]
        x = np.arange(len(part))
        peak, late = part.peak_tok_s / 1000, part.late_tok_s / 1000
        bars = (ax.bar(x - 0.2, peak, 0.4, color="#9ecae1"),
                ax.bar(x + 0.2, late, 0.4, color="#1f77b4"))
        # when the tier filled: on white above each pair, horizontal (not on the dark bars)
        for xi, fill, top in zip(x, part.fill_min, np.maximum(peak, late), strict=True):
            text = "never\nfull" if np.isnan(fill) else f"full at\n{fill:.0f} min"
            ax.annotate(text, (xi, top), xytext=(0, 4), textcoords="offset points",
                        ha="center", va="bottom", fontsize=13, color="0.15", linespacing=1.1)
        ax.set_xticks(x, part.value)
        ax.set_ylim(0, float(np.maximum(peak, late).max()) * 1.32)
        ax.set(xlabel=knob, ylabel="total throughput (K tok/s)", title=knob)
    fig.suptitle("What-if: where the offload tier saturates", fontweight="bold")
    fig.legend(bars, ["peak", "last third of the run"], loc="outside lower center", ncol=2,
               fontsize=15, frameon=False)
    return fig
