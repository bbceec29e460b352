"""kvrepro._files: a file of ours is made and used through one descriptor and removed on
every exit path; a replaced file is whole or untouched, on real filesystems and signals."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kvrepro._files import own_file, replace_file, replace_files

ROOT = Path(__file__).resolve().parents[1]
needs_mounts = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                  reason="mounting a test filesystem needs root and unshare")


def test_own_file_writes_through_its_descriptor_even_when_the_name_is_swapped(tmp_path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    with own_file(tmp_path, ".probe-") as (path, fd):
        path.unlink()
        path.symlink_to(victim)  # an attacker swaps the name for a link
        os.write(fd, b"random bytes")
    assert victim.read_text() == "keep me"
    assert path.is_symlink()  # not ours any more: left alone, not removed


def test_own_file_is_removed_when_the_block_raises(tmp_path) -> None:
    with pytest.raises(RuntimeError), own_file(tmp_path, ".probe-") as (path, _fd):
        assert path.is_file()
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_own_file_is_removed_on_sigterm(tmp_path) -> None:
    script = (f"import sys, time; sys.path.insert(0, {str(ROOT)!r})\n"
              "from kvrepro._files import own_file\n"
              "from kvrepro._signals import stop_on_signals\n"
              "with stop_on_signals():\n"
              f"    with own_file({str(tmp_path)!r}, '.probe-'):\n"
              "        print('made', flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "made"
    assert len(list(tmp_path.iterdir())) == 1
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert list(tmp_path.iterdir()) == []


def test_replace_files_keeps_every_file_when_the_check_refuses(tmp_path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("a: 1\n")
    b.write_text("b: 1\n")

    def refuse(new: dict) -> None:
        raise ValueError("b.yaml would not load")

    with pytest.raises(ValueError):
        replace_files({a: "a: 2\n", b: "b: 2\n"}, check=refuse)
    assert (a.read_text(), b.read_text()) == ("a: 1\n", "b: 1\n")
    replace_files({a: "a: 2\n", b: b"b: 2\n"})
    assert (a.read_text(), b.read_text()) == ("a: 2\n", "b: 2\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.yaml", "b.yaml"]


def test_replace_file_keeps_the_mode_and_refuses_a_second_writer(tmp_path) -> None:
    from kvrepro._locks import FolderLock

    path = tmp_path / "spec.yaml"
    path.write_text("x: 1\n")
    path.chmod(0o640)
    replace_file(path, "x: 2\n")
    assert oct(path.stat().st_mode & 0o777) == "0o640"
    lock = FolderLock(tmp_path / ".spec.yaml.lock")
    assert lock.acquire("pid 1 (test)\n") is None
    try:
        with pytest.raises(FileExistsError, match="another process is rewriting it"):
            replace_file(path, "x: 3\n", wait_s=0.1)
    finally:
        lock.release()
    assert path.read_text() == "x: 2\n"


@needs_mounts
def test_a_full_filesystem_leaves_the_old_files_whole(tmp_path) -> None:
    """The old way (`write_text` in place) cut a spec short on a full disk; here the temporary
    file fails and both files keep their bytes."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = (f"mount -t tmpfs -o size=16k tmpfs {mnt} && "
              f"printf 'drive_tb: 12.8\\n' > {mnt}/server.yaml && "
              f"printf 'plan: 1\\n' > {mnt}/plan.yaml && "
              f"{sys.executable} -c \"import sys; sys.path.insert(0, {str(ROOT)!r}); "
              "from kvrepro._files import replace_files; "
              f"replace_files({{'{mnt}/server.yaml': 'x' * 9000, '{mnt}/plan.yaml': 'y' * 9000}})"
              f"\"; echo rc=$?; cat {mnt}/server.yaml {mnt}/plan.yaml; ls -A {mnt}")
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=60)
    out = done.stdout.split()
    assert "rc=0" not in out and "No space left on device" in done.stderr
    assert out[1:] == ["drive_tb:", "12.8", "plan:", "1", "plan.yaml", "server.yaml"], done.stdout


def test_own_file_refuses_an_existing_name(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(os, "urandom", lambda n: b"\0" * n)
    (tmp_path / (".probe-" + "00" * 6)).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FileExistsError), own_file(tmp_path, ".probe-"):
        pass
    assert not (tmp_path / "elsewhere").exists()
