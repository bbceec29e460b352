"""Time the simulator (simulated requests per second), optionally side by side with another
checkout of kvrepro (`--base PATH`, e.g. a `git worktree` of the previous commit).

Usage: .venv/bin/python benchmarks/bench_sim.py [--base PATH] [--repeat 3]
                                                [--cases campaign azure dram fleet]
                                                [--profile CASE] [--tracemalloc]

Cases (each timed from a fresh process, the workload built before the clock starts):

* `campaign`: study A's three-tier campaign as notebook 04 runs it (seed 0, 5400 s, 180 s
  warm-up, 2.5 sessions/min, the fitted pause `kvrepro.studies.study_a.STUDY_A_PAUSE`,
  `data/servers/study_a.yaml`, tiers baseline, dram, flash, through
  `kvrepro.engines.sim.campaign.simulate_campaign`). Goal: >= 5,000 simulated requests/s.
* `azure`: a replay of the one-hour Azure LLM inference conversation trace
  (`../shared/data/azure/AzureLLMInferenceTrace_conv.csv`, read with
  `kvrepro.workload.benchmarks.read_azure_trace`): every row is a one-turn request
  (prompt = ContextTokens, output = GeneratedTokens, at least 1) sent at the trace's arrival
  time, on study A's server, GPU only (tier baseline), until every request has finished.
  Goal: >= 10,000 simulated requests/s.
* `dram`: study A's campaign workload on the dram tier alone (`kvrepro.engines.sim.simulate`).
* `fleet`: study A's server x 8 (`data/fleets/study_a_8x.yaml`: round robin, shared pool)
  for 30 minutes at 8 x 2.5 sessions/min (`kvrepro.engines.sim.fleet.simulate_fleet`), one
  point of notebook 13's sweep.

Each case runs `--repeat` times per checkout, alternating checkouts, in a new process whose
PYTHONPATH is the checkout's root (this repository's, or `--base`'s); the table gives the
median wall time and simulated requests/s (records / wall time) of each, and the speed-up.
`--profile CASE` prints a cProfile of one run of CASE in this process (top functions by own
time) with the kvrepro it imports (this repository's, or PYTHONPATH's: `PYTHONPATH=<base>
... --profile campaign` profiles the other checkout); `--tracemalloc` the peak of Python
allocations of one dram run likewise (slow: not timed).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
AZURE_CONV = ROOT.parent / "shared" / "data" / "azure" / "AzureLLMInferenceTrace_conv.csv"
CASES = ("campaign", "azure", "dram", "fleet")
STUDY_A_TIERS = ["baseline", "dram", "flash"]
STUDY_A_WARMUP_S = 180.0


def _study_a_workload() -> Any:
    from kvrepro.studies.study_a import STUDY_A_PAUSE
    from kvrepro.workload import AgenticSpec, generate_agentic

    return generate_agentic(AgenticSpec(seed=0, duration_s=5400.0, warmup_s=STUDY_A_WARMUP_S,
                                        pause=STUDY_A_PAUSE, session_rate_per_min=2.5))


def azure_replay_workload(path: Path = AZURE_CONV) -> Any:
    """The Azure trace as one-turn sessions sent open loop at the trace's arrival times."""
    import numpy as np
    import pandas as pd

    from kvrepro.workload.base import SESSION_COLUMNS, TURN_COLUMNS, SeededTokens, Workload
    from kvrepro.workload.benchmarks import read_azure_trace

    rows = read_azure_trace(path).frame.sort_values("arrival_s", kind="stable")
    n = len(rows)
    arrival_s = rows["arrival_s"].to_numpy(dtype="float64")
    context = rows["context_tokens"].to_numpy(dtype="int64")
    turns = pd.DataFrame({
        "session_id": np.arange(n), "turn": 0, "pause_s": 0.0, "not_before_s": arrival_s,
        "append_tokens": context, "prompt_tokens": context,
        "output_tokens": np.maximum(rows["generated_tokens"].to_numpy(dtype="int64"), 1),
        "is_resume": False, "append_kind": "trace", "output_kind": "trace",
    })[list(TURN_COLUMNS)].astype(TURN_COLUMNS)
    sessions = pd.DataFrame({
        "session_id": np.arange(n), "arrival_s": arrival_s, "n_turns": 1, "cohort": "trace",
        "is_warmup": False, "end_reason": "trace"}).astype(SESSION_COLUMNS)
    spec = {"kind": "azure_replay", "trace": {"path": str(path), "n_requests": n}}
    return Workload(spec, sessions, turns, SeededTokens(seed=0))


def _case(name: str) -> tuple[Callable[[], int], str]:
    """(a callable that runs the case and returns its records, a description); the workload
    and profile are built here, before the clock starts."""
    from kvrepro.engines.sim import load_profile, simulate
    from kvrepro.engines.sim.campaign import simulate_campaign

    profile = load_profile(ROOT / "data" / "servers" / "study_a.yaml")
    if name == "campaign":
        workload = _study_a_workload()
        return (lambda: len(simulate_campaign(workload, profile, STUDY_A_TIERS,
                                              warmup_s=STUDY_A_WARMUP_S, progress=False)[0]),
                f"study A campaign, {len(workload.sessions)} sessions, 3 tiers")
    if name == "azure":
        workload = azure_replay_workload()
        return (lambda: len(simulate(workload, profile, "baseline", progress=False).records),
                f"Azure conv trace replay, {len(workload.turns)} one-turn requests, baseline")
    if name == "dram":
        workload = _study_a_workload()
        return (lambda: len(simulate(workload, profile, "dram", warmup_s=STUDY_A_WARMUP_S,
                                     progress=False).records),
                "study A workload, dram tier")
    if name == "fleet":
        from kvrepro.engines.sim.fleet import simulate_fleet
        from kvrepro.studies.study_a import STUDY_A_PAUSE
        from kvrepro.workload import AgenticSpec, generate_agentic

        fleet = ROOT / "data" / "fleets" / "study_a_8x.yaml"
        workload = generate_agentic(AgenticSpec(seed=0, duration_s=1800.0, warmup_s=180.0,
                                                pause=STUDY_A_PAUSE,
                                                session_rate_per_min=8 * 2.5))
        return (lambda: len(simulate_fleet(workload, fleet, progress=False).records),
                f"study A x 8 fleet, {len(workload.sessions)} sessions, 30 min")
    raise ValueError(f"unknown case {name!r} (parameter '--cases'); known: {CASES}")


def _worker(name: str) -> None:
    """Run one case once and print its timing as one JSON line."""
    import kvrepro

    run, description = _case(name)
    t0 = time.perf_counter()
    requests = run()
    wall_s = time.perf_counter() - t0
    print(json.dumps({"case": name, "description": description, "requests": requests,
                      "wall_s": wall_s, "kvrepro": kvrepro.__file__,
                      "max_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))


def _timed(checkout: Path, name: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run([sys.executable, __file__, "--worker", name], env=env, text=True,
                          capture_output=True, check=False)
    if done.returncode:
        raise RuntimeError(f"case {name} on {checkout} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _side_by_side(cases: list[str], checkouts: dict[str, Path], repeat: int) -> None:
    print(f"{'case':9s} {'checkout':8s} {'requests':>8s} {'median s':>9s} {'req/s':>8s}  "
          "runs (s)")
    for name in cases:
        runs: dict[str, list[dict[str, Any]]] = {label: [] for label in checkouts}
        for _ in range(repeat):  # alternate, so that drift of the machine hits both
            for label, checkout in checkouts.items():
                runs[label].append(_timed(checkout, name))
        rates = {}
        for label, got in runs.items():
            wall_s = statistics.median(r["wall_s"] for r in got)
            rates[label] = got[0]["requests"] / wall_s
            walls = ", ".join(f"{r['wall_s']:.2f}" for r in got)
            print(f"{name:9s} {label:8s} {got[0]['requests']:8d} {wall_s:9.2f} "
                  f"{rates[label]:8.0f}  {walls}"
                  f"  (max RSS {max(r['max_rss_gib'] for r in got):.2f} GiB)")
        print(f"{'':9s} {got[0]['description']}")
        if "base" in rates:
            print(f"{'':9s} speed-up new / base: {rates['new'] / rates['base']:.2f}x")


def _profile(name: str, top: int = 25) -> None:
    run, description = _case(name)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    requests = prof.runcall(run)
    print(f"cProfile of {name} ({description}): {requests} requests in "
          f"{time.perf_counter() - t0:.2f} s under the profiler")
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    print(out.getvalue())


def _traced_peak_mib() -> float:
    from kvrepro.engines.sim import load_profile, simulate

    workload, profile = _study_a_workload(), load_profile(ROOT / "data/servers/study_a.yaml")
    tracemalloc.start()
    simulate(workload, profile, "dram", progress=False)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=["campaign", "azure"], choices=CASES)
    parser.add_argument("--base", type=Path, help="another checkout's root, run side by side")
    parser.add_argument("--repeat", type=int, default=3, help="runs per case and checkout")
    parser.add_argument("--profile", choices=CASES, help="cProfile one run of this case")
    parser.add_argument("--tracemalloc", action="store_true",
                        help="peak Python allocations of one dram run (slow)")
    parser.add_argument("--worker", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker)
        return
    if args.base is not None and not (args.base / "kvrepro" / "__init__.py").is_file():
        parser.error(f"--base {args.base}: no kvrepro package there")
    if args.profile:
        _profile(args.profile)
        return
    checkouts = {"new": ROOT} if args.base is None else {"base": args.base, "new": ROOT}
    _side_by_side(args.cases, checkouts, max(1, args.repeat))
    if args.tracemalloc:
        print(f"tracemalloc peak of one dram run: {_traced_peak_mib():.0f} MiB")


if __name__ == "__main__":
    main()
