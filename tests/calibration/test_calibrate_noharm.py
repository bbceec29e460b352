"""Issue 37, items 2 and 5: `kvrepro calibrate` never leaves a server spec or a plan cut short
or out of step with the other, keeps what another calibration wrote, refuses a plan whose
places are not in its files before any point runs, and names a bad `--plan` in one line.

Real files and a real full filesystem (a tmpfs mounted in a private mount namespace, as the
doctor's tests do); the write-back runs in another process where it must wait for a lock.
No Ray: the write-back is given a fit (`CalibrationResult`) directly, and a refused plan is
refused before any sweep starts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from kvrepro import cli
from kvrepro._locks import FolderLock
from kvrepro.calibration.calibrate import CalibrationResult, current_values, load_plan, write_fit
from tests.calibration.test_calibrate import TOY_SERVER, _toy_plan

ROOT = Path(__file__).resolve().parents[2]
PAGE = 4096
LONG = "x" * 20_000
"""A candidate value (the server's description) that makes the fitted server spec five pages
longer: more than the pages a full disk has left, as it had on study A's array."""
FIT = {"mode": "fast", "x": 2.0, "bw": 2e9}


def _result(**values) -> CalibrationResult:
    return CalibrationResult({**FIT, **values}, {"T.x": 0.0, "T.bw": 0.0}, pd.DataFrame(), 1.0)


def _long_plan(tmp_path: Path) -> Path:
    """The toy plan, with a parameter that writes a long text into the server spec."""
    tmp_path.mkdir()
    plan = _toy_plan(tmp_path)
    (tmp_path / "server.yaml").write_text(TOY_SERVER.replace("model:", "description: toy\n"
                                                             "model:", 1))
    body = yaml.safe_load(plan.read_text())
    body["calibration"]["parameters"].append(
        {"name": "note", "sets": ["server:description"], "values": ["toy", LONG], "stage": 1,
         "fits": ["T.x"], "why": "a long text"})
    plan.write_text(yaml.safe_dump(body, sort_keys=False))
    return plan


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


# ------------------------------------------------------------------ a full filesystem

needs_mounts = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                  reason="mounting a test filesystem needs root and unshare")

ON_A_FULL_DISK = '''
import json, os, shutil, sys
from pathlib import Path

import pandas as pd

from kvrepro.calibration.calibrate import CalibrationResult, write_fit

src, mnt, report, free_pages = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(
    sys.argv[4])
for name in ("server.yaml", "plan.yaml"):
    shutil.copy(src / name, mnt / name)
fd = os.open(mnt / "fill", os.O_WRONLY | os.O_CREAT)
try:
    while True:
        os.write(fd, bytes(4096))
except OSError:
    pass
os.ftruncate(fd, os.fstat(fd).st_size // 4096 * 4096 - free_pages * 4096)
os.close(fd)
result = CalibrationResult(json.loads(sys.argv[5]), {"T.x": 0.0, "T.bw": 0.0},
                           pd.DataFrame(), 1.0)
try:
    write_fit(mnt / "plan.yaml", result)
    error = None
except OSError as err:
    error = f"{type(err).__name__}: {err}"
files = {p.name: p.read_text(errors="replace") for p in mnt.iterdir() if p.name != "fill"}
report.write_text(json.dumps({"error": error, "files": files}))
'''


@needs_mounts
@pytest.mark.parametrize("free_pages", [0, 2])
def test_a_fit_that_does_not_fit_on_the_disk_leaves_both_files_as_they_were(tmp_path,
                                                                            free_pages):
    """0 pages left: the old code truncated the server spec and wrote it cut at 4 KB (the
    issue's study A spec cut at 8 KB); 2 pages: the new code's locks fit, its temporary copy
    of the server spec does not and is removed."""
    plan = _long_plan(tmp_path / "src")
    fitted = {**FIT, "note": LONG}
    on_disk = tmp_path / "on_disk"
    shutil.copytree(tmp_path / "src", on_disk)
    write_fit(on_disk / "plan.yaml", _result(note=LONG))  # a disk with room: written
    pages = [-(-(folder / "server.yaml").stat().st_size // PAGE) for folder in (plan.parent,
                                                                               on_disk)]
    assert pages[1] > pages[0] + free_pages, "the old code's rewrite must not fit either"
    mnt, report = tmp_path / "mnt", tmp_path / "report.json"
    mnt.mkdir()
    script = (f"mount -t tmpfs -o size=64k tmpfs {mnt} && {sys.executable} -c "
              f"\"$KVREPRO_SCRIPT\" {plan.parent} {mnt} {report} {free_pages} "
              f"'{json.dumps(fitted)}'")
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "KVREPRO_SCRIPT": ON_A_FULL_DISK})
    assert done.returncode == 0 and report.is_file(), done.stderr
    seen = json.loads(report.read_text())
    assert seen["error"] and "No space left on device" in seen["error"], seen["error"]
    before = {name: (plan.parent / name).read_text() for name in ("plan.yaml", "server.yaml")}
    assert seen["files"] == before, "both files whole, and nothing else left (no temp, lock)"


# ------------------------------------------------------------------ checked before replaced


def test_a_fit_the_server_spec_refuses_changes_neither_file(tmp_path):
    """step_overhead_s must be >= 0: the old code wrote -1.0 into the server spec and the
    plan (the plan still loaded) and said nothing."""
    plan = _toy_plan(tmp_path)
    before = _contents(tmp_path)
    with pytest.raises(ValueError, match=f"{tmp_path / 'server.yaml'}: invalid server spec: "
                                         "key twin.step_overhead_s"):
        write_fit(plan, _result(x=-1.0))
    assert _contents(tmp_path) == before


def test_the_values_written_are_the_fitted_ones_to_the_last_digit(tmp_path):
    """The old code wrote 1234567891.0 as 1.2346e+09 and 0.1234567 as 0.123457."""
    plan = _toy_plan(tmp_path)
    write_fit(plan, _result(x=0.1234567, bw=1234567891.0))
    assert current_values(plan) == {**FIT, "x": 0.1234567, "bw": 1234567891.0}
    assert load_plan(plan).calibration.result["values"]["bw"] == 1234567891.0


# ------------------------------------------------------------------ two calibrations

WRITE_FIT = '''
import json, sys
import pandas as pd
from kvrepro.calibration.calibrate import CalibrationResult, write_fit

print("ready", flush=True)
write_fit(sys.argv[1], CalibrationResult(json.loads(sys.argv[2]), {"T.x": 0.0, "T.bw": 0.0},
                                         pd.DataFrame(), 1.0))
'''


def test_a_second_calibration_keeps_the_first_ones_values(tmp_path):
    """Another calibration of a plan sharing the server holds the server's lock (the one
    `kvrepro._files` takes, `.server.yaml.lock`), read the spec and is about to write its
    value (the engine's KV bytes); this one's write-back waits, then reads that value and
    keeps it. The old code wrote at once, and the other's write dropped this fit; one that
    read the spec before it took the lock would drop the other's value."""
    plan = _toy_plan(tmp_path)
    server = tmp_path / "server.yaml"
    lock = FolderLock(server.with_name(".server.yaml.lock"))
    assert lock.acquire("pid of the other calibration\n") is None
    try:
        theirs = server.read_text().replace("kv_cache_bytes: 8.0e+09",
                                            "kv_cache_bytes: 9.0e+09")
        ours = subprocess.Popen([sys.executable, "-c", WRITE_FIT, str(plan), json.dumps(FIT)],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        assert ours.stdout.readline().strip() == "ready", ours.stderr.read()
        time.sleep(1.5)  # it has read the plan and waits for the lock (the old code wrote)
        tmp = server.with_name(".server.yaml.theirs")
        tmp.write_text(theirs)
        os.replace(tmp, server)
    finally:
        lock.release()
    assert ours.wait(timeout=60) == 0, ours.stderr.read()
    written = yaml.safe_load(server.read_text())
    assert written["engine"]["kv_cache_bytes"] == 9e9, "the other calibration's value is kept"
    assert written["twin"]["step_overhead_s"] == 2.0, "and this one's is written"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calls", "plan.yaml", "server.yaml"]


# ------------------------------------------------------------------ the plan, before any point


@pytest.mark.parametrize(("place", "missing", "owner"), [
    ("campaign:workload.extra.p_returning", "workload.extra", "the plan's campaign"),
    ("server:twin.nosuch", "twin.nosuch", "the server spec server.yaml"),
    ("server:tiers.a.stores.-1.read_bw_bytes_s", "tiers.a.stores.-1", "the server spec"),
])
def test_a_place_that_is_not_in_the_files_is_refused_before_any_point_runs(
        tmp_path, capsys, place, missing, owner):
    """The old code ran the whole fit, then lost it to a KeyError at the write-back
    (campaign:workload.extra.p_returning) or wrote a key the spec does not have."""
    plan = _toy_plan(tmp_path)
    body = yaml.safe_load(plan.read_text())
    body["campaign"]["workload"] = {"p_returning": 0.1}
    body["calibration"]["parameters"][0]["sets"] = [place]
    plan.write_text(yaml.safe_dump(body, sort_keys=False))
    before = _contents(tmp_path)
    out = tmp_path / "runs"
    assert cli.main(["calibrate", "--plan", str(plan), "--out", str(out),
                     "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"kvrepro calibrate: {plan}: "), err
    assert f"place {place!r}: {owner}" in err and f"has no key {missing!r}" in err, err
    assert not out.exists() and list((tmp_path / "calls").iterdir()) == [], "no point ran"
    assert _contents(tmp_path) == before


@pytest.mark.parametrize(("name", "text", "message"), [
    ("missing.yaml", None, "calibration plan not found: {path}"),
    ("broken.yaml", "server: [a\ncalibration: 1\n", "{path}: malformed YAML: "),
    ("server.yaml", TOY_SERVER, "{path}: invalid calibration plan: key server: Field required"),
])
def test_a_bad_plan_file_is_one_line_naming_it(tmp_path, capsys, name, text, message):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    assert cli.main(["calibrate", "--plan", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("kvrepro calibrate: " + message.format(path=path)), err
