"""Issue 24, items 4 and 6: a sweep's local Ray listens on the loopback only, with token
authentication, and a sweep folder survives corruption and a second writer.

Real sweeps, real Ray, real files and real processes: a sweep run by a child process whose
point waits for the test (so that its Ray processes' sockets can be listed, or so that it
holds its folder while another sweep tries it), point files cut short as a crash leaves
them, temporary files of a dead and of a live writer, and `strace` of a point's write.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import uuid
from pathlib import Path

import psutil
import pytest

from kvrepro._paths import RefusedFolder
from kvrepro.sweep import point_id, read_sweep, run_sweep

ray = pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[1]
TWIN = {"server": "cpu_tiny", "tier": "dram", "session_rate_per_min": 20.0,
        "duration_s": 60.0, "warmup_s": 10.0}

SWEEP_SCRIPT = '''
"""A sweep in its own process: waits for <gate>/go, then runs its grid; each point marks
<gate>/running and waits for <gate>/release (a twin point then runs the twin)."""
import json, sys, time
from pathlib import Path

from kvrepro._paths import RefusedFolder
from kvrepro.studies.whatif import default_point
from kvrepro.sweep import run_sweep


def gated_point(point):
    gate = Path(point["gate"])
    (gate / "running").write_text("")
    deadline = time.monotonic() + 180
    while not (gate / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if point.get("kind") == "twin":
        return default_point({k: v for k, v in point.items() if k not in ("gate", "kind")})
    return {"value": point["a"] * 10}


out, points, gate = sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3])
while not (gate / "go").exists():
    time.sleep(0.01)
try:
    table = run_sweep(points, out, point_fn=gated_point, max_parallel=1, progress=False)
except RefusedFolder as err:
    print(f"REFUSED {err}", file=sys.stderr)
    sys.exit(3)
print(json.dumps(list(table.status)))
'''


def _start_sweep(tmp_path: Path, out: Path, points: list[dict], gate: Path) -> subprocess.Popen:
    """A child process running `SWEEP_SCRIPT` on this checkout's package."""
    script = tmp_path / "sweep_child.py"
    script.write_text(SWEEP_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.Popen([sys.executable, str(script), str(out), json.dumps(points),
                             str(gate)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, procs: list[subprocess.Popen], timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        for proc in procs:
            if proc.poll() is not None and proc.returncode != 3:
                raise AssertionError(f"sweep exited {proc.returncode}: {proc.stderr.read()}")
        assert time.monotonic() < deadline, f"{path} did not appear in {timeout_s} s"
        time.sleep(0.1)


def _gated_points(gate: Path, values: list[int]) -> list[dict]:
    return [{"a": a, "gate": str(gate)} for a in values]


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or bool(mapped and mapped.is_loopback)


def _listening(root_pid: int) -> tuple[set[tuple[str, str, int]], dict[str, dict]]:
    """(process name, ip, port) of every TCP socket the process tree listens on, and the
    environment of each process by name."""
    root = psutil.Process(root_pid)
    sockets, environs = set(), {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            name = proc.name()
            environs.setdefault(name, proc.environ())
            conns = proc.net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        sockets |= {(name, c.laddr.ip, c.laddr.port) for c in conns
                    if c.status == psutil.CONN_LISTEN}
    return sockets, environs


def test_a_local_sweep_listens_on_the_loopback_only_with_token_auth(tmp_path):
    """Item 4: while a point of a real local sweep runs (every Ray process is up), no process
    of the sweep listens on 0.0.0.0 / :: or another interface, and its Ray cluster runs with
    token authentication. On the old code gcs_server and raylet listened on `::`."""
    gate, out = tmp_path / "gate", tmp_path / "sweep"
    gate.mkdir()
    points = [{**TWIN, "dram_gb": g, "gate": str(gate), "kind": "twin"} for g in (0.05, 0.5)]
    proc = _start_sweep(tmp_path, out, points, gate)
    (gate / "go").write_text("")
    try:
        _wait_for(gate / "running", [proc])
        sockets, environs = _listening(proc.pid)
    finally:
        (gate / "release").write_text("")
        stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert json.loads(stdout) == ["ok", "ok"]
    names = {name for name, _, _ in sockets}
    assert {"gcs_server", "raylet"} <= names, sockets
    exposed = sorted(s for s in sockets if not _is_loopback(s[1]))
    assert not exposed, f"listening beyond the loopback: {exposed}"
    assert environs["gcs_server"].get("RAY_AUTH_MODE") == "token"
    assert read_sweep(out).throughput_tok_s.gt(0).all()


def test_the_pinned_ray_has_token_authentication(monkeypatch, tmp_path):
    """Item 4: pyproject's extras ask for the first Ray with token authentication, and a
    sweep refuses an older Ray (here the installed one, claiming to be 2.51)."""
    from kvrepro.sweep import RAY_MIN_VERSION

    assert RAY_MIN_VERSION == "2.59"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for extra in ("sweep", "notebooks", "dev"):
        assert [r for r in extras[extra] if r.startswith("ray")] == [f"ray>={RAY_MIN_VERSION}"]
    monkeypatch.setattr(ray, "__version__", "2.58.0")
    with pytest.raises(ImportError, match=r"Ray >= 2\.59 \(token authentication\), found 2\.58"):
        run_sweep([{"a": 1}], tmp_path / "sweep", point_fn=quick_point, progress=False)


# ---------------------------------------------------------------- item 6, in this process

@pytest.fixture(scope="module")
def ray_session():
    """One local Ray for the in-process sweeps, on the loopback as a sweep starts it."""
    from kvrepro.sweep import _loopback_node

    with _loopback_node():
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def quick_point(point: dict) -> dict:
    """A cheap point that records each call with one file in `log_dir` (when given)."""
    if "log_dir" in point:
        Path(point["log_dir"], f"{point_id(point)}-{uuid.uuid4().hex}").write_text("")
    return {"value": point["a"] * 10}


def _calls(log_dir: Path) -> list[str]:
    return sorted(p.name.split("-")[0] for p in log_dir.iterdir())


def test_a_cut_point_file_is_named_left_out_and_run_again(ray_session, tmp_path, caplog):
    """Item 6: a point file cut to 100 bytes (a crash) and one of 0 bytes (a power cut before
    the data reached the disk) do not count as done: `read_sweep` leaves them out and names
    them (strict: raises naming the file), and a resumed sweep, also with `retry_failed`,
    runs exactly those points again. On the old code `read_sweep` failed with ArrowInvalid."""
    log_dir, out = tmp_path / "calls", tmp_path / "sweep"
    log_dir.mkdir()
    grid = {"a": [1, 2, 3], "log_dir": [str(log_dir)]}
    first = run_sweep(grid, out, point_fn=quick_point, progress=False)
    ids = list(first.point_id)
    cut, empty = (out / "points" / f"{key}.parquet" for key in ids[1:])
    cut.write_bytes(cut.read_bytes()[:100])
    os.truncate(empty, 0)
    with caplog.at_level(logging.WARNING, logger="kvrepro.sweep"):
        lax = read_sweep(out)
    assert list(lax.point_id) == ids[:1]
    assert f"{cut}: unreadable point file" in caplog.text and str(empty) in caplog.text
    with pytest.raises(ValueError, match=re.escape(f"{cut}: unreadable point file")):
        read_sweep(out, strict=True)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kvrepro.sweep"):
        again = run_sweep(grid, out, point_fn=quick_point, progress=False, retry_failed=True)
    assert re.search(re.escape(str(cut)) + r".*the point runs again", caplog.text)
    assert (again.attrs["ran"], list(again.point_id)) == (2, ids)
    assert list(again.value) == [10, 20, 30]
    assert _calls(log_dir) == sorted([ids[0], *ids[1:], *ids[1:]])
    assert list(read_sweep(out, strict=True).point_id) == ids


@pytest.mark.parametrize("text, line, message", [
    ('{"format": 1,\n "points": {\n', 3, "Expecting property name"),
    ("", 1, "Expecting value"),
    ("[1, 2]\n", None, "expected an object whose 'points' maps"),
])
def test_a_broken_sweep_json_is_named(tmp_path, text, line, message):
    """Item 6: a corrupt or empty `sweep.json` is an error naming the file and its line, in
    `read_sweep` and in a resumed `run_sweep` (the old code raised a bare JSONDecodeError
    or KeyError)."""
    out = tmp_path / "sweep"
    out.mkdir()
    manifest = out / "sweep.json"
    manifest.write_text(text)
    where = re.escape(f"{manifest}:{line}:" if line else f"{manifest}:")
    with pytest.raises(ValueError, match=f"{where} not a sweep manifest: {message}"):
        read_sweep(out)
    with pytest.raises(ValueError, match=f"{where} not a sweep manifest: {message}"):
        run_sweep([{"a": 1}], out, point_fn=quick_point, progress=False)
    assert manifest.read_text() == text, "the manifest is left as it was"


def _dead_pid() -> int:
    """The pid of a process that has exited (and was reaped)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def test_only_a_dead_writers_temp_files_are_removed(ray_session, tmp_path):
    """Item 6: a resumed sweep removes the temporary files of a writer that died, in the
    folder and in points/, and leaves those of a live process (the old code removed every
    `.*.tmp` in points/) and files that are not a sweep's temporary names (issue 37: a
    dead pid in a name that is not one of the sweep's own files, `.thesis.tex.<pid>.tmp`)."""
    out = tmp_path / "sweep"
    grid = {"a": [1, 2]}
    run_sweep(grid, out, point_fn=quick_point, progress=False)
    dead = _dead_pid()
    live = subprocess.Popen(["sleep", "120"])
    try:
        points, point = out / "points", "0123456789abcdef"
        gone = [points / f".{point}.parquet.{dead}.tmp", out / f".sweep.parquet.{dead}.tmp"]
        kept = [points / f".{point}.parquet.{live.pid}.tmp",
                out / f".sweep.parquet.{live.pid}.tmp", points / ".notes.tmp",
                points / f".x.parquet.{dead}.tmp", out / f".thesis.tex.{dead}.tmp"]
        for path in gone + kept:
            path.write_text("half")
        table = run_sweep(grid, out, point_fn=quick_point, progress=False)
        assert table.attrs["ran"] == 0
        assert [p for p in kept if not p.exists()] == []
        assert [p for p in gone if p.exists()] == []
    finally:
        live.kill()
        live.wait()


def test_a_point_is_on_the_disk_before_its_rename(tmp_path):
    """Item 6: a point file is fsynced before it is renamed into place, and its folder after
    (seen with strace on a real write: the old code renamed without any fsync)."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    points = tmp_path / "sweep" / "points"
    points.mkdir(parents=True)
    code = ("import sys; from pathlib import Path; from kvrepro.sweep import _write_point; "
            "_write_point(Path(sys.argv[1]), {'a': 1, 'point_id': 'abc', 'status': 'ok'})")
    trace = tmp_path / "trace.txt"
    done = subprocess.run(["strace", "-f", "-y", "-o", str(trace), "-e",
                           "trace=fsync,fdatasync,rename,renameat,renameat2", sys.executable,
                           "-c", code, str(tmp_path / "sweep")], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0 and "ptrace" in done.stderr:
        pytest.skip(f"strace cannot trace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    calls = [line for line in trace.read_text().splitlines()
             if re.search(r"\b(fsync|fdatasync|rename\w*)\(", line)]
    final = str(points / "abc.parquet")
    rename = next(i for i, line in enumerate(calls) if "rename" in line and final in line)
    assert any("sync(" in line and ".abc.parquet." in line and ".tmp>" in line
               for line in calls[:rename]), calls
    assert any("sync(" in line and f"<{points}>" in line for line in calls[rename:]), calls
    assert (points / "abc.parquet").stat().st_size > 0


# ---------------------------------------------------------------- item 6, two processes

def test_two_sweeps_on_one_folder_one_is_refused_naming_the_holder(tmp_path):
    """Item 6: two sweeps with different grids started in the same instant on one folder:
    one runs, the other is refused with `RefusedFolder` naming the folder and the holder's
    pid. While the holder runs, a third sweep (same grid) is refused too and the holder's
    temporary file is left alone; at the end the folder holds exactly the holder's points.
    The old code accepted both (one of three tries), or failed the second with another
    error after it had deleted the first's temporary files."""
    gate, out = tmp_path / "gate", tmp_path / "sweep"
    gate.mkdir()
    grids = [_gated_points(gate, [1, 2]), _gated_points(gate, [3, 4, 5])]
    procs = [_start_sweep(tmp_path, out, grid, gate) for grid in grids]
    time.sleep(1.0)  # both are waiting for the go
    (gate / "go").write_text("")
    try:
        _wait_for(gate / "running", procs)
        deadline = time.monotonic() + 60
        while all(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.1)
        loser = next(p for p in procs if p.poll() is not None)
        winner = next(p for p in procs if p is not loser)
        assert winner.poll() is None, "the holder still runs its point"
        refused = loser.stderr.read()
        assert loser.returncode == 3, refused
        assert refused.startswith(f"REFUSED {out}: another sweep (pid {winner.pid})"), refused
        theirs = out / "points" / f".x.parquet.{winner.pid}.tmp"
        theirs.write_text("half")
        same = grids[procs.index(winner)]
        with pytest.raises(RefusedFolder, match=re.escape(f"{out}: another sweep "
                                                          f"(pid {winner.pid})")):
            run_sweep(same, out, point_fn=quick_point, progress=False)
        assert theirs.read_text() == "half"
    finally:
        (gate / "release").write_text("")
        for proc in procs:
            proc.wait(timeout=300)
    assert winner.returncode == 0, winner.stderr.read()
    manifest = json.loads((out / "sweep.json").read_text())["points"]
    files = {p.stem for p in (out / "points").glob("*.parquet")}
    assert files == set(manifest) == {point_id(p) for p in same}


def test_a_sweep_starting_on_a_locked_folder_is_refused_as_another_sweep(tmp_path):
    """The window CI once hit: the holder has made its lock and its first temporary file
    (`.sweep.json.<pid>.tmp`) but not yet `sweep.json`. A second sweep arriving then must
    be refused as "another sweep (pid ...)", naming the holder, not as "not a sweep
    folder" because it saw the holder's temporary file; and the file is left alone."""
    from kvrepro._locks import FolderLock
    from kvrepro.sweep import LOCK_NAME

    out = tmp_path / "sweep"
    out.mkdir()
    lock = FolderLock(out / LOCK_NAME)
    assert lock.acquire("4242\n") is None
    temp = out / f".sweep.json.{os.getpid()}.tmp"
    temp.write_text("half")
    try:
        with pytest.raises(RefusedFolder, match=re.escape(f"{out}: another sweep (pid 4242)")):
            run_sweep([dict(TWIN)], out, point_fn=quick_point, progress=False)
    finally:
        lock.release()
    assert temp.read_text() == "half"
