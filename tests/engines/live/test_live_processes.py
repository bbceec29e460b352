"""What a live run owns and gives back: the flash folder, /dev/shm leftovers, process groups."""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kvrepro.engines.live import processes
from kvrepro.engines.live.ownership import DiskFolder, SharedMemory
from kvrepro.engines.live.processes import (
    ManagedProcess,
    ServerError,
    free_port,
    group_pids,
    port_in_use,
)
from kvrepro.engines.live.server import VllmServer
from kvrepro.engines.live.tiers import TierConfig

SLEEPER = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(120)"]


def test_disk_folder_refuses_foreign_files_and_removes_only_its_own(tmp_path: Path) -> None:
    folder = tmp_path / "l2"
    folder.mkdir()
    (folder / "theirs.data").write_text("x")
    with pytest.raises(ServerError, match=r"l2 already holds 1 file\(s\) this run did not create"):
        DiskFolder(folder).prepare()
    allowed = DiskFolder(folder, allow_existing=True)
    allowed.prepare()
    (folder / "sub").mkdir()
    (folder / "sub" / "mine.data").write_text("y")
    (folder / "mine2.data").write_text("z")
    assert allowed.cleanup() == 2
    assert sorted(p.name for p in folder.rglob("*")) == ["theirs.data"]


def test_disk_folder_removes_the_folders_it_made_and_keeps_files_when_asked(tmp_path) -> None:
    made = DiskFolder(f"file://{tmp_path}/a/b/l2")
    made.prepare()
    (made.path / "c.data").write_text("1")
    made.cleanup()
    assert not (tmp_path / "a").exists()
    kept = DiskFolder(tmp_path / "k", keep_files=True)
    kept.prepare()
    (kept.path / "c.data").write_text("1")
    assert kept.cleanup() == 0 and (kept.path / "c.data").exists()


def test_managed_process_reports_its_death_with_its_log(tmp_path: Path) -> None:
    script = "import sys; print('boom: no such model', flush=True); sys.exit(3)"
    proc = ManagedProcess("toy server", [sys.executable, "-c", script], tmp_path / "toy.log",
                          dict(os.environ), "http://127.0.0.1:9/health")
    proc.start()
    with pytest.raises(ServerError, match=r"toy server exited during start-up with code 3"
                                          r"(.|\n)*boom: no such model"):
        proc.wait_healthy(timeout_s=30, poll_s=0.05)
    assert proc.stop() == 3 and proc.stop() is None  # stopping twice is harmless


def test_managed_process_stop_takes_down_the_whole_group(tmp_path: Path) -> None:
    script = ("import subprocess, sys, time; "
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              "time.sleep(60)")
    proc = ManagedProcess("toy", [sys.executable, "-c", script], tmp_path / "toy.log",
                          dict(os.environ), "http://127.0.0.1:9/health")
    proc.start()
    import time

    deadline = time.monotonic() + 10
    while len(group_pids(proc.process.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = group_pids(proc.process.pid)
    assert len(pids) == 2
    proc.stop(grace_s=5)

    def alive(pid: int) -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        return state not in ("Z", "X")

    assert not [p for p in pids if alive(p)]


def test_free_port_is_free_and_outside_the_ephemeral_range(tmp_path: Path) -> None:
    low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range")
                 .read_text().split())
    ports = {free_port() for _ in range(50)}
    assert all(p < low or p > high for p in ports), sorted(ports)
    assert all(p >= 1024 and not port_in_use("127.0.0.1", p) for p in ports)
    # the range comes from the kernel's file: a narrower one leaves more ports to pick from
    narrow = tmp_path / "range"
    narrow.write_text("60000\t60999\n")
    assert any(low <= free_port(range_file=narrow) <= high for _ in range(200))


def _reap(pid: int) -> None:
    """Kill and reap a test's own child (its group) so no zombie or sleeper outlives it."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def test_stop_of_a_process_that_outlives_sigkill_returns_and_closes_its_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[int, int]] = []  # signals are recorded, not sent: the process lives on
    monkeypatch.setattr(processes, "_signal_group", lambda pgid, sig: sent.append((pgid, sig)))
    # the process never goes, so stop's final wait_gone always runs to its timeout: 0.2 s
    # here instead of the default 5 s (the same code path, the same outcome)
    real_wait_gone = processes.wait_gone
    monkeypatch.setattr(processes, "wait_gone",
                        lambda pids, timeout_s=0.2: real_wait_gone(pids, timeout_s))
    proc = ManagedProcess("stuck", SLEEPER, tmp_path / "stuck.log", dict(os.environ),
                          "http://127.0.0.1:9/health")
    proc.start()
    pid, log = proc.process.pid, proc._log
    try:
        assert proc.stop(grace_s=0.2) is None  # both real waits time out: no exit code
        assert sent == [(pid, signal.SIGTERM), (pid, signal.SIGKILL), (pid, signal.SIGKILL)]
        assert log.closed and proc._log is None and proc.process is None
        assert processes.pid_alive(pid)  # it really did outlive both waits
    finally:
        _reap(pid)


DEAF = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        " print('deaf', flush=True); time.sleep(120)"]


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("answers_health", [False, True], ids=["starting", "serving"])
def test_a_process_still_starting_gets_a_short_grace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answers_health: bool) -> None:
    """A process that ignores SIGTERM is SIGKILLed after STARTING_GRACE_S while it never
    answered its health URL (vLLM waiting for its engine core), after the full grace once
    it has."""
    import time

    monkeypatch.setattr(processes, "STARTING_GRACE_S", 0.2)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1] if answers_health else 9
    proc = ManagedProcess("deaf", DEAF, tmp_path / "deaf.log", dict(os.environ),
                          f"http://127.0.0.1:{port}/health")
    proc.start()
    pid = proc.process.pid
    try:
        deadline = time.monotonic() + 30
        while "deaf" not in (tmp_path / "deaf.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.05)  # its SIGTERM handler is in place
        if answers_health:
            proc.wait_healthy(timeout_s=10, poll_s=0.05)
        start = time.monotonic()
        assert proc.stop(grace_s=2.0) == -signal.SIGKILL
        took_s = time.monotonic() - start
        assert took_s >= 2.0 if answers_health else took_s < 1.5, took_s
    finally:
        server.shutdown()
        _reap(pid)


def _never_exits(*args: object, **kwargs: object) -> int:
    raise subprocess.TimeoutExpired("vllm", 20.0)


def test_server_exit_passes_on_the_runs_error_when_vllm_will_not_exit(
        tmp_path: Path) -> None:
    tier = TierConfig(name="stuck", kind="baseline", model="/no/model", port=free_port(),
                      folders=[{"store": "flash", "path": str(tmp_path / "l2")}])
    sleeper = tmp_path / "python"  # stands in for vLLM's interpreter: ignores its arguments
    sleeper.write_text("#!/bin/sh\necho starting; exec sleep 120\n")
    sleeper.chmod(0o755)
    server = VllmServer(tier, tmp_path / "run", python=str(sleeper))
    with pytest.raises(RuntimeError, match="the run's own error"):
        with server:
            pid, log = server.process.pid, server.vllm._log
            server.process.wait = _never_exits  # every wait times out, SIGKILL included
            (tmp_path / "l2" / "chunk.data").write_text("kv")
            raise RuntimeError("the run's own error")
    _reap(pid)
    assert log.closed and server.process is None
    assert server.cleaned["disk_files"] == 1 and not (tmp_path / "l2").exists()


def test_server_exit_keeps_a_failed_clean_up_step_instead_of_raising_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: SharedMemory) -> list[str]:
        raise PermissionError("[Errno 13] Permission denied: '/dev/shm/psm_x'")

    monkeypatch.setattr(SharedMemory, "cleanup", refuse)
    tier = TierConfig(name="t", kind="baseline", model="/no/model", port=free_port(),
                      folders=[{"store": "flash", "path": str(tmp_path / "l2")}])
    server = VllmServer(tier, tmp_path / "run", python="/bin/true")
    with pytest.raises(RuntimeError, match="the run's own error"):
        with server:
            (tmp_path / "l2" / "chunk.data").write_text("kv")
            raise RuntimeError("the run's own error")
    assert server.cleaned["errors"] == [
        "shm_segments: [Errno 13] Permission denied: '/dev/shm/psm_x'"]
    assert server.cleaned["disk_files"] == 1  # the step after the failed one still ran
    assert not (tmp_path / "l2").exists()


TOY_SERVER = """#!{python}
# a stand-in that serves 200 on any GET on its `{flag}` port after sleeping `{delay_s}` s,
# and writes when it started and when it answered (time.time()) into {stamps}
import http.server, sys, time
start = time.time()
port = int(sys.argv[sys.argv.index("{flag}") + 1])
time.sleep({delay_s})
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", port), Ok)
with open("{stamps}", "w") as out:
    out.write(f"{{start}} {{time.time()}}")
server.serve_forever()
"""


def _toy(path: Path, flag: str, delay_s: float) -> Path:
    """An executable toy server at `path` (see TOY_SERVER); its stamps go to path.stamps."""
    path.write_text(TOY_SERVER.format(python=sys.executable, flag=flag, delay_s=delay_s,
                                      stamps=path.with_suffix(".stamps")))
    path.chmod(0o755)
    return path.with_suffix(".stamps")


def test_lmcache_and_vllm_start_side_by_side_and_vllm_is_awaited_after_lmcache(
        tmp_path: Path) -> None:
    """The LMCache server takes 2 s to answer; vLLM starts meanwhile, not after it
    (`VllmServer.start`), and `wait_healthy` returns once both answer, counting from the
    start. Started one after the other, vLLM would start after LMCache answered."""
    from kvrepro.engines.live.tiers import live_tier
    from kvrepro.tier_spec import shipped_server

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    lmcache = _toy(bin_dir / "lmcache", "--http-port", delay_s=2.0)
    vllm = _toy(bin_dir / "python", "--port", delay_s=0.0)
    tier = live_tier(shipped_server("cpu_tiny"), "dram").model_copy(
        update={"model": "/no/model", "port": free_port()})
    with VllmServer(tier, tmp_path / "run", python=str(bin_dir / "python"),
                    health_poll_s=0.05) as server:
        took_s = server.wait_healthy(timeout_s=30)
    lmcache_start, lmcache_up = map(float, lmcache.read_text().split())
    vllm_start, _ = map(float, vllm.read_text().split())
    assert vllm_start < lmcache_up - 1.0  # started while LMCache still slept
    assert 2.0 <= took_s < 10.0


def test_an_lmcache_server_that_dies_starting_stops_vllm_too(tmp_path: Path) -> None:
    """vLLM started beside an LMCache server that exits at once: `wait_healthy` names the
    LMCache server and its log, and leaving the deployment stops vLLM's group."""
    from kvrepro.engines.live.tiers import live_tier
    from kvrepro.tier_spec import shipped_server

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "lmcache").write_text("#!/bin/sh\necho 'no such flag: --l1-size-gb'; exit 2\n")
    (bin_dir / "lmcache").chmod(0o755)
    _toy(bin_dir / "python", "--port", delay_s=60.0)  # still starting when LMCache dies
    tier = live_tier(shipped_server("cpu_tiny"), "dram").model_copy(
        update={"model": "/no/model", "port": free_port()})
    server = VllmServer(tier, tmp_path / "run", python=str(bin_dir / "python"),
                        health_poll_s=0.05)
    with pytest.raises(ServerError, match=r"LMCache server for tier 'dram' exited during "
                                          r"start-up with code 2(.|\n)*no such flag"):
        with server:
            vllm_pid = server.process.pid
            server.wait_healthy(timeout_s=30)
    assert server.process is None and not group_pids(vllm_pid)
