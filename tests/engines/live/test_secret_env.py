"""A spec's `live.env` values (a token, a key) reach the server processes and nothing else: no
file a dry run or a run writes (env.json, tier.json, dry_run.txt, meta.json), not the screen.
The CLI runs as a real process; the run test starts a real process in place of vLLM (a shell
script given as the live engine's Python) and reads what it received. No vLLM is started."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvrepro.engines.live.processes import free_port
from kvrepro.engines.live.runner import LiveOptions, run_tier
from kvrepro.engines.live.server import ServerError
from kvrepro.engines.live.tiers import REDACTED, live_tier
from kvrepro.tier_spec import load_server, override_server
from kvrepro.workload import build_workload

ROOT = Path(__file__).resolve().parents[3]
CPU_TINY = ROOT / "data" / "servers" / "cpu_tiny.yaml"
SECRET = "hf_secret123"
ENV_PARAM = f"live.env={{HF_TOKEN: {SECRET}}}"


def _kvrepro(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvrepro.cli", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


def _holding(folder: Path, text: str) -> list[Path]:
    """Every file under `folder` whose bytes hold `text`."""
    return [p for p in folder.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def test_a_live_dry_run_writes_and_prints_no_env_value(tmp_path) -> None:
    out = tmp_path / "dry"
    done = _kvrepro("run", "live", "--server", str(CPU_TINY), "-p", ENV_PARAM, "--dry-run",
                    "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert SECRET not in done.stdout + done.stderr
    assert f"env: HF_TOKEN={REDACTED}" in done.stdout  # the name is shown, not the value
    assert _holding(out, SECRET) == []
    for tier in ("small-kv", "dram", "flash"):
        assert json.loads((out / tier / "env.json").read_text())["HF_TOKEN"] == REDACTED
        assert json.loads((out / tier / "tier.json").read_text())["env"] == {"HF_TOKEN": REDACTED}
    assert f"HF_TOKEN={REDACTED}" in (out / "dry_run.txt").read_text()


def test_a_fleet_dry_run_writes_and_prints_no_env_value(tmp_path) -> None:
    server = yaml.safe_load(CPU_TINY.read_text())
    server["live"]["env"] = {"HF_TOKEN": SECRET}
    (tmp_path / "server.yaml").write_text(yaml.safe_dump(server))
    fleet = {"server": str(tmp_path / "server.yaml"), "tier": "dram", "n_servers": 2,
             "routing": "round_robin", "kv_pool": "shared"}
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(fleet))
    out = tmp_path / "dry"
    done = _kvrepro("run", "fleet", "--fleet", str(tmp_path / "fleet.yaml"), "--dry-run",
                    "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert SECRET not in done.stdout + done.stderr
    assert _holding(out, SECRET) == []
    env_files = sorted(out.rglob("env.json"))
    assert {p.parent.name for p in env_files} >= {"pool", "i0", "i1"}  # the pool's, each one's
    assert all(json.loads(p.read_text())["HF_TOKEN"] == REDACTED for p in env_files)


def test_a_run_gives_the_value_to_its_server_and_writes_it_nowhere(tmp_path) -> None:
    """The real VllmServer starts a stand-in for vLLM (it writes what HF_TOKEN it got outside
    the run folder, then exits): the run fails at start-up as it would, and the run folder
    (meta.json with the tier and the server spec, env.json, tier.json, server.log) holds only
    the redacted value."""
    saw = tmp_path / "child_saw.txt"
    fake_python = tmp_path / "python"
    fake_python.write_text(f'#!/bin/bash\nprintf %s "$HF_TOKEN" > {saw}\nexit 3\n')
    fake_python.chmod(0o755)
    spec = override_server(load_server(CPU_TINY), {
        "live.env": {"HF_TOKEN": SECRET}, "live.port": free_port("127.0.0.1"),
        "live.model": str(tmp_path / "model")})
    workload = build_workload("micro", {"prompt_lengths": [16], "prompts_per_length": 1})
    run_dir = tmp_path / "run"
    with pytest.raises(ServerError):
        run_tier(live_tier(spec, "small-kv"), workload, run_dir,
                 LiveOptions(python=str(fake_python)), server=spec)
    assert saw.read_text() == SECRET  # the server process got the real value
    assert {"meta.json", "env.json", "tier.json", "server.log"} <= {
        p.name for p in run_dir.iterdir()}
    assert _holding(run_dir, SECRET) == []
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["tier_config"]["env"] == {"HF_TOKEN": REDACTED}
    assert meta["server_spec"]["live"]["env"] == {"HF_TOKEN": REDACTED}
