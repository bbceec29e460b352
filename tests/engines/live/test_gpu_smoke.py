"""scripts/gpu_smoke.sh: its dry-run path runs here (the doctors, the dry run, the summary,
the tarball); its campaign path needs a GPU (or SMOKE_SPEC=data/servers/cpu_tiny.yaml)."""

from __future__ import annotations

import gzip
import json
import os
import re
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

from kvrepro.engines.live.smoke_summary import campaign_table, summary

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "gpu_smoke.sh"
VENV = Path(sys.executable).parent.parent


def _smoke(out: Path | str, *args: str, venv: Path = VENV, path: str | None = None,
           ) -> subprocess.CompletedProcess:
    env = {**os.environ, "VENV": str(venv), "OUT": str(out)}
    if path is not None:
        env["PATH"] = path
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)


def test_dry_run_path_writes_the_doctors_the_plans_and_a_tarball(tmp_path) -> None:
    out = tmp_path / "smoke"
    done = _smoke(out, "--dry-run")
    gpu_here = done.returncode == 0
    assert done.returncode in (0, 1), done.stderr
    text = (out / "summary.txt").read_text()
    assert text in done.stdout and "campaign: not run" in text
    assert ("doctor-smoke: " in text) and ("doctor-study: " in text)
    if not gpu_here:  # no GPU: the doctors say so, line by line
        assert "FAIL GPUs: 0 found" in text
    for tier in ("baseline", "dram", "flash"):
        assert (out / "dry-run" / tier / "command.txt").is_file()
    with tarfile.open(f"{out}.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"smoke/summary.txt", "smoke/doctor-smoke.json", "smoke/machine.txt",
            "smoke/dry-run/flash/lmcache.yaml"} <= names


def test_it_refuses_an_existing_folder_and_unknown_arguments(tmp_path) -> None:
    (tmp_path / "taken").mkdir()
    done = _smoke(tmp_path / "taken")
    assert done.returncode == 2 and "exists" in done.stderr
    assert _smoke(tmp_path / "new", "--bogus").returncode == 2
    assert not (tmp_path / "new").exists()


def test_it_refuses_an_existing_tarball_and_leaves_it_whole(tmp_path) -> None:
    """OUT is new but OUT.tar.gz (a file, or a symlink to a file not there yet) is not."""
    (tmp_path / "smoke.tar.gz").write_bytes(b"the user's own")
    done = _smoke(tmp_path / "smoke", "--dry-run")
    assert done.returncode == 2 and "smoke.tar.gz exists" in done.stderr
    assert (tmp_path / "smoke.tar.gz").read_bytes() == b"the user's own"
    assert not (tmp_path / "smoke").exists()
    (tmp_path / "link.tar.gz").symlink_to(tmp_path / "target")
    assert _smoke(tmp_path / "link", "--dry-run").returncode == 2
    assert not (tmp_path / "target").exists() and not (tmp_path / "link").exists()


GPU_LINE = "0, NVIDIA H200, 143771"
PROCESS_MARK = "otheruser-private-job.py"  # a line of nvidia-smi's process table


def _gpu_machine(tmp_path: Path) -> tuple[Path, str]:
    """A venv whose `kvrepro` is the real one, except that a campaign copies the shipped
    three-tier runs (their meta.json name this host, their .gz logs the home and repository
    paths) and adds a line naming the host and home to a server log, and that the smoke
    server's doctor passes; a PATH whose `nvidia-smi` lists one GPU, and a process table when
    called without arguments. Returns (venv, PATH)."""
    venv, bin_dir = tmp_path / "venv", tmp_path / "bin"
    (venv / "bin").mkdir(parents=True)
    bin_dir.mkdir()
    shipped = ROOT / "data" / "live" / "cpu_tiny_lmcache"
    scripts = {
        venv / "bin" / "python": f'exec {VENV}/bin/python "$@"\n',
        venv / "bin" / "kvrepro": f"""real={VENV}/bin/kvrepro
if [ "$1" = doctor ]; then "$real" "$@"; exit 0; fi  # its lines kept, its verdict not
case " $* " in *" --dry-run "*) exec "$real" "$@" ;; esac
while [ $# -gt 1 ] && [ "$1" != --out ]; do shift; done
mkdir "$2" && cp -r {shipped}/small-kv {shipped}/dram {shipped}/flash "$2"/ || exit 2
echo "INFO server on $(uname -n) as $HOME ({VENV})" >> "$2/dram/server.log"
""",
        bin_dir / "nvidia-smi": f"""case "$*" in
  *driver_version*) echo "index, name, memory.total [MiB], driver_version"
                    echo "{GPU_LINE}, 570.86" ;;
  *--query-gpu*) echo "{GPU_LINE}" ;;
  *) echo "| GPU  PID  Process name"; echo "|  0  4242  /home/otheruser/{PROCESS_MARK}" ;;
esac
"""}
    for path, text in scripts.items():
        path.write_text("#!/bin/bash\n" + text)
        path.chmod(0o755)
    return venv, f"{bin_dir}:{os.environ['PATH']}"


def _packed(tarball: Path) -> dict[str, bytes]:
    """Each file of the tarball, a .gz member decompressed."""
    with tarfile.open(tarball) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    return {n: gzip.decompress(b) if n.endswith(".gz") else b for n, b in files.items()}


def _host_word() -> re.Pattern[bytes]:
    return re.compile(rb"(?<![\w.-])" + re.escape(socket.gethostname().encode()) + rb"(?![\w-])")


def test_the_tarball_holds_no_host_name_process_table_or_paths(tmp_path) -> None:
    """A campaign (the shipped runs stand in for it) packed by default: no host name in any
    file (meta.json's `host.hostname` replaced), no process table, no home, repository or
    venv path; the GPU line is there; OUT/ (trailing slash) is OUT.tar.gz; the local run
    folder keeps what the run recorded."""
    venv, path = _gpu_machine(tmp_path)
    done = _smoke(f"{tmp_path}/smoke/", venv=venv, path=path)
    assert done.returncode == 0, done.stderr  # both doctors pass here
    assert not (tmp_path / "smoke" / ".tar.gz").exists()
    files = _packed(tmp_path / "smoke.tar.gz")
    with tarfile.open(tmp_path / "smoke.tar.gz") as tar:  # no owner names either
        assert {(m.uname, m.gname) for m in tar.getmembers()} == {("", "")}
    assert "smoke/campaign/dram/meta.json" in files and "campaign:" in done.stdout
    assert GPU_LINE.encode() in files["smoke/machine.txt"]
    home, venv_path = str(Path.home()).encode(), str(VENV).encode()
    for name, data in files.items():
        assert not _host_word().search(data), name
        for private in (PROCESS_MARK.encode(), home, str(ROOT).encode(), venv_path):
            assert private not in data, (name, private)
    for tier in ("small-kv", "dram", "flash"):
        assert json.loads(files[f"smoke/campaign/{tier}/meta.json"])["host"]["hostname"] \
            == "<host>"
    assert b"INFO server on <host> as ~ (<venv>)" in files["smoke/campaign/dram/server.log"]
    local = json.loads((tmp_path / "smoke/campaign/dram/meta.json").read_text())
    assert _host_word().search(local["host"]["hostname"].encode())


def test_with_host_details_the_tarball_keeps_them(tmp_path) -> None:
    venv, path = _gpu_machine(tmp_path)
    done = _smoke(tmp_path / "smoke", "--with-host-details", "--dry-run", venv=venv, path=path)
    assert done.returncode == 0, done.stderr
    machine = _packed(tmp_path / "smoke.tar.gz")["smoke/machine.txt"]
    assert _host_word().search(machine) and PROCESS_MARK.encode() in machine
    assert str(VENV).encode() in _packed(tmp_path / "smoke.tar.gz")["smoke/dry-run/dry_run.txt"]


def test_campaign_table_of_a_recorded_three_tier_run(tmp_path) -> None:
    shipped = ROOT / "data" / "live" / "cpu_tiny_lmcache"
    table = campaign_table(shipped).set_index("tier")
    assert set(table.index) >= {"small-kv", "dram", "flash"}
    assert (table.requests_ok > 0).all() and (table.median_ttft_s > 0).all()
    # the offload tiers serve more of the prompts from cache than the engine alone
    assert table.at["dram", "cached_share"] > table.at["small-kv", "cached_share"]
    assert "campaign: not run" in summary(tmp_path)
