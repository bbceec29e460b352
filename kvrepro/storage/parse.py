"""Reading what fio writes: its JSON report and its per-I/O latency logs.

* `load_fio_json` / `parse_fio_json`: fio's `--output-format=json` report as a tidy table, one
  row per job entry (a job, or a whole group under `group_reporting`) and direction that did
  I/O. Bandwidth is recomputed as `io_bytes / runtime` next to fio's own `bw_bytes`, so a
  reader can see the two agree. Several jobs and several groups (`stonewall`, `new_group`)
  are kept apart by `jobname` / `groupid`; `group_summary` adds a group's jobs up the way
  fio's "Run status group" line does (bytes summed, over the longest runtime).
* `read_lat_log`: a `write_lat_log` file with `log_avg_msec=0` (one line per I/O). fio 3.33
  writes `time (ms), value (ns), direction, block size, offset, priority`; the offset is
  there with `log_offset=1`, which this package always sets.
* `io_events` / `in_flight`: per-I/O submission and completion times from a `lat` log, and
  the number of I/Os in flight over time (figure B10). fio 3.33 logs the completion time
  in whole milliseconds since the job started (truncated) and the I/O's total latency in
  ns; completions within one logged ms are spread across it in log order, and submission
  = completion - latency, so times are good to a fraction of a millisecond (the count can
  briefly read above the job's iodepth by that much).
"""

from __future__ import annotations

import io
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvrepro._checks import not_utf8

DIRECTIONS = ("read", "write", "trim")
PERCENTILES = (50.0, 90.0, 99.0, 99.9)
"""Percentiles kept from fio's report (fio's default list includes all four)."""

_LOG_BASE = ["time_ms", "value_ns", "direction_code", "block_size_bytes"]
_OPTION_COLUMNS = {"rw": "rw", "bs": "bs", "iodepth": "iodepth", "numjobs": "numjobs",
                   "ioengine": "ioengine", "direct": "direct", "filename": "filename"}


def load_fio_json(path: str | Path) -> dict[str, Any]:
    """fio's JSON report from the `--output` file (see `fio_json_from_text`); bytes that
    are not UTF-8 raise ValueError naming the file and line."""
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line, reason = not_utf8(err)
        raise ValueError(f"{path}:{line}: fio output is {reason}") from err
    return fio_json_from_text(text, source=str(path))


def fio_json_from_text(text: str, source: str = "fio output") -> dict[str, Any]:
    """fio's JSON report from its text.

    fio writes some warnings into the `--output` file ahead of the JSON (e.g. "fio:
    time_based requires a runtime/timeout setting"), so everything before the first `{` is
    skipped. Invalid JSON raises ValueError("source:line: ...", the line in the whole text).
    """
    start = text.find("{")
    if start < 0:
        raise ValueError(f"{source}: no JSON object in fio output: {text[:200]!r}")
    try:
        return json.loads(text[start:])
    except json.JSONDecodeError as err:
        line = text.count("\n", 0, start + err.pos) + 1
        raise ValueError(f"{source}:{line}: fio output is not valid JSON ({err.msg} at "
                         f"column {err.colno}); it starts: {text[start:start + 200]!r}") from err


class _BadField(ValueError):
    """A field of one job entry that is there but is not a count fio could have written;
    `parse_fio_json` adds the file and the job to its message."""


def _amount(block: Mapping[str, Any], key: str, where: str) -> float:
    """`block[key]` as a finite number >= 0, else _BadField naming `where.key`.

    Why: every number this table takes from fio (bytes, ms, I/Os, ns, ids, errno) is a
    count or a duration; a negative, infinite or non-numeric one (a hand-edited or corrupt
    report) would otherwise come out as a negative or NaN bandwidth without a word.
    """
    value = block[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _BadField(f"field '{where}.{key}' is {value!r}, not a number")
    if not math.isfinite(value) or value < 0:
        raise _BadField(f"field '{where}.{key}' is {value!r}, not a finite number >= 0")
    return value


def _whole(block: Mapping[str, Any], key: str, where: str) -> int:
    """`_amount` that must also be a whole number (bytes, I/Os, ids, errno)."""
    value = _amount(block, key, where)
    if value != int(value):
        raise _BadField(f"field '{where}.{key}' is {value!r}, not a whole number")
    return int(value)


def _percentile(block: Mapping[str, Any], pct: float, where: str) -> float:
    """One percentile (ns) of a fio `clat_ns` / `lat_ns` block, NaN if fio did not give it."""
    table = block.get("percentile") or {}
    key = f"{pct:.6f}"
    return _amount(table, key, f"{where}.percentile") if key in table else float("nan")


def _direction_row(job: Mapping[str, Any], direction: str,
                   options: Mapping[str, Any]) -> dict[str, Any]:
    stats, lat, clat = job[direction], job[direction]["lat_ns"], job[direction]["clat_ns"]
    runtime_ms = float(_amount(stats, "runtime", direction))
    io_bytes = _whole(stats, "io_bytes", direction)
    row: dict[str, Any] = {
        "jobname": job["jobname"], "groupid": _whole(job, "groupid", "job"),
        "error": _whole(job, "error", "job"), "direction": direction, "io_bytes": io_bytes,
        "runtime_ms": runtime_ms,
        "bw_bytes_s": io_bytes / (runtime_ms / 1e3) if runtime_ms else float("nan"),
        "fio_bw_bytes_s": float(_amount(stats, "bw_bytes", direction)),
        "iops": float(_amount(stats, "iops", direction)),
        "total_ios": _whole(stats, "total_ios", direction),
        "lat_mean_ns": float(_amount(lat, "mean", f"{direction}.lat_ns")),
        "lat_min_ns": float(_amount(lat, "min", f"{direction}.lat_ns")),
        "lat_max_ns": float(_amount(lat, "max", f"{direction}.lat_ns")),
        "clat_mean_ns": float(_amount(clat, "mean", f"{direction}.clat_ns")),
    }
    for pct in PERCENTILES:
        tag = f"{pct:g}".replace(".", "_")
        row[f"clat_p{tag}_ns"] = _percentile(clat, pct, f"{direction}.clat_ns")
        row[f"lat_p{tag}_ns"] = _percentile(lat, pct, f"{direction}.lat_ns")
    for key, column in _OPTION_COLUMNS.items():
        row[column] = options.get(key)
    return row


def parse_fio_json(data: Mapping[str, Any] | str | Path) -> pd.DataFrame:
    """Tidy table of a fio report: one row per job entry and direction that moved bytes.

    A job entry that moved nothing (e.g. it failed at once) still gets one row, for its
    first direction, so its `error` is not lost. Job options are the job's own merged over
    `global options`. Columns: jobname, groupid, error, direction, io_bytes, runtime_ms,
    bw_bytes_s (io_bytes / runtime), fio_bw_bytes_s (fio's bw_bytes), iops, total_ios,
    lat_{mean,min,max}_ns, clat_mean_ns, clat_p{50,90,99,99_9}_ns, lat_p..._ns (NaN unless
    the job set lat_percentiles), rw, bs, iodepth, numjobs, ioengine, direct, filename.
    A report without a field this needs, with no jobs, with a job entry that has no direction
    section, or with a negative, infinite or non-numeric count raises ValueError naming the
    file (or "fio report"), the job (index and name) and the field.
    """
    source = "fio report" if isinstance(data, Mapping) else str(data)
    report = data if isinstance(data, Mapping) else load_fio_json(data)
    if not isinstance(report.get("jobs"), list):
        raise ValueError(f"{source}: not a fio JSON report: no 'jobs' key with a list of jobs")
    if not report["jobs"]:
        raise ValueError(f"{source}: fio report lists no jobs ('jobs' is empty)")
    rows = []
    for index, job in enumerate(report["jobs"]):
        name = job.get("jobname") if isinstance(job, Mapping) else None
        try:
            rows.extend(_job_rows(job, report.get("global options") or {}))
        except _BadField as err:
            raise ValueError(f"{source}: job {index} ({name!r}): {err}") from err
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as err:
            raise ValueError(f"{source}: job {index} ({name!r}): missing or malformed field "
                             f"({type(err).__name__}: {err})") from err
    return pd.DataFrame(rows)


def _job_rows(job: Mapping[str, Any], global_options: Mapping[str, Any]) -> list[dict]:
    """The rows of one job entry (see `parse_fio_json`); an entry without any direction
    section (e.g. `{}`) is an error, not zero rows, so a broken report cannot pass as a
    job that did nothing."""
    present = [d for d in DIRECTIONS if d in job]
    if not present:
        raise _BadField(f"no {', '.join(DIRECTIONS)} section (an empty or cut job entry)")
    options = {**global_options, **job.get("job options", {})}
    moved = [d for d in present if _whole(job[d], "total_ios", d) > 0]
    return [_direction_row(job, direction, options) for direction in moved or present[:1]]


def fio_errors(data: Mapping[str, Any]) -> list[str]:
    """'job <name>: error <n> (<strerror>)' for every job entry fio reports an error for
    (a job entry or error field that cannot be read counts as an error too)."""
    out = []
    jobs = data.get("jobs", [])
    for job in jobs if isinstance(jobs, list) else [jobs]:
        try:
            code = int(job.get("error", 0))
        except (AttributeError, TypeError, ValueError, OverflowError):
            out.append(f"job entry {str(job)[:60]!r}: unreadable error field")
            continue
        if code:
            out.append(f"job {job.get('jobname')!r}: error {code} ({_strerror(code)})")
    return out


def _strerror(code: int) -> str:
    try:
        return os.strerror(code)
    except (ValueError, OverflowError):
        return "unknown error"


def group_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per group and direction: bytes of all its jobs over the longest runtime.

    This is fio's own group bandwidth ("Run status group N ... bw="): jobs of a group run
    side by side, so their bytes add up over the time the slowest one took.
    """
    grouped = table.groupby(["groupid", "direction"], sort=True)
    out = grouped.agg(io_bytes=("io_bytes", "sum"), runtime_ms=("runtime_ms", "max"),
                      total_ios=("total_ios", "sum"), n_jobs=("jobname", "size"),
                      error=("error", "max")).reset_index()
    out["bw_bytes_s"] = out["io_bytes"] / (out["runtime_ms"] / 1e3)
    return out


def read_lat_log(path: str | Path, has_offset: bool = True) -> pd.DataFrame:
    """One fio latency log (`log_avg_msec=0`: one row per I/O) as a table.

    Columns: time_ms (when the I/O completed, whole ms since the job started), value_ns,
    direction ("read", "write", "trim"), block_size_bytes, and offset_bytes / prio when
    present. `has_offset` says whether the job set `log_offset=1` (it tells a fifth column
    apart: the offset, or fio >= 3.2x's priority).
    """
    src = Path(path)
    data = src.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line, reason = not_utf8(err)
        raise ValueError(f"{src}:{line}: not a fio latency log: {reason}") from err
    try:
        raw = pd.read_csv(io.StringIO(text), header=None, skipinitialspace=True)
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise ValueError(f"{src}: not a fio latency log ({err})") from err
    extra = ["offset_bytes", "prio"] if has_offset else ["prio"]
    if raw.empty or not 4 <= raw.shape[1] <= 4 + len(extra):
        raise ValueError(f"{src}: not a fio latency log (expected 4 to {4 + len(extra)} "
                         f"columns, got {raw.shape[1]})")
    numeric = raw.apply(pd.to_numeric, errors="coerce")
    bad = (numeric.isna() & raw.notna()).any(axis=1)
    if bad.any():
        row = int(bad.idxmax())
        raise ValueError(f"{src}: not a fio latency log: row {row + 1} is not all numbers: "
                         f"{raw.loc[row].tolist()}")
    raw.columns = _LOG_BASE + extra[:raw.shape[1] - 4]
    raw["direction"] = raw.pop("direction_code").map(dict(enumerate(DIRECTIONS)))
    return raw


_LOG_NAME = re.compile(r"_(lat|clat|slat)\.(\d+)\.log$")


def lat_log_files(prefix: str | Path, kind: str = "lat") -> list[Path]:
    """The per-job log files fio wrote for `write_lat_log=<prefix>`, in job order."""
    base = Path(prefix)
    found = []
    for path in base.parent.glob(f"{base.name}_{kind}.*.log"):
        match = _LOG_NAME.search(path.name)
        if match and match.group(1) == kind:
            found.append((int(match.group(2)), path))
    return [p for _, p in sorted(found)]


def read_lat_logs(prefix: str | Path, kind: str = "lat") -> pd.DataFrame:
    """All jobs' `kind` logs (lat, clat or slat) of one run, with a `job` column (1, 2, ...)."""
    files = lat_log_files(prefix, kind)
    if not files:
        raise FileNotFoundError(f"no fio {kind} logs named {Path(prefix).name}_{kind}.N.log "
                                f"in {Path(prefix).parent}")
    parts = [read_lat_log(p).assign(job=int(_LOG_NAME.search(p.name).group(2)))
             for p in files]
    return pd.concat(parts, ignore_index=True)


def io_events(lat_log: pd.DataFrame) -> pd.DataFrame:
    """Per I/O: submission and completion time (ms) and latency, from a `lat` log.

    fio logs each completion in whole ms (truncated), in completion order. The k I/Os of one
    job logged in the same ms are spread evenly across it in that order (the i-th at
    ms + (i + 0.5) / k), which keeps their order and halves the worst-case error of placing
    them all mid-ms; submission = completion - total latency (exact, in ns). Times of
    several jobs share one axis (jobs of a group start together).
    """
    job = lat_log["job"] if "job" in lat_log else pd.Series(1, index=lat_log.index)
    by_bin = lat_log.groupby([job, lat_log["time_ms"]], sort=False)["time_ms"]
    rank, count = by_bin.cumcount(), by_bin.transform("size")
    out = pd.DataFrame({"job": job, "direction": lat_log["direction"],
                        "block_size_bytes": lat_log["block_size_bytes"],
                        "lat_s": lat_log["value_ns"] / 1e9})
    out["complete_ms"] = lat_log["time_ms"] + (rank + 0.5) / count
    out["submit_ms"] = out["complete_ms"] - lat_log["value_ns"] / 1e6
    return out


def in_flight(events: pd.DataFrame) -> pd.DataFrame:
    """I/Os in flight over time: a step function from `io_events`.

    Each I/O counts from its submission to its completion. At equal times submissions are
    counted before completions; one row per distinct time holds the counts after all of
    that time's events, so `in_flight` can never go below zero and ends at zero. Columns:
    time_ms, in_flight, submitted and completed (cumulative).
    """
    times = np.concatenate([events["submit_ms"].to_numpy(), events["complete_ms"].to_numpy()])
    steps = np.concatenate([np.ones(len(events), int), -np.ones(len(events), int)])
    order = np.lexsort((-steps, times))
    steps = steps[order]
    frame = pd.DataFrame({"time_ms": times[order], "in_flight": np.cumsum(steps),
                          "submitted": np.cumsum(steps > 0), "completed": np.cumsum(steps < 0)})
    return frame.groupby("time_ms", as_index=False).last()


def percentiles_ordered(values: Iterable[float]) -> bool:
    """True when the given percentiles (low to high) never decrease (NaNs skipped)."""
    arr = np.array([v for v in values if not np.isnan(v)], dtype=float)
    return bool(np.all(np.diff(arr) >= 0))


__all__ = ["PERCENTILES", "fio_errors", "fio_json_from_text", "group_summary", "in_flight",
           "io_events", "lat_log_files", "load_fio_json", "parse_fio_json",
           "percentiles_ordered", "read_lat_log", "read_lat_logs"]
