"""Fleet figures (no study figure: the studies size one server): routing x pool on the twin,
the flash a shared pool needs against private tiers, its drive writes per day, the sweep's
Pareto view of throughput per dollar against p90 TTFT.

Inputs are the tidy tables of `kvrepro.sweep` (one row per configuration, columns of
`kvrepro.engines.sim.fleet.fleet_headlines`) and of `kvrepro.studies.fleet_study`.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import numpy as np
import pandas as pd
import seaborn as sns

from kvrepro.plots import require_columns

POOL_COLORS = {"private": "#7f7f7f", "shared": "#0173b2"}
SOURCE_COLORS = {"gpu": "#029e73", "staging": "#de8f05", "flash": "#d55e00", "dram": "#1f77b4"}


def _label(row: pd.Series) -> str:
    """Routing over pool, each word on its own line: six of them side by side stay legible."""
    return "\n".join([*row["routing"].split("_"), row["kv_pool"]])


def fleet_policies(table: pd.DataFrame, stores: tuple[str, ...] = ("staging", "flash"),
                   title: str = "Fleet on the twin: routing x KV pool") -> plt.Figure:
    """Left: throughput per server; right: where prompt tokens came from (GPU prefix cache,
    each offload store, computed), one bar per routing x pool."""
    shares = [f"cached_share_{s}" for s in ("gpu", *stores)]
    require_columns(table, ["routing", "kv_pool", "throughput_per_server_tok_s", *shares],
                    "fleet-policies")
    table = table.sort_values(["routing", "kv_pool"]).reset_index(drop=True)
    labels = [_label(r) for _, r in table.iterrows()]
    x = np.arange(len(table))
    fig, (left, right) = plt.subplots(1, 2, figsize=(16, 6.5))
    left.bar(x, table["throughput_per_server_tok_s"],
             color=[POOL_COLORS.get(p, "0.5") for p in table["kv_pool"]])
    left.set(xticks=x, ylabel="tok/s per server (prompt + output)",
             title="Throughput per server")
    left.set_xticklabels(labels, fontsize=10)
    bottom = np.zeros(len(table))
    for col, source in zip(shares, ("gpu", *stores), strict=True):
        values = table[col].fillna(0.0).to_numpy(float) * 100
        right.bar(x, values, bottom=bottom, color=SOURCE_COLORS.get(source, "0.6"),
                  label=f"from {source}")
        bottom += values
    right.bar(x, 100 - bottom, bottom=bottom, color="0.9", label="computed")
    right.set(xticks=x, ylabel="% of prompt tokens", ylim=(0, 100),
              title="Prompt tokens by source")
    right.set_xticklabels(labels, fontsize=10)
    right.legend(fontsize=11, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.suptitle(title, x=0.01, ha="left", fontweight="bold")
    fig.tight_layout()
    return fig


def fleet_capacity(table: pd.DataFrame, target_share: float | None = None,
                   needed: pd.DataFrame | None = None,
                   share_col: str = "cached_share",
                   title: str = "Hit share vs the fleet's flash capacity") -> plt.Figure:
    """Hit share `share_col` against total flash capacity (TB), one line per pool x routing;
    with `target_share` and `needed` (`fleet_study.capacity_for_hit_share`), the capacity
    each needs for that share is marked."""
    require_columns(table, ["routing", "kv_pool", "flash_capacity_bytes", share_col],
                    "fleet-capacity")
    data = table.assign(capacity_tb=table["flash_capacity_bytes"] / 1e12,
                        share_pct=table[share_col] * 100)
    fig, ax = plt.subplots(figsize=(11, 6.5))
    sns.lineplot(data=data.sort_values("capacity_tb"), x="capacity_tb", y="share_pct",
                 hue="kv_pool", style="routing", markers=True, dashes=False,
                 palette=POOL_COLORS, ms=10, ax=ax)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(mticker.NullFormatter())
    if target_share is not None:
        ax.axhline(target_share * 100, color="0.3", ls=":", lw=1.5)
        ax.text(ax.get_xlim()[0], target_share * 100, f" target {target_share:.0%}",
                va="bottom", fontsize=12, color="0.3")
    if needed is not None:
        for row in needed[needed["reached"]].itertuples():
            ax.plot(row.capacity_bytes / 1e12, target_share * 100, "v", ms=12,
                    color=POOL_COLORS.get(row.kv_pool, "0.5"))
    source = share_col.removeprefix("cached_share").lstrip("_") or "any cache"
    ax.set(xlabel="flash capacity of the whole fleet (TB, log)",
           ylabel=f"% of prompt tokens cached ({source})", title=title)
    ax.legend(fontsize=11, loc="lower right")
    return fig


def fleet_dwpd(dwpd: pd.DataFrame, rating_dwpd: float | None = None,
               title: str = "Drive writes per day of the fleet's flash") -> plt.Figure:
    """DWPD per drive by RAID layout, one bar group per pool (x routing)."""
    require_columns(dwpd, ["raid_level", "kv_pool", "routing", "dwpd"], "fleet-dwpd")
    data = dwpd.assign(config=dwpd["routing"].str.replace("_", " ") + ", " + dwpd["kv_pool"])
    fig, ax = plt.subplots(figsize=(12, 6))
    sns.barplot(data=data, x="raid_level", y="dwpd", hue="config", ax=ax)
    if rating_dwpd is not None:
        ax.axhline(rating_dwpd, color="#d55e00", ls="--", lw=1.5)
        ax.text(ax.get_xlim()[1], rating_dwpd, f"drive rating {rating_dwpd:g} DWPD ",
                ha="right", va="bottom", fontsize=12, color="#d55e00")
    ax.set(xlabel="RAID layout", ylabel="drive writes per day (per drive)", title=title)
    ax.legend(fontsize=11, title=None)
    return fig


def _two_and_five(value: float, _pos: int) -> str:
    """A log axis's minor tick label at 2x and 5x a power of ten only: all eight of a
    decade's labels overlap once the axis spans little more than one decade."""
    if value <= 0:
        return ""
    mantissa = round(value / 10 ** math.floor(math.log10(value)))
    return f"{value:g}" if mantissa in (2, 5) else ""


def sweep_pareto(table: pd.DataFrame, front: pd.DataFrame, x: str = "ttft_p90_s",
                 y: str = "tok_per_usd", hue: str = "tier",
                 title: str = "Sweep: throughput per dollar vs p90 TTFT") -> plt.Figure:
    """Every configuration of a sweep, the Pareto front (`kvrepro.sweep.pareto_front`:
    nothing else is both cheaper per token and faster) drawn as a line through its points."""
    require_columns(table, [x, y, hue], "sweep-pareto")
    fig, ax = plt.subplots(figsize=(11, 6.5))
    sns.scatterplot(data=table, x=x, y=y, hue=hue, s=70, ax=ax)
    if len(front):
        line = front.sort_values(x)
        ax.plot(line[x], line[y], "-", color="0.2", lw=1.5, label="Pareto front", zorder=0)
        ax.scatter(line[x], line[y], s=170, facecolors="none", edgecolors="0.2", lw=1.5)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(mticker.FuncFormatter(_two_and_five))
    ax.set(xlabel="p90 TTFT (s, log)", ylabel="tokens per dollar", title=title)
    ax.legend(fontsize=11)
    return fig
