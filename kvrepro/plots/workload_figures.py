"""Figures that describe a generated workload (not study figures): arrivals, context growth,
turn sizes, and the returning users' schedule."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from kvrepro.plots import require_columns


def workload_arrivals(sessions: pd.DataFrame, rate_per_min: float | None = None,
                      warmup_s: float = 0.0) -> plt.Figure:
    """Cumulative session arrivals over time against the nominal Poisson rate."""
    require_columns(sessions, ["arrival_s"], "workload-arrivals")
    minutes = np.sort(sessions.arrival_s.to_numpy()) / 60
    fig, ax = plt.subplots()
    ax.step(minutes, np.arange(1, len(minutes) + 1), where="post", linewidth=3,
            label="generated sessions")
    if rate_per_min is not None and len(minutes):
        ax.plot([0, minutes[-1]], [0, rate_per_min * minutes[-1]], "--", color="0.3",
                label=f"{rate_per_min:g} sessions/min")
    if warmup_s:
        ax.axvspan(0, warmup_s / 60, color="0.85", label="warm-up")
    ax.set(xlabel="run time (min)", ylabel="sessions arrived",
           title="Workload: session arrivals")
    ax.legend(fontsize=12)
    return fig


def workload_context_growth(turns: pd.DataFrame, session_ids: list[int],
                            cap_tokens: int | None = None) -> plt.Figure:
    """Prompt length per turn over the planned schedule, for a few sessions."""
    require_columns(turns, ["session_id", "planned_send_s", "prompt_tokens", "is_resume"],
             "workload-context-growth")
    part = turns[turns.session_id.isin(session_ids)]
    fig, ax = plt.subplots()
    for sid, rows in part.groupby("session_id"):
        ax.plot(rows.planned_send_s / 60, rows.prompt_tokens / 1000, linewidth=2,
                label=f"session {sid}")
        resumes = rows[rows.is_resume]
        ax.scatter(resumes.planned_send_s / 60, resumes.prompt_tokens / 1000, s=120,
                   marker="*", color="black", zorder=3)
    if cap_tokens:
        ax.axhline(cap_tokens / 1000, color="0.3", linestyle="--", linewidth=1.5)
        ax.text(0, cap_tokens / 1000, " context cap", va="bottom", fontsize=12)
    ax.set(xlabel="planned send time (min)", ylabel="prompt length (K tokens)",
           title="Workload: context growth (star = resume)")
    ax.legend(fontsize=10, ncol=2, loc="lower right")
    return fig


def workload_turn_sizes(turns: pd.DataFrame) -> plt.Figure:
    """Distributions of append and output sizes by kind (log-spaced bins)."""
    require_columns(turns, ["append_tokens", "append_kind", "output_tokens", "output_kind"],
             "workload-turn-sizes")
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.5), layout="constrained")
    bins = np.logspace(0, np.log10(max(turns.append_tokens.max(), 10) * 1.1), 60)
    for ax, column, kind, what in ((axes[0], "append_tokens", "append_kind", "input append"),
                                   (axes[1], "output_tokens", "output_kind", "output")):
        sns.histplot(data=turns, x=column, hue=kind, bins=bins, ax=ax, element="step")
        ax.set_xscale("log")
        ax.set(xlabel=f"{what} (tokens, log scale)", ylabel="turns", title=what)
    fig.suptitle("Workload: turn sizes", fontweight="bold")
    return fig


def workload_resumes(turns: pd.DataFrame, duration_s: float, warmup_s: float = 0.0) -> plt.Figure:
    """When returning users go idle and resume, against the measurement window."""
    require_columns(turns, ["session_id", "planned_send_s", "pause_s", "is_resume"],
                    "workload-resumes")
    resumes = turns[turns.is_resume].sort_values("planned_send_s")
    fig, ax = plt.subplots()
    for i, row in enumerate(resumes.itertuples()):
        idle_start = (row.planned_send_s - row.pause_s) / 60
        inside = warmup_s <= row.planned_send_s < duration_s
        ax.plot([idle_start, row.planned_send_s / 60], [i, i], color="0.6", linewidth=4)
        ax.scatter(row.planned_send_s / 60, i, s=80, zorder=3,
                   color="tab:red" if inside else "0.4")
    ax.axvline(duration_s / 60, color="black", linestyle="--", linewidth=1.5)
    ax.text(duration_s / 60, len(resumes) - 0.5, " end of run", fontsize=12, va="top")
    ax.set_yticks(range(len(resumes)), [f"s{sid}" for sid in resumes.session_id], fontsize=10)
    ax.set(xlabel="planned time (min)", ylabel="returning session",
           title="Workload: idle (grey) then resume (red: inside the run)")
    return fig
