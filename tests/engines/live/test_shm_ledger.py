"""The `sitecustomize` a live run puts on its servers' PYTHONPATH (issue 37, item 8): a user's
own sitecustomize behaves as it would without kvrepro, and the run's ledger of shared-memory
objects costs the reader only what is new and keeps only what is alive.

Real processes throughout: a fresh Python with the ledger folder on its PYTHONPATH (before a
folder holding the user's own `sitecustomize.py`) next to the same Python without it, and a
process that makes thousands of transient `multiprocessing` locks.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvrepro.engines.live.ownership import LEDGER_ENV, LEDGER_PATH_DIR, SHM_DIR, SharedMemory

pytestmark = pytest.mark.skipif(not SHM_DIR.is_dir(), reason="no /dev/shm")

USERS_SITECUSTOMIZE = {  # what a user's own sitecustomize.py may hold
    "fails importing": "import kvrepro_no_such_module_37\n",
    "raises": "raise RuntimeError('the user s own error')\n",
    "syntax error": "def broken(:\n",
    "sets attributes": ("import pathlib\nFLAG = 'the user s'\ndef helper():\n"
                        "    return 42\nwith open(pathlib.Path(__file__).with_name("
                        "'runs.txt'), 'a') as runs:\n    runs.write('ran\\n')\n"),
}
SHOW = ("import json, sitecustomize; print(json.dumps({'file': sitecustomize.__file__, "
        "'names': sorted(n for n in vars(sitecustomize) if not n.startswith('__')), "
        "'flag': getattr(sitecustomize, 'FLAG', None)}))")


def _python(tmp_path: Path, user_dir: Path, with_ledger: bool) -> subprocess.CompletedProcess:
    """A fresh Python with the user's folder on PYTHONPATH, after the ledger's when asked."""
    path = [str(LEDGER_PATH_DIR)] if with_ledger else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(user_dir)]),
           LEDGER_ENV: str(tmp_path / "ledger.txt")}
    env.pop("PYTHONVERBOSE", None)
    return subprocess.run([sys.executable, "-c", SHOW], env=env, capture_output=True,
                          text=True, timeout=60)


def test_a_users_sitecustomize_behaves_as_without_the_ledger(tmp_path: Path) -> None:
    """Same stderr (an error in the user's module printed as site.py prints it, not
    swallowed), same `sitecustomize` module (the user's attributes, not ours), run once."""
    for case, source in USERS_SITECUSTOMIZE.items():
        user_dir = tmp_path / case.replace(" ", "_")
        user_dir.mkdir()
        (user_dir / "sitecustomize.py").write_text(source)
        without = _python(tmp_path, user_dir, with_ledger=False)
        with_ledger = _python(tmp_path, user_dir, with_ledger=True)
        assert (with_ledger.returncode, with_ledger.stderr, with_ledger.stdout) == (
            without.returncode, without.stderr, without.stdout), case
        if case != "sets attributes":
            assert without.stderr.startswith(  # what site.py prints, and we must not hide
                "Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"), case
    assert '"flag": "the user s"' in without.stdout
    assert (tmp_path / "sets_attributes" / "runs.txt").read_text() == "ran\n" * 2


def test_the_ledger_still_records_beside_a_users_sitecustomize(tmp_path: Path) -> None:
    """The user's module runs and the run's semaphore is still written into the ledger."""
    user_dir = tmp_path / "user"
    user_dir.mkdir()
    (user_dir / "sitecustomize.py").write_text("FLAG = 'users'\n")
    script = ("import multiprocessing as mp, sitecustomize; lock = mp.get_context('spawn')"
              ".Lock(); print(sitecustomize.FLAG, lock._semlock.name)")
    env = {**os.environ, LEDGER_ENV: str(tmp_path / "ledger.txt"),
           "PYTHONPATH": os.pathsep.join([str(LEDGER_PATH_DIR), str(user_dir)])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=60, check=True)
    flag, name = done.stdout.split()
    assert flag == "users" and not done.stderr
    events = [line.split()[::2] for line in (tmp_path / "ledger.txt").read_text().splitlines()]
    assert events == [["created", "sem." + name.lstrip("/")],
                      ["unlinked", "sem." + name.lstrip("/")]]


TRANSIENT = r"""
import multiprocessing as mp, sys
from multiprocessing import shared_memory
mp.set_start_method("spawn")  # a named semaphore, as vLLM's processes make them
count = int(sys.argv[1])
for _ in range(count):
    mp.Lock()  # unlinked as soon as it is collected
for _ in range(count // 10):
    segment = shared_memory.SharedMemory(create=True, size=4096)
    segment.close()
    segment.unlink()
kept = mp.Lock()
print(kept._semlock.name, flush=True)
sys.stdin.readline()
"""


def _bytes_read_by_this_thread() -> int:
    """rchar of this thread (/proc/thread-self/io): every byte its read calls returned."""
    for line in Path("/proc/thread-self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/thread-self/io")


def test_transient_locks_cost_the_reader_their_lines_once(tmp_path: Path) -> None:
    """2,000 transient locks and 200 transient segments: the ledger says each was unlinked,
    the reader keeps only the one live lock, and a later sample reads no ledger byte again
    (it re-read the whole file every second)."""
    count = 2000
    shm = SharedMemory()
    env = shm.environment(dict(os.environ), tmp_path)
    with (tmp_path / "child.err").open("w") as errors:
        child = subprocess.Popen([sys.executable, "-c", TRANSIENT, str(count)], env=env,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=errors, text=True)
    try:
        kept = "sem." + child.stdout.readline().strip().lstrip("/")
        shm.sample([child.pid])
        lines = shm.ledger.read_text().splitlines()
        events = [line.split(" ", 1)[0] for line in lines]
        assert events.count("unlinked") == count + count // 10
        assert events.count("created") == count + count // 10 + 1
        assert list(shm.seen) == [kept]
        size = shm.ledger.stat().st_size
        before = _bytes_read_by_this_thread()
        for _ in range(3):
            shm.sample(())  # a watcher's next seconds: nothing new in the ledger
        assert _bytes_read_by_this_thread() - before < 1024 < size
        assert list(shm.seen) == [kept]
    finally:
        child.communicate("\n", timeout=60)  # its lock is unlinked at its exit
    shm.sample(())
    assert shm.seen == {} and shm.cleanup() == [] and not (SHM_DIR / kept).exists()
    assert "sitecustomize" not in (tmp_path / "child.err").read_text()
