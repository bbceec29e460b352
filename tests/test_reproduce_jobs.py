"""`reproduce(jobs=N)`: notebooks run N at a time, except those marked runs_alone."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from kvrepro.reproduce import reproduce, runs_alone
from tests.conftest import NOTEBOOKS, write_notebook

HOLD_S = 2.0  # each notebook holds its interval this long, so overlaps are unambiguous


def _notebook(path: Path, body: str, alone: str = "") -> None:
    """A notebook with papermill parameters that records when its cell ran."""
    write_notebook(path, "import json, os, time\n"
                   "start = time.time()\n"
                   f"{body}\n"
                   f"time.sleep({HOLD_S})\n"
                   "os.makedirs(results_dir, exist_ok=True)\n"
                   f"json.dump({{'start': start, 'end': time.time(), 'pid': os.getpid()}},\n"
                   f"          open(os.path.join(results_dir, '{path.stem}.json'), 'w'))\n",
                   **({"runs_alone": alone} if alone else {}))


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


def _children(pid: int) -> set[int]:
    """Every process whose ancestry reaches `pid` (kernels run in sessions of their own)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def test_sigterm_stops_the_workers_and_their_kernels(tmp_path: Path) -> None:
    """SIGTERM to `kvrepro reproduce` while two notebooks run side by side: it exits, no
    worker or kernel is left, and the notebook that finished before is kept in
    timings.csv."""
    import signal
    import subprocess
    import sys
    import time

    nbs = tmp_path / "nbs"
    nbs.mkdir()
    _notebook(nbs / "01_first.ipynb", "pass", alone="runs before the others")
    _notebook(nbs / "02_slow.ipynb", "time.sleep(120)")
    _notebook(nbs / "03_slow.ipynb", "time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-m", "kvrepro.cli", "reproduce", "--notebooks",
                             str(nbs), "--figures", str(tmp_path / "f"), "--runs",
                             str(tmp_path / "r"), "--jobs", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # both slow notebooks' kernels have started
            kernels = [p for p in _children(proc.pid)
                       if b"ipykernel" in Path(f"/proc/{p}/cmdline").read_bytes()]
            if len(kernels) >= 2:
                break
            time.sleep(0.5)
        assert len(kernels) >= 2, "the two notebooks did not start side by side"
        started = _children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(3)  # kernels see their worker gone within a second (ipykernel's parent poller)
    left = {p for p in started if Path(f"/proc/{p}").exists()}
    assert not left, f"left running: {left}"
    [run_dir] = list((tmp_path / "r").iterdir())
    timings = pd.read_csv(run_dir / "timings.csv")
    assert timings.notebook.tolist() == ["01_first.ipynb"]
