"""A run removes and kills only what it can prove it created (issue 24, items 1, 2 and 12).

Everything here is real: processes (a stand-in server, `tests/data/fake_server.py`, that maps
POSIX shared memory and writes LMCache-named chunk files, started by the real `VllmServer`),
segments under /dev/shm, folders, flock locks and a `setsid` grandchild. Each test names only
the segments and files it made (a random tag), and removes them by those names if a test fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvrepro._paths import RefusedFolder
from kvrepro.engines.live.ownership import (
    LOCK_NAME,
    SHM_DIR,
    DiskFolder,
    FolderRefused,
    SharedMemory,
)
from kvrepro.engines.live.processes import ManagedProcess, ServerError, free_port, pid_alive
from kvrepro.engines.live.server import VllmServer
from kvrepro.engines.live.tiers import RUN_DISK_DIR, live_tier
from kvrepro.tier_spec import shipped_server

pytestmark = pytest.mark.skipif(not SHM_DIR.is_dir(), reason="no /dev/shm")
FAKE_SERVER = Path(__file__).resolve().parents[2] / "data" / "fake_server.py"
NOBODY = 65534
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make another "
                               "user's folder or segment")

# One live-like run in its own process: the real VllmServer with the stand-in server, its own
# flash folder, held until the file `go` exists. Prints what it cleaned and what it made.
RUN = r"""
import json, sys, time
from pathlib import Path
from kvrepro.engines.live.processes import free_port
from kvrepro.engines.live.server import VllmServer
from kvrepro.engines.live.tiers import TierConfig
run_dir, tag, python, disk, go = sys.argv[1:6]
ready = Path(run_dir).parent / f"{tag}.ready"
tier = TierConfig(name=tag, kind="baseline", model="/no/model", port=free_port(),
                  folders=[{"store": "flash", "path": disk}],
                  env={"FAKE_TAG": tag, "FAKE_READY": str(ready), "FAKE_DISK_DIR": disk})
server = VllmServer(tier, run_dir, python=python)
with server:
    while not ready.exists():
        server.check_alive()
        time.sleep(0.05)
    while not Path(go).exists():
        time.sleep(0.05)
print(json.dumps({"cleaned": server.cleaned, **json.loads(ready.read_text())}))
"""

# A bystander: a segment it created and closed (it persists) and one it keeps mapped.
BYSTANDER = r"""
import mmap, os, sys
tag = sys.argv[1]
def segment(name):
    fd = os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.ftruncate(fd, 4096)
    mapped = mmap.mmap(fd, 4096)
    os.close(fd)
    mapped[:9] = b"bystander"
    return mapped
segment(f"psm_{tag}_closed").close()
held = segment(f"psm_{tag}_held")
print("ready", flush=True)
sys.stdin.readline()
ok = held[:9] == b"bystander" and os.path.exists(f"/dev/shm/psm_{tag}_held")
print("intact" if ok else "lost", flush=True)
"""


@pytest.fixture
def tag() -> Iterator[str]:
    """A random tag for this test's segment names; whatever carries it is removed after."""
    value = f"kvt{uuid.uuid4().hex[:10]}"
    yield value
    for path in SHM_DIR.glob(f"*{value}*"):
        path.unlink(missing_ok=True)


def _stand_in(tmp_path: Path) -> str:
    """A file that stands in for vLLM's interpreter and starts the fake server instead."""
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_SERVER}\n")
    script.chmod(0o755)
    return str(script)


def _fake(tmp_path: Path, tag: str, disk: Path | None = None) -> ManagedProcess:
    """The fake server as a ManagedProcess, started and ready (its segments made)."""
    ready = tmp_path / f"{tag}.ready"
    env = {**os.environ, "FAKE_TAG": tag, "FAKE_READY": str(ready),
           **({"FAKE_DISK_DIR": str(disk)} if disk else {})}
    proc = ManagedProcess("fake", [sys.executable, str(FAKE_SERVER)], tmp_path / f"{tag}.log",
                          env, "http://127.0.0.1:9/health")
    proc.start()
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline and proc.process.poll() is None, "fake not ready"
        time.sleep(0.02)
    return proc


def _made(tmp_path: Path, tag: str) -> dict:
    return json.loads((tmp_path / f"{tag}.ready").read_text())


def test_two_runs_and_a_bystander_each_run_removes_exactly_its_own(tmp_path: Path,
                                                                   tag: str) -> None:
    python, go = _stand_in(tmp_path), tmp_path / "go"
    runs = {}
    for name in ("a", "b"):
        run_dir = tmp_path / name / "run"
        run_dir.parent.mkdir()
        disk = tmp_path / name / "flash"
        runs[name] = subprocess.Popen(
            [sys.executable, "-c", RUN, str(run_dir), f"{tag}{name}", python, str(disk),
             str(go)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for name in runs:  # both runs serve, with their segments and chunk files made
        deadline = time.monotonic() + 60
        while not (tmp_path / name / f"{tag}{name}.ready").exists():
            assert time.monotonic() < deadline and runs[name].poll() is None, \
                runs[name].communicate()
            time.sleep(0.05)
    bystander = subprocess.Popen([sys.executable, "-c", BYSTANDER, tag], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
    assert bystander.stdout.readline().strip() == "ready"
    notes = tmp_path / "a" / "flash" / "notes.txt"  # a user's file, dropped in mid-run
    notes.write_text("mine")
    go.touch()
    results = {}
    for name, run in runs.items():
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
        results[name] = json.loads(out.strip().splitlines()[-1])
    bystander.stdin.write("done\n")
    bystander.stdin.flush()
    assert bystander.stdout.readline().strip() == "intact"
    bystander.wait(timeout=10)
    assert (SHM_DIR / f"psm_{tag}_closed").exists()  # created and closed: still there
    assert notes.read_text() == "mine"
    for name, made in results.items():
        assert not pid_alive(made["pid"])
        assert not [s for s in made["segments"] if (SHM_DIR / s).exists()], name
        assert sorted(made["cleaned"]["shm_segments"]) == sorted(made["segments"])
        assert not [f for f in made["files"] if Path(f).exists()], name
        assert made["cleaned"]["disk_files"] == 3
    assert not (tmp_path / "b" / "flash").exists()  # b's folder was its own: gone
    assert sorted(p.name for p in (tmp_path / "a" / "flash").iterdir()) == ["notes.txt"]
    assert any("left 1 file(s) the run did not create" in e
               for e in results["a"]["cleaned"]["errors"])


def test_a_second_run_on_a_flash_folder_in_use_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "l2"
    first = DiskFolder(folder, run_dir=tmp_path / "run1")
    first.prepare()
    (folder / "chunk.data").write_bytes(b"kv")
    second = subprocess.run(
        [sys.executable, "-c", "import sys; from kvrepro.engines.live.ownership import "
         "DiskFolder; DiskFolder(sys.argv[1], allow_existing=True).prepare()", str(folder)],
        capture_output=True, text=True)
    assert second.returncode != 0
    assert f"flash folder {folder} is in use by another run (pid {os.getpid()}" in second.stderr
    assert first.cleanup() == 1
    assert not folder.exists()  # the lock file and the folder it made went with it
    again = DiskFolder(folder)  # free again once the first run is done
    again.prepare()
    assert (folder / LOCK_NAME).exists()
    again.cleanup()


def test_flash_folder_that_contains_the_run_folder_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "flash"
    run_dir.mkdir(parents=True)
    (run_dir / "server.log").write_text("the run's own log")
    for folder in (tmp_path, tmp_path / "runs", run_dir):
        with pytest.raises(FolderRefused, match="contains the run folder"):
            DiskFolder(folder, allow_existing=True, run_dir=run_dir).prepare()
    assert (run_dir / "server.log").read_text() == "the run's own log"
    assert issubclass(FolderRefused, RefusedFolder) and issubclass(FolderRefused, ServerError)


@ROOT_ONLY
def test_flash_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o777)
    os.chown(folder, NOBODY, NOBODY)
    with pytest.raises(FolderRefused, match=f"belongs to uid {NOBODY}"):
        DiskFolder(folder).prepare()
    assert not (folder / LOCK_NAME).exists()


def test_only_files_seen_new_unchanged_and_named_as_lmcache_names_them_go(
        tmp_path: Path) -> None:
    folder = tmp_path / "l2"
    disk = DiskFolder(folder, run_dir=tmp_path / "run")
    disk.prepare()
    (folder / "sub").mkdir()
    for name in ("a.data", "sub/b.data", "c.data.tmp", "d.pt"):
        (folder / name).write_bytes(b"kv")
    (folder / "notes.txt").write_text("a user's")
    disk.sample()
    (folder / "a.data").write_bytes(b"changed after the run's processes stopped")
    os.utime(folder / "a.data", ns=(1, 1))
    assert disk.cleanup() == 3
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) == [
        "a.data", "notes.txt"]
    assert any("a.data: changed after" in p for p in disk.problems)
    assert any("left 1 file(s) the run did not create" in p for p in disk.problems)


def test_a_chunk_written_again_in_its_place_while_the_run_runs_is_still_the_runs(
        tmp_path: Path) -> None:
    """LMCache writes a chunk through `.tmp` and a rename: written again during the run (an
    instance of a fleet storing a chunk another stored in the shared folder), the new file
    in its place is the run's too; one replaced after the processes stopped is not."""
    folder = tmp_path / "share"
    disk = DiskFolder(folder, run_dir=tmp_path / "run", label="shared folder")
    disk.prepare()
    (folder / "k.data").write_text("first")
    (folder / "j.data").write_text("first")
    disk.sample()
    for name in ("k", "j"):
        (folder / f"{name}.tmp").write_text("again")
        os.replace(folder / f"{name}.tmp", folder / f"{name}.data")
    disk.sample()  # the run's processes still write: k's new file is seen as theirs
    (folder / "x.tmp").write_text("after")
    os.replace(folder / "x.tmp", folder / "j.data")  # replaced after they stopped
    assert disk.cleanup() == 1
    assert sorted(p.name for p in folder.iterdir()) == ["j.data"]
    assert any("j.data: changed after" in p for p in disk.problems)


def test_default_flash_folder_is_the_runs_own(tmp_path: Path) -> None:
    spec = shipped_server("cpu_tiny")
    tier = live_tier(spec, "flash", "multi_process")
    assert [f.path for f in tier.folders] == [RUN_DISK_DIR]
    servers = [VllmServer(tier.model_copy(update={"port": free_port()}), tmp_path / n)
               for n in ("one", "two")]
    folders = [s.tier.folders[0].path for s in servers]
    assert folders == [str((tmp_path / n / "lmcache-l2").resolve()) for n in ("one", "two")]
    for server, folder in zip(servers, folders, strict=True):
        assert [a["base_path"] for a in server.tier.lmcache_mp.l2_adapters] == [folder]
        assert [d.path for d in server.disks] == [Path(folder)]


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_check_refuses_what_prepare_refuses_and_touches_nothing(tmp_path: Path) -> None:
    """`DiskFolder.check` (what `kvrepro doctor` asks, issue 37 item 7) gives the run's own
    verdict on each folder without making, locking or writing anything (6065f95 had no such
    check: the doctor kept rules of its own, and they disagreed)."""
    held, foreign, only_dirs = tmp_path / "held", tmp_path / "foreign", tmp_path / "dirs"
    other_run = DiskFolder(held, run_dir=tmp_path / "other")
    other_run.prepare()
    foreign.mkdir()
    (foreign / "theirs.bin").write_bytes(b"x")
    (only_dirs / "sub").mkdir(parents=True)
    os.mkfifo(only_dirs / "fifo")
    cases = {held: "is in use by another run", foreign: r"already holds 1 file\(s\)",
             tmp_path: "contains the run folder", only_dirs: None, tmp_path / "new": None}
    try:
        for folder, refused in cases.items():
            before = _listing(tmp_path)
            for url in (str(folder), f"file://{folder}"):
                disk = DiskFolder(url, run_dir=tmp_path / "runs" / "run")
                if refused is None:
                    disk.check()
                else:
                    with pytest.raises(FolderRefused, match=refused):
                        disk.check()
                assert _listing(tmp_path) == before  # the check made and wrote nothing
                if refused is None:
                    disk.prepare()  # the run agrees
                    disk.cleanup()
                else:
                    with pytest.raises(FolderRefused, match=refused):
                        disk.prepare()
    finally:
        other_run.cleanup()
    DiskFolder(foreign, allow_existing=True).check()


def test_a_folders_files_are_counted_only_up_to_a_bound(tmp_path: Path) -> None:
    """A folder holding FILES_COUNTED_AT_MOST files or more is refused as holding "at least"
    that many, after a walk that stopped there (6065f95 walked and counted all 150)."""
    folder = tmp_path / "l2"
    for n in range(150):
        (folder / f"d{n:03d}").mkdir(parents=True)
        (folder / f"d{n:03d}" / "chunk.data").write_bytes(b"kv")
    for disk in (DiskFolder(folder), DiskFolder(folder, run_dir=tmp_path / "run")):
        with pytest.raises(FolderRefused, match="already holds at least 100 file"):
            disk.prepare()
    assert not (folder / LOCK_NAME).exists()


def test_segments_the_run_held_are_removed_a_bystanders_never(tmp_path: Path,
                                                              tag: str) -> None:
    closed = SHM_DIR / f"psm_{tag}_bystander"
    closed.write_bytes(b"someone else's, created and closed")
    shm = SharedMemory()
    proc = _fake(tmp_path, tag)
    shm.sample(proc.track())
    late = SHM_DIR / f"psm_{tag}_late"  # appears during the run, not the run's
    late.write_bytes(b"x")
    proc.stop(grace_s=5)
    made = _made(tmp_path, tag)["segments"]
    assert all((SHM_DIR / s).exists() for s in made)  # a killed server leaves them behind
    assert sorted(shm.cleanup()) == sorted(made)
    assert not [s for s in made if (SHM_DIR / s).exists()]
    assert closed.exists() and late.exists() and not shm.problems


@ROOT_ONLY
def test_another_users_segment_is_never_the_runs_and_the_rest_still_goes(
        tmp_path: Path, tag: str) -> None:
    proc = _fake(tmp_path, tag)
    psm, kv = _made(tmp_path, tag)["segments"]
    os.chown(SHM_DIR / psm, NOBODY, NOBODY)  # as if another user's process made it
    shm = SharedMemory()
    shm.sample(proc.track())
    proc.stop(grace_s=5)
    assert shm.cleanup() == [kv]
    assert (SHM_DIR / psm).exists() and not (SHM_DIR / kv).exists()


def test_a_replaced_or_still_held_segment_is_skipped_and_reported(tmp_path: Path,
                                                                  tag: str) -> None:
    proc = _fake(tmp_path, tag)
    psm, kv = _made(tmp_path, tag)["segments"]
    shm = SharedMemory()
    shm.sample(proc.track())
    proc.stop(grace_s=5)
    (SHM_DIR / psm).unlink()
    (SHM_DIR / psm).write_bytes(b"a new segment under the old name")
    holder = subprocess.Popen(  # someone maps the run's other segment and keeps it
        [sys.executable, "-c", "import mmap, sys; f = open(sys.argv[1], 'r+b'); "
         "m = mmap.mmap(f.fileno(), 0); print('held', flush=True); sys.stdin.read()",
         str(SHM_DIR / kv)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert shm.cleanup() == []
    finally:
        holder.communicate("")
    assert (SHM_DIR / psm).read_bytes() == b"a new segment under the old name"
    assert (SHM_DIR / kv).exists()
    assert sorted(p.split(": ", 1)[1] for p in shm.problems) == [
        "another segment now has this name; left alone", "still held by a live process; "
        "left alone"]
    assert shm.cleanup() == [kv]  # once nobody holds it, it goes


def test_a_grandchild_that_left_the_group_is_killed_a_bystander_is_not(
        tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    grandchild = ("import os, sys, time; os.setsid(); "
                  "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)")
    script = ("import subprocess, sys, time; "
              f"subprocess.Popen([sys.executable, '-c', {grandchild!r}, {str(pid_file)!r}]); "
              "time.sleep(120)")
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    proc = ManagedProcess("toy", [sys.executable, "-c", script], tmp_path / "toy.log",
                          dict(os.environ), "http://127.0.0.1:9/health")
    proc.start()
    try:
        deadline = time.monotonic() + 20
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        escaped = int(pid_file.read_text())
        assert os.getpgid(escaped) != proc.process.pid  # it left the group
        proc.track()
        proc.started[bystander.pid] = 1  # a recorded pid now someone else's: wrong start time
        proc.stop(grace_s=5)
        assert not pid_alive(escaped)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_a_semaphore_no_sample_saw_is_removed_by_the_ledger(tmp_path: Path) -> None:
    """A multiprocessing semaphore (`sem.mp-*`) of a server SIGKILLed before any sample:
    the creating process wrote it into the run's ledger, so the run removes it; a
    bystander's semaphore made at the same time stays."""
    # The semaphore is taken off multiprocessing's resource tracker, as the tracker of a
    # SIGKILLed process group dies with it: else the tracker unlinks it when the server dies,
    # racing the test's own check (seen once in CI-like load: cleanup() found it gone).
    script = ("import multiprocessing as mp, sys, time; "
              "from multiprocessing import resource_tracker; "
              "lock = mp.get_context('spawn').Lock(); "
              "resource_tracker.unregister(lock._semlock.name, 'semaphore'); "
              "print(lock._semlock.name, flush=True); time.sleep(120)")
    shm = SharedMemory()
    env = shm.environment(dict(os.environ), tmp_path)
    errors_path = tmp_path / "server.err"
    with errors_path.open("w") as errors_file:  # a file: a pipe's EOF would wait for the
        server = subprocess.Popen(  # resource tracker, which unlinks the semaphore first
            [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
            stderr=errors_file, text=True)
    bystander = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                                 text=True)
    try:
        mine = "sem." + server.stdout.readline().strip().lstrip("/")
        theirs = "sem." + bystander.stdout.readline().strip().lstrip("/")
        server.kill()
        server.wait()
        assert (SHM_DIR / mine).exists()  # killed: nothing unlinked it
        assert shm.cleanup() == [mine]
        assert not (SHM_DIR / mine).exists() and (SHM_DIR / theirs).exists()
        # the ledger's hook starts cleanly (it once printed "Error in sitecustomize:
        # KeyError" into every server log)
        assert "sitecustomize" not in errors_path.read_text()
    finally:
        bystander.kill()
        bystander.wait()
        for name in (mine, theirs):  # the test's own two semaphores, by their exact names
            (SHM_DIR / name).unlink(missing_ok=True)
