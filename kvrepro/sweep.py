"""Sweeps of twin runs on Ray: a grid of points, one tidy table of their headline numbers.

A *point* is a flat dict of parameters (`dram_gb`, `flash_gb`, `session_rate_per_min`,
`routing`, `n_servers`, `seed`, ...); a *point function* maps one point to one flat dict of
headline numbers. `run_sweep` runs every point of a grid as a Ray task (a local Ray by default,
a cluster with `address`) and writes each finished point as it finishes, so a sweep survives an
interrupted session and a rerun runs only the points that are missing:

    out_dir/sweep.json              the grid and the point function (checked on resume)
    out_dir/points/<point_id>.parquet   one row per finished point, written atomically
    out_dir/sweep.parquet           all points, one tidy table (rewritten at the end)
    out_dir/.sweep.lock             held (flock) by the one sweep that writes the folder

`read_sweep(out_dir)` reads the table from the points folder at any time, also mid-sweep.
An existing `out_dir` is written only when it is empty or holds `sweep.json`; any other is
refused (`RefusedFolder`) before anything is written or deleted there, and a resumed sweep
deletes only its own dead writers' temporary files (`TEMP_NAMES`).
A second sweep on a folder another sweep is writing is refused (`RefusedFolder`); a point
file that cannot be read back (cut short by a crash) is named, skipped by `read_sweep` and
run again on resume. A local Ray listens on 127.0.0.1 only, with token authentication.
Every row holds the point's parameters, `point_id`, `status` ("ok" or "failed"), `error`,
`wall_s` and the point function's headline columns. A failed point is recorded with its error
and does not stop the others; a finished point, failed or not, is not run again unless
`retry_failed`. Nothing here seeds a random generator: seeds are point parameters.

This is the runner only: it knows no engine, no server and no study. What a point means is
the point function's, which a caller passes (`run_sweep(..., point_fn=...)`) or a grid file
names (`point_function: module:function`, `load_grid`): the studies' what-if points (a twin
run of one configuration, priced; notebooks 07 and 13, `data/sweeps/*.yaml`) live with the
studies, above this module, and are never imported from here.
"""

from __future__ import annotations

import errno
import hashlib
import importlib
import itertools
import json
import logging
import os
import re
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from kvrepro._checks import load_yaml_model
from kvrepro._locks import FolderLock
from kvrepro._paths import RefusedFolder

log = logging.getLogger(__name__)

Scalar = StrictBool | StrictInt | StrictFloat | StrictStr | None
Point = dict[str, Any]
PointFn = Callable[[Point], Mapping[str, Any]]

SWEEP_FORMAT = 1
META_COLUMNS = ("point_id", "status", "error", "traceback", "wall_s")
"""Columns every row has besides the parameters and the headlines."""
RAY_MIN_VERSION = "2.59"
"""The first Ray whose local `ray.init` turns token authentication (`RAY_AUTH_MODE=token`,
Ray >= 2.52) on by itself: a sweep's local cluster is never open to other local users."""
LOCK_NAME = ".sweep.lock"
MANIFEST_NAME = "sweep.json"
"""The marker of a sweep folder: an existing folder without it is written only when empty."""
TEMP_NAMES = {
    "": re.compile(r"^\.(?:sweep\.json|sweep\.parquet)\.(?P<pid>\d+)\.tmp$"),
    "points": re.compile(r"^\.[0-9a-f]{16}\.parquet\.(?P<pid>\d+)\.tmp$")}
"""`_write_atomic`'s temporary names (`.<file name>.<writer's pid>.tmp`) of the only files a
sweep writes: in the folder (its manifest and table) and in points/ (a point's file)."""


# ---------------------------------------------------------------- points and grids

def point_id(point: Mapping[str, Any]) -> str:
    """A stable key of a point: the SHA-256 of its sorted parameters as JSON (16 hex digits).

    The same parameters give the same key in every session and on every machine (no Python
    hash seeds); 1 and 1.0 are different values, as YAML reads them."""
    text = json.dumps(dict(point), sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _check_point(point: Any, where: str) -> Point:
    if not isinstance(point, Mapping) or not point:
        raise ValueError(f"{where}: a point is a non-empty mapping of parameter -> value, "
                         f"got {point!r}")
    for key, value in point.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"{where}: parameter names are non-empty strings, got {key!r}")
        if key in META_COLUMNS:
            raise ValueError(f"{where}: parameter {key!r} is a reserved column name")
        if not (value is None or isinstance(value, bool | int | float | str)):
            raise ValueError(f"{where}: parameter {key!r} must be a number, string, bool or "
                             f"null, got {type(value).__name__} {value!r}")
    return dict(point)


def product_points(grid: Mapping[str, Sequence[Any]]) -> list[Point]:
    """The cartesian product of a mapping parameter -> list of values, in the given order."""
    for key, values in grid.items():
        if isinstance(values, str | bytes) or not isinstance(values, Sequence) or not values:
            raise ValueError(f"grid parameter {key!r}: expected a non-empty list of values, "
                             f"got {values!r}")
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True))
            for combo in itertools.product(*(grid[k] for k in keys))]


def expand_grid(grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]]) -> list[Point]:
    """The points of a grid: a mapping (cartesian product) or a list of point dicts.

    Every point is checked (flat, scalar values) and must be distinct: two equal points would
    share one result file."""
    raw = product_points(grid) if isinstance(grid, Mapping) else list(grid)
    points = [_check_point(p, f"point {i}") for i, p in enumerate(raw)]
    if not points:
        raise ValueError("the grid has no points")
    seen: dict[str, int] = {}
    for i, point in enumerate(points):
        key = point_id(point)
        if key in seen:
            raise ValueError(f"points {seen[key]} and {i} are the same point {point}")
        seen[key] = i
    return points


# ---------------------------------------------------------------- point functions

def point_function(version: str) -> Callable[[PointFn], PointFn]:
    """Mark a point function with a version: a sweep folder remembers it, and resuming with
    another version (the function's results changed) is an error, not a mix."""
    def mark(fn: PointFn) -> PointFn:
        fn.sweep_version = str(version)  # type: ignore[attr-defined]
        return fn
    return mark


def function_name(fn: PointFn) -> str:
    """`module:qualname` of a point function, what a sweep folder records."""
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


def load_point_function(name: str) -> PointFn:
    """Import a point function named `module:attribute`."""
    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        raise ValueError(f"point function {name!r}: expected 'module:function'")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"point function {name!r} not found: {err}") from err
    if not callable(fn):
        raise ValueError(f"point function {name!r} is not callable")
    return fn


def _identity(fn: PointFn) -> dict[str, Any]:
    return {"point_function": function_name(fn),
            "point_function_version": getattr(fn, "sweep_version", None)}


# ---------------------------------------------------------------- the sweep folder

def _points_dir(out_dir: Path) -> Path:
    return out_dir / "points"


def _fsync(path: Path, directory: bool = False) -> None:
    """Flush a file (or a folder's entries) to the disk."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Write to a temporary name next to `path` (the writer's pid in it), then rename: a
    reader never sees half. The file is flushed to the disk before the rename and the folder
    after it: else a power cut can keep the rename but not the data (a 0-byte point)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync(path.parent, directory=True)


def _alive(pid: int) -> bool:
    """Whether a process `pid` exists (another user's counts: it may still be writing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_dead_writers_temp(out: Path, sub: str) -> None:
    """Remove, in sweep folder `out` (or its `sub` folder), the temporary files of sweep
    writers that died mid-write: only the names a sweep gives them there (`TEMP_NAMES`),
    only regular files, and only when the pid in the name is gone or is this process (which
    holds the folder's lock and is not writing yet). Anything else is not this sweep's to
    delete: a user's `.thesis.tex.4000000.tmp` is left as it is."""
    folder = out / sub if sub else out
    for path in folder.glob(".*.tmp"):
        match = TEMP_NAMES[sub].match(path.name)
        if match is None or path.is_symlink() or not path.is_file():
            log.warning("%s: left as it is (not a sweep's temporary file)", path)
            continue
        pid = int(match["pid"])
        if pid != os.getpid() and _alive(pid):
            log.warning("%s: left as it is (its writer, pid %d, is alive)", path, pid)
            continue
        path.unlink(missing_ok=True)


def _sweep_folder(out: Path, locked: bool = False) -> None:
    """Refuse (`RefusedFolder`, before anything is written there) an existing `out` that is
    neither empty (a lock file a killed sweep left aside) nor a sweep folder (`sweep.json`, a
    regular file). Why: a sweep deletes temporary files in its folder and writes its own
    names there; in a user's folder that would touch what is not the sweep's. Before the
    lock is taken (`locked` false), a folder whose lock file exists is left to the lock: a
    starting sweep makes its lock before its first temporary file, and a second sweep must
    be refused as "another sweep", not because it saw that file."""
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir():
        raise RefusedFolder(f"{out}: not a folder; a sweep writes into a new or empty folder, "
                            "or resumes a sweep folder")
    marker = out / MANIFEST_NAME
    if marker.is_file() and not marker.is_symlink():
        return
    others = sorted(p.name for p in out.iterdir() if p.name != LOCK_NAME)
    if others and not locked and (out / LOCK_NAME).exists():
        return  # a sweep holds (or held) it: the lock decides, then this check runs again
    if others:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise RefusedFolder(f"{out}: not a sweep folder (no {MANIFEST_NAME}) and not empty "
                            f"({len(others)} entries: {shown}); a sweep writes into a new or "
                            "empty folder, or resumes a sweep folder")


@contextmanager
def _sweep_lock(out: Path) -> Iterator[None]:
    """Hold `out/.sweep.lock` (`kvrepro._locks`, the holder's pid written in it) while a
    sweep writes `out`: two sweeps on one folder would mix their grids' points under one
    manifest. Raises `RefusedFolder` naming the folder and the holder, or a lock that is a
    symbolic link (never followed); an existing folder that is not a sweep's is refused
    before the lock is made (`_sweep_folder`)."""
    _sweep_folder(out)
    out.mkdir(parents=True, exist_ok=True)
    lock = FolderLock(out / LOCK_NAME)
    try:
        other = lock.acquire(f"{os.getpid()}\n")
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise RefusedFolder(f"{lock.path}: a symbolic link where the sweep's lock file "
                                "belongs (not followed); remove it or use another folder"
                                ) from None
        raise
    if other is not None:
        raise RefusedFolder(f"{out}: another sweep (pid {other}) is writing this folder "
                            f"(it holds {lock.path}); wait for it to finish or use another "
                            "folder")
    try:
        _sweep_folder(out, locked=True)  # again: what was put there meanwhile counts
        yield
    finally:
        lock.release()


def _read_manifest(out: Path) -> dict[str, Any]:
    """`sweep.json`, checked to be a manifest; a broken one is an error naming it (and its
    line), not a bare JSONDecodeError."""
    manifest = out / MANIFEST_NAME
    try:
        had = json.loads(manifest.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{manifest}:{err.lineno}: not a sweep manifest: {err.msg} (column "
                         f"{err.colno}); use a new folder (or delete this one)") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"{manifest}: not a sweep manifest: not UTF-8 text ({err})") from None
    if not isinstance(had, dict) or not isinstance(had.get("points"), dict):
        raise ValueError(f"{manifest}: not a sweep manifest: expected an object whose "
                         "'points' maps point_id -> point")
    return had


def _remembered(out_dir: Path, fn: PointFn, points: list[Point]) -> None:
    """Record the grid and point function in `sweep.json`, or check them against it."""
    manifest = out_dir / MANIFEST_NAME
    wanted = {"format": SWEEP_FORMAT, **_identity(fn),
              "points": {point_id(p): p for p in points}}
    if not manifest.is_file():
        if _points_dir(out_dir).is_dir() and any(_points_dir(out_dir).glob("*.parquet")):
            raise ValueError(f"{out_dir}: holds point files but no sweep.json; not a sweep "
                             "folder this version wrote (use a new folder)")
        out_dir.mkdir(parents=True, exist_ok=True)
        _write_atomic(manifest, lambda p: p.write_text(json.dumps(wanted, indent=1) + "\n"))
        return
    had = _read_manifest(out_dir)
    for key in ("format", "point_function", "point_function_version"):
        if had.get(key) != wanted[key]:
            raise ValueError(f"{out_dir}: this sweep folder was run with {key} "
                             f"{had.get(key)!r}, not {wanted[key]!r}; use a new folder "
                             "(or delete this one) rather than mix results")
    old, new = set(had.get("points", {})), set(wanted["points"])
    if old != new:
        raise ValueError(f"{out_dir}: this sweep folder holds another grid ({len(old - new)} "
                         f"of its points are not in this grid, {len(new - old)} of this grid's "
                         "are new); use a new folder (or delete this one) rather than mix "
                         "results")


def _read_point(path: Path) -> pd.DataFrame:
    """One point file, checked: one row of its own point with a status; else ValueError
    naming the file (a file cut short by a crash or a full disk)."""
    try:
        frame = pd.read_parquet(path)
    except (pa.ArrowException, OSError, ValueError) as err:
        raise ValueError(f"{path}: unreadable point file ({type(err).__name__}: {err})") from err
    ids = list(frame["point_id"]) if "point_id" in frame else []
    if ids != [path.stem] or "status" not in frame:
        raise ValueError(f"{path}: not the point file of point {path.stem} (one row with its "
                         f"point_id and a status; got {len(frame)} row(s), ids {ids[:3]})")
    return frame


def _read_points(out: Path, ids: Sequence[str], strict: bool,
                 unreadable_note: str) -> dict[str, pd.DataFrame]:
    """The readable point files of `ids` (those with a file). An unreadable one raises
    (`strict`) or is logged with `unreadable_note` and left out."""
    frames = {}
    for key in ids:
        path = _points_dir(out) / f"{key}.parquet"
        if not path.is_file():
            continue
        try:
            frames[key] = _read_point(path)
        except ValueError as err:
            if strict:
                raise
            log.warning("%s: %s", err, unreadable_note)
    return frames


def _done_ids(out_dir: Path, points: Sequence[Point], retry_failed: bool) -> set[str]:
    """Points with a readable result file (failed ones too, unless `retry_failed`); an
    unreadable file is named and its point runs again."""
    frames = _read_points(out_dir, [point_id(p) for p in points], strict=False,
                          unreadable_note="the point runs again")
    return {key for key, frame in frames.items()
            if not (retry_failed and (frame.status != "ok").any())}


def _write_point(out_dir: Path, row: Mapping[str, Any]) -> None:
    frame = pd.DataFrame([dict(row)])
    _write_atomic(_points_dir(out_dir) / f"{row['point_id']}.parquet",
                  lambda p: frame.to_parquet(p, index=False))


def _tidy_columns(table: pd.DataFrame, points: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Parameters first (in the grid's order), then point_id and status, the headlines, and
    wall time, error and traceback last."""
    params = list(dict.fromkeys(k for p in points for k in p))
    tail = ["wall_s", "error", "traceback"]
    head = [c for c in [*params, "point_id", "status"] if c in table]
    rest = [c for c in table if c not in head and c not in tail]
    return table[head + rest + [c for c in tail if c in table]]


def read_sweep(out_dir: str | Path, *, strict: bool = False) -> pd.DataFrame:
    """Every finished point of a sweep folder, one row each, in the grid's order.

    Reads the points folder, so it works while a sweep runs or after it was interrupted. A
    point file that cannot be read back is named in a warning and left out (a resumed sweep
    runs it again), or, with `strict`, a ValueError naming it."""
    out = Path(out_dir)
    if not (out / MANIFEST_NAME).is_file():
        raise FileNotFoundError(f"{out}: not a sweep folder (no {MANIFEST_NAME})")
    points = _read_manifest(out)["points"]
    frames = _read_points(out, list(points), strict, unreadable_note="left out of the table")
    rows = [row for frame in frames.values() for row in frame.to_dict("records")]
    if not rows:
        return pd.DataFrame(columns=list(META_COLUMNS))
    return _tidy_columns(pd.DataFrame(rows), list(points.values()))


# ---------------------------------------------------------------- running on Ray

def _headlines(point: Point, returned: Mapping[str, Any]) -> dict[str, Any]:
    """A point function's columns, checked: none may be a reserved column, and one named as
    a parameter must repeat the parameter's value (then the parameter's column holds it)."""
    reserved = sorted(set(returned) & set(META_COLUMNS))
    differ = sorted(k for k in set(returned) & set(point) if returned[k] != point[k])
    if reserved or differ:
        raise ValueError(f"point function returned reserved column(s) {reserved} or "
                         f"parameter column(s) {differ} with another value than the point's")
    return {k: v for k, v in returned.items() if k not in point}


def evaluate_point(point_fn: PointFn, point: Point) -> dict[str, Any]:
    """Run one point and return its row: parameters, `point_id`, status, error, wall time and
    headlines. Never raises for the point's own failure: that is the row's `error`."""
    started = time.perf_counter()
    row: dict[str, Any] = {**point, "point_id": point_id(point), "status": "ok", "error": "",
                           "traceback": ""}
    try:
        row.update(_headlines(point, point_fn(dict(point))))
    except Exception as err:  # any failure of a point is recorded, not raised
        row.update(status="failed", error=f"{type(err).__name__}: {err}",
                   traceback=traceback.format_exc(limit=8))
    row["wall_s"] = time.perf_counter() - started
    return row


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as err:
        raise ImportError("sweeps run on Ray, which is not installed: pip install "
                          f"'kvrepro[sweep]' (or 'ray>={RAY_MIN_VERSION}')") from err
    from packaging.version import Version

    if Version(ray.__version__) < Version(RAY_MIN_VERSION):
        raise ImportError(f"sweeps need Ray >= {RAY_MIN_VERSION} (token authentication), "
                          f"found {ray.__version__}: pip install 'kvrepro[sweep]'")
    return ray


@contextmanager
def _loopback_node() -> Iterator[None]:
    """While a local Ray starts: make it a single-machine node on 127.0.0.1, as Ray does on
    macOS and Windows (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`), so that its GCS, raylet,
    workers and agents listen on the loopback only, not on every interface
    (`ray.init(_node_ip_address="127.0.0.1")` is turned into the machine's address). Ray reads
    the variable when it is imported: the driver's copy is set too, and both are restored
    once the node runs (it keeps its address)."""
    constants = importlib.import_module("ray._private.ray_constants")
    name = constants.ENABLE_RAY_CLUSTERS_ENV_VAR
    saved_env, saved = os.environ.get(name), constants.ENABLE_RAY_CLUSTER
    os.environ[name], constants.ENABLE_RAY_CLUSTER = "0", False
    try:
        yield
    finally:
        constants.ENABLE_RAY_CLUSTER = saved
        if saved_env is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved_env


def _start_ray(ray: Any, address: str | None, max_parallel: int | None) -> bool:
    """Connect to Ray; True when this call started it (and must shut it down).

    An already initialised Ray session (a notebook's, a test fixture's) is used as it is."""
    if ray.is_initialized():
        if address:
            log.warning("Ray is already running in this process: address %s not used", address)
        return False
    if address:
        ray.init(address=address, logging_level=logging.WARNING)
    else:
        with _loopback_node():
            ray.init(num_cpus=max_parallel, include_dashboard=False,
                     logging_level=logging.WARNING)
        if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
            log.warning("the local Ray runs without token authentication (RAY_AUTH_MODE=%s): "
                        "Ray >= 2.59 turns it on itself; on older Ray set RAY_AUTH_MODE=token "
                        "before Python starts", os.environ.get("RAY_AUTH_MODE", "unset"))
    return True


def _slots(ray: Any, max_parallel: int | None) -> int:
    """How many points run at once: `max_parallel`, else the cluster's CPUs."""
    if max_parallel is not None:
        return max_parallel
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def _crashed_row(point: Point, err: BaseException) -> dict[str, Any]:
    """The row of a point whose Ray task died (worker killed, out of memory)."""
    return {**point, "point_id": point_id(point), "status": "failed",
            "error": f"{type(err).__name__}: {err}", "traceback": "", "wall_s": float("nan")}


def _run_tasks(ray: Any, point_fn: PointFn, todo: list[Point], out_dir: Path, slots: int,
               bar: Any) -> int:
    """Submit at most `slots` points at a time; write each as it finishes. Returns failures."""
    task = ray.remote(num_cpus=1, max_retries=0)(evaluate_point)
    fn_ref = ray.put(point_fn)
    pending: dict[Any, Point] = {}
    queue, failed = list(todo), 0
    try:
        while queue or pending:
            while queue and len(pending) < slots:
                point = queue.pop(0)
                pending[task.remote(fn_ref, point)] = point
            ready, _ = ray.wait(list(pending), num_returns=1)
            point = pending.pop(ready[0])
            try:
                row = ray.get(ready[0])
            except Exception as err:  # a dead task is a failed point
                row = _crashed_row(point, err)
            _write_point(out_dir, row)
            failed += row["status"] != "ok"
            bar.update(1)
            bar.set_postfix(failed=failed, refresh=False)
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
    return failed


def _check_points(points: list[Point], point_fn: PointFn) -> None:
    """Check the points with the point function's `check`, before anything is written."""
    check = getattr(point_fn, "check", None)
    for i, point in enumerate(points):
        if check is not None:
            check(point, where=f"point {i} {point}")


def _prepare(points: list[Point], out: Path, point_fn: PointFn,
             retry_failed: bool) -> list[Point]:
    """With the folder's lock held: remember or check the folder's grid, remove the
    temporary files of dead writers, and return the points still to run."""
    _remembered(out, point_fn, points)
    _points_dir(out).mkdir(parents=True, exist_ok=True)
    for sub in TEMP_NAMES:
        _remove_dead_writers_temp(out, sub)
    done = _done_ids(out, points, retry_failed)
    todo = [p for p in points if point_id(p) not in done]
    if len(todo) < len(points):
        log.warning("%s: %d of %d points already finished, not run again", out,
                    len(points) - len(todo), len(points))
    return todo


def run_sweep(grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]],
              out_dir: str | Path, *, point_fn: PointFn,
              address: str | None = None, max_parallel: int | None = None,
              progress: bool = True, retry_failed: bool = False) -> pd.DataFrame:
    """Run every point of `grid` not yet in `out_dir` as a Ray task; return the whole table.

    `grid`: a mapping parameter -> list of values (cartesian product) or a list of point
    dicts. `point_fn` maps a point to its headline numbers (no default: what a point means
    is the caller's, e.g. the studies' what-if `default_point`); it is checked up front with
    its `check` attribute if it has one. `address`: a Ray cluster
    (`ray.init(address=...)`); default a local Ray with `max_parallel` CPUs (all by default).
    An already running Ray session is used as it is. Ray is shut down on every exit path when
    this call started it. The table has `attrs` `skipped`, `ran`, `failed` and `wall_s`.
    The folder is locked while the sweep runs: a second sweep on it raises `RefusedFolder`.
    """
    from tqdm.auto import tqdm

    if max_parallel is not None and max_parallel < 1:
        raise ValueError(f"max_parallel must be >= 1, got {max_parallel}")
    out = Path(out_dir)
    points = expand_grid(grid)
    _check_points(points, point_fn)
    with _sweep_lock(out):
        todo = _prepare(points, out, point_fn, retry_failed)
        skipped = len(points) - len(todo)
        started, failed = time.perf_counter(), 0
        if todo:
            ray = _import_ray()
            owns = _start_ray(ray, address, max_parallel)
            try:
                with tqdm(total=len(points), initial=skipped, unit="point",
                          disable=not progress, desc=f"sweep {out.name}") as bar:
                    failed = _run_tasks(ray, point_fn, todo, out, _slots(ray, max_parallel),
                                        bar)
            finally:
                if owns:
                    ray.shutdown()
        table = read_sweep(out)
        _write_atomic(out / "sweep.parquet", lambda p: table.to_parquet(p, index=False))
    table.attrs.update(skipped=skipped, ran=len(todo), failed=failed,
                       wall_s=time.perf_counter() - started)
    return table


# ---------------------------------------------------------------- the Pareto view

def _better(values: pd.Series, how: str, name: str) -> pd.Series:
    """Values turned so that larger is better (`how`: "max" or "min")."""
    if how not in ("max", "min"):
        raise ValueError(f"pareto_front: {name} must be 'max' or 'min', got {how!r}")
    return values if how == "max" else -values


def pareto_front(table: pd.DataFrame, x: str, y: str, *, x_better: str = "max",
                 y_better: str = "min") -> pd.DataFrame:
    """The rows no other row beats on both `x` and `y` (non-dominated), sorted by `x`.

    Defaults: the larger `x` (throughput per dollar) and the smaller `y` (p90 TTFT) are
    better. A row is dominated when another is at least as good on both and better on one;
    equal rows are all kept. Rows that failed (`status` != "ok") or lack `x` or `y` are left
    out."""
    missing = [c for c in (x, y) if c not in table]
    if missing:
        raise ValueError(f"pareto_front: no column(s) {missing}; columns: {list(table)}")
    ok = table if "status" not in table else table[table["status"] == "ok"]
    ok = ok[ok[x].notna() & ok[y].notna()]
    gx, gy = _better(ok[x].astype(float), x_better, "x_better"), _better(
        ok[y].astype(float), y_better, "y_better")
    best_y_before = float("-inf")  # best y among rows with a strictly better x
    keep: list[Any] = []
    for _, group in reversed(list(gy.groupby(gx, sort=True))):
        group_best = group.max()
        keep += [i for i, v in group.items() if v >= group_best and v > best_y_before]
        best_y_before = max(best_y_before, group_best)
    return ok.loc[keep].sort_values(x, kind="stable")


# ---------------------------------------------------------------- grid files

class GridFile(BaseModel):
    """A sweep grid in YAML: the points and the point function that runs them.

    The points are the union of the `grid` products (one mapping, or a list of mappings,
    each a cartesian product) and the explicit `points`, each merged with `fixed`."""

    model_config = ConfigDict(extra="forbid")

    description: str = Field("", description="what the sweep asks")
    point_function: str = Field(description="module:function that maps a point to its "
                                "headline numbers (required: the runner has no default)")
    fixed: dict[str, Scalar] = Field(default_factory=dict, description="parameters every "
                                     "point has")
    grid: dict[str, list[Scalar]] | list[dict[str, list[Scalar]]] = Field(
        default_factory=dict, description="parameter -> values (a cartesian product), or a "
                                          "list of such products")
    points: list[dict[str, Scalar]] = Field(default_factory=list, description="explicit "
                                            "points, besides the grid's")

    def expanded(self) -> list[Point]:
        """All points, `fixed` merged in (a parameter in `fixed` and in a point is an error)."""
        products = [self.grid] if isinstance(self.grid, dict) else self.grid
        raw = [p for g in products if g for p in product_points(g)] + list(self.points)
        merged = []
        for i, point in enumerate(raw):
            both = sorted(set(point) & set(self.fixed))
            if both:
                raise ValueError(f"point {i}: parameter(s) {both} are also in 'fixed'")
            merged.append({**self.fixed, **point})
        return expand_grid(merged)


def load_grid(path: str | Path) -> tuple[list[Point], PointFn, GridFile]:
    """Read a grid file (a path, or the name of a shipped one in `data/sweeps/`, e.g.
    `whatif_48`): its points, its point function (each point checked by it) and the file's
    model. Errors name the file and the key."""
    src = Path(path)
    if not src.is_file() and src.suffix == "" and src.name == str(path):
        from kvrepro._paths import data_dir

        src = data_dir() / "sweeps" / f"{path}.yaml"  # a shipped grid by name
    if not src.is_file():
        raise FileNotFoundError(f"sweep grid not found: {path}")
    spec = load_yaml_model(src, GridFile, "sweep grid")
    try:
        fn = load_point_function(spec.point_function)
        points = spec.expanded()
        check = getattr(fn, "check", None)
        for i, point in enumerate(points):
            if check is not None:
                check(point, where=f"point {i}")
    except ValueError as err:
        raise ValueError(f"{src}: {err}") from err
    return points, fn, spec


# ---------------------------------------------------------------- notebook folders

def sweep_folder(sweep_dir: str | Path = "", parent: str | Path = "") -> Path:
    """The folder a notebook's sweep writes: `sweep_dir` when set (a rerun resumes it), else
    a new empty folder (under `parent` when set, else the system's temporary folder), so that
    a run never mixes with an older sweep's points."""
    import tempfile

    if str(sweep_dir):
        return Path(sweep_dir)
    if str(parent):
        Path(parent).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="sweep_", dir=str(parent) or None))
