"""Run every notebook with papermill and gather the headline numbers: `kvrepro reproduce`.

Each notebook runs with its embedded defaults plus `figures_dir` and `results_dir`; the
executed copy lands in `runs/<UTC timestamp>/`, figures in `figures/`, and each notebook's
headline CSV in `runs/<ts>/results/`. A failing notebook is reported with the cell that
failed; the others still run, and what they produced stays on disk. Each notebook's wall
time goes to `runs/<ts>/timings.csv`, and the page a reader opens (figures, numbers,
validation, provenance) to `runs/<ts>/report.html` (`kvrepro.report`).

The notebooks are independent (each reads shipped data and writes its own files), so with
`jobs` > 1 they run that many at a time, each in its own process, except those whose
metadata says `"kvrepro": {"runs_alone": "<why>"}`: a notebook that measures this machine
(fio) or uses every core itself (a Ray sweep) runs by itself, first, in order.
"""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import papermill as pm
from tqdm.auto import tqdm

from kvrepro._checks import load_yaml
from kvrepro._signals import stop_on_signals
from kvrepro.report import EXTERNAL_CSV, TIMINGS_CSV, write_report
from kvrepro.studies import reference


@dataclass
class NotebookFailure:
    """Where a notebook stopped: which notebook, which cell, and the error."""

    notebook: str
    cell_index: int | None
    exec_count: int | None
    error: str

    def __str__(self) -> str:
        where = (f"cell {self.cell_index} (execution count {self.exec_count})"
                 if self.cell_index is not None else "before any cell ran")
        return f"notebook {self.notebook} failed in {where}: {self.error}"


@dataclass
class ReproduceResult:
    """What one `reproduce` call produced."""

    run_dir: Path
    executed: list[Path] = field(default_factory=list)
    failures: list[NotebookFailure] = field(default_factory=list)
    headlines: Any = None
    validation: Any = None
    timings: list[dict[str, Any]] = field(default_factory=list)
    report: Path | None = None


def _parse_value(text: str) -> Any:
    for number in (int, float):  # YAML 1.1 reads "1.9e9" as a string
        try:
            return number(text)
        except ValueError:
            pass
    return load_yaml(text, f"value {text!r}") if text.strip() else ""


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """Turn ["key=value", ...] into a dict: numbers, YAML lists, or strings."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"-p expects key=value, got {pair!r}")
        out[key.strip()] = _parse_value(value)
    return out


def find_notebooks(notebooks_dir: Path, only: list[str] | None = None) -> list[Path]:
    """Notebooks named NN_name.ipynb in order; `only` keeps those whose name contains a term."""
    found = sorted(p for p in notebooks_dir.glob("[0-9][0-9]_*.ipynb"))
    if not found:
        raise FileNotFoundError(f"no notebooks named NN_name.ipynb in {notebooks_dir}")
    if only:
        found = [p for p in found if any(term in p.stem for term in only)]
        if not found:
            raise ValueError(f"--only {only} matches no notebook in {notebooks_dir}")
    return found


def _overrides_for(notebook: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    declared = {name for name in pm.inspect_notebook(str(notebook))}
    return {k: v for k, v in overrides.items() if k in declared}


def _check_overrides(notebooks: list[Path], overrides: dict[str, Any]) -> None:
    declared: set[str] = set()
    for nb in notebooks:
        declared |= set(pm.inspect_notebook(str(nb)))
    unknown = sorted(set(overrides) - declared)
    if unknown:
        raise ValueError(f"parameter(s) {unknown} are declared by none of the notebooks "
                         f"{[nb.name for nb in notebooks]}")


def _run_one(notebook: Path, run_dir: Path, figures_dir: Path, parameters: dict[str, Any],
             progress: bool = True) -> tuple[NotebookFailure | None, float]:
    """Execute one notebook; (its failure or None, its wall time in s)."""
    params = {"figures_dir": str(figures_dir.resolve()),
              "results_dir": str((run_dir / "results").resolve()), **parameters}
    start_s = time.perf_counter()
    bar: Any = {"leave": False, "desc": notebook.stem} if progress else False
    try:
        pm.execute_notebook(str(notebook), str(run_dir / notebook.name), parameters=params,
                            cwd=str(notebook.parent), progress_bar=bar,
                            kernel_name="python3")
    except pm.PapermillExecutionError as err:
        failure = NotebookFailure(notebook.name, err.cell_index, err.exec_count,
                                  f"{err.ename}: {err.evalue}")
        return failure, time.perf_counter() - start_s
    return None, time.perf_counter() - start_s


def runs_alone(notebook: Path) -> str:
    """Why `notebook` must run by itself (its metadata's kvrepro.runs_alone), or ""."""
    meta = json.loads(notebook.read_text(encoding="utf-8")).get("metadata", {})
    return str(meta.get("kvrepro", {}).get("runs_alone", ""))


def default_jobs() -> int:
    """Notebooks run at once by default: one per CPU, at most 4 (each kernel holds its
    data in memory)."""
    return max(1, min(4, os.cpu_count() or 1))


def _note(result: ReproduceResult, nb: Path, failure: NotebookFailure | None,
          wall_s: float) -> None:
    result.timings.append({"notebook": nb.name, "wall_s": wall_s,
                           "status": "failed" if failure else "ok"})
    result.executed.append(result.run_dir / nb.name)
    if failure:
        result.failures.append(failure)
        tqdm.write(f"FAILED: {failure}")


def _run_guarded(task: tuple[Path, Path, Path, dict[str, Any]]
                 ) -> tuple[Path, NotebookFailure | None, float]:
    """`_run_one` in a worker process, any error turned into the notebook's failure (so
    that the other notebooks still run)."""
    nb, run_dir, figures_dir, params = task
    start_s = time.perf_counter()
    try:
        return (nb, *_run_one(nb, run_dir, figures_dir, params, progress=False))
    except Exception as err:  # e.g. the kernel could not start
        return nb, NotebookFailure(nb.name, None, None, repr(err)), time.perf_counter() - start_s


def _run_side_by_side(notebooks: list[Path], result: ReproduceResult, figures_dir: Path,
                      overrides: dict[str, Any], jobs: int, bar: Any) -> None:
    """The notebooks, `jobs` at a time in worker processes. An interruption (SIGINT, or
    SIGTERM under `stop_on_signals`) terminates the workers (their kernels, in sessions of
    their own, exit with them: ipykernel watches its parent); what finished is kept."""
    tasks = [(nb, result.run_dir, figures_dir, _overrides_for(nb, overrides))
             for nb in notebooks]
    pool = multiprocessing.get_context("spawn").Pool(jobs)
    try:
        for nb, failure, wall_s in pool.imap_unordered(_run_guarded, tasks):
            _note(result, nb, failure, wall_s)
            bar.update()
        pool.close()
    finally:
        pool.terminate()  # at once if interrupted; after close(), the idle workers
        pool.join()


def _run_all(notebooks: list[Path], result: ReproduceResult, figures_dir: Path,
             overrides: dict[str, Any], jobs: int) -> None:
    """Run the notebooks (see the module doc): those that run alone first, one by one,
    then the others `jobs` at a time, each in a fresh process."""
    alone = [nb for nb in notebooks if jobs == 1 or runs_alone(nb)]
    shared = [nb for nb in notebooks if nb not in alone]
    bar = tqdm(total=len(notebooks), desc="notebooks", unit="nb")
    try:
        for nb in alone:
            bar.set_postfix_str(nb.name)
            _note(result, nb, *_run_one(nb, result.run_dir, figures_dir,
                                        _overrides_for(nb, overrides)))
            bar.update()
        if shared:
            bar.set_postfix_str(f"{len(shared)} notebooks, {jobs} at a time")
            _run_side_by_side(shared, result, figures_dir, overrides, jobs, bar)
    finally:
        bar.close()
        order = {nb.name: i for i, nb in enumerate(notebooks)}
        result.timings.sort(key=lambda row: order[row["notebook"]])
        result.executed.sort(key=lambda path: order[path.name])


def reproduce(notebooks_dir: str | Path = "notebooks", figures_dir: str | Path = "figures",
              runs_dir: str | Path = "runs", only: list[str] | None = None,
              overrides: dict[str, Any] | None = None,
              jobs: int | None = None) -> ReproduceResult:
    """Execute the notebooks, write figures and the headline table; see the module doc.
    `jobs`: notebooks run at once (default `default_jobs()`; 1: one by one, in order)."""
    notebooks = find_notebooks(Path(notebooks_dir), only)
    overrides = overrides or {}
    jobs = default_jobs() if jobs is None else jobs
    if jobs < 1:
        raise ValueError(f"parameter 'jobs' must be >= 1, got {jobs}")
    _check_overrides(notebooks, overrides)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    result = ReproduceResult(run_dir=Path(runs_dir) / stamp)
    result.run_dir.mkdir(parents=True, exist_ok=True)
    try:
        with stop_on_signals():  # SIGTERM too unwinds: workers and kernels are stopped
            _run_all(notebooks, result, Path(figures_dir), overrides, jobs)
    finally:  # interrupted too: what ran is kept, with its times
        pd.DataFrame(result.timings, columns=["notebook", "wall_s", "status"]).to_csv(
            result.run_dir / TIMINGS_CSV, index=False)
    result.headlines = reference.collect_headlines(result.run_dir / "results")
    result.headlines.to_csv(result.run_dir / "headline_numbers.csv", index=False)
    validation = result.run_dir / "results" / "sim_validation" / VALIDATION_CSV
    if validation.is_file():  # notebook 06: the twin vs the live runs
        shutil.copyfile(validation, result.run_dir / VALIDATION_CSV)
        result.validation = pd.read_csv(validation)
    external = result.run_dir / "results" / "external" / EXTERNAL_CSV
    if external.is_file():  # notebook 14: the twin vs published GPU measurements
        shutil.copyfile(external, result.run_dir / EXTERNAL_CSV)
    result.report = write_report(result.run_dir, figures_dir)
    return result


VALIDATION_CSV = "validation.csv"
"""The twin's validation table (`validate.TABLE_COLUMNS`: run, tier, metric, live, sim,
null_sim, error, error_unit, null_error, informative), next to the
headline table in runs/<UTC timestamp>/."""


CHECK_MARK = "# NBVAL_CHECK_OUTPUT"
"""Cells whose outputs nbval compares with the ones stored in the notebook (`make test`)."""


def store_checked_outputs(executed: str | Path, source: str | Path) -> int:
    """Copy the outputs of an executed notebook's checked cells into its source notebook.

    Why: nbval fails `make test` when a checked number moves, until the stored output is
    updated on purpose; this is that update (`kvrepro reproduce --store-checked-outputs`).
    Cells are matched by id (papermill keeps them); only checked cells change. Returns how
    many cells were updated.
    """
    import nbformat

    ran = nbformat.read(str(executed), as_version=4)
    checked = {c.get("id"): c for c in ran.cells if c.cell_type == "code"
               and c.source.lstrip().startswith(CHECK_MARK)}
    nb = nbformat.read(str(source), as_version=4)
    updated = 0
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.get("id") in checked:
            done = checked[cell.get("id")]
            # nbval treats a cell without an execution count as unrun, so keep the count
            cell.outputs, cell.execution_count = done.outputs, done.execution_count
            updated += 1
    nbformat.write(nb, str(source))
    return updated
