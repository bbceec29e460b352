"""What a live run owns and gives back: the flash folder, /dev/shm leftovers, process groups."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

from kvrepro.engines.live.processes import (
    SHM_DIR,
    DiskFolder,
    ManagedProcess,
    ServerError,
    SharedMemory,
    free_port,
    group_pids,
    port_in_use,
)


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


@pytest.mark.skipif(not SHM_DIR.is_dir(), reason="no /dev/shm")
def test_shared_memory_leftovers_are_the_runs_own_only() -> None:
    tag = uuid.uuid4().hex[:8]
    old = SHM_DIR / f"psm_old{tag}"
    old.write_bytes(b"0")
    try:
        shm = SharedMemory()
        new, mine = SHM_DIR / f"psm_new{tag}", SHM_DIR / f"lmcache_kv_{os.getpid()}_{tag}"
        other = SHM_DIR / "lmcache_kv_1_" f"{tag}"  # pid 1 is not one of the run's
        held = SHM_DIR / f"psm_held{tag}"
        for path in (new, mine, other, held):
            path.write_bytes(b"0")
        with held.open("rb"):  # an open segment is some live process's: left alone
            removed = shm.cleanup({os.getpid()})
        assert sorted(removed) == sorted([new.name, mine.name])
        assert old.exists() and other.exists() and held.exists()
        assert not new.exists() and not mine.exists()
    finally:
        for path in SHM_DIR.glob(f"*{tag}"):
            path.unlink()


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


def test_free_port_is_free() -> None:
    port = free_port()
    assert 0 < port < 65536 and not port_in_use("127.0.0.1", port)
