"""scripts/gpu_smoke.sh: its dry-run path runs here (the doctors, the dry run, the summary,
the tarball); its campaign path needs a GPU (or SMOKE_SPEC=data/servers/cpu_tiny.yaml)."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

from kvrepro.engines.live.smoke_summary import campaign_table, summary

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_smoke.sh"
VENV = Path(sys.executable).parent.parent


def _smoke(out: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "VENV": str(VENV), "OUT": str(out)}
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


def test_campaign_table_of_a_recorded_three_tier_run(tmp_path) -> None:
    shipped = ROOT / "data" / "live" / "cpu_tiny_lmcache"
    table = campaign_table(shipped).set_index("tier")
    assert set(table.index) >= {"small-kv", "dram", "flash"}
    assert (table.requests_ok > 0).all() and (table.median_ttft_s > 0).all()
    # the offload tiers serve more of the prompts from cache than the engine alone
    assert table.at["dram", "cached_share"] > table.at["small-kv", "cached_share"]
    assert "campaign: not run" in summary(tmp_path)
