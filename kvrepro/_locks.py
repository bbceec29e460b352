"""One writer per folder: an exclusive `flock` on a lock file in it, held for the writer's life.

Used by run folders (`records.RunWriter`), sweep folders (`sweep.run_sweep`) and flash folders
(`engines.live.ownership.DiskFolder`). Why flock and not only O_EXCL: the kernel lets go of
it when the holder dies, so a killed writer never leaves its folder locked for good and
nobody has to guess whether it is dead; a reader can ask whether a folder still has a writer.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


def _same_file(fd: int, path: Path) -> bool:
    """Whether `path` is still the file `fd` has open (its last holder may have unlinked it
    after we opened it: holding that one would lock nothing)."""
    try:
        return os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _holder_text(fd: int, wait_s: float = 0.5) -> str:
    """What the holder wrote into the lock file (it writes just after taking the lock: a
    moment's wait for it), or "unknown holder"."""
    deadline = time.monotonic() + wait_s
    while True:
        text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        if text or time.monotonic() > deadline:
            return text or "unknown holder"
        time.sleep(0.02)


class FolderLock:
    """The exclusive lock on `path` (a file in the folder it guards)."""

    def __init__(self, path: Path):
        self.path = path
        self.fd: int | None = None

    def acquire(self, holder: str, wait_s: float = 0.0) -> str | None:
        """Take the lock and write `holder` into it; None when taken, else what its current
        holder wrote (after retrying for `wait_s`). An OSError opening the file (a symlink
        there, another user's file) is passed on."""
        deadline = time.monotonic() + wait_s
        while True:
            fd = os.open(self.path, _FLAGS, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    other = _holder_text(fd)
                    os.close(fd)
                    return other
                os.close(fd)
                time.sleep(0.01)
                continue
            if _same_file(fd, self.path):
                self.fd = fd
                try:
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, holder.encode(), 0)
                except OSError:  # a full disk: the lock file we made is not left behind
                    self.release()
                    raise
                return None
            os.close(fd)

    def release(self) -> None:
        """Remove the lock file (while still holding it, so no one takes the old file after
        us) and let go; a second call does nothing."""
        if self.fd is None:
            return
        try:
            if _same_file(self.fd, self.path):
                self.path.unlink()
        except OSError:
            pass  # gone already: nothing of ours to remove
        finally:
            os.close(self.fd)
            self.fd = None

    @staticmethod
    def is_held(path: Path) -> bool:
        """Whether a live holder has the lock on `path` now (probed with a shared lock let go
        at once)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False
