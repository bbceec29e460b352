"""Figures A2-A5 draw from the analysis frames, with units and figure ids."""

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from kvrepro import analysis as an
from kvrepro.plots import TIER_COLORS
from kvrepro.plots import run_figures as runs
from kvrepro.records import RECORD_COLUMNS


@pytest.fixture(scope="module")
def records() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for tier, slow in (("baseline", 8.0), ("dram", 1.0), ("flash", 2.0)):
        for i, send in enumerate(np.arange(0, 1200, 10.0)):
            ttft = 0.5 * (slow if send > 300 else 1) * rng.uniform(0.8, 1.2)
            resume = i % 20 == 19
            rows.append({"session_id": i, "turn": 1, "tier": tier, "engine": "sim",
                         "send_s": send, "first_token_s": send + ttft,
                         "finish_s": send + ttft + 5, "prompt_tokens": 2000,
                         "cached_prompt_tokens": 1500.0, "output_tokens": 100,
                         "is_resume": resume, "is_warmup": send < 120, "error": ""})
    df = pd.DataFrame(rows, columns=list(RECORD_COLUMNS))
    return df.assign(ttft_s=df.first_token_s - df.send_s)


def _labels(fig: plt.Figure) -> str:
    return " ".join(ax.get_xlabel() + " " + ax.get_ylabel() for ax in fig.axes)


def _title(fig: plt.Figure) -> str:
    return " ".join(ax.get_title() for ax in fig.axes)


@pytest.mark.parametrize("figure_id, draw, units", [
    ("A2", lambda r: runs.a2_total_throughput(an.throughput_over_time(r), warmup_s=120,
                                              fill_time_s=600), ["(min)", "(tok/s)"]),
    ("A3", lambda r: runs.a3_output_throughput(an.throughput_over_time(r)),
     ["(min)", "(tok/s)"]),
    ("A4", lambda r: runs.a4_ttft_over_time(an.ttft_over_time(r, exclude_warmup=True)),
     ["(min)", "(s"]),
    ("A5", lambda r: runs.a5_returning_users(an.resume_stats(r)), ["TTFT (s)"]),
])
def test_figure_has_units_and_title(records, figure_id, draw, units) -> None:
    fig = draw(records)
    assert isinstance(fig, plt.Figure)
    for unit in units:
        assert unit in _labels(fig)
    assert _title(fig).startswith(f"{figure_id}  ")


def test_title_names_another_run(records) -> None:
    """A live run of this package passes its own title: no study figure id on it."""
    draws = [runs.a2_total_throughput(an.throughput_over_time(records), title="Live: a2"),
             runs.a3_output_throughput(an.throughput_over_time(records), title="Live: a3"),
             runs.a4_ttft_over_time(an.ttft_over_time(records), title="Live: a4"),
             runs.a5_returning_users(an.resume_stats(records), title="Live: a5")]
    assert [_title(fig) for fig in draws] == ["Live: a2", "Live: a3", "Live: a4", "Live: a5"]


def test_a4_legend_sits_outside_the_data(records) -> None:
    from kvrepro.plots.legibility import text_problems

    fig = runs.a4_ttft_over_time(an.ttft_over_time(records), warmup_s=120, fill_time_s=600)
    fig.canvas.draw()
    ax, legend = fig.axes[0], fig.axes[0].get_legend()
    assert legend.get_window_extent().x0 > ax.get_window_extent().x1
    assert not text_problems(fig)


def test_a2_lines_use_tier_colours_and_mark_phases(records) -> None:
    fig = runs.a2_total_throughput(an.throughput_over_time(records), warmup_s=120,
                                   fill_time_s=600)
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines() if not
             line.get_label().startswith("_")}
    assert list(lines) == ["baseline", "dram", "flash"]
    for tier, line in lines.items():
        assert line.get_color() == TIER_COLORS[tier]
    # x in minutes: bin centres 0.5, 1.5, ...
    assert lines["dram"].get_xdata()[0] == pytest.approx(0.5)
    texts = " ".join(t.get_text() for t in ax.texts)
    assert "warm-up" in texts and "10 min" in texts


def test_a4_is_log_scale_with_p90_band(records) -> None:
    fig = runs.a4_ttft_over_time(an.ttft_over_time(records))
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    assert len(ax.collections) == 3          # one band per tier
    no_band = runs.a4_ttft_over_time(an.ttft_over_time(records).drop(columns="ttft_p90_s"),
                                     p90_band=False)
    assert len(no_band.axes[0].collections) == 0


def test_a5_annotates_medians_and_slowest_resume() -> None:
    stats = pd.DataFrame({"tier": ["flash", "baseline", "dram"],
                          "normal_ttft_median_s": [0.5, 0.5, 0.5], "n_resumes": [11, 11, 11],
                          "resume_ttft_median_s": [0.8, 1.4, 0.6],
                          "resume_ttft_max_s": [3.2, 13.9, 0.8]})
    fig = runs.a5_returning_users(stats)
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert "1.4 s\nmax 13.9 s" in texts and "0.8 s\nmax 3.2 s" in texts
    assert texts.count("0.5 s") == 3
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks[0].startswith("baseline") and "11 resumes" in ticks[2]
    assert ax.get_ylim()[1] > 13.9


def test_a5_tier_without_resumes_says_so() -> None:
    stats = pd.DataFrame({"tier": ["dram"], "normal_ttft_median_s": [0.5],
                          "resume_ttft_median_s": [math.nan], "resume_ttft_max_s": [math.nan]})
    fig = runs.a5_returning_users(stats)
    assert "no\nresumes" in [t.get_text() for t in fig.axes[0].texts]


def test_missing_column_is_named(records) -> None:
    data = an.throughput_over_time(records).drop(columns="total_tok_s")
    with pytest.raises(ValueError, match=r"figure A2: data lacks column\(s\) \['total_tok_s'\]"):
        runs.a2_total_throughput(data)
