"""Figures of study B on the simulator: B6 (prompt-caching microbenchmark), B7 (QPS sweep).

Input frames are what `kvrepro.studies.study_b.run_b6` / `run_b7` return; any engine's
results in
the same columns plot the same way.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from kvrepro.plots import TIER_COLORS, require_columns

B6_ORDER = ("mem", "ssd1", "ssd2", "ssd3", "ssd4", "opt")
B6_LABELS = {"mem": "MEM", "ssd1": "SSDx1", "ssd2": "SSDx2", "ssd3": "SSDx3", "ssd4": "SSDx4",
             "opt": "OPT"}
STUDY_B_COLORS = {"mem": TIER_COLORS["dram"], "ssd1": "#fdd0a2", "ssd2": "#fdae6b",
                  "ssd3": "#fd8d3c", "ssd4": "#e6550d", "opt": TIER_COLORS["flash"]}
"""MEM like study A's DRAM, untuned SSDs in oranges (darker: more drives), OPT like flash."""


def _tokens_label(tokens: int) -> str:
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else f"{tokens:,}"


def b6_microbenchmark(df: pd.DataFrame) -> plt.Figure:
    """Measure-round TTFT normalized to MEM, grouped by prompt length, one bar per tier."""
    require_columns(df, ["tier", "prompt_tokens", "norm_ttft"], "B6")
    tiers = [t for t in B6_ORDER if t in set(df.tier)] + sorted(set(df.tier) - set(B6_ORDER))
    lengths = sorted(df.prompt_tokens.unique())
    wide = df.pivot(index="prompt_tokens", columns="tier", values="norm_ttft").loc[lengths]
    fig, ax = plt.subplots(figsize=(12, 6.5))
    width = 0.8 / len(tiers)
    x = np.arange(len(lengths))
    for i, tier in enumerate(tiers):
        values = wide[tier].to_numpy()
        bars = ax.bar(x + (i - (len(tiers) - 1) / 2) * width, values, width * 0.95,
                      label=B6_LABELS.get(tier, tier), color=STUDY_B_COLORS.get(tier),
                      edgecolor="0.3", linewidth=0.6)
        if tier != "mem":
            ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], fontsize=9, rotation=90,
                         padding=3)
    ax.axhline(1.0, color="0.2", linestyle="--", linewidth=1.2)
    ticks = [_tokens_label(int(n)) for n in lengths]
    if "ttft_mem_s" in df.columns:  # MEM's absolute TTFT, what every bar is divided by
        mem_s = df.groupby("prompt_tokens").ttft_mem_s.first()
        ticks = [f"{t}\nMEM {mem_s[n] * 1e3:.0f} ms" for t, n in zip(ticks, lengths, strict=True)]
    ax.set_xticks(x, ticks)
    ax.set_ylim(0, float(np.nanmax(wide.to_numpy())) * 1.18)
    ax.set(xlabel="prompt length (tokens)", ylabel="TTFT / MEM TTFT (x)",
           title="B6  Prompt-caching microbenchmark (simulated)")
    ax.legend(ncol=len(tiers), fontsize=12, loc="upper left", frameon=True,
              columnspacing=1.0, handlelength=1.2)
    return fig


def _annotate_b7(ax: plt.Axes, df: pd.DataFrame, a: str, b: str) -> None:
    """Under each QPS point pair, near the x axis: the QPS and tier `a`'s TTFT over `b`'s."""
    wide = df.pivot(index="qps", columns="tier", values="ttft_mean_s")
    x = df.groupby("qps").throughput_ktok_s.mean()
    for qps in wide.index:
        text = f"QPS {qps:g}"
        if a in wide.columns and b in wide.columns:
            text += f"\n{(wide.at[qps, a] / wide.at[qps, b] - 1) * 100:+.1f} %"
        ax.annotate(text, (x[qps], 0.03), xycoords=("data", "axes fraction"), ha="center",
                    va="bottom", fontsize=11, color="0.25")


def b7_macrobenchmark(df: pd.DataFrame, a: str = "opt", b: str = "mem") -> plt.Figure:
    """Mean TTFT vs achieved throughput at each QPS, one line per tier, OPT's % over Memory."""
    require_columns(df, ["tier", "qps", "throughput_ktok_s", "ttft_mean_s"], "B7")
    labels = {"mem": "Memory", "opt": "OPT (SSDs)"}
    if "label" in df.columns:
        labels.update(dict(zip(df.tier, df.label, strict=True)))
    fig, ax = plt.subplots(figsize=(10, 6.5))
    for tier, part in df.sort_values("qps").groupby("tier", sort=False):
        ax.plot(part.throughput_ktok_s, part.ttft_mean_s, marker="o" if tier == b else "s",
                markersize=9, linewidth=2.5, label=labels.get(tier, tier),
                color=STUDY_B_COLORS.get(tier), alpha=0.9)
    _annotate_b7(ax, df, a, b)
    ax.set_ylim(0, df.ttft_mean_s.max() * 1.2)
    span = df.throughput_ktok_s.max() - df.throughput_ktok_s.min()
    ax.set_xlim(df.throughput_ktok_s.min() - 0.12 * span, df.throughput_ktok_s.max() + 0.12 * span)
    ax.set(xlabel="achieved throughput (K tok/s, prompt + output)", ylabel="mean TTFT (s)",
           title="B7  Multi-turn QPS sweep, Memory vs OPT (simulated)")
    ax.legend(fontsize=13, loc="upper left",
              title=f"labels at the bottom: QPS, {labels.get(a, a)} TTFT vs {labels.get(b, b)}",
              title_fontsize=11)
    return fig


__all__ = ["B6_LABELS", "B6_ORDER", "STUDY_B_COLORS", "b6_microbenchmark", "b7_macrobenchmark"]
