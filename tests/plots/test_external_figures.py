"""Figures external-vs-published and external-errors, the tier-effect table and the score, on a
small hand-made table whose counts are known."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PathCollection

from kvrepro.plots import external_figures as ext
from kvrepro.plots.legibility import check_legible

ROWS = [  # case, metric, tier, point, unit, published, predicted, label
    ("llmd_qwen3_32b", "ttft_mean_s", "baseline", "qps=5", "s", 1.0, 1.05, "predicted"),
    ("llmd_qwen3_32b", "ttft_mean_s", "cpu", "qps=5", "s", 0.5, 0.6, "predicted"),
    ("llmd_qwen3_32b", "throughput_tok_s", "baseline", "qps=5", "tok/s", 2000.0, 1000.0,
     "predicted"),
    ("lmcache_llama8b", "prefill_s", "miss", "prompt_tokens=16384", "s", 2.0, 2.0, "fitted"),
    ("lmcache_llama8b", "hot_ttft_s", "gpu_hit", "prompt_tokens=16384", "s", 0.1, 0.6,
     "predicted"),
    ("lmcache_llama8b", "h2d_gb_s", "cpu", "prompt_tokens=16384", "GB/s", 20.0, math.nan,
     "predicted"),
    ("dynamo_70b", "decode_step_s", "baseline", "batch=8", "s", 0.02, 0.019, "fitted"),
    ("dynamo_70b", "e2e_mean_s", "fs_io16", "qps=2", "s", 10.0, 7.0, "predicted"),
    ("dynamo_70b", "ttft_p90_s", "fs_io1", "qps=2", "s", 0.3, 0.33, "predicted"),
]
"""Predictions that ran: +5, +20, -50, +500, -30 and +10 % (0.33 against 0.3, which floats
make 10.000000000000009): two within 10 %, three within 25 %; one not run; two fitted."""


@pytest.fixture()
def table() -> pd.DataFrame:
    df = pd.DataFrame(ROWS, columns=["case", "metric", "tier", "point", "unit", "published",
                                     "predicted", "label"])
    return df.assign(point_value=df["point"].str.split("=").str[1].astype(float),
                     error_pct=100 * (df["predicted"] - df["published"]) / df["published"],
                     read_off_figure=[False, True] * 4 + [False],
                     cause=[""] * 4 + ["GPU prefix cache modelled cold"] + [""] * 4)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _scatters(ax: plt.Axes) -> dict[str, PathCollection]:
    return {c.get_gid(): c for c in ax.collections
            if isinstance(c, PathCollection) and c.get_gid()}


def _hollow(collection: PathCollection) -> bool:
    faces = collection.get_facecolors()
    return len(faces) == 0 or bool(np.all(faces[:, 3] == 0))


def test_score_counts_exactly(table) -> None:
    counts = ext.score(table)
    assert counts == {"n_predicted": 6, "within_10": 2, "within_25": 3,
                      "share_within_10": 2 / 6, "share_within_25": 3 / 6,
                      "n_not_run": 1, "n_fitted": 2}


def test_score_of_no_predictions_is_nan_not_a_division_error(table) -> None:
    counts = ext.score(table[table["label"] == "fitted"])
    assert counts["n_predicted"] == 0 and counts["n_fitted"] == 2
    assert math.isnan(counts["share_within_10"]) and math.isnan(counts["share_within_25"])


def test_unknown_label_is_refused(table) -> None:
    table.loc[0, "label"] = "Predicted"
    with pytest.raises(ValueError, match=r"'label' must be one of .*'Predicted'"):
        ext.score(table)


def test_vs_published_is_log_log_with_band_line_and_score_in_title(table) -> None:
    fig = ext.external_vs_published(table)
    assert isinstance(fig, plt.Figure)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "values in each metric's own unit" in ax.get_xlabel()
    assert "3 of 6 predictions within 25 %, 2 within 10 %" in ax.get_title("left")
    assert "1 not run by the twin" in ax.get_title("left")
    band = next(c for c in ax.collections if c.get_gid() == "band-25")
    vertices = band.get_paths()[0].vertices
    x, y = vertices[:, 0], vertices[:, 1]
    on_edge = np.isclose(y, 0.75 * x) | np.isclose(y, 1.25 * x)
    assert on_edge.all() and np.isclose(y, 0.75 * x).any() and np.isclose(y, 1.25 * x).any()
    identity = next(line for line in ax.get_lines() if line.get_gid() == "identity")
    assert np.allclose(identity.get_xdata(), identity.get_ydata())


def test_vs_published_draws_fitted_hollow_and_predicted_filled(table) -> None:
    scatters = _scatters(ext.external_vs_published(table).axes[0])
    assert set(scatters) == {"predicted-llmd_qwen3_32b", "predicted-lmcache_llama8b",
                             "predicted-dynamo_70b", "fitted-lmcache_llama8b",
                             "fitted-dynamo_70b"}
    for gid, collection in scatters.items():
        assert _hollow(collection) == gid.startswith("fitted"), gid
    # the run that did not run is not drawn: 8 points of 9 rows
    assert sum(len(c.get_offsets()) for c in scatters.values()) == 8
    legend = [t.get_text() for t in scatters["fitted-dynamo_70b"].axes.get_legend().texts]
    assert "fitted (hollow)" in legend and "dynamo_70b" in legend


def test_one_style_per_case_in_both_figures(table) -> None:
    first = _scatters(ext.external_vs_published(table).axes[0])
    second = _scatters(ext.external_errors(table).axes[0])
    for gid in ("predicted-dynamo_70b", "fitted-lmcache_llama8b"):
        assert np.allclose(first[gid].get_edgecolors(), second[gid].get_edgecolors())
    colours = {tuple(first[f"predicted-{c}"].get_edgecolors()[0])
               for c in ("llmd_qwen3_32b", "lmcache_llama8b", "dynamo_70b")}
    assert len(colours) == 3


def test_errors_rows_lines_band_and_hollow_fitted(table) -> None:
    fig = ext.external_errors(table)
    assert isinstance(fig, plt.Figure)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(labels) == 9 and labels[0] == "llmd_qwen3_32b · ttft_mean_s · baseline"
    assert "lmcache_llama8b · h2d_gb_s · cpu (1 not run)" in labels
    assert "% of published" in ax.get_xlabel()
    assert "3 of 6 predictions within 25 %" in ax.get_title("left")
    verticals = sorted(line.get_xdata()[0] for line in ax.get_lines())
    assert verticals == [-10, 0, 10]
    band = next(p for p in ax.patches if p.get_gid() == "band-25")
    xs = band.get_path().transformed(band.get_patch_transform()).vertices[:, 0]
    assert np.isclose(xs.min(), -25) and np.isclose(xs.max(), 25)
    for gid, collection in _scatters(ax).items():
        assert _hollow(collection) == gid.startswith("fitted"), gid


def test_errors_clip_the_point_beyond_and_write_its_value(table) -> None:
    ax = ext.external_errors(table, clip_pct=300).axes[0]
    clipped = _scatters(ax)["predicted-lmcache_llama8b-clipped"]
    assert clipped.get_offsets().tolist() == [[300.0, 4.0]]
    notes = [t for t in ax.texts if t.get_gid() == "clipped-note"]
    assert [t.get_text() for t in notes] == ["+500 %"]
    assert ax.get_xlim()[1] > 300
    drawn = sum(len(c.get_offsets()) for c in _scatters(ax).values())
    assert drawn == 8  # every number that ran, the clipped one included


def test_figures_are_legible_and_draw_into_a_given_axes(table) -> None:
    assert check_legible(ext.external_vs_published(table), "external-vs-published",
                         strict=False) == []
    assert check_legible(ext.external_errors(table), "external-errors", strict=False) == []
    fig, ax = plt.subplots(figsize=(12, 7))
    assert ext.external_errors(table, ax=ax) is fig


@pytest.mark.parametrize("draw, figure, column", [
    (ext.external_vs_published, "figure external-vs-published", "published"),
    (ext.external_errors, "figure external-errors", "error_pct"),
    (ext.score, "external score", "label"),
])
def test_missing_column_is_named(table, draw, figure, column) -> None:
    with pytest.raises(ValueError,
                       match=rf"{figure}: data lacks column\(s\) \['{column}'\]"):
        draw(table.drop(columns=column))


def test_tier_effects_table() -> None:
    effects = pd.DataFrame({
        "case": ["llmd_qwen3_32b"] * 3, "metric": ["ttft_mean_s"] * 3,
        "point": ["qps=5", "qps=10", "qps=20"], "baseline_tier": ["baseline"] * 3,
        "offload_tier": ["cpu", "cpu", "fs_io16"], "published_ratio": [0.4123, 0.0041, 1.5],
        "predicted_ratio": [0.5, 1.2, math.nan], "direction_right": [True, False, False]})
    shown = ext.tier_effects_table(effects)
    assert list(shown.columns) == ["case", "metric", "point", "tiers", "published ratio",
                                   "predicted ratio", "direction"]
    assert shown["tiers"].tolist() == ["cpu / baseline", "cpu / baseline",
                                       "fs_io16 / baseline"]
    assert shown["published ratio"].tolist() == [0.412, 0.0041, 1.5]
    assert shown["direction"].tolist() == ["right", "WRONG", "not run"]
    with pytest.raises(ValueError, match=r"data lacks column\(s\) \['direction_right'\]"):
        ext.tier_effects_table(effects.drop(columns="direction_right"))
