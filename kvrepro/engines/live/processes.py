"""What a live run owns on the machine, and how it gives all of it back.

A live tier is up to two process groups (vLLM, and for multi-process LMCache the `lmcache
server`), a folder of chunk files (the flash tier's L2) and shared-memory segments under
`/dev/shm` (vLLM's `psm_*` message queues and `sem.mp-*` semaphores; `lmcache_kv_<pid>_*`
with LMCache's shared-memory transfer). A killed process leaves its segments behind
(measured: `lmcache_kv_*` after SIGTERM, `psm_*` of 160-250 MB after a SIGKILLed vLLM), so
the run removes them itself,
but only what it created: segments that appeared during the run and that no live process
still maps, and in the L2 folder only the files that were not there before.

* `ManagedProcess`: a command in its own process group with its log in the run folder, a
  health URL, `check_alive` quoting the log's end, and `stop` that cannot raise;
* `DiskFolder`: the L2 folder; refuses a folder that already holds files unless allowed;
* `SharedMemory`: snapshot before, remove the run's leftovers after.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path
from typing import IO, Self

SHM_DIR = Path("/dev/shm")
SHM_PREFIXES = ("psm_", "lmcache_kv_", "sem.mp-")


class ServerError(RuntimeError):
    """A server process could not start, or died while serving."""


def port_in_use(host: str, port: int) -> bool:
    """True when something already listens on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the kernel's choice for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = 30) -> str:
    """The last `lines` lines of a log file (empty if it does not exist)."""
    if not path.is_file():
        return ""
    with path.open(errors="replace") as handle:
        return "".join(deque(handle, maxlen=lines))


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    """True when GET `url` answers 200; a loopback check never goes through a proxy."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout_s) as resp:
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def group_pids(pgid: int) -> set[int]:
    """Pids of the live processes in process group `pgid` (from /proc)."""
    pids = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after the command: state, ppid, pgrp
            pids.add(int(stat.parent.name))
    return pids


def pid_alive(pid: int) -> bool:
    """A process that still runs (a zombie waiting for its reaper does not count)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_gone(pids: set[int], timeout_s: float = 5.0) -> set[int]:
    """Wait until none of `pids` runs (a killed process unmaps its memory as it exits);
    the ones still running at the timeout."""
    deadline = time.monotonic() + timeout_s
    alive = {p for p in pids if pid_alive(p)}
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = {p for p in alive if pid_alive(p)}
    return alive


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class ManagedProcess:
    """One command in its own process group, logging to a file; always stoppable."""

    def __init__(self, name: str, command: list[str], log_path: Path, env: dict[str, str],
                 health_url: str):
        self.name, self.command, self.log_path = name, command, log_path
        self.env, self.health_url = env, health_url
        self.process: subprocess.Popen | None = None
        self.pids: set[int] = set()
        self._log: IO[bytes] | None = None

    def start(self) -> None:
        """Start the process (no waiting)."""
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=self.env,
                                        start_new_session=True)
        self.pids.add(self.process.pid)

    def died(self, when: str) -> ServerError:
        """The error that says this process exited, with the end of its log."""
        code = self.process.poll() if self.process else None
        return ServerError(f"{self.name} exited {when} with code {code}; last lines of "
                           f"{self.log_path}:\n{log_tail(self.log_path)}")

    def wait_healthy(self, timeout_s: float, poll_s: float = 0.5) -> float:
        """Block until the health URL answers; the seconds it took. Raise on exit/timeout."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if self.process is None or self.process.poll() is not None:
                raise self.died("during start-up")
            if http_ok(self.health_url):
                return time.monotonic() - start
            self.pids |= group_pids(self.process.pid)
            time.sleep(poll_s)
        raise ServerError(f"{self.name} not healthy after {timeout_s:g} s; last lines of "
                          f"{self.log_path}:\n{log_tail(self.log_path)}")

    def check_alive(self) -> None:
        """Raise ServerError if the process has exited (call it during a run)."""
        if self.process is None or self.process.poll() is not None:
            raise self.died("mid-run")

    def stop(self, grace_s: float = 20.0) -> int | None:
        """Terminate the whole process group; returns the exit code (None when the process
        did not exit, e.g. stuck in D state after SIGKILL). Raises nothing of its own: a
        process that outlives both waits is left reported by its missing code, so the run's
        own error is what the caller sees. The group is SIGKILLed and the log closed even
        when a Ctrl-C interrupts the waits (that interrupt is then passed on)."""
        proc, self.process = self.process, None
        try:
            if proc is not None:
                self.pids |= group_pids(proc.pid)
                _signal_group(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    _signal_group(proc.pid, signal.SIGKILL)
                    try:
                        proc.wait(timeout=grace_s)
                    except subprocess.TimeoutExpired:
                        pass  # unkillable (D state): reported by its missing exit code
        finally:
            if proc is not None:
                _signal_group(proc.pid, signal.SIGKILL)  # stray children of the group
                wait_gone(self.pids)  # a SIGKILLed process takes a moment to exit under load
            if self._log is not None:
                self._log.close()
                self._log = None
        return proc.returncode if proc is not None else None


class DiskFolder:
    """The flash tier's folder: refuse foreign files, remove exactly the run's own."""

    def __init__(self, path: str | Path, keep_files: bool = False,
                 allow_existing: bool = False):
        self.path = Path(str(path).removeprefix("file://"))
        self.keep_files, self.allow_existing = keep_files, allow_existing
        self.before: set[Path] = set()
        self.created_dirs: list[Path] = []

    def files(self) -> set[Path]:
        """Every file below the folder now."""
        return {p for p in self.path.rglob("*") if p.is_file()} if self.path.is_dir() else set()

    def prepare(self) -> None:
        """Create the folder; refuse one that already holds files unless allowed."""
        self.before = self.files()
        if self.before and not self.allow_existing:
            raise ServerError(f"flash folder {self.path} already holds {len(self.before)} "
                              "file(s) this run did not create; empty it, choose another "
                              "path, or allow it (store allow_existing_files: true)")
        missing = [p for p in [self.path, *self.path.parents] if not p.exists()]
        self.path.mkdir(parents=True, exist_ok=True)
        self.created_dirs = missing  # deepest first

    def cleanup(self) -> int:
        """Remove the files the run wrote (unless kept) and the folders it made; how many."""
        if self.keep_files:
            return 0
        mine = self.files() - self.before
        for path in mine:
            path.unlink(missing_ok=True)
        for folder in sorted({p.parent for p in mine}, key=lambda p: -len(p.parts)):
            if folder != self.path and folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        for folder in self.created_dirs:
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        return len(mine)


def _mapped_shm() -> set[str]:
    """Names of /dev/shm segments some live process maps or holds open."""
    names = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:
            continue
        names.update(line.rsplit("/dev/shm/", 1)[1].split(" ")[0]
                     for line in text.splitlines() if "/dev/shm/" in line)
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("/dev/shm/"):
            names.add(target.removeprefix("/dev/shm/"))
    return names


class SharedMemory:
    """Segments under /dev/shm that a run's processes leave behind."""

    def __init__(self) -> None:
        self.before = self._names()

    @staticmethod
    def _names() -> set[str]:
        if not SHM_DIR.is_dir():
            return set()
        return {p.name for p in SHM_DIR.iterdir() if p.name.startswith(SHM_PREFIXES)}

    def leftovers(self, pids: set[int]) -> list[str]:
        """New segments no live process holds: `lmcache_kv_<pid>_*` of the run's own pids
        and vLLM's `psm_*` that appeared since the snapshot."""
        held = _mapped_shm()
        out = []
        for name in sorted(self._names() - self.before - held):
            if name.startswith("lmcache_kv_"):
                pid = name.removeprefix("lmcache_kv_").split("_", 1)[0]
                if not (pid.isdigit() and int(pid) in pids):
                    continue
            out.append(name)
        return out

    def cleanup(self, pids: set[int]) -> list[str]:
        """Remove the run's leftover segments; their names."""
        removed = self.leftovers(pids)
        for name in removed:
            (SHM_DIR / name).unlink(missing_ok=True)
        return removed


class StartedOnEnter:
    """`with x:` starts x and stops it on every exit, also when start fails half-way (a
    half-started deployment still holds processes, ports and segments). Subclasses define
    `start()` and `stop()`; `stop()` must never raise."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
