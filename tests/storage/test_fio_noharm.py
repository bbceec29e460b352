"""The fio driver deletes only what it can prove it created, and the fio parser refuses
reports whose numbers cannot be fio's: real fio, real files, real failures to unlink."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kvrepro.storage import fio, parse
from kvrepro.storage.fio import MANIFEST, FioBench, FioPoint

SIZE = fio.MIB
WRITE_BOTH = FioPoint(rw="write", block_size_bytes=65536, n_targets=2, runtime_s=0.2)
DATA = Path(__file__).resolve().parents[1] / "data" / "fio"


def _user_file(folder: Path) -> Path:
    notes = folder / "notes.txt"
    notes.write_text("the user's notes")
    return notes


# --------------------------------------------------------------------------- the driver


@pytest.mark.parametrize("entry", ["path", "record", "garbage"])
@pytest.mark.parametrize("target", ["folder", "the listed file"])
def test_foreign_manifest_in_a_reused_folder_is_refused(tmp_path, entry, target) -> None:
    notes = _user_file(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    listed = {"path": str(notes), "device": 0, "inode": 0, "size_bytes": 16, "mtime_ns": 0}
    text = {"path": json.dumps({"created": [str(notes)]}),
            "record": json.dumps({"created": [listed]}), "garbage": "{not json"}[entry]
    (run_dir / MANIFEST).write_text(text)
    bench = FioBench([tmp_path / "scratch" if target == "folder" else notes], run_dir, SIZE)
    (tmp_path / "scratch").mkdir()
    with pytest.raises(FileExistsError, match=MANIFEST) as err:
        bench.prepare()
    if entry != "garbage":
        assert str(notes) in str(err.value) and "did not create" in str(err.value)
    assert bench.cleanup() == []  # as a `finally:` does after a refused prepare
    assert notes.read_text() == "the user's notes"
    assert list((tmp_path / "scratch").iterdir()) == []
    assert (run_dir / MANIFEST).read_text() == text  # the other run's note is kept


def test_manifest_rewritten_during_a_run_is_not_trusted(tmp_path) -> None:
    notes = _user_file(tmp_path)
    run_dir = tmp_path / "run"
    with FioBench([tmp_path], run_dir, SIZE) as bench:
        [own] = bench.paths
        (run_dir / MANIFEST).write_text(json.dumps({"created": [str(own), str(notes)]}))
    assert notes.read_text() == "the user's notes" and not own.exists()
    assert json.loads((run_dir / MANIFEST).read_text()) == {"created": []}


@pytest.mark.parametrize("replacement", ["file", "symlink"])
def test_replaced_file_is_kept_and_the_rest_still_removed(tmp_path, replacement) -> None:
    notes = _user_file(tmp_path)
    a, b, run_dir = tmp_path / "a.dat", tmp_path / "b.dat", tmp_path / "run"
    with pytest.warns(UserWarning, match="replaced"):
        with FioBench([a, b], run_dir, SIZE) as bench:
            bench.run(WRITE_BOTH)  # the driver's own writes: b is still removed below
            a.unlink()
            if replacement == "file":
                a.write_text("a new file of the user's")
            else:
                a.symlink_to(notes)
    assert not b.exists() and notes.read_text() == "the user's notes"
    assert a.is_symlink() if replacement == "symlink" else a.read_text().startswith("a new")
    [(path, why)] = bench.cleanup_skipped
    assert path == a and ("replaced" in why or "regular file" in why)
    [left] = json.loads((run_dir / MANIFEST).read_text())["created"]
    assert left["path"] == str(a) and left["not_removed"] == why
    with pytest.raises(FileExistsError, match=str(a)):  # leftovers: the folder is refused
        FioBench([tmp_path / "c.dat"], run_dir, SIZE).prepare()
    assert a.exists() or a.is_symlink()


def test_file_written_by_someone_else_after_the_last_point_is_kept(tmp_path) -> None:
    a, b = tmp_path / "a.dat", tmp_path / "b.dat"
    with pytest.warns(UserWarning, match="written by someone else"):
        with FioBench([a, b], tmp_path / "run", SIZE) as bench:
            bench.run(WRITE_BOTH)
            with open(a, "ab") as handle:
                handle.write(b"data someone else added")
    assert a.stat().st_size == SIZE + len(b"data someone else added") and not b.exists()
    assert [p for p, _ in bench.cleanup_skipped] == [a]


def test_file_swapped_in_between_check_and_unlink_is_put_back(tmp_path, monkeypatch) -> None:
    """The racer's move is timed by wrapping the check; the swap itself is real files."""
    a = tmp_path / "a.dat"
    checked = FioBench._why_not_own

    def check_then_swap(self: FioBench, path: Path) -> str | None:
        why = checked(self, path)
        path.unlink()
        path.write_text("a file of the user's, put there after the check")
        return why

    bench = FioBench([a], tmp_path / "run", SIZE)
    bench.prepare()
    monkeypatch.setattr(FioBench, "_why_not_own", check_then_swap)
    with pytest.warns(UserWarning, match="replaced while being removed"):
        assert bench.cleanup() == []
    assert a.read_text().startswith("a file of the user's")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.dat", "run"]  # nothing aside


@contextmanager
def _undeletable(path: Path) -> Iterator[None]:
    """Make unlinking `path` fail for real: immutable (root: `chattr +i`) or a read-only
    parent folder (anyone else). Undone on leaving."""
    if os.geteuid() != 0:
        path.parent.chmod(0o500)
        try:
            yield
        finally:
            path.parent.chmod(0o700)
        return
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(path)], check=False).returncode:
        pytest.skip("root without a working `chattr +i`: no way to make unlink fail")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(path)], check=True)


def test_failure_to_remove_is_reported_and_the_rest_still_removed(tmp_path) -> None:
    (tmp_path / "da").mkdir()
    (tmp_path / "db").mkdir()
    a, b = tmp_path / "da" / "a.dat", tmp_path / "db" / "b.dat"
    bench = FioBench([a, b], tmp_path / "run", SIZE)
    bench.prepare()
    with _undeletable(a):
        with pytest.warns(UserWarning, match="could not remove"):
            assert bench.cleanup() == [b]
        assert a.exists() and not b.exists()
    [(path, why)] = bench.cleanup_skipped
    assert path == a and why.startswith("could not remove it: ")


# --------------------------------------------------------------------------- the parser


def _two_jobs() -> dict:
    return parse.load_fio_json(DATA / "two_jobs.json")


def test_empty_job_entry_and_no_jobs_are_errors(tmp_path) -> None:
    report = _two_jobs()
    report["jobs"][1] = {}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    with pytest.raises(ValueError, match=rf"^{path}: job 1 \(None\): no read, write, trim "):
        parse.parse_fio_json(path)
    report["jobs"] = []
    path.write_text(json.dumps(report))
    with pytest.raises(ValueError, match=rf"^{path}: fio report lists no jobs"):
        parse.parse_fio_json(path)


@pytest.mark.parametrize(("where", "value"), [
    (("read", "runtime"), -250), (("read", "io_bytes"), -4096), (("read", "runtime"), "250"),
    (("read", "io_bytes"), None), (("read", "lat_ns", "mean"), math.inf),
    (("read", "total_ios"), True), (("read", "bw_bytes"), -1.5), (("error",), -22),
    (("read", "clat_ns", "percentile", "50.000000"), -1)])
def test_negative_or_non_numeric_value_names_file_job_and_field(tmp_path, where,
                                                                  value) -> None:
    report = _two_jobs()
    block = report["jobs"][1]
    for key in where[:-1]:
        block = block[key]
    block[where[-1]] = value
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))  # inf is written as Infinity, which json reads back
    field = ".".join(("job",) + where if len(where) == 1 else where)
    with pytest.raises(ValueError, match=rf"^{path}: job 1 \('randread4k'\): field "
                                         rf"'{field}' is "):
        parse.parse_fio_json(path)
