"""The twin's host-CPU demand (`engines.sim.host_cpu`), measured on this machine's live runs.

Three measurements, none a fit to latency:

* the API server's, LMCache server's and load client's CPU seconds per unit of work: the
  regression of their process accounting on the fit campaign's work counters
  (`analysis.cpu_demand.measure`, its residuals in notebook 06);
* how long a polling reader woken on a busy CPU waits (benchmarks/bench_handoff.py, its
  result in the profile campaign's handoff.json);
* how the steps' host part splits between vLLM's engine core and its worker: their CPU
  seconds of work (sampled stacks less the queue polling, `analysis.cpu_demand.stack_profile`)
  per second of the host part the twin runs on the same workload (`step_host_s`). The
  stacks come from a profile campaign (data/live/cpu_tiny_host_profile: the fit workload,
  py-spy on the running engine core, worker and API server; its run.sh), since the process
  accounting cannot tell polling from work.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from kvrepro._checks import load_yaml, validate_model
from kvrepro._paths import data_dir
from kvrepro.analysis.cpu_demand import stack_profile, write_demand
from kvrepro.calibration.validate import simulate_run
from kvrepro.engines.sim.config import SimProfile
from kvrepro.records import read_run
from kvrepro.tier_spec import HostCpuSpec

PROFILE_DIR = "cpu_tiny_host_profile"
"""data/live/<PROFILE_DIR>: the stack-profile campaign (profile.yaml, tier runs, stacks)."""
HANDOFF_JSON = "handoff.json"
"""In PROFILE_DIR: a polling reader's wait on a busy CPU (benchmarks/bench_handoff.py)."""


class StackProfile(BaseModel):
    """profile.yaml: how the stacks were sampled and where each process's are."""

    model_config = ConfigDict(extra="forbid")
    rate_hz: float = Field(gt=0, description="py-spy's --rate")
    duration_s: float = Field(gt=0, description="py-spy's --duration")
    stacks: dict[str, dict[str, str]] = Field(description="tier -> role -> raw stacks file")


def load_stack_profile(profile_dir: str | Path) -> StackProfile:
    """The profile campaign's profile.yaml; an error names the file and the key."""
    path = Path(profile_dir) / "profile.yaml"
    return validate_model(load_yaml(path.read_text(), str(path)), StackProfile,
                          "stack profile", str(path))


def stack_table(profile_dir: str | Path) -> pd.DataFrame:
    """Per profiled tier and role: CPU-s per s active, polling, in the forward pass and
    working (`analysis.cpu_demand.stack_profile` over the sampling window)."""
    root = Path(profile_dir)
    plan = load_stack_profile(root)
    return pd.DataFrame([{"tier": tier, "role": role, **{
        key: value / plan.duration_s for key, value in stack_profile(
            root / path, plan.rate_hz).items()}}
        for tier, roles in plan.stacks.items() for role, path in roles.items()])


def host_split(profile_dir: str | Path, profile: SimProfile) -> dict[str, float]:
    """engine_core's and worker's CPU seconds of work per second of the twin's step host
    part, pooled over the profiled tiers (their work over the tiers' host parts; the
    worker's without its forward pass)."""
    root = Path(profile_dir)
    plan = load_stack_profile(root)
    bare = profile.model_copy(update={"host_cpu": None})  # the host part as CPU work
    work = {"engine_core": 0.0, "worker": 0.0}
    host_load = 0.0
    for tier, files in plan.stacks.items():
        result, _, _ = simulate_run(read_run(root / tier), bare)
        host_load += result.stats["host_part_cpu_s"] / result.stats["end_s"]
        for role in work:
            stacks = stack_profile(root / files[role], plan.rate_hz)
            work_s = stacks["work_s"] - (stacks["forward_s"] if role == "worker" else 0.0)
            work[role] += work_s / plan.duration_s
    return {role: cpu / host_load for role, cpu in work.items()}


def demand_path(spec_path: str | Path) -> Path:
    """Where a fitted spec's demand table goes: next to it (cpu_tiny.yaml ->
    cpu_tiny_host_cpu.csv)."""
    spec_path = Path(spec_path)
    return spec_path.with_name(f"{spec_path.stem}_host_cpu.csv")


def measured_host_cpu(campaign_dir: Path, tier: str, profile: SimProfile, out: Path,
                      profile_dir: str | Path | None = None) -> HostCpuSpec:
    """The fit machine's host CPUs (a run's recorded CPU count) with the demand measured on
    the campaign's accounting and the profile's stacks, written to `out` (a CSV)."""
    root = Path(profile_dir or data_dir() / "live" / PROFILE_DIR)
    write_demand(campaign_dir, host_split(root, profile), out)
    cpus = (read_run(campaign_dir / tier).meta.get("host") or {}).get("cpus") or os.cpu_count()
    handoff = json.loads((root / HANDOFF_JSON).read_text())["handoff_wait_s"]
    return HostCpuSpec(cpus=cpus, demand_csv=str(Path(out).resolve()), handoff_wait_s=handoff)


def host_of(cpus: int, speed: float = 1.0) -> HostCpuSpec:
    """Another server's host CPUs with this machine's measured demand (the shipped tiny
    server's table and handoff wait), its CPU seconds divided by `speed`: the model on a GPU
    server, whose host CPU count is data."""
    shipped = data_dir() / "servers"
    handoff = json.loads((data_dir() / "live" / PROFILE_DIR / HANDOFF_JSON).read_text())
    return HostCpuSpec(cpus=cpus, speed=speed, handoff_wait_s=handoff["handoff_wait_s"],
                       demand_csv=str(demand_path(shipped / "cpu_tiny.yaml")))


__all__ = ["PROFILE_DIR", "StackProfile", "demand_path", "host_of", "host_split",
           "load_stack_profile", "measured_host_cpu", "stack_table"]
