"""The package's one way to make a file of its own, and its one way to replace a file.

* `own_file`: a new file made with `O_CREAT | O_EXCL | O_NOFOLLOW` and used only through the
  descriptor that made it, then removed (if it is still the same file) on every exit path.
  Why: opening a file again by its name lets whoever can write the folder swap it for a
  symlink in between, and our write lands on the link's target.
* `replace_files`: rewrite one or several files atomically (a temporary file of ours in the
  same folder, fsync, rename, fsync of the folder), each under a lock of its own, every
  content produced and checked before the first file is replaced. Why: a shipped spec cut short
  by a full disk can still load as a valid but wrong spec; two writers must not interleave.
  `rewriting` holds the same locks over a whole read-modify-write.

SIGTERM and SIGINT reach the `finally` blocks here only where the caller runs under
`kvrepro._signals.stop_on_signals` (the CLI does, for the commands that make files).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

from kvrepro._locks import FolderLock

_NEW_FILE = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _unlink_if_same(path: Path, fd: int) -> None:
    """Remove `path` only if it is still the file `fd` has open (never what replaced it)."""
    try:
        if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
            path.unlink()
    except FileNotFoundError:
        pass


@contextlib.contextmanager
def own_file(folder: str | Path, prefix: str, flags: int = os.O_RDWR,
             mode: int = 0o600) -> Iterator[tuple[Path, int]]:
    """(path, descriptor) of a new file `<folder>/<prefix><random>` that this call made;
    `flags` are added to the open (e.g. `os.O_DIRECT`). The file is closed and removed on
    exit, normal or not, if its name still points at it."""
    path = Path(folder) / f"{prefix}{os.urandom(6).hex()}"
    fd = os.open(path, _NEW_FILE | flags, mode)
    try:
        yield path, fd
    finally:
        try:
            _unlink_if_same(path, fd)
        finally:
            os.close(fd)


def fsync_folder(folder: str | Path) -> None:
    """Flush a folder's entries (a rename in it) to the disk."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _lock_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


@contextlib.contextmanager
def _locked(paths: list[Path], wait_s: float) -> Iterator[None]:
    """Hold each file's lock (`.<name>.lock` next to it), taken in a fixed order so that two
    writers of overlapping sets never wait on each other forever."""
    with contextlib.ExitStack() as stack:
        for path in sorted(set(paths)):
            lock = FolderLock(_lock_path(path))
            other = lock.acquire(f"pid {os.getpid()}\n", wait_s=wait_s)
            if other is not None:
                raise FileExistsError(f"{path}: another process is rewriting it ({other.strip()}"
                                      f", holds {lock.path}); try again when it is done")
            stack.callback(lock.release)
        yield


def replace_files(contents: Mapping[str | Path, bytes | str],
                  check: Callable[[Mapping[Path, bytes]], None] | None = None,
                  wait_s: float = 10.0) -> None:
    """Replace each file of `contents` by its new bytes, atomically per file, under a lock
    per file. `check` (given the new contents) runs before anything is replaced: when it
    raises, every file stays as it was. Every temporary file is written and flushed before
    the first rename, so a full disk or a signal leaves the old files whole."""
    new = _encoded(contents)
    if check is not None:
        check(new)
    with _locked(list(new), wait_s):
        _replace_locked(new)


@contextlib.contextmanager
def rewriting(paths: Iterable[str | Path], wait_s: float = 10.0
              ) -> Iterator[Callable[..., None]]:
    """Hold the locks `replace_files` takes on `paths` for a whole read-modify-write, and yield
    `replace(contents, check=None)`: `replace_files` without taking them again. Read the files
    inside the block. Why: a writer that reads before it locks writes back over what another
    wrote in between (two calibrations sharing a server spec would drop one fit)."""
    held = {Path(p) for p in paths}
    with _locked(list(held), wait_s):
        def replace(contents: Mapping[str | Path, bytes | str],
                    check: Callable[[Mapping[Path, bytes]], None] | None = None) -> None:
            new = _encoded(contents)
            if not set(new) <= held:
                raise ValueError(f"{sorted(map(str, set(new) - held))}: not locked by this "
                                 "rewrite")
            if check is not None:
                check(new)
            _replace_locked(new)
        yield replace


def _encoded(contents: Mapping[str | Path, bytes | str]) -> dict[Path, bytes]:
    return {Path(p): (c.encode() if isinstance(c, str) else bytes(c)) for p, c in contents.items()}


def _replace_locked(new: Mapping[Path, bytes]) -> None:
    """Write every temporary file and flush it, then rename them all (the locks are held)."""
    with contextlib.ExitStack() as temps:
        ready: list[tuple[Path, Path]] = []
        for path, data in new.items():
            tmp, fd = temps.enter_context(own_file(path.parent, f".{path.name}.tmp-",
                                                   os.O_WRONLY, _mode_of(path)))
            os.fchmod(fd, _mode_of(path))  # the old file's bits, not those umask leaves
            _write_all(fd, data)
            os.fsync(fd)
            ready.append((tmp, path))
        for tmp, path in ready:
            os.replace(tmp, path)
        for folder in {path.parent for path in new}:
            fsync_folder(folder)


def _mode_of(path: Path) -> int:
    """The permission bits the replaced file had (0o644 for a new one)."""
    try:
        return os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        return 0o644


def replace_file(path: str | Path, data: bytes | str, wait_s: float = 10.0) -> None:
    """`replace_files` for one file."""
    replace_files({path: data}, wait_s=wait_s)
