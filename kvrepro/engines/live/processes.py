"""The processes of a live run: started in their own group, always stopped, all of them.

A live tier is up to two process groups (vLLM, and for multi-process LMCache the `lmcache
server`), in the caller's session (`ManagedProcess` says why). What else a run leaves on
the machine (shared memory, flash files) and how it is given back is in
`kvrepro.engines.live.ownership`.

* `ManagedProcess`: a command in its own process group with its log in the run folder, a
  health URL, `check_alive` quoting the log's end, `track` recording every process of the
  group and every descendant with its start time, and `stop` that cannot raise and also kills
  recorded processes that left the group (a grandchild that called `setsid`);
* `StartedOnEnter`: start on `with`, stop on every exit.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Self

from kvrepro.engines.live.placement import preexec


class ServerError(RuntimeError):
    """A server process could not start, or died while serving."""


def port_in_use(host: str, port: int) -> bool:
    """True when something already listens on host:port, at any address `host` resolves to
    (IPv4 or IPv6: `::1` too); socket.gaierror (an OSError) when `host` does not resolve."""
    for family, kind, proto, _name, address in socket.getaddrinfo(host, port,
                                                                  type=socket.SOCK_STREAM):
        with socket.socket(family, kind, proto) as sock:
            sock.settimeout(0.5)
            if sock.connect_ex(address) == 0:
                return True
    return False


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 20000  # below it lie the well-known and commonly configured services' ports


def ephemeral_ports(range_file: Path = EPHEMERAL_RANGE_FILE) -> range:
    """The kernel's range of local ports for outgoing connections (Linux's default where
    the file is missing)."""
    try:
        low, high = (int(v) for v in range_file.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def free_port(host: str = "127.0.0.1", range_file: Path = EPHEMERAL_RANGE_FILE) -> int:
    """A port nothing listens on now, below the kernel's ephemeral range. A port the kernel
    hands out for port 0 lies inside that range, where any outgoing connection (the load
    client's, vLLM's own sockets) may take it as its local port before the server meant for
    it binds: a fleet run's router died so ("Address already in use") under load."""
    ephemeral = ephemeral_ports(range_file)
    candidates = [p for p in range(LOWEST_PORT, 65536) if p not in ephemeral]
    for port in random.sample(candidates, len(candidates)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    raise ServerError(f"no free port on {host} outside the ephemeral range")


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


@dataclass(frozen=True)
class ProcInfo:
    """One line of the process table: parent, process group, start time (clock ticks since
    boot; with the pid, what tells a process from a later one that got the same pid)."""

    ppid: int
    pgrp: int
    start_ticks: int


def _proc_info(pid: int) -> ProcInfo | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # after the command: state ppid pgrp session tty tpgid flags 4 x faults 4 x times
    # priority nice threads itrealvalue starttime
    return ProcInfo(int(fields[1]), int(fields[2]), int(fields[19]))


def running_processes() -> dict[int, ProcInfo]:
    """Every process now, from /proc."""
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (info := _proc_info(int(entry.name))) is not None:
            table[int(entry.name)] = info
    return table


def group_pids(pgid: int) -> set[int]:
    """Pids of the live processes in process group `pgid` (from /proc)."""
    return {pid for pid, info in running_processes().items() if info.pgrp == pgid}


def family(root: int, table: dict[int, ProcInfo]) -> set[int]:
    """`root`, its process group and all their descendants in `table` (a descendant that
    called `setsid` has left the group but not the family)."""
    members = {pid for pid, info in table.items() if info.pgrp == root} | {root}
    children: dict[int, list[int]] = {}
    for pid, info in table.items():
        children.setdefault(info.ppid, []).append(pid)
    todo = list(members)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in members:
                members.add(child)
                todo.append(child)
    return {pid for pid in members if pid in table}


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


# A process that never answered its health URL has served nothing and holds nothing to flush,
# so `stop` gives it this much grace at most. vLLM 0.32's API server, asked to stop while it
# waits in a zmq poll for its engine core's ready message, does not exit on SIGTERM (seen with
# py-spy): a Ctrl-C during start-up always ended in SIGKILL, after the full grace.
STARTING_GRACE_S = 3.0


class ManagedProcess:
    """One command in its own process group, logging to a file; always stoppable.

    Its own process group, not its own session: with the kernel's autogroup on (Debian's and
    Ubuntu's default), each session is one scheduling group, and a CPU is shared between the
    groups before their threads. A server in a session of its own then kept the load client
    that shares its CPU waiting 70-400 ms at a time, runnable, while vLLM's engine core and
    API server ran (perf sched here; `benchmarks/bench_autogroup.py` measures it): the
    client stamped a whole streamed answer as its first token. In the caller's session the
    server's and the client's threads share the CPU one by one, as the twin assumes
    (`engines.sim.host_cpu`). The group still gets the group's signals, and a Ctrl-C typed
    in the terminal still reaches only the foreground group (the caller).
    """

    def __init__(self, name: str, command: list[str], log_path: Path, env: dict[str, str],
                 health_url: str, cpus: frozenset[int] | None = None):
        # cpus: the CPUs the process (and all it starts) may run on; None: the OS's choice
        self.name, self.command, self.log_path = name, command, log_path
        self.cpus = cpus
        self.env, self.health_url = env, health_url
        self.process: subprocess.Popen | None = None
        self.started: dict[int, int] = {}  # every pid seen in the family -> its start ticks
        self._mutex = threading.Lock()
        self._log: IO[bytes] | None = None
        self.healthy = False  # its health URL has answered once

    @property
    def pids(self) -> set[int]:
        """Every process of this command's family seen so far (alive or not)."""
        with self._mutex:
            return set(self.started)

    def track(self) -> set[int]:
        """Record the processes of the group and their descendants now; the live ones.
        Called while it runs (health polls, the run's `Watcher`), so that a descendant that
        leaves the group is known when the group is killed."""
        proc = self.process
        return self._track(proc.pid) if proc is not None else set()

    def _track(self, root: int) -> set[int]:
        table = running_processes()
        alive = family(root, table)
        with self._mutex:
            for pid in alive:
                self.started.setdefault(pid, table[pid].start_ticks)
        return alive

    def still_running(self) -> set[int]:
        """The recorded processes that still run under their recorded start time (a pid
        reused by another process has another start time)."""
        with self._mutex:
            started = dict(self.started)
        return {pid for pid, ticks in started.items()
                if (info := _proc_info(pid)) is not None and info.start_ticks == ticks
                and pid_alive(pid)}

    def _kill_strays(self, root: int) -> None:
        """SIGKILL every recorded process still running outside group `root` (one that
        left it with `setsid`; the group itself gets the group's signals), and wait until
        they are gone."""
        strays = {pid for pid in self.still_running()
                  if (info := _proc_info(pid)) is not None and info.pgrp != root}
        for pid in strays:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        wait_gone(strays)  # a SIGKILLed process takes a moment to exit under load

    def start(self) -> None:
        """Start the process (no waiting)."""
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=self.env,
                                        process_group=0, preexec_fn=preexec(self.cpus))
        self.track()

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
                self.healthy = True
                return time.monotonic() - start
            self.track()
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
        when a Ctrl-C interrupts the waits (that interrupt is then passed on). A process still
        starting gets at most `STARTING_GRACE_S` to exit on SIGTERM."""
        proc, self.process = self.process, None
        term_grace_s = grace_s if self.healthy else min(grace_s, STARTING_GRACE_S)
        try:
            if proc is not None:
                self._track(proc.pid)
                _signal_group(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=term_grace_s)
                except subprocess.TimeoutExpired:
                    _signal_group(proc.pid, signal.SIGKILL)
                    try:
                        proc.wait(timeout=grace_s)
                    except subprocess.TimeoutExpired:
                        pass  # unkillable (D state): reported by its missing exit code
        finally:
            if proc is not None:
                _signal_group(proc.pid, signal.SIGKILL)  # stray children of the group
                self._kill_strays(proc.pid)
                wait_gone(self.still_running())
            if self._log is not None:
                self._log.close()
                self._log = None
        return proc.returncode if proc is not None else None


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
