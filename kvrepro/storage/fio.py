"""A fio driver: job files for a sweep, runs on the user's targets, raw output kept, cleanup.

Why fio: it is what storage engineers already trust for drive measurements, so a number from
here can be checked against their own. `FioBench` owns one run directory and a set of
targets; every fio call leaves its job file, its JSON report (`--output-format=json`), its
stderr and, when asked, its per-I/O latency logs in that directory, written as each point
finishes.

Targets are protected:

* a directory gets a new file of the bench's own (`kvrepro-fio-<n>-<random>.dat`);
* a path that does not exist is created;
* an existing regular file is refused unless `allow_existing=True`, a block device unless
  `allow_block_device=True` (a write point would overwrite what is on them);
* files the bench creates are written once in full (so reads hit real blocks, not holes
  that the file system answers without touching the drive), and only those are removed by
  `cleanup()` (also on leaving a `with` block).

What `cleanup()` may delete is proven, not read back from disk. Each file the bench creates
(`O_CREAT | O_EXCL`) is recorded in memory with its device, inode, size and mtime, and the
bench keeps the creating descriptor open until cleanup, so that inode cannot be freed and its
number handed to another file. After each fio call (the fill, every point) the size and mtime
are taken again from that descriptor: the state after the driver's last write. A file is
removed only if it is in this bench's own record, the path is still a regular file with the
recorded (st_dev, st_ino), and its size and mtime are still those after the driver's last
write; anything else (replaced, turned into a symlink, written by someone else since, an
unlink that fails) is skipped, named in a `FioCleanupWarning` and in `cleanup_skipped`, and
the rest are still removed.

`<run_dir>/created_files.json` lists the record for people (written atomically as files are
created and after cleanup, then holding only what was left behind). It is never read to
decide a deletion: a reused run folder whose manifest lists files this bench did not create
(another run's leftovers, or a forged list) is refused with `RefusedFolder`, naming them.

Errors say what to do: `FioNotFoundError` (how to install fio), `FioError` (fio's own error
text quoted), `FioTargetError` (refused or unwritable target, naming the path).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import uuid
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, model_validator
from tqdm.auto import tqdm

from kvrepro._paths import RefusedFolder
from kvrepro.storage import parse

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
FIO_INSTALL_HINT = ("install it with `apt-get install fio` (Debian/Ubuntu, as root; "
                    "`make fio` does this), `dnf install fio` (Fedora/RHEL) or "
                    "`brew install fio` (macOS), or pass fio_path=")
MANIFEST = "created_files.json"
Engine = Literal["io_uring", "libaio", "psync"]
Direction = Literal["read", "write", "randread", "randwrite"]
SECTOR_BYTES = 4096
"""Direct I/O needs sizes aligned to the drive's logical block; 4 KiB suits every drive."""


class FioError(RuntimeError):
    """fio ran and failed; the message quotes fio's own error text."""


class FioNotFoundError(FileNotFoundError):
    """No fio binary where it was looked for."""


class FioTargetError(ValueError):
    """A target the bench refuses to use, or cannot create."""


class FioCleanupWarning(UserWarning):
    """`FioBench.cleanup()` left a file it created in place (why: in the message)."""


# --------------------------------------------------------------------------- fio itself


def find_fio(fio_path: str = "fio") -> str:
    """The full path of the fio binary, or FioNotFoundError saying how to install it."""
    found = shutil.which(fio_path)
    if found is None:
        raise FioNotFoundError(f"fio not found (looked for {fio_path!r}); {FIO_INSTALL_HINT}")
    return found


def fio_version(fio_path: str = "fio") -> str:
    """`fio --version`, e.g. 'fio-3.33'."""
    done = subprocess.run([find_fio(fio_path), "--version"], capture_output=True, text=True,
                          check=False)
    return done.stdout.strip() or done.stderr.strip()


def is_block_device(path: str | Path) -> bool:
    """True when `path` exists and is a block device (a whole drive or a partition)."""
    try:
        return stat.S_ISBLK(os.stat(path).st_mode)
    except OSError:  # missing, or a parent is not a directory
        return False


# --------------------------------------------------------------------------- job files


class FioPoint(BaseModel):
    """One measurement: one fio run of one I/O pattern on `n_targets` targets at once."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rw: Direction = Field("read", description="read, write, randread or randwrite")
    block_size_bytes: int = Field(gt=0, description="request size, bytes")
    iodepth: int = Field(1, gt=0, description="I/Os in flight per job (psync: always 1)")
    numjobs: int = Field(1, gt=0, description="issuing threads (processes) per target")
    n_targets: int = Field(1, gt=0, description="targets read side by side")
    engine: Engine = Field("io_uring", description="io_uring, libaio or psync")
    direct: bool = Field(True, description="O_DIRECT: bypass the page cache")
    runtime_s: float | None = Field(1.0, gt=0, description="time-based run of this length")
    io_size_bytes: int | None = Field(None, gt=0, description="bytes per job instead of a "
                                                              "runtime (wraps over the file)")
    lat_log: bool = Field(False, description="write per-I/O latency logs (lat, clat, slat)")

    @model_validator(mode="after")
    def _valid(self) -> FioPoint:
        if self.direct and self.block_size_bytes % SECTOR_BYTES:
            raise ValueError(f"block_size_bytes {self.block_size_bytes} must be a multiple of "
                             f"{SECTOR_BYTES} for direct I/O")
        if (self.runtime_s is None) == (self.io_size_bytes is None):
            raise ValueError("give exactly one of runtime_s and io_size_bytes")
        return self

    def name(self) -> str:
        """File-name stem, unique per parameter set: read-bs4096-qd1-j1-t1-io_uring."""
        size = f"-io{self.io_size_bytes}" if self.io_size_bytes else ""
        return (f"{self.rw}-bs{self.block_size_bytes}-qd{self.iodepth}-j{self.numjobs}"
                f"-t{self.n_targets}-{self.engine}{size}")

    def buffer_bytes(self) -> int:
        """Memory fio allocates for I/O buffers: bs x iodepth per job."""
        return self.block_size_bytes * self.iodepth * self.numjobs * self.n_targets


def _fio_filename(path: Path) -> str:
    """fio splits `filename` on ':'; escape it."""
    return str(path).replace(":", "\\:")


def build_job_file(point: FioPoint, targets: Sequence[Path], size_bytes: int,
                   lat_log_prefix: Path | None = None) -> str:
    """fio job file for `point` on the first `point.n_targets` targets.

    All jobs are one group with `group_reporting`, so fio reports the point's aggregate
    bandwidth and exact merged latency percentiles. With numjobs > 1 every job gets its own
    slice of the file (`offset_increment`), so clones do not reread one another's blocks.
    """
    if len(targets) < point.n_targets:
        raise ValueError(f"point needs {point.n_targets} targets, {len(targets)} given")
    per_job = size_bytes // point.numjobs // point.block_size_bytes * point.block_size_bytes
    if per_job < point.block_size_bytes:
        raise ValueError(f"file of {size_bytes} B split over {point.numjobs} jobs holds no "
                         f"{point.block_size_bytes}-B request; use a larger file")
    lines = ["[global]", f"ioengine={point.engine}", f"direct={int(point.direct)}",
             f"rw={point.rw}", f"bs={point.block_size_bytes}", f"iodepth={point.iodepth}",
             f"numjobs={point.numjobs}", f"size={per_job}", f"offset_increment={per_job}",
             "group_reporting=1", "lat_percentiles=1", "randrepeat=0", "norandommap=1"]
    if point.runtime_s is not None:
        lines += [f"runtime={max(1, round(point.runtime_s * 1e3))}ms", "time_based=1"]
    else:
        lines.append(f"io_size={point.io_size_bytes}")
    if point.lat_log:
        if lat_log_prefix is None:
            raise ValueError("lat_log needs a lat_log_prefix")
        lines += [f"write_lat_log={lat_log_prefix}", "log_avg_msec=0", "log_offset=1"]
    for i, target in enumerate(targets[:point.n_targets]):
        lines += ["", f"[target{i}]", f"filename={_fio_filename(target)}"]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- running fio


@dataclass
class FioRun:
    """One finished fio call: where its files are, and its report."""

    name: str
    job_path: Path
    json_path: Path
    report: dict[str, Any]
    lat_log_prefix: Path | None = None

    def table(self) -> pd.DataFrame:
        """`parse.parse_fio_json` of the report."""
        return parse.parse_fio_json(self.report)

    def lat_log(self, kind: str = "lat") -> pd.DataFrame:
        """All jobs' per-I/O `kind` log (lat, clat or slat)."""
        if self.lat_log_prefix is None:
            raise ValueError(f"fio run {self.name!r} wrote no latency logs (lat_log=False)")
        return parse.read_lat_logs(self.lat_log_prefix, kind)


def run_fio(job_text: str, run_dir: str | Path, name: str, fio_path: str = "fio",
            timeout_s: float | None = 600.0, lat_log_prefix: Path | None = None) -> FioRun:
    """Write `<name>.fio`, run fio on it, keep `<name>.json` and `<name>.stderr`.

    Raises FioError quoting fio's stderr when fio exits non-zero or a job reports an error.
    """
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    job_path, json_path = out / f"{name}.fio", out / f"{name}.json"
    job_path.write_text(job_text)
    cmd = [find_fio(fio_path), "--output-format=json", f"--output={json_path}", str(job_path)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired as err:
        raise FioError(f"fio run {name!r} did not finish in {timeout_s} s ({job_path})") from err
    (out / f"{name}.stderr").write_text(done.stderr)
    report = _report_or_none(json_path)
    problems = parse.fio_errors(report) if report else []
    if done.returncode != 0 or problems or report is None:
        said = done.stderr.strip() or done.stdout.strip() or "(fio printed nothing)"
        raise FioError(f"fio failed on {name!r} (exit code {done.returncode}; job file "
                       f"{job_path}): {said}" + (f" [{'; '.join(problems)}]" if problems else ""))
    return FioRun(name, job_path, json_path, report, lat_log_prefix)


def _absolute(path: Path) -> Path:
    """`path` made absolute without following links (the record's key: a link planted in
    its place later must not be taken for the file)."""
    return Path(os.path.abspath(path))


def _manifest_paths(manifest: Path) -> list[Path]:
    """The paths a `created_files.json` lists (entries as path strings, the older format,
    or objects with a "path"); ValueError if it is not such a list."""
    data = json.loads(manifest.read_text())
    entries = data.get("created") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError("no 'created' list")
    paths = [e.get("path") if isinstance(e, dict) else e for e in entries]
    if not all(isinstance(p, str) for p in paths):
        raise ValueError("an entry without a path")
    return [_absolute(Path(p)) for p in paths]


def _report_or_none(json_path: Path) -> dict[str, Any] | None:
    if not json_path.is_file():
        return None
    try:
        return parse.load_fio_json(json_path)
    except ValueError:
        return None


# --------------------------------------------------------------------------- the bench


@dataclass(frozen=True)
class CreatedFile:
    """A file the bench created: which inode it is, and its size and mtime after the
    driver's last write (what `cleanup()` checks before removing it)."""

    path: Path
    device: int
    inode: int
    size_bytes: int
    mtime_ns: int

    @classmethod
    def from_stat(cls, path: Path, st: os.stat_result) -> CreatedFile:
        return cls(path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "device": self.device, "inode": self.inode,
                "size_bytes": self.size_bytes, "mtime_ns": self.mtime_ns}


@dataclass
class FioBench:
    """Targets prepared for fio, a run directory, and cleanup of what the bench created.

    Use as a context manager (`with FioBench([...], run_dir, size) as bench:`), or call
    `prepare()` and `cleanup()` yourself. After `cleanup()`, `cleanup_skipped` holds
    (path, reason) for each created file it did not remove.
    """

    targets: Sequence[str | Path]
    run_dir: Path
    size_bytes: int
    fio_path: str = "fio"
    allow_existing: bool = False
    allow_block_device: bool = False
    fill_block_size_bytes: int = 1 * MIB
    max_buffer_bytes: int = 2 * GIB
    paths: list[Path] = field(default_factory=list)
    cleanup_skipped: list[tuple[Path, str]] = field(default_factory=list, init=False)
    _created: dict[Path, CreatedFile] = field(default_factory=dict, init=False, repr=False)
    _handles: dict[Path, int] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        if not self.targets:
            raise ValueError("parameter 'targets' is empty: give a directory, file or device")
        if self.size_bytes < self.fill_block_size_bytes:
            raise ValueError(f"parameter 'size_bytes' ({self.size_bytes}) must be at least "
                             f"{self.fill_block_size_bytes}")
        self.size_bytes -= self.size_bytes % self.fill_block_size_bytes  # whole fill blocks

    def __enter__(self) -> FioBench:
        self.prepare()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    # ---- targets

    def prepare(self) -> list[Path]:
        """Check every target, create (and fill) the bench's own files; return the paths."""
        find_fio(self.fio_path)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._refuse_foreign_manifest()
        self.paths = []
        try:
            for i, target in enumerate(self.targets):
                path, new = self._resolve(Path(target), i)
                if new:
                    self._create(path)
                    self._fill(path, i)
                self.paths.append(path)
        except BaseException:
            self.cleanup()  # a `with` block never starts: remove what was created so far
            raise
        return self.paths

    def _refuse_foreign_manifest(self) -> None:
        """RefusedFolder if the run folder's manifest lists files this bench did not create.

        Why refuse rather than overwrite: such a list is another run's record of files it
        left behind (or a forged one); it must never lead to a deletion, and overwriting it
        would lose the only note of what to clean up by hand.
        """
        manifest = self.run_dir / MANIFEST
        try:
            st = os.lstat(manifest)
        except FileNotFoundError:
            return
        try:
            if not stat.S_ISREG(st.st_mode):
                raise ValueError("not a regular file")
            listed = _manifest_paths(manifest)
        except (OSError, ValueError) as err:
            raise RefusedFolder(f"{manifest}: cannot be read as this package's list of created "
                                f"files ({err}); remove it or use another run_dir") from err
        foreign = [p for p in listed if p not in self._created]
        if foreign:
            raise RefusedFolder(f"{manifest} lists {len(foreign)} file(s) this run did not "
                                f"create ({', '.join(map(str, foreign[:3]))}); kvrepro will not "
                                "delete or reuse them: check and remove them yourself and "
                                "delete the manifest, or use another run_dir")

    def _resolve(self, target: Path, index: int) -> tuple[Path, bool]:
        """(the path fio will use, whether the bench must create it)."""
        if is_block_device(target):
            if not self.allow_block_device:
                raise FioTargetError(f"target {target} is a block device: write points would "
                                     "overwrite it; pass allow_block_device=True if that is "
                                     "what you want")
            return target, False
        if target.is_dir():
            return target / f"kvrepro-fio-{index}-{uuid.uuid4().hex[:8]}.dat", True
        if target.exists():
            if self._why_not_own(_absolute(target)) is None or self.allow_existing:
                return target, False
            raise FioTargetError(f"target {target} is an existing file kvrepro did not create; "
                                 "pass allow_existing=True to let fio read and write it")
        return target, True

    def _create(self, path: Path) -> None:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except OSError as err:
            raise FioTargetError(f"cannot create fio target {path}: {err.strerror} "
                                 f"(is {path.parent} a writable directory?)") from err
        key = _absolute(path)
        self._handles[key] = fd  # held open: the inode cannot be freed and reused
        self._created[key] = CreatedFile.from_stat(key, os.fstat(fd))
        self._write_manifest()
        # full length before fio sees it: fio "lays out" (unlinks and recreates) a file
        # shorter than its job's size, and a recreated file is a new inode, not the one recorded
        try:
            os.ftruncate(fd, self.size_bytes)
        except OSError as err:
            raise FioTargetError(f"cannot size fio target {path} to {self.size_bytes} B: "
                                 f"{err.strerror}") from err
        self._restamp()

    def _fill(self, path: Path, index: int) -> None:
        """Write the whole file once (fio, sequential, direct) so reads hit real blocks."""
        point = FioPoint(rw="write", block_size_bytes=self.fill_block_size_bytes, iodepth=16,
                         engine="libaio" if sys.platform.startswith("linux") else "psync",
                         runtime_s=None, io_size_bytes=self.size_bytes)
        text = build_job_file(point, [path], self.size_bytes)
        try:
            run_fio(text, self.run_dir, f"fill-target{index}", self.fio_path)
        finally:
            self._restamp()

    def _restamp(self) -> None:
        """Size and mtime of every created file after the driver's fio call, read from the
        descriptor the bench holds (so from its own inode, whatever the path names now)."""
        for key, fd in self._handles.items():
            self._created[key] = CreatedFile.from_stat(key, os.fstat(fd))
        self._write_manifest()

    def created(self) -> list[Path]:
        """Files this bench created and has not removed yet (its own record, not the
        manifest on disk)."""
        return list(self._created)

    def _write_manifest(self, left: dict[Path, str] | None = None) -> None:
        """The record as `created_files.json`, replaced atomically (a unique temporary name,
        then a rename: a symlink planted at the manifest's name is replaced, not followed)."""
        if left is None:
            entries = [made.to_json() for made in self._created.values()]
        else:
            entries = [{**self._created[p].to_json(), "not_removed": why}
                       for p, why in left.items()]
        text = json.dumps({"created": entries}, indent=1) if entries else '{"created": []}'
        tmp = self.run_dir / f".{MANIFEST}.{uuid.uuid4().hex}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.run_dir / MANIFEST)

    def _why_not_own(self, path: Path) -> str | None:
        """None if `path` is, provably, the file this bench created and last wrote; else why
        not (the reason `cleanup()` reports)."""
        made = self._created.get(path)
        if made is None:
            return "not created by this bench"
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return "no longer there"
        except OSError as err:
            return f"cannot be checked ({err.strerror})"
        if not stat.S_ISREG(st.st_mode):
            return "no longer a regular file (replaced by a link, folder or device)"
        if (st.st_dev, st.st_ino) != (made.device, made.inode):
            return (f"replaced: inode {st.st_dev}:{st.st_ino} is not the bench's "
                    f"{made.device}:{made.inode}")
        if (st.st_size, st.st_mtime_ns) != (made.size_bytes, made.mtime_ns):
            return "written by someone else since the bench's last fio run (size or mtime)"
        return None

    def cleanup(self) -> list[Path]:
        """Remove the files the bench provably created (see the module doc); return what
        was removed. Each file it cannot prove or cannot remove is skipped, kept in
        `cleanup_skipped` and named in a FioCleanupWarning; the others are still removed."""
        removed, left = [], {}
        for path in list(self._created):
            why = self._remove(path)
            if why is None:
                removed.append(path)
            else:
                left[path] = why
        self.cleanup_skipped = list(left.items())
        if self._created:  # only a manifest this bench wrote: never another run's
            self._write_manifest({p: why for p, why in left.items() if why != "no longer there"})
        self._release()
        if self.cleanup_skipped:
            warnings.warn(f"FioBench.cleanup() left {len(left)} file(s) it created: "
                          + "; ".join(f"{p}: {why}" for p, why in left.items()),
                          FioCleanupWarning, stacklevel=2)
        return removed

    def _remove(self, path: Path) -> str | None:
        """Unlink `path` if it is provably the bench's file; else why not.

        The file is first renamed to a unique name beside it and checked again there, so a
        file put at `path` between the check and the unlink is never the one unlinked (it is
        put back if that happens)."""
        why = self._why_not_own(path)
        if why is not None:
            return why
        aside = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.removing")
        try:
            os.rename(path, aside)
            st = os.lstat(aside)
            made = self._created[path]
            if (st.st_dev, st.st_ino) == (made.device, made.inode):
                os.unlink(aside)
                return None
            # not ours after all: back under its name, never over one put there since
            os.link(aside, path, follow_symlinks=False)
            os.unlink(aside)
            return "replaced while being removed; left in place"
        except OSError as err:
            where = f" (it is at {aside})" if os.path.lexists(aside) else ""
            return f"could not remove it: {err.strerror}{where}"

    def _release(self) -> None:
        """Close the held descriptors and forget the record (nothing is provable after)."""
        for fd in self._handles.values():
            os.close(fd)
        self._handles.clear()
        self._created.clear()

    # ---- running

    def run(self, point: FioPoint, name: str | None = None) -> FioRun:
        """Run one point on the prepared targets; its files go to the run directory."""
        if not self.paths:
            raise RuntimeError("FioBench.prepare() has not run (use `with FioBench(...)`)")
        if point.buffer_bytes() > self.max_buffer_bytes:
            raise ValueError(f"point {point.name()} needs {point.buffer_bytes() / GIB:.1f} GiB "
                             f"of I/O buffers (bs x iodepth x numjobs x targets), more than "
                             f"max_buffer_bytes = {self.max_buffer_bytes / GIB:.1f} GiB")
        name = name or point.name()
        prefix = self.run_dir / f"{name}-log" if point.lat_log else None
        text = build_job_file(point, self.paths, self.size_bytes, prefix)
        try:
            return run_fio(text, self.run_dir, name, self.fio_path, lat_log_prefix=prefix)
        finally:
            self._restamp()  # write points change size and mtime: keep the driver's last

    def sweep(self, points: Iterable[FioPoint], progress: bool = True) -> pd.DataFrame:
        """Run every point; one summary row each (see `point_summary`).

        Each row is appended to `<run_dir>/sweep.jsonl` as soon as its point finishes, next
        to fio's own JSON, so an interrupted sweep keeps what it measured.
        """
        points = list(points)
        rows = []
        with open(self.run_dir / "sweep.jsonl", "a") as sink:
            for point in tqdm(points, desc="fio sweep", unit="point", disable=not progress):
                row = point_summary(point, self.run(point))
                sink.write(json.dumps(row) + "\n")
                sink.flush()
                rows.append(row)
        return pd.DataFrame(rows)


def point_summary(point: FioPoint, run: FioRun) -> dict[str, Any]:
    """The point's parameters and fio's group result for its direction, as one flat row."""
    table = run.table()
    direction = "write" if "write" in point.rw else "read"
    rows = table[table.direction == direction]
    if len(rows) != 1:
        raise ValueError(f"fio report of {run.name!r}: expected one {direction} group entry "
                         f"(group_reporting), found {len(rows)}")
    stats = rows.iloc[0].to_dict()
    keep = {k: v for k, v in stats.items() if k.endswith(("_ns", "_s", "_ms", "_bytes", "ios"))
            or k in ("iops", "error")}
    return {"name": run.name, **point.model_dump(exclude={"lat_log"}), "direction": direction,
            "fio_version": run.report.get("fio version", ""),
            **{k: (v.item() if hasattr(v, "item") else v) for k, v in keep.items()}}


# --------------------------------------------------------------------------- B5, B9, B10


def b5_points(block_sizes_bytes: Sequence[int], iodepths: Sequence[int],
              numjobs: Sequence[int], *, n_targets: int = 1, rws: Sequence[str] = ("read",),
              base_block_size_bytes: int | None = None, base_iodepth: int | None = None,
              engine: str = "io_uring", runtime_s: float = 1.0) -> list[FioPoint]:
    """The points of figure B5: what each kind of parallelism does to throughput.

    * request size x I/O depth, for each of `rws`, one job, one target;
    * jobs (`numjobs`) at the base request size and depth, reads;
    * targets 1..`n_targets` at the base, one job each, reads (only with several targets).

    The base defaults to the smallest request size at the smallest depth. Duplicates (the
    base point belongs to every panel) are measured once.
    """
    base_bs = base_block_size_bytes or min(block_sizes_bytes)
    base_qd = base_iodepth or min(iodepths)
    common = {"engine": engine, "runtime_s": runtime_s}
    points = [FioPoint(rw=rw, block_size_bytes=bs, iodepth=qd, **common)
              for rw in rws for bs in block_sizes_bytes for qd in iodepths]
    points += [FioPoint(block_size_bytes=base_bs, iodepth=base_qd, numjobs=nj, **common)
               for nj in numjobs]
    points += [FioPoint(block_size_bytes=base_bs, iodepth=base_qd, n_targets=k, **common)
               for k in range(1, n_targets + 1)]
    return list(dict.fromkeys(points))


def b5_panels(sweep: pd.DataFrame, base_block_size_bytes: int,
              base_iodepth: int) -> pd.DataFrame:
    """B5's tidy table: one row per (panel, point), throughput normalized per direction.

    Panels: "request size" (x = block size, series = direction + depth), "jobs" (x =
    numjobs), "targets" (x = n_targets); `base` names the base request size and depth.
    `norm_throughput` is bandwidth over the highest bandwidth measured in that direction
    (read or write) anywhere in the sweep.
    """
    df = sweep.copy()
    df["norm_throughput"] = df.bw_bytes_s / df.groupby("direction").bw_bytes_s.transform("max")
    single = (df.numjobs == 1) & (df.n_targets == 1)
    base = (df.block_size_bytes == base_block_size_bytes) & (df.iodepth == base_iodepth)
    reads = df.direction == "read"
    parts = [
        df[single].assign(panel="request size", x=df.block_size_bytes,
                          series=df.direction + ", iodepth " + df.iodepth.astype(str)),
        df[base & reads & (df.n_targets == 1)].assign(panel="jobs", x=df.numjobs,
                                                       series="read"),
        df[base & reads & (df.numjobs == 1)].assign(panel="targets", x=df.n_targets,
                                                     series="read"),
    ]
    base_text = f"{size_text(base_block_size_bytes)}, iodepth {base_iodepth}"
    table = pd.concat(parts, ignore_index=True).assign(base=base_text)
    return table.sort_values(["panel", "series", "x"], ignore_index=True)


def size_text(n_bytes: int) -> str:
    """4096 -> '4 KiB', 41943040 -> '40 MiB' (binary units, as fio's bs)."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n_bytes >= size:
            return f"{n_bytes / size:g} {unit}"
    return f"{n_bytes} B"


def chunk_read_times(bench: FioBench, chunk_bytes: int, n_chunks: int = 41,
                     engine: str = "io_uring") -> pd.DataFrame:
    """B9's SSD side: `n_chunks` chunk-sized reads, one at a time, each one's time from fio.

    One sequential job, bs = chunk, iodepth 1, direct; fio's per-I/O `lat` log gives each
    read's time from submission to completion (`clat_s`: from when the kernel had it). The
    file is read from the start and wraps if it holds fewer chunks. Columns: chunk_id,
    time_s, clat_s, offset_bytes, tier ("SSD").
    """
    point = FioPoint(rw="read", block_size_bytes=chunk_bytes, iodepth=1, engine=engine,
                     runtime_s=None, io_size_bytes=n_chunks * chunk_bytes, lat_log=True)
    run = bench.run(point, name="b9-chunk-reads")
    lat, clat = run.lat_log("lat"), run.lat_log("clat")
    return pd.DataFrame({"chunk_id": range(len(lat)), "time_s": lat.value_ns / 1e9,
                         "clat_s": clat.value_ns.to_numpy() / 1e9,
                         "offset_bytes": lat.offset_bytes, "tier": "SSD"})


def queue_depth_run(bench: FioBench, block_size_bytes: int, iodepth: int, total_bytes: int,
                    engine: str = "io_uring") -> tuple[pd.DataFrame, pd.DataFrame]:
    """B10: read `total_bytes` in `block_size_bytes` requests with up to `iodepth` in flight.

    Returns (per-I/O events, I/Os in flight over time); see `parse.io_events` and
    `parse.in_flight` for how the times are derived from fio's logs.
    """
    point = FioPoint(rw="read", block_size_bytes=block_size_bytes, iodepth=iodepth,
                     engine=engine, runtime_s=None, io_size_bytes=total_bytes, lat_log=True)
    events = parse.io_events(bench.run(point, name="b10-queue-depth").lat_log("lat"))
    return events, parse.in_flight(events)


__all__ = ["FIO_INSTALL_HINT", "CreatedFile", "FioBench", "FioCleanupWarning", "FioError",
           "FioNotFoundError", "FioPoint", "FioRun", "FioTargetError", "GIB", "KIB", "MIB",
           "b5_panels", "b5_points",
           "build_job_file", "chunk_read_times", "find_fio", "fio_version", "is_block_device",
           "point_summary", "queue_depth_run", "run_fio", "size_text"]
