"""What a live run can prove it created, and how it removes exactly that.

A run leaves shared-memory segments under `/dev/shm` (vLLM's `psm_*` queues and `sem.mp-*`
semaphores, LMCache's `lmcache_kv_<pid>_*`: a killed process leaves them behind, 160-250 MB
each for a SIGKILLed vLLM) and its stores' chunk files. Other programs (another run, a
user, a container sharing the host's `/dev/shm`) put things with the same names in the same
places, so a name or a before/after listing never proves ownership. What does:

* a segment: seen in the memory maps or open files of one of the run's own processes while
  they ran (`SharedMemory.sample`, called by a `Watcher` every second), or written into the
  run's ledger by the process that created it (`shm_ledger/sitecustomize.py` on the servers'
  PYTHONPATH: a multiprocessing semaphore is often mapped by no process, so no sample sees
  it), with its inode, owned by this user. At the end it is removed only if its name still
  has that inode and no live process holds it;
* a chunk file: new in a store folder (a flash store's, a shared filesystem's) this run
  holds an exclusive lock on (`DiskFolder`, one per folder, `store_folder_owner`),
  owned by this user, named as LMCache names its files, and unchanged (inode, mtime) since the
  run's processes stopped. A folder that contains the run folder, or that belongs to another
  user, is refused.

Each removal that fails is skipped and listed in `problems`; the rest are still removed.
"""

from __future__ import annotations

import itertools
import os
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kvrepro._locks import FolderLock
from kvrepro._paths import RefusedFolder
from kvrepro.engines.live.processes import ServerError
from kvrepro.stores import StoreFolder

SHM_DIR = Path("/dev/shm")
LEDGER_ENV = "KVREPRO_SHM_LEDGER"
LEDGER_PATH_DIR = Path(__file__).resolve().parent / "shm_ledger"
LMCACHE_FILE_SUFFIXES = (".data", ".tmp", ".pt", ".bin")
"""The chunk files the offload stores write into a store folder: LMCache's `fs_native` and
`fs` L2 adapters and its in-process `fs` connector (`<key>.data`, written through `.tmp`),
its in-process disk backend's `<key>.pt`, and vLLM's own `fs` secondary tier (`<hash>.bin`,
written through `.tmp`, `vllm/v1/kv_offload/tiering/fs/manager.py`)."""
LOCK_NAME = ".kvrepro-flash.lock"
FILES_COUNTED_AT_MOST = 100
"""A folder's foreign files are counted up to this many ("at least 100"): refusing it needs
only none vs some, and a walk of a whole tree (`/usr`) takes seconds."""


class FolderRefused(RefusedFolder, ServerError):
    """A store folder a run will not use: in use by another run, another user's, holding
    foreign files, or containing the run folder."""


# --------------------------------------------------------------------------- shared memory


def _maps_segments(pid: int) -> Iterator[tuple[str, int]]:
    """(name, inode) of each /dev/shm segment process `pid` maps (from /proc/<pid>/maps)."""
    try:
        text = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return
    for line in text.splitlines():
        fields = line.split(maxsplit=5)  # address perms offset dev inode path
        if len(fields) == 6 and fields[5].startswith("/dev/shm/"):
            name = fields[5].removeprefix("/dev/shm/")
            if "/" not in name and not name.endswith(" (deleted)"):
                yield name, int(fields[4])


def _fd_segments(pid: int) -> Iterator[tuple[str, int]]:
    """(name, inode) of each /dev/shm segment process `pid` holds open."""
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return
    for fd in fds:
        try:
            target = os.readlink(fd)
            if target.startswith("/dev/shm/") and not target.endswith(" (deleted)"):
                yield target.removeprefix("/dev/shm/"), os.stat(fd).st_ino
        except OSError:
            continue


def held_segments(pids: Iterable[int]) -> set[tuple[str, int]]:
    """(name, inode) of every segment the processes `pids` map or hold open now."""
    return {seg for pid in pids for seg in (*_maps_segments(pid), *_fd_segments(pid))}


def _all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


class SharedMemory:
    """The /dev/shm segments a run's own processes were seen holding; removes those."""

    def __init__(self, shm_dir: Path = SHM_DIR) -> None:
        self.dir = shm_dir
        self.ledger: Path | None = None
        self.seen: dict[str, int] = {}  # name -> inode the run's processes had (alive)
        self.problems: list[str] = []
        self._ledger_offset = 0  # where the ledger's unread lines start: each byte read once
        self._lock = threading.Lock()

    def environment(self, env: dict[str, str], run_dir: Path) -> dict[str, str]:
        """`env` for the run's server processes: their Python writes what it creates into a
        new ledger file of this run's (`shm_created.<random>.txt` in `run_dir`)."""
        if self.ledger is None:
            fd, name = tempfile.mkstemp(prefix="shm_created.", suffix=".txt", dir=run_dir)
            os.close(fd)
            self.ledger = Path(name)
        path = os.pathsep.join(p for p in (str(LEDGER_PATH_DIR), env.get("PYTHONPATH")) if p)
        return {**env, "PYTHONPATH": path, LEDGER_ENV: str(self.ledger.resolve())}

    def _new_ledger_lines(self) -> list[str]:
        """The complete lines the ledger gained since the last call. Read from where the
        last call stopped: a run's 20,000 transient semaphores are parsed once, not once a
        second (a line still being written is left for the next call)."""
        if self.ledger is None:
            return []
        try:
            with self.ledger.open("rb") as ledger:
                ledger.seek(self._ledger_offset)
                data = ledger.read()
        except OSError:
            return []
        complete = data[:data.rfind(b"\n") + 1]
        self._ledger_offset += len(complete)
        return complete.decode(errors="replace").splitlines()

    def _read_ledger(self, uid: int) -> None:
        """Apply the ledger's new lines (`created|unlinked <inode> <name>`, written by
        `shm_ledger/sitecustomize.py`): a created segment still there is seen, an unlinked
        one forgotten, so `seen` holds only what may still be alive (and one created and
        unlinked between two reads is not even looked up)."""
        created: dict[str, int] = {}
        for line in self._new_ledger_lines():
            event, _, rest = line.partition(" ")
            inode, _, name = rest.partition(" ")
            if not inode.isdigit() or not name or "/" in name:
                continue
            if event == "created":
                created[name] = int(inode)
            elif event == "unlinked":
                for alive in (created, self.seen):
                    if alive.get(name) == int(inode):
                        del alive[name]
        for name, inode in created.items():
            self._see(name, inode, uid)

    def _see(self, name: str, inode: int, uid: int) -> None:
        """Record `name` if it still carries `inode` and is a file of this user's."""
        try:
            info = os.lstat(self.dir / name)
        except OSError:
            return  # gone already: nothing to remove
        if info.st_ino == inode and info.st_uid == uid and stat.S_ISREG(info.st_mode):
            self.seen[name] = inode

    def sample(self, pids: Iterable[int]) -> None:
        """Record the segments `pids` (the run's processes) hold now that belong to this
        user, and what the ledger gained; call it while they run (a segment is proven the
        run's only by being seen)."""
        uid = os.geteuid()
        held = held_segments(pids)
        with self._lock:
            self._read_ledger(uid)
            for name, inode in held:
                if name not in self.seen:
                    self._see(name, inode, uid)

    def cleanup(self) -> list[str]:
        """Remove the recorded segments that still carry their inode and that no live process
        holds (call it after the run's processes exited); the names removed."""
        self.sample(())  # what the ledger gained since the last sample
        with self._lock:
            held = held_segments(_all_pids())
            removed = []
            for name, inode in sorted(self.seen.items()):
                if self._remove(name, inode, held):
                    removed.append(name)
            return removed

    def _remove(self, name: str, inode: int, held: set[tuple[str, int]]) -> bool:
        path = self.dir / name
        try:
            if os.lstat(path).st_ino != inode:
                self.problems.append(f"{path}: another segment now has this name; left alone")
                return False
            if (name, inode) in held:
                self.problems.append(f"{path}: still held by a live process; left alone")
                return False
            path.unlink()
        except FileNotFoundError:
            return False  # its process removed it on exit
        except OSError as err:
            self.problems.append(f"{path}: {err}")
            return False
        return True


# --------------------------------------------------------------------------- flash folder


@dataclass(frozen=True)
class FileId:
    """A file as it was seen: device, inode, last modification."""

    dev: int
    ino: int
    mtime_ns: int

    @classmethod
    def of(cls, info: os.stat_result) -> FileId:
        return cls(info.st_dev, info.st_ino, info.st_mtime_ns)

    def same_file(self, other: FileId) -> bool:
        return (self.dev, self.ino) == (other.dev, other.ino)


def _contains(folder: Path, inner: Path) -> bool:
    folder, inner = folder.resolve(), inner.resolve()
    return inner == folder or inner.is_relative_to(folder)


def flash_path(path: str | Path) -> Path:
    """The folder a flash store's path names (LMCache takes a `file://` URL as well)."""
    return Path(str(path).removeprefix("file://"))


class DiskFolder:
    """A store's folder (a flash store's, a shared filesystem's), held under an exclusive
    lock for the run's life; removes the chunk files the run's processes wrote there and the
    folders it made. `label` names it in messages ("flash folder", "shared folder")."""

    def __init__(self, path: str | Path, keep_files: bool = False,
                 allow_existing: bool = False, run_dir: str | Path | None = None,
                 label: str = "flash folder"):
        self.path, self.label = flash_path(path), label
        self.keep_files, self.allow_existing = keep_files, allow_existing
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.before: dict[Path, FileId] = {}
        self.seen: dict[Path, FileId] = {}
        self.created_dirs: list[tuple[Path, int]] = []  # deepest first, with their inodes
        self.problems: list[str] = []
        self._lock: FolderLock | None = None
        self._mutex = threading.Lock()

    def _files(self) -> Iterator[tuple[Path, os.stat_result]]:
        """Every regular file below the folder (symlinks not followed), the lock excluded."""
        for root, _dirs, names in os.walk(self.path):
            for name in names:
                path = Path(root) / name
                try:
                    info = os.lstat(path)
                except OSError:
                    continue
                if stat.S_ISREG(info.st_mode) and path != self.path / LOCK_NAME:
                    yield path, info

    def _refuse_unsafe(self) -> None:
        if self.run_dir is not None and _contains(self.path, self.run_dir):
            raise FolderRefused(f"{self.label} {self.path} contains the run folder "
                                f"{self.run_dir}: its clean-up could remove the run's own "
                                "files; choose a folder outside it")
        if self.path.exists():
            info = os.stat(self.path)
            if not stat.S_ISDIR(info.st_mode):
                raise FolderRefused(f"{self.label} {self.path} is not a folder")
            if info.st_uid != os.geteuid():
                raise FolderRefused(f"{self.label} {self.path} belongs to uid {info.st_uid}, "
                                    f"not to this user (uid {os.geteuid()}): choose a folder "
                                    "of your own")

    def _refuse_foreign_files(self) -> None:
        """Refuse a folder holding regular files (unless allowed): the run could not tell
        them from its own. Counted only up to `FILES_COUNTED_AT_MOST`."""
        if self.allow_existing:
            return
        found = sum(1 for _ in itertools.islice(self._files(), FILES_COUNTED_AT_MOST))
        if found:
            count = f"at least {found}" if found == FILES_COUNTED_AT_MOST else str(found)
            raise FolderRefused(
                f"{self.label} {self.path} already holds {count} file(s) this run did not "
                "create; empty it, choose another path, or allow it (store "
                "allow_existing_files: true)")

    def check(self) -> None:
        """FolderRefused where `prepare` would refuse the folder, found without making,
        locking or writing anything: `kvrepro doctor` calls it, so that the preflight and
        the run can never disagree about a folder."""
        self._refuse_unsafe()
        if not self.path.is_dir():
            return  # the run makes it: new, so empty and nobody else's
        if FolderLock.is_held(self.path / LOCK_NAME):
            raise FolderRefused(f"{self.label} {self.path} is in use by another run (its lock "
                                f"{self.path / LOCK_NAME} is held); choose another path")
        self._refuse_foreign_files()

    def prepare(self) -> None:
        """Make the folder, take its lock, and note what it already holds; refuse a folder in
        use, unsafe, or (unless allowed) holding files this run did not create."""
        self._refuse_unsafe()
        missing = [p for p in [self.path, *self.path.parents] if not p.exists()]
        self.path.mkdir(parents=True, exist_ok=True)
        self.created_dirs = [(p, os.stat(p).st_ino) for p in missing]
        self._take_lock()
        try:
            self._refuse_foreign_files()
            self.before = {path: FileId.of(info) for path, info in self._files()}
        except BaseException:
            self._release()
            raise

    def _take_lock(self) -> None:
        """Hold `<folder>/.kvrepro-flash.lock` (`kvrepro._locks`): a second run on the same
        folder is refused instead of mixing its files in."""
        lock = FolderLock(self.path / LOCK_NAME)
        try:
            other = lock.acquire(f"pid {os.getpid()}, run {self.run_dir}\n")
        except OSError as err:
            raise FolderRefused(f"{self.label} {self.path}: cannot take its lock "
                                f"{lock.path} ({err.strerror})") from err
        if other is not None:
            raise FolderRefused(f"{self.label} {self.path} is in use by another run "
                                f"({other}); choose another path")
        self._lock = lock

    def _release(self) -> None:
        """Remove and unlock the lock file, then the folders the run made (if empty)."""
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()
        for folder, inode in self.created_dirs:
            self._rmdir_if_empty(folder, inode)

    def _rmdir_if_empty(self, folder: Path, inode: int) -> None:
        try:
            if os.lstat(folder).st_ino == inode and not any(folder.iterdir()):
                folder.rmdir()
        except OSError:
            pass  # gone already, or not empty: what is left is someone's

    def sample(self, final: bool = False) -> None:
        """Record the LMCache files of this user that appeared since `prepare`; while the
        run's processes write (`final=False`) a known file's new mtime, or a new file of this
        user's in its place (a chunk written again through `.tmp` and renamed), is taken as
        theirs: the same proof as a new file's."""
        uid = os.geteuid()
        with self._mutex:
            for path, info in self._files():
                now, old = FileId.of(info), self.seen.get(path)
                if path in self.before and self.before[path].same_file(now):
                    continue
                ours = info.st_uid == uid and path.name.endswith(LMCACHE_FILE_SUFFIXES)
                if old is None:
                    if ours:
                        self.seen[path] = now
                elif not final and (old.same_file(now) or ours):
                    self.seen[path] = now

    def cleanup(self) -> int:
        """Remove the run's files (unless kept) and the folders it made; how many files.
        Call it after the run's processes exited."""
        try:
            if self.keep_files:
                return 0
            self.sample(final=True)
            removed = sum(self._remove(path, seen) for path, seen in sorted(self.seen.items()))
            self._remove_new_subfolders()
            self._note_foreign()
            return removed
        finally:
            self._release()

    def _remove(self, path: Path, seen: FileId) -> bool:
        try:
            if FileId.of(os.lstat(path)) != seen:
                self.problems.append(f"{path}: changed after the run's processes stopped; "
                                     "left in place")
                return False
            path.unlink()
        except FileNotFoundError:
            return False  # LMCache evicted it
        except OSError as err:
            self.problems.append(f"{path}: {err}")
            return False
        return True

    def _remove_new_subfolders(self) -> None:
        """Empty sub-folders that held the run's files (deepest first)."""
        for folder in sorted({p.parent for p in self.seen}, key=lambda p: -len(p.parts)):
            if folder != self.path and folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()

    def _note_foreign(self) -> None:
        """Report files that appeared during the run without proof that the run made them."""
        left = [p for p, info in self._files()
                if p not in self.before and p not in self.seen]
        if left:
            shown = ", ".join(str(p) for p in sorted(left)[:5])
            self.problems.append(f"{self.path}: left {len(left)} file(s) the run did not "
                                 f"create: {shown}")


def store_folder_owner(folder: StoreFolder, run_dir: str | Path | None = None) -> DiskFolder:
    """The `DiskFolder` that owns a store's folder for a run (`TierConfig.folders`; its path
    with `{run_dir}` filled in already), named in messages as a shared or a flash folder."""
    return DiskFolder(folder.path, folder.keep_files, folder.allow_existing_files,
                      run_dir=run_dir, label="shared folder" if folder.shared else "flash folder")


# --------------------------------------------------------------------------- watcher


class Watcher:
    """Samples what a run's processes own, every `interval_s` in a daemon thread, so that
    what they create and leave behind is known when they are gone."""

    def __init__(self, sample: Callable[[], None], interval_s: float = 1.0):
        self._sample, self.interval_s = sample, interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="kvrepro-watcher", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        """One sample now; an error is kept (a sample must never end a run)."""
        try:
            self._sample()
        except Exception as err:  # noqa: BLE001 - a failed sample is reported, not raised
            if len(self.errors) < 10:
                self.errors.append(f"sample: {err!r}")

    def stop(self) -> None:
        """Take a last sample and end the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.sample()
