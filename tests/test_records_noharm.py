"""Issue 24, items 3, 5 and 9 (the run-record reader): one writer per run folder, unique
temp and default folder names, a refused folder as a one-line CLI error, an unfinished run
never read as a finished one, and a bounded, streamed JSON Lines reader.

Real processes throughout: writers are separate Python processes started together or
killed with SIGKILL, and the CLI runs as `python -m kvrepro.cli`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kvrepro import analysis, cli
from kvrepro.records import RUN_FILES, RunWriter, read_jsonl, read_run, read_runs

ROOT = Path(__file__).resolve().parents[1]
PROFILE = str(ROOT / "data" / "servers" / "study_a.yaml")
N_RECORDS = 200


def _record(i: int, tier: str = "dram") -> dict:
    return {"session_id": i, "turn": 0, "tier": tier, "engine": "sim", "send_s": float(i),
            "first_token_s": i + 0.5, "finish_s": i + 1.0, "prompt_tokens": 1000,
            "cached_prompt_tokens": 800, "output_tokens": 50}


def _python(code: str, *args: str, cwd: Path | None = None) -> subprocess.Popen:
    """A Python child that imports this checkout's kvrepro (the tree the test runs in)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], cwd=cwd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


# ---------------------------------------------------------------- item 3: one writer

WRITER = """
    import sys, time
    from kvrepro.records import RunWriter
    folder, start, first = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    while time.time() < start:
        pass
    try:
        writer = RunWriter(folder, {"tier": "dram"})
    except FileExistsError as err:
        print("refused", type(err).__name__, err)
        sys.exit(3)
    for i in range(first, first + 200):
        writer.write_record({"session_id": i, "turn": 0, "tier": "dram", "engine": "sim",
                             "send_s": 0.0, "first_token_s": 0.5, "finish_s": 1.0,
                             "prompt_tokens": 10, "output_tokens": 1})
    writer.close()
    print("accepted")
"""


def test_two_writers_started_together_never_share_a_folder(tmp_path: Path) -> None:
    """Both were accepted 6 of 6 times, and 200 records were lost or a line was mangled."""
    for pair in range(3):
        folder = tmp_path / f"run{pair}"
        start = time.time() + 1.5  # both children past their imports by then
        children = [_python(WRITER, str(folder), str(start), str(k * 1000)) for k in (0, 1)]
        outs = [c.communicate(timeout=60)[0] for c in children]
        codes = sorted(c.returncode for c in children)
        assert codes == [0, 3], outs
        refused = next(o for o in outs if o.startswith("refused"))
        assert refused.split()[1] == "RefusedFolder" and str(folder) in refused
        run = read_run(folder)
        first = int(run.records.session_id.min())
        assert run.status == "finished" and run.problems == []
        assert run.records.session_id.tolist() == list(range(first, first + N_RECORDS))
        assert sorted(p.name for p in folder.iterdir()) == sorted(RUN_FILES)  # lock gone


def test_overwrite_never_mixes_two_live_writers(tmp_path: Path) -> None:
    first = RunWriter(tmp_path, {"tier": "dram"})
    first.write_record(_record(0))
    with pytest.raises(FileExistsError, match="being written by another run") as caught:
        RunWriter(tmp_path, {"tier": "dram"}, overwrite=True)
    assert type(caught.value).__name__ == "RefusedFolder"
    first.write_record(_record(1))
    first.close()
    assert read_run(tmp_path).records.session_id.tolist() == [0, 1]
    with RunWriter(tmp_path, {"tier": "flash"}, overwrite=True) as second:  # writer gone
        second.write_record(_record(7))
    run = read_run(tmp_path)
    assert run.records.session_id.tolist() == [7] and run.meta["tier"] == "flash"


def test_meta_temp_file_is_the_writers_own(tmp_path: Path) -> None:
    """The fixed `meta.json.tmp` of another writer was overwritten and renamed away."""
    theirs = tmp_path / "meta.json.tmp"
    theirs.write_text("another writer's half-written metadata")
    with RunWriter(tmp_path, {"tier": "dram"}) as writer:
        writer.write_record(_record(0))
    assert theirs.read_text() == "another writer's half-written metadata"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*RUN_FILES, theirs.name])
    assert json.loads((tmp_path / "meta.json").read_text())["status"] == "finished"


def test_default_run_folders_are_new_and_unique(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs in one second got the same `runs/sim-<time>` folder."""
    monkeypatch.chdir(tmp_path)
    folders = [cli._out_dir(None, "sim") for _ in range(3)]
    assert len(set(folders)) == 3 and all(f.is_dir() for f in folders)
    assert all(re.fullmatch(r"sim-\d{8}T\d{6}Z-\d+-[0-9a-f]{4}", f.name) for f in folders)
    assert cli._out_dir(str(tmp_path / "given"), "sim") == tmp_path / "given"


SIM = ["-m", "kvrepro.cli", "run", "sim", "--profile", PROFILE, "--tier", "dram",
       "-w", "duration_s=120"]


def test_cli_runs_started_together_and_a_refused_folder(tmp_path: Path) -> None:
    """Same-second `run sim` without --out crashed with a FileExistsError traceback; a
    folder holding a run is one line on stderr and exit code 2."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    pair = [subprocess.Popen([sys.executable, *SIM], cwd=tmp_path, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in (0, 1)]
    results = [(p.communicate(timeout=300), p.returncode) for p in pair]
    assert [code for _, code in results] == [0, 0], results
    folders = sorted((tmp_path / "runs").iterdir())
    assert len(folders) == 2 and all(read_run(f / "dram").finished for f in folders)
    again = subprocess.run([sys.executable, *SIM, "--out", str(folders[0])], cwd=tmp_path,
                           env=env, text=True, capture_output=True, timeout=300)
    assert again.returncode == 2, again.stderr
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in again.stderr, again.stderr
    assert lines[0].startswith(f"kvrepro run sim: {folders[0] / 'dram'} already holds a run")


# ---------------------------------------------------------------- item 5: unfinished runs

KILLED = """
    import sys, time
    from kvrepro.records import RunWriter
    writer = RunWriter(sys.argv[1], {"tier": "flash"})
    for i in range(37):
        writer.write_record({"session_id": i, "turn": 0, "tier": "flash", "engine": "live",
                             "send_s": float(i), "first_token_s": i + 0.5,
                             "finish_s": i + 1.0, "prompt_tokens": 10, "output_tokens": 1})
    print("written", flush=True)
    time.sleep(600)
"""


def _killed_run(folder: Path) -> None:
    child = _python(KILLED, str(folder))
    assert child.stdout.readline().strip() == "written", child.stderr.read()
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL


def test_a_killed_run_is_refused_or_read_with_a_warning(tmp_path: Path) -> None:
    killed = tmp_path / "flash"
    _killed_run(killed)
    assert json.loads((killed / "meta.json").read_text())["status"] == "running"
    with pytest.raises(ValueError, match=rf"^{killed}: run did not finish .*killed"):
        read_run(killed)
    with pytest.warns(UserWarning, match=rf"^{killed}: run did not finish .*'running'"):
        run = read_run(killed, allow_unfinished=True)
    assert run.status == "running" and not run.finished and len(run.records) == 37
    with pytest.warns(UserWarning, match="did not finish"):
        assert read_run(killed, strict=False).status == "running"

    with RunWriter(tmp_path / "dram", {"tier": "dram"}) as writer:
        writer.write_record(_record(0))
    with pytest.raises(ValueError, match=str(killed)):
        read_runs([tmp_path / "dram", killed])
    with pytest.warns(UserWarning, match=str(killed)):
        records, _ = read_runs([tmp_path / "dram", killed], allow_unfinished=True)
    status = records.groupby("tier").run_status.unique().to_dict()
    assert {k: list(v) for k, v in status.items()} == {"dram": ["finished"],
                                                       "flash": ["running"]}
    for pooled in (analysis.throughput_over_time, analysis.prompt_split,
                   analysis.resume_stats, analysis.ttft_over_time):
        with pytest.warns(UserWarning, match=rf"{pooled.__name__} pools runs that did not "
                                             r"finish \(flash: 'running'\)"):
            pooled(records)

    with RunWriter(killed, {"tier": "flash"}, overwrite=True) as writer:  # a stale lock
        writer.write_record(_record(1, tier="flash"))
    assert read_run(killed).finished


def test_failed_and_live_runs_are_read_with_a_warning(tmp_path: Path) -> None:
    writer = RunWriter(tmp_path / "live", {"tier": "dram"})
    writer.write_record(_record(0))
    with pytest.warns(UserWarning, match="still being written"):
        assert len(read_run(tmp_path / "live").records) == 1  # strict, and not refused
    writer.close()
    with pytest.raises(RuntimeError), RunWriter(tmp_path / "failed", {}) as failing:
        failing.write_record(_record(0))
        raise RuntimeError("server died")
    with pytest.warns(UserWarning, match=r"failed: RuntimeError: server died.*incomplete"):
        run = read_run(tmp_path / "failed")
    assert run.status.startswith("failed: ") and len(run.records) == 1


# ---------------------------------------------------------------- item 9: bounded lines

def test_a_line_over_the_limit_is_a_bad_line_naming_file_line_and_limit(
        tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    good = json.dumps(_record(0)).encode()
    path.write_bytes(good + b"\n" + b'{"blob": "' + b"a" * 3_000_000 + b'"}\n' + good + b"\n")
    limit = 2**20
    with pytest.raises(ValueError, match=rf"^{path}:2: line longer than 1,048,576 bytes"):
        read_jsonl(path, max_line_bytes=limit)
    rows, problems = read_jsonl(path, strict=False, max_line_bytes=limit)
    assert len(rows) == 2 and len(problems) == 1 and problems[0].startswith(f"{path}:2: ")
    assert len(read_jsonl(path)[0]) == 3  # under the default limit it is a line like any


def test_one_huge_line_without_newline_is_streamed(tmp_path: Path) -> None:
    """200 MB without a newline peaked at about 500 MB (the whole file, then split)."""
    path = tmp_path / "records.jsonl"
    with path.open("wb") as handle:
        handle.write(b'{"session_id": 1, "blob": "')
        for _ in range(200):
            handle.write(b"a" * 1_000_000)
    code = """
        import resource, sys
        from kvrepro.records import read_jsonl
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        rows, problems = read_jsonl(sys.argv[1], strict=False)
        grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        print(len(rows), round(grown_mb), problems[0] if problems else "")
    """
    child = _python(code, str(path))
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    n_rows, grown_mb, problem = out.split(" ", 2)
    assert int(grown_mb) < 100, out  # the 32 MiB limit (and a copy), not 200 MB (and two)
    assert n_rows == "0" and problem.startswith(f"{path}:1: line longer than 33,554,432")
