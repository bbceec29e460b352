"""`reproduce(jobs=N)`: notebooks run N at a time, except those marked runs_alone."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from kvrepro.reproduce import reproduce, runs_alone
from tests.conftest import NOTEBOOKS

HOLD_S = 2.0  # each notebook holds its interval this long, so overlaps are unambiguous


def _notebook(path: Path, body: str, alone: str = "") -> None:
    """A notebook with papermill parameters that records when its cell ran."""
    params = nbformat.v4.new_code_cell('figures_dir = ""\nresults_dir = ""')
    params.metadata["tags"] = ["parameters"]
    cell = nbformat.v4.new_code_cell(
        "import json, os, time\n"
        "start = time.time()\n"
        f"{body}\n"
        f"time.sleep({HOLD_S})\n"
        "os.makedirs(results_dir, exist_ok=True)\n"
        f"json.dump({{'start': start, 'end': time.time(), 'pid': os.getpid()}},\n"
        f"          open(os.path.join(results_dir, '{path.stem}.json'), 'w'))\n")
    nb = nbformat.v4.new_notebook(cells=[params, cell])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    if alone:
        nb.metadata["kvrepro"] = {"runs_alone": alone}
    nbformat.write(nb, str(path))


def _interval(run_dir: Path, name: str) -> tuple[float, float]:
    got = json.loads((run_dir / "results" / f"{name}.json").read_text())
    return got["start"], got["end"]


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_jobs_run_notebooks_side_by_side_and_alone_ones_by_themselves(tmp_path: Path) -> None:
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    _notebook(nbs / "01_a.ipynb", "pass")
    _notebook(nbs / "02_alone.ipynb", "pass", alone="measures the disk")
    _notebook(nbs / "03_b.ipynb", "pass")
    _notebook(nbs / "04_fails.ipynb", "raise ValueError('bad input in 04')")
    result = reproduce(nbs, tmp_path / "fig", tmp_path / "runs", jobs=2)
    run_dir = result.run_dir
    a, b = _interval(run_dir, "01_a"), _interval(run_dir, "03_b")
    alone = _interval(run_dir, "02_alone")
    assert _overlap(a, b)  # two at a time
    assert not _overlap(alone, a) and not _overlap(alone, b)
    [failure] = result.failures  # the others still ran
    assert failure.notebook == "04_fails.ipynb" and "bad input in 04" in failure.error
    assert failure.cell_index is not None
    timings = pd.read_csv(run_dir / "timings.csv")
    assert timings.notebook.tolist() == ["01_a.ipynb", "02_alone.ipynb", "03_b.ipynb",
                                         "04_fails.ipynb"]  # in notebook order
    assert timings.set_index("notebook").status.to_dict()["04_fails.ipynb"] == "failed"
    assert (timings.wall_s[timings.status == "ok"] >= HOLD_S).all()
    assert [p.name for p in result.executed] == timings.notebook.tolist()
    assert all(p.exists() for p in result.executed)


def test_jobs_one_runs_in_order(tmp_path: Path) -> None:
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    _notebook(nbs / "01_a.ipynb", "pass")
    _notebook(nbs / "02_b.ipynb", "pass")
    result = reproduce(nbs, tmp_path / "fig", tmp_path / "runs", jobs=1)
    a, b = _interval(result.run_dir, "01_a"), _interval(result.run_dir, "02_b")
    assert a[1] <= b[0]
    with pytest.raises(ValueError, match="jobs"):
        reproduce(nbs, tmp_path / "fig", tmp_path / "runs", jobs=0)


def test_shipped_notebooks_that_run_alone_say_why() -> None:
    alone = {nb.name: runs_alone(nb) for nb in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
             if runs_alone(nb)}
    assert set(alone) == {"07_sim_whatif.ipynb", "11_storage_fio.ipynb", "13_fleet.ipynb"}
    assert all(len(why.split()) >= 5 for why in alone.values())
