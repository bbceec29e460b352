"""Issue 37, items 3 and 5: `kvrepro sweep --out` writes only into a new or empty folder or a
sweep's own (its `sweep.json`), refuses any other before it writes or deletes anything there,
and names a folder it cannot write (a read-only filesystem, a symlinked lock) in one line.

Real folders, a real read-only filesystem (a tmpfs mounted read-only in a private mount
namespace, as the doctor's tests do) and the real command. Every refusal comes before Ray
starts, so no test here starts Ray.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvrepro import cli
from kvrepro._paths import RefusedFolder
from kvrepro.sweep import LOCK_NAME

ROOT = Path(__file__).resolve().parents[1]
GRID = "point_function: tests.test_sweep_folder:quick_point\ngrid: {a: [1, 2]}\n"


def quick_point(point: dict) -> dict:
    return {"value": point["a"] * 10}


def _grid(tmp_path: Path) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(GRID)
    return path


def _tree(folder: Path) -> dict[str, bytes | None]:
    """Every entry below `folder` (a folder as None), to compare before and after."""
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes()
            for p in sorted(folder.rglob("*"))}


def test_a_folder_that_is_not_a_sweeps_is_refused_and_left_as_it_was(tmp_path, capsys):
    """A user's folder: the old code took it, and deleted `.thesis.tex.4000000.tmp` because
    its name parsed as a dead writer's temporary file (pid 4000000)."""
    folder = tmp_path / "thesis"
    (folder / "figures").mkdir(parents=True)
    (folder / ".thesis.tex.4000000.tmp").write_text("my unsaved chapter")
    (folder / "thesis.tex").write_text("\\documentclass{book}")
    (folder / "figures" / ".plot.png.4000001.tmp").write_bytes(b"\x89PNG")
    before = _tree(folder)
    assert cli.main(["sweep", str(_grid(tmp_path)), "--out", str(folder),
                     "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"kvrepro sweep: {folder}: not a sweep folder (no sweep.json) and "
                          "not empty (3 entries: .thesis.tex.4000000.tmp, figures, "
                          "thesis.tex)"), err
    assert _tree(folder) == before, "nothing written or deleted there, no lock file either"


def test_a_file_named_as_the_folder_is_refused(tmp_path):
    out = tmp_path / "notes.txt"
    out.write_text("mine")
    with pytest.raises(RefusedFolder, match=f"{out}: not a folder"):
        from kvrepro.sweep import run_sweep

        run_sweep({"a": [1]}, out, point_fn=quick_point, progress=False)
    assert out.read_text() == "mine"


def test_a_symlinked_lock_is_named_and_not_followed(tmp_path, capsys):
    """The old code raised OSError ELOOP (a traceback, exit 1)."""
    out, target = tmp_path / "sweep", tmp_path / "elsewhere.txt"
    out.mkdir()
    target.write_text("not the sweep's")
    (out / LOCK_NAME).symlink_to(target)
    assert cli.main(["sweep", str(_grid(tmp_path)), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == (f"kvrepro sweep: {out / LOCK_NAME}: a symbolic link where the sweep's lock "
                   "file belongs (not followed); remove it or use another folder\n")
    assert target.read_text() == "not the sweep's" and (out / LOCK_NAME).is_symlink()
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]


needs_mounts = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                  reason="mounting a test filesystem needs root and unshare")


@needs_mounts
@pytest.mark.parametrize("below", ["", "new"], ids=["the mount", "a new folder in it"])
def test_a_read_only_filesystem_is_one_line_naming_the_path(tmp_path, below):
    """The old code raised OSError EROFS from mkdir or the lock's open (a traceback, exit
    1)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    out = mnt / below if below else mnt
    sweep = " ".join([sys.executable, "-m", "kvrepro.cli", "sweep", str(_grid(tmp_path)),
                      "--out", str(out), "--no-progress"])
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                           f"mount -t tmpfs -o ro,size=1m tmpfs {mnt} && {sweep}"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2, done.stderr
    lock = out / LOCK_NAME if not below else out
    assert done.stderr == f"kvrepro sweep: {lock}: Read-only file system\n", done.stderr
