"""One runner per workload kind of a case, registered by kind (`EXPERIMENTS`).

A runner takes the case, its server spec and a run folder, runs the twin, and returns the
predicted value of every point it can: a dict (metric, tier, point, extra) -> value, where
`extra` is the sorted tuple of the published row's extra coordinates. `predict` matches them
to the published rows. Every runner uses the twin's own parts (`StepTimer` for a bare step,
`simulate` for a server, `simulate_fleet` for replicas behind a router): nothing here
computes a time the twin does not.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from kvrepro.calc.gpu_rates import Constants
from kvrepro.engines.sim import simulate
from kvrepro.engines.sim.config import sim_profile
from kvrepro.engines.sim.fleet import simulate_fleet
from kvrepro.engines.sim.steptime import StepTimer
from kvrepro.fleet_spec import FleetSpec
from kvrepro.studies.external.case import ExternalCase, Published
from kvrepro.studies.external.server_spec import case_gpu
from kvrepro.studies.study_b import microbench_profile
from kvrepro.tier_spec import ServerSpec
from kvrepro.workload.benchmarks import MicrobenchSpec, microbenchmark
from kvrepro.workload.shared_prefix import SharedPrefixSpec, shared_prefix_workload

Key = tuple[str, str, float, tuple[tuple[str, float], ...]]


@dataclass(frozen=True)
class CaseRun:
    """What a runner gets: the case, the folder its file is in, its server spec, the shared
    constants and the run folder it may write into."""

    case: ExternalCase
    case_dir: Path
    server: ServerSpec
    constants: Constants
    run_dir: Path


Runner = Callable[[CaseRun], dict[Key, float]]
EXPERIMENTS: dict[str, Runner] = {}
PUBLISHED_FROM: dict[str, Callable[[ExternalCase, Path], list[Published]]] = {}
"""Kinds whose published numbers live in a file next to the case (the probe's JSON)."""


def register(kind: str) -> Callable[[Runner], Runner]:
    def wrap(fn: Runner) -> Runner:
        EXPERIMENTS[kind] = fn
        return fn
    return wrap


def key(metric: str, tier: str, point: float, **extra: float) -> Key:
    return (metric, tier, float(point), tuple(sorted((k, float(v)) for k, v in extra.items())))


# ------------------------------------------------------------------ probe (bare GPU)

def probe_published(case: ExternalCase, case_dir: Path) -> list[Published]:
    """The probe's measurements as published rows (all measured on the device)."""
    res = json.loads((case_dir / case.workload.results).read_text())
    rows = [Published(metric="prefill_s", tier="device", point=r["prompt_tokens"],
                      value=r["prefill_s"]) for r in res["prefill"]]
    rows += [Published(metric=f"decode_{mode}_step_s", tier="device", point=r["batch"],
                       value=r[f"{mode}_step_s"], extra={"context_tokens": r["context_tokens"]})
             for r in res["decode"] for mode in ("graph", "eager") if f"{mode}_step_s" in r]
    rows += [Published(metric=f"{way}_gb_s", tier="device", point=r["block_bytes"] / 2**20,
                       value=r[f"{way}_gb_s"]) for r in res["copies"] for way in ("h2d", "both")]
    return rows


PUBLISHED_FROM["probe"] = probe_published


@register("probe")
def run_probe(run: CaseRun) -> dict[Key, float]:
    """The twin's step model on the probe's shapes: prefill compute, decode steps with and
    without CUDA graphs, and the DMA rate."""
    case, constants = run.case, run.constants
    profile = sim_profile(run.server)
    timer = StepTimer(profile.server)
    model = profile.server.model_spec()
    eager_s = constants.value("eager_layer_overhead_s") * model.num_layers
    gpu = case_gpu(case)
    out: dict[Key, float] = {}
    for row in probe_published(case, run.case_dir):
        if row.metric == "prefill_s":
            out[key(row.metric, row.tier, row.point)] = timer.compute_s([(int(row.point), 0)])
        elif row.metric.startswith("decode_"):
            ctx = int(row.extra["context_tokens"])
            batch = int(row.point)
            step = timer.decode_step_s(batch * ctx, batch)
            value = step + (eager_s if "eager" in row.metric else 0.0)
            out[key(row.metric, row.tier, row.point, context_tokens=ctx)] = value
        else:
            one_way = gpu.host_link_gb_s * constants.value("dma_one_way_efficiency")
            both = 2 * gpu.host_link_gb_s * constants.value("dma_both_ways_efficiency")
            out[key(row.metric, row.tier, row.point)] = both if row.metric == "both_gb_s" \
                else one_way
    return out


# ------------------------------------------------------------------ single requests

ASYNC_SLACK_TOKENS = 64
"""GPU pool beyond the longest request for the offload runs: an asynchronous load holds its
blocks plus a spare one while it runs."""
SINGLE_GAP_S = 600.0
"""Seconds between single requests: longer than any of them, so none overlaps another."""


def _ttfts(workload, spec: ServerSpec, tier: str) -> dict[str, dict[int, float]]:
    """TTFT by prompt length of the fill round and of the measure round."""
    result = simulate(workload, sim_profile(spec), tier, progress=False)
    rec = result.records.merge(workload.turns[["session_id", "round", "prompt_length"]],
                               on="session_id", validate="one_to_one")
    out = {}
    for name, part in rec.groupby("round"):
        part = part.drop_duplicates("prompt_length")  # the flush prompt repeats the longest
        out[name] = dict(zip(part["prompt_length"].astype(int), part["ttft_s"], strict=True))
    return out


@register("single_request")
def run_single_request(run: CaseRun) -> dict[Key, float]:
    """Per prompt length: a miss and a GPU prefix hit on the GPU-only tier (the same prompt
    sent twice on a GPU pool that holds it), and a hit of each offload tier (the GPU pool
    shrunk to one request, as study B's microbenchmark does, so the prompt comes back from
    the store)."""
    case, server = run.case, run.server
    work = case.workload
    out: dict[Key, float] = {}
    gpu_only = [n for n, t in case.setup.tiers.items() if t.connector == "none"]
    if not gpu_only:
        raise ValueError(f"case {case.name}: a single_request workload needs a GPU-only tier "
                         f"(connector none) for its misses and GPU hits")
    for length in work.prompt_tokens:  # one prompt per run: nothing else in the GPU pool
        spec = MicrobenchSpec(prompt_lengths=[length], prompts_per_length=1,
                              output_tokens=work.output_tokens, gap_s=SINGLE_GAP_S,
                              round_gap_s=SINGLE_GAP_S)
        ttfts = _ttfts(microbenchmark(spec), server, gpu_only[0])
        out[key("ttft_s", "miss", length)] = ttfts["fill"][length]
        out[key("ttft_s", "gpu_hit", length)] = ttfts["measure"][length]
    # a flush prompt as long as the longest, last in the fill round: the GPU pool (one such
    # request, plus the slack an asynchronous load needs) then holds none of the measured ones
    lengths = sorted(work.prompt_tokens)
    spec = MicrobenchSpec(prompt_lengths=[*lengths, lengths[-1]], prompts_per_length=1,
                          output_tokens=work.output_tokens, gap_s=SINGLE_GAP_S,
                          round_gap_s=SINGLE_GAP_S)
    need = lengths[-1] + work.output_tokens + ASYNC_SLACK_TOKENS
    small = microbench_profile(server, spec, gpu_kv_tokens=need)
    wl = microbenchmark(spec)
    for name, tier in case.setup.tiers.items():
        if tier.connector != "none":
            for length, ttft in _ttfts(wl, small, name)["measure"].items():
                out[key("ttft_s", name, length)] = ttft
    return out


# ------------------------------------------------------------------ shared-prefix fleet

STAGE_DRAIN_S = 900.0
"""Idle time the twin leaves after each stage's last send before the next stage: inference-perf
waits for every request of a stage to finish and then idles (its `interval`); the run checks
that every stage finished inside it."""


@register("shared_prefix")
def run_shared_prefix(run: CaseRun) -> dict[Key, float]:
    """Every tier of the case on `replicas` instances behind the router, all stages in one run
    (caches carry from stage to stage, as on the real servers), per-stage metrics."""
    case, run_dir = run.case, run.run_dir
    work = case.workload
    wl = shared_prefix_workload(SharedPrefixSpec(
        num_groups=work.num_groups, num_prompts_per_group=work.num_prompts_per_group,
        system_prompt_len=work.system_prompt_len, question_len=work.question_len,
        output_len=work.output_len, stages=[s.model_dump() for s in work.stages],
        stage_gap_s=STAGE_DRAIN_S))
    server_path = run_dir / "server.yaml"
    server_path.write_text(yaml.safe_dump(run.server.model_dump(mode="json"), sort_keys=False))
    out: dict[Key, float] = {}
    for tier in case.setup.tiers:
        fleet = FleetSpec(server=str(server_path), tier=tier, n_servers=case.setup.replicas,
                          routing=case.setup.router, kv_pool="private")
        result = simulate_fleet(wl, fleet, progress=False)
        rec = result.records.merge(wl.turns[["session_id", "stage"]], on="session_id",
                                   validate="one_to_one")
        rec.to_parquet(run_dir / f"records_{tier}.parquet")
        for (_stage, rate), metrics in _stage_metrics(rec, work.stages).items():
            for metric, value in metrics.items():
                out[key(metric, tier, rate)] = value
    return out


def _stage_metrics(rec: pd.DataFrame, stages: list[Any]) -> dict[tuple[int, float], dict]:
    """inference-perf's per-stage numbers: mean and p90 TTFT and end-to-end latency, and
    prompt + output tokens over the stage's first send to its last completion."""
    out = {}
    for i, stage in enumerate(stages):
        s = rec[rec["stage"] == i]
        if s.empty:
            continue
        e2e = s["finish_s"] - s["send_s"]
        span_s = s["finish_s"].max() - s["send_s"].min()
        tokens = (s["prompt_tokens"] + s["output_tokens"]).sum()
        out[(i, stage.rate_qps)] = {
            "ttft_mean_s": s["ttft_s"].mean(), "ttft_p90_s": float(np.quantile(s["ttft_s"], .9)),
            "e2e_mean_s": e2e.mean(), "e2e_p90_s": float(np.quantile(e2e, .9)),
            "throughput_tok_s": tokens / span_s}
    return out


# ------------------------------------------------------------------ study B

B6_REFERENCE: dict[str, tuple[str, str, float]] = {
    "B6.untuned_low": ("ttft_over_mem", "ssd4", 32768),
    "B6.untuned_high": ("ttft_over_mem", "ssd1", 32768),
    "B6.opt_low": ("ttft_over_mem_min_over_lengths", "opt", 0),
    "B6.opt_high": ("ttft_over_mem_max_over_lengths", "opt", 0),
}
"""Study B's B6 ids as (metric, tier, point): TTFT over MEM's at the longest prompt (the
untuned drives: 4 drives the best, 1 the worst, `study_b_headlines`), and OPT's range over
the prompt lengths."""
B7_METRIC = "ttft_mean_over_mem"
"""B7 as a ratio, OPT's mean TTFT over Memory's (1 + the study's percent / 100): a signed
error of a percent difference near 0 would mean nothing."""


def study_b_published(case: ExternalCase, case_dir: Path) -> list[Published]:
    """B6 (the fit of study B's LMCache store costs: fitted) and B7 (predicted), from the
    reference table."""
    from kvrepro.studies.reference import load_reference
    from kvrepro.studies.study_b import qps_id
    ref = load_reference()["value"]
    rows = [Published(metric=m, tier=t, point=p, value=float(ref[i]), used_in_fit=True)
            for i, (m, t, p) in B6_REFERENCE.items()]
    rows += [Published(metric=B7_METRIC, tier="opt", point=q,
                       value=1 + float(ref[f"B7.qps_{qps_id(q)}"]) / 100)
             for q in case.workload.b7_qps]
    return rows


PUBLISHED_FROM["study_b"] = study_b_published


@register("study_b")
def run_study_b(run: CaseRun) -> dict[Key, float]:
    """B6 and B7 on study B's server with the shared constants' H100 PCIe rates."""
    from kvrepro.studies.study_b import qps_id, run_b6, run_b7, study_b_headlines
    b6 = run_b6(run.server)
    b7 = run_b7(run.server, qps_values=run.case.workload.b7_qps)
    b6.to_csv(run.run_dir / "b6.csv", index=False)
    b7.to_csv(run.run_dir / "b7.csv", index=False)
    heads = study_b_headlines(b6, b7)
    out = {key(m, t, p): heads[i] for i, (m, t, p) in B6_REFERENCE.items()}
    for q in run.case.workload.b7_qps:
        out[key(B7_METRIC, "opt", q)] = 1 + heads[f"B7.qps_{qps_id(q)}"] / 100
    return out
