"""How much host CPU each serving process spends per unit of its work, read from a live
run's process accounting (issue [host-cpu], its first part: the demand, not yet the twin).

Why from the accounting and not from TTFT: a process's CPU seconds are measured directly
(`proc_<role>_cpu_user_s` + `_system_s` in a live run's samples, `engines.live.placement`),
and so is its work (the server's counters in the same samples), so the demand per unit of
work is a regression of one on the other, interval by interval, with nothing the twin
predicts in it. A TTFT fit would fold queueing on shared CPUs into the constants.

Each role has the units of work the issue names, where a run counts them (an engine step
is not counted by vLLM's metrics: the engine core's per-step cost is carried by its output
tokens, one per running request and step, and its per-second term), plus `seconds`: what
the process spends while it is up whatever it does (polling loops, heartbeats). The
regression is least squares without an intercept; a negative coefficient is kept and shown
(two units that move together cannot be told apart on these runs), not clipped.
"""

from __future__ import annotations

import argparse
import gzip
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from kvrepro._files import replace_files
from kvrepro.records import read_run
from kvrepro.tier_spec import HOST_CPU_UNITS

REQUESTS = ("requests_finished_stop", "requests_finished_length", "requests_finished_abort",
            "requests_finished_error", "requests_finished_repetition")
"""vLLM's finished-request counters: their sum is the requests a run finished."""
UNITS: dict[str, tuple[str, ...]] = {  # keys: tier_spec.HOST_CPU_UNITS but "seconds"
    "requests": REQUESTS,
    "prompt_tokens": ("prompt_tokens",),
    "output_tokens": ("generation_tokens",),
    "lookup_tokens": ("lmcache_lookup_tokens",),
    "chunks_moved": ("lmcache_l1_read_chunks", "lmcache_l1_write_chunks"),
}
"""A unit of work -> the cumulative sample counters whose sum counts it."""
ROLE_UNITS: dict[str, tuple[str, ...]] = {  # keys: tier_spec.HOST_CPU_UNITS but "seconds"
    "api_server": ("seconds", "requests", "prompt_tokens", "output_tokens"),
    "engine_core": ("seconds", "requests", "prompt_tokens", "output_tokens"),
    "lmcache_server": ("seconds", "lookup_tokens", "chunks_moved"),
    "client": ("seconds", "requests"),
}
"""Each process role and the units its CPU is regressed on (the issue's list)."""
REGRESSED_ROLES = ("api_server", "lmcache_server", "client")
"""The roles whose regressed demand the twin uses. Not the engine core's: its accounting is
mostly vLLM's queue polling (`stack_profile`: 0.45 of its 0.55 CPU-s/s on the fit load), so
its regression (r2 0.39) fits the polling; its work, and the worker's besides the forward
pass, are their share of the steps' host part (`step_host_s`), from sampled stacks."""


def _cumulative(samples: pd.DataFrame, columns: Sequence[str]) -> pd.Series:
    present = [c for c in columns if c in samples.columns]
    return samples[present].fillna(0.0).sum(axis=1) if present else pd.Series(
        np.nan, index=samples.index)


def work_intervals(samples: pd.DataFrame, run: str = "", window_s: float | None = None
                   ) -> pd.DataFrame:
    """One row per interval between consecutive samples (or per `window_s` of them, summed:
    the kernel's CPU accounting ticks and the scheduler make a 2-second interval noisy):
    `seconds`, each unit's increase, and `cpu_<role>_s`, the role's user + system CPU
    seconds in it (roles the samples account for). `run` labels the rows (several runs are
    fitted together)."""
    data = samples.sort_values("time_s").reset_index(drop=True)
    if window_s is not None:
        window = (data["time_s"] - data["time_s"].iloc[0]) // window_s
        data = data.groupby(window, sort=True).first().reset_index(drop=True)  # boundaries
    out = pd.DataFrame({"seconds": data["time_s"].diff()})
    for unit, columns in UNITS.items():
        out[unit] = _cumulative(data, columns).diff()
    for role in ROLE_UNITS:
        user, system = f"proc_{role}_cpu_user_s", f"proc_{role}_cpu_system_s"
        if user in data.columns:
            out[f"cpu_{role}_s"] = (data[user] + data[system].fillna(0.0)).diff()
    return out.iloc[1:].assign(run=run).reset_index(drop=True)


def fit_cpu_demand(intervals: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(demand, fit): `demand` has one row per role and unit, `cpu_s_per_unit`; `fit` one
    row per role: intervals, r2, cpu_s (total), median and p90 |residual| per interval as a
    share of the role's mean CPU per interval. Least squares over `intervals`
    (`work_intervals` of one or more runs, concatenated)."""
    demand, quality = [], []
    for role, units in ROLE_UNITS.items():
        column = f"cpu_{role}_s"
        if column not in intervals.columns:
            continue
        rows = intervals.dropna(subset=[column, *units])
        x, y = rows[list(units)].to_numpy(float), rows[column].to_numpy(float)
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        residual = y - x @ coef
        demand += [{"role": role, "unit": u, "cpu_s_per_unit": float(c)}
                   for u, c in zip(units, coef, strict=True)]
        quality.append(_quality(role, y, residual))
    return pd.DataFrame(demand), pd.DataFrame(quality)


def _quality(role: str, y: np.ndarray, residual: np.ndarray) -> dict[str, float | str]:
    spread = float(((y - y.mean()) ** 2).sum())
    mean = float(y.mean()) if len(y) else np.nan
    return {"role": role, "intervals": len(y), "cpu_s": float(y.sum()),
            "r2": 1 - float((residual ** 2).sum()) / spread if spread > 0 else np.nan,
            "median_abs_residual_share": float(np.median(np.abs(residual))) / mean,
            "p90_abs_residual_share": float(np.quantile(np.abs(residual), 0.9)) / mean}


def predicted_cpu_s(intervals: pd.DataFrame, demand: pd.DataFrame) -> pd.DataFrame:
    """Each role's CPU seconds per interval as `demand` predicts them from the work
    (`cpu_<role>_s_predicted`): what a held-out run checks the demand on."""
    out = intervals.copy()
    for role, part in demand.groupby("role", sort=False):
        coef: Mapping[str, float] = dict(zip(part["unit"], part["cpu_s_per_unit"], strict=True))
        out[f"cpu_{role}_s_predicted"] = sum(intervals[u] * c for u, c in coef.items())
    return out


POLL_FRAMES = ("sched_yield (vllm/distributed/utils.py", "MessageQueue.acquire_read (",
               "SpinCondition.wait (")
"""Frames of a reader polling vLLM's shared-memory queue (vLLM 0.32 `shm_broadcast`:
`acquire_read` loops on `SpinCondition.wait`, which calls sched_yield for 1 s after the last
read): a sampled stack through one of them is the process polling, not working. The
writer's side (`enqueue`, its notify) is work."""
FORWARD_FRAMES = ("torch/_ops.py", "torch/nn/modules/module.py")
"""Frames of the worker's forward pass (torch operators), as opposed to its Python."""


def stack_profile(raw: str | Path, rate_hz: float) -> dict[str, float]:
    """CPU seconds of one process by what it did, from py-spy's raw output (collapsed
    stacks with their sample counts, `py-spy record --format raw --rate RATE`; only
    running threads are sampled): `active_s`, `polling_s` (a POLL_FRAMES stack),
    `forward_s` (a FORWARD_FRAMES stack), and `work_s` (active, not polling). Why sampled
    stacks: the process accounting cannot tell polling from work (both are CPU time)."""
    out = dict.fromkeys(("active_s", "polling_s", "forward_s", "work_s"), 0.0)
    path = Path(raw)
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" \
        else path.read_text()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        seconds = int(count) / rate_hz
        out["active_s"] += seconds
        if any(frame in stack for frame in POLL_FRAMES):
            out["polling_s"] += seconds
        elif any(frame in stack for frame in FORWARD_FRAMES):
            out["forward_s"] += seconds
    out["work_s"] = out["active_s"] - out["polling_s"]
    return out


WINDOW_S = 10.0
"""Seconds of samples summed per regression row (`work_intervals`): the kernel's accounting
ticks and the 2-second sampling make single intervals noisy."""


def measure(fit_dir: str | Path, window_s: float = WINDOW_S
            ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(demand, fit) of `fit_cpu_demand` over every tier run of `fit_dir` together (one
    regression per role: each role's units move differently across the tiers)."""
    runs = sorted(p.parent for p in Path(fit_dir).glob("*/samples.jsonl"))
    if not runs:
        raise ValueError(f"{fit_dir}: no run folder with samples.jsonl")
    parts = [work_intervals(read_run(r).samples, r.name, window_s) for r in runs]
    return fit_cpu_demand(pd.concat(parts, ignore_index=True))


def write_demand(fit_dir: str | Path, host_split: Mapping[str, float],
                 out: str | Path) -> Path:
    """The twin's demand table into `out`, replaced atomically: `measure`'s rows of
    REGRESSED_ROLES, and each of `host_split`'s roles' CPU seconds per second of the
    steps' host part (unit `step_host_s`)."""
    demand, _ = measure(fit_dir)
    demand = pd.concat([demand[demand["role"].isin(REGRESSED_ROLES)], pd.DataFrame(
        [{"role": r, "unit": "step_host_s", "cpu_s_per_unit": v}
         for r, v in host_split.items()])], ignore_index=True)
    assert set(demand["unit"]) <= set(HOST_CPU_UNITS), "a unit the twin cannot count"
    path = Path(out)
    replace_files({path: demand.to_csv(index=False, float_format="%.6g")})
    return path


def main(argv: list[str] | None = None) -> int:
    """`python -m kvrepro.analysis.cpu_demand CAMPAIGN_DIR`: print each role's demand and
    the regression's quality (the calibration writes the twin's table: `write_demand`)."""
    parser = argparse.ArgumentParser(prog="python -m kvrepro.analysis.cpu_demand",
                                     description=main.__doc__)
    parser.add_argument("campaign_dir", help="a campaign folder (one run folder per tier)")
    args = parser.parse_args(argv)
    try:
        demand, fit = measure(args.campaign_dir)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(demand.pivot(index="role", columns="unit", values="cpu_s_per_unit").to_string())
    print(fit.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())

