"""Issue 37, items 5 and 6: every bad input of a `run` command is one line on stderr naming
the input, exit status 2, no traceback; nothing bad is accepted silently.

Each test here failed on 6065f95 (a traceback and exit 1, or exit 0 for input it took as is).
Read-only filesystems are real: a read-only tmpfs mounted in a private mount namespace."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kvrepro import cli

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "data" / "servers" / "cpu_tiny.yaml")
STUDY_A = str(ROOT / "data" / "servers" / "study_a.yaml")
SIM = ["run", "sim", "--server", STUDY_A, "--tier", "dram", "-w", "duration_s=10"]
DRY_RUN = ["run", "live", "--server", TINY, "--dry-run"]


def _exit_code(argv: list[str]) -> int:
    """`cli.main(argv)`'s exit status, argparse's refusals (SystemExit) included."""
    try:
        return cli.main(argv)
    except SystemExit as stop:
        return stop.code


def _one_line(capsys: pytest.CaptureFixture, argv: list[str], *named: str) -> str:
    """The one stderr line of a refused command, checked to name each of `named`."""
    code = _exit_code(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
    for text in named:
        assert text in lines[0], err
    return lines[0]


# ------------------------------------------------------------------ item 5: where runs go


def test_run_sim_out_a_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    afile = tmp_path / "afile"
    afile.write_text("the user's\n")
    line = _one_line(capsys, [*SIM, "--out", str(afile)], str(afile), "--out")
    assert "not a folder" in line and afile.read_text() == "the user's\n"
    _one_line(capsys, [*SIM, "--out", str(afile / "sub")], f"{afile}/sub", "Not a directory")


def test_run_sim_out_in_proc(capsys: pytest.CaptureFixture) -> None:
    _one_line(capsys, [*SIM, "--out", "/proc/x"], "/proc/x", "--out")


def test_run_sim_with_runs_a_file(tmp_path: Path, capsys: pytest.CaptureFixture,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("not a folder\n")
    line = _one_line(capsys, SIM, "runs: not a folder", "--out")
    assert line.startswith("kvrepro run sim: ")


needs_mounts = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                  reason="mounting a test filesystem needs root and unshare")


def _on_read_only_tmpfs(tmp_path: Path, argv: list[str]) -> subprocess.CompletedProcess:
    """`python -m kvrepro.cli argv` with `tmp_path/mnt` a read-only tmpfs (in a private
    mount namespace: the mount goes away with the command)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir(exist_ok=True)
    command = shlex.join([sys.executable, "-m", "kvrepro.cli", *argv])
    script = f"mount -t tmpfs -o ro,size=1m none {shlex.quote(str(mnt))} && {command}"
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


@needs_mounts
@pytest.mark.parametrize("argv", [SIM, DRY_RUN], ids=["run-sim", "run-live-dry-run"])
@pytest.mark.parametrize("below", ["new", ""], ids=["new-folder", "mount-point"])
def test_out_on_a_read_only_filesystem(tmp_path: Path, argv: list[str], below: str) -> None:
    out = tmp_path / "mnt" / below if below else tmp_path / "mnt"
    done = _on_read_only_tmpfs(tmp_path, [*argv, "--out", str(out)])
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert f"{out}: Read-only file system" in lines[0] and "--out" in lines[0], done.stderr


# ------------------------------------------------------------ item 5: numbers and overrides


@pytest.mark.parametrize("argv", [SIM, DRY_RUN], ids=["run-sim", "run-live-dry-run"])
@pytest.mark.parametrize("param, named", [
    ("dram_gb=inf", "server override 'dram_gb': must be a finite number of GB >= 0"),
    ("dram_gb=abc", "server override 'dram_gb': must be a finite number of GB >= 0"),
    ("tiers.dram.stores.0.capacity_bytes=inf", "tiers.dram.stores.0.capacity_bytes: Input "
                                               "should be a finite number"),
    ("engine.kv_cache_bytes=inf", "engine.kv_cache_bytes: Input should be a finite number"),
])
def test_sizes_and_times_are_finite_and_non_negative(
        tmp_path: Path, capsys: pytest.CaptureFixture, argv: list[str], param: str,
        named: str) -> None:
    """`-p dram_gb=inf` was an OverflowError traceback in the twin, and a live dry run wrote
    `--l1-size-gb inf` / `"max_capacity_gb": Infinity` into the tier's files."""
    out = tmp_path / "out"
    _one_line(capsys, [*argv, "--out", str(out), "-p", param], named)
    assert not out.exists()


@pytest.mark.parametrize("command", [[*DRY_RUN, "--out", "{tmp}/out"],
                                     ["doctor", "--server", TINY]], ids=["run-live", "doctor"])
def test_an_override_through_a_value_without_keys(
        tmp_path: Path, capsys: pytest.CaptureFixture, command: list[str]) -> None:
    """`-p live.model.x.y=1` was an AttributeError traceback ('str' has no setdefault)."""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in command]
    line = _one_line(capsys, [*argv, "-p", "live.model.x.y=1"], "'live.model.x.y'")
    assert "live.model is 'kvrepro:tiny', not a mapping" in line


# --------------------------------------------------------------- item 6: accepted silently


@pytest.mark.parametrize("flag, value, rule", [
    ("--duration-s", "-5", "> 0"), ("--duration-s", "0", "> 0"),
    ("--duration-s", "inf", "> 0"), ("--warmup-s", "-3", ">= 0"),
    ("--warmup-s", "nan", ">= 0"), ("--duration-s", "soon", "not a number"),
])
def test_negative_times_are_refused_naming_the_flag(
        tmp_path: Path, capsys: pytest.CaptureFixture, flag: str, value: str,
        rule: str) -> None:
    """`--duration-s -5` ran nothing and exited 0; `--warmup-s -3` was taken as is."""
    out = tmp_path / "out"
    _one_line(capsys, [*SIM, flag, value, "--out", str(out)], f"argument {flag}", rule,
              repr(value))
    assert not out.exists()


def test_request_timeout_and_sample_interval_are_positive(
        capsys: pytest.CaptureFixture) -> None:
    for flag in ("--request-timeout-s", "--sample-interval-s"):
        _one_line(capsys, [*DRY_RUN, flag, "-1"], f"argument {flag}", "> 0")


def test_a_negative_list_index_is_refused(tmp_path: Path,
                                          capsys: pytest.CaptureFixture) -> None:
    """`tiers.dram.stores.-1.capacity_bytes=1` silently set the last store."""
    out = tmp_path / "out"
    line = _one_line(capsys, [*DRY_RUN, "--out", str(out), "-p",
                              "tiers.dram.stores.-1.capacity_bytes=1"],
                     "'tiers.dram.stores.-1.capacity_bytes'")
    assert "tiers.dram.stores is a list of 1: '-1' is not an index 0..0" in line
    assert not out.exists()
    _one_line(capsys, [*DRY_RUN, "--out", str(out), "-p", "tiers.dram.stores.1.eviction=ttl"],
              "'tiers.dram.stores.1.eviction'", "'1' is not an index")


def test_a_spec_that_is_not_utf8_names_the_file_and_line(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    lines = Path(TINY).read_bytes().splitlines(keepends=True)
    spec = tmp_path / "latin1.yaml"
    spec.write_bytes(b"".join([*lines[:2], b"# caf\xe9\n", *lines[2:]]))
    line = _one_line(capsys, ["run", "sim", "--server", str(spec)], f"{spec}: line 3:",
                     "not UTF-8", "0xe9")
    assert "codec" not in line


def test_a_bad_workload_parameter_is_one_line(capsys: pytest.CaptureFixture) -> None:
    """`-w duration_s=abc` printed pydantic's multi-line error with its URL."""
    line = _one_line(capsys, [*SIM[:-2], "-w", "duration_s=abc"], "-w duration_s: Input "
                     "should be a valid number")
    assert "pydantic.dev" not in line and "input_value" not in line


# ------------------------------------------------------------------- main's one place


def _raises(err: BaseException):
    def command(args: object) -> int:
        raise err
    return command


def _validation_error() -> Exception:
    from kvrepro.tier_spec import EngineSpec

    try:
        EngineSpec.model_validate({"kv_cache_bytes": "lots"})
    except ValueError as err:
        return err
    raise AssertionError("EngineSpec took kv_cache_bytes='lots'")


@pytest.mark.parametrize("err, named", [
    (socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
     "a host name does not resolve (Name or service not known)"),
    (IsADirectoryError(21, "Is a directory", "/tmp/report.json"),
     "/tmp/report.json: Is a directory"),
    (OverflowError("cannot convert float infinity to integer"), "not finite"),
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
     "can't decode byte 0xff"),
    (_validation_error(), "kv_cache_bytes: Input should be a valid number"),
], ids=["gaierror", "oserror", "overflow", "unicode", "pydantic"])
def test_main_prints_expected_errors_as_one_line(
        capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, err: BaseException,
        named: str) -> None:
    monkeypatch.setattr(cli, "_run_sim", _raises(err))
    line = _one_line(capsys, ["run", "sim", "--server", STUDY_A], "kvrepro run sim: ", named)
    assert "errors.pydantic.dev" not in line


def test_main_keeps_the_traceback_of_a_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    """An AttributeError is ours to fix, not a bad input: it is not turned into a line."""
    monkeypatch.setattr(cli, "_run_sim", _raises(AttributeError("a bug of ours")))
    with pytest.raises(AttributeError, match="a bug of ours"):
        cli.main(["run", "sim", "--server", STUDY_A])
