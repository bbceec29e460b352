"""Study B on the simulator: the B6 prompt-caching microbenchmark and the B7 QPS sweep.

The server is `data/servers/study_b.yaml` (one H100 PCIe, Qwen3-14B BF16, vLLM + LMCache; tiers
`mem`, `ssd1`..`ssd4`, `opt`, each a single offload store named like the tier, so records
carry `loaded_tokens_<tier>`). Where each number comes from is written in that file.

* B6 (`b6_records`, `b6_summary`, `run_b6`):
  `kvrepro.workload.benchmarks.microbenchmark` (a fill
  round, then the same prompts again), on every tier; the TTFT of the measure round's
  requests, averaged per prompt length and divided by MEM's. The GPU prefix cache must not
  serve the measure round, or every tier would show the GPU's TTFT and B6 would have no tier
  differences at all. The study does not say how it kept the GPU out. Here the GPU KV pool
  is shrunk to one request of the longest prompt (the smallest pool vLLM starts with for
  that max_model_len), so each prompt is evicted from the GPU long before it is measured:
  the prefill still has room, and the hit comes from the offload tier, as with vLLM's prefix
  caching turned off. The real pool (~232K tokens) would hold the whole default fill round
  (217K tokens) and serve the measure round itself. `b6_records` checks every measured
  request and raises if the GPU served any part of it.
* B7 (`b7_workload`, `run_b7`, `b7_differences`): ShareGPT cannot be shipped, so
  conversations come from the synthetic ShareGPT-shaped generator, scheduled like LMCache's
  multi-round QA benchmark (`num_users` users, aggregate rate `qps`) with what that
  benchmark adds to each conversation: a shared system prompt and a per-user history in the
  first turn. Without the history, contexts stay near 2K tokens, TTFT is tens of ms, B7's
  throughput axis (K tok/s at <= 0.5 QPS) is out of reach, and the recompute of each
  context's partial last chunk (LMCache only stores whole chunks) decides the comparison
  instead of the tier. The GPU KV pool is the real one (~232K tokens), so offload serves a
  turn only once the other users' traffic has evicted it from the GPU; DRAM and SSD get
  equal capacity (`with_cache_capacity`).
* `study_b_headlines` maps both to the reference ids B6.untuned_low/high, B6.opt_low/high
  and B7.qps_<q>.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from kvrepro._checks import positive
from kvrepro._paths import data_file
from kvrepro.engines.sim.config import SimProfile, sim_profile
from kvrepro.engines.sim.engine import simulate
from kvrepro.model_spec import ModelSpec
from kvrepro.studies.microbench import TIER_LABELS, b6_summary
from kvrepro.studies.reference import load_reference
from kvrepro.tier_spec import ServerSpec, load_server, override_server
from kvrepro.workload.base import Workload
from kvrepro.workload.benchmarks import (
    MacrobenchSpec,
    MicrobenchSpec,
    microbenchmark,
    schedule_conversations,
    synthetic_conversations,
)

B6_TIERS = ("mem", "ssd1", "ssd2", "ssd3", "ssd4", "opt")
B7_TIERS = ("mem", "opt")
B7_LABELS = {"mem": "Memory", "opt": "OPT (SSDs)"}
UNTUNED_TIERS = ("ssd1", "ssd2", "ssd3", "ssd4")
B6_GAP_S = 5.0
"""Microbenchmark spacing: longer than any single request (a 32K fill prefill is ~4 s), so
each measured request runs alone and its TTFT is the tier's best case, not a queue."""


# --------------------------------------------------------------------------- profile


StudyBServer = ServerSpec | SimProfile
"""What study B's functions take: the server spec (its what-ifs go through
`kvrepro.tier_spec.override_server`, so they are the spec a deployment or the cost model
would read), or a simulator profile already rendered (e.g. a measured flash drive's,
`kvrepro.studies.flash_profile`, which has no spec)."""


def study_b_spec(path: str | Path | None = None) -> ServerSpec:
    """The study-B server spec (`data/servers/study_b.yaml` unless `path` is given)."""
    return load_server(path if path else data_file("servers", "study_b.yaml"))


def study_b_profile(path: str | Path | None = None) -> SimProfile:
    """The study-B server rendered for the simulator (`study_b_spec`)."""
    return sim_profile(study_b_spec(path))


def _as_profile(server: StudyBServer) -> SimProfile:
    return sim_profile(server) if isinstance(server, ServerSpec) else server


def _model(server: StudyBServer) -> ModelSpec:
    return server.model_spec() if isinstance(server, ServerSpec) else server.server.model_spec()


def _with(server: StudyBServer, spec_overrides: dict[str, object],
          profile_overrides: dict[str, object]) -> StudyBServer:
    """`server` with a what-if: a spec through `override_server` (`spec_overrides`, dotted
    spec paths); a rendered profile, which has no spec, by the same settings at its own
    paths (`profile_overrides`), validated again."""
    if isinstance(server, ServerSpec):
        return override_server(server, spec_overrides)
    tree = server.model_dump()
    for dotted, value in profile_overrides.items():
        *path, key = dotted.split(".")
        node = tree
        for part in path:
            node = node[int(part) if isinstance(node, list) else part]
        node[key] = value
    return SimProfile.model_validate(tree)


def with_gpu_kv_tokens(server: StudyBServer, tokens: int,
                       max_model_len: int | None = None) -> StudyBServer:
    """A copy of `server` whose GPU KV pool (`engine.kv_cache_bytes`) holds `tokens` tokens
    (and, if given, whose max_model_len is `max_model_len`: vLLM needs a pool of at least one
    such request)."""
    spec = {"engine.kv_cache_bytes": float(tokens * _model(server).kv_bytes_per_token)}
    if max_model_len is not None:
        spec["engine.max_model_len"] = int(max_model_len)
    return _with(server, spec, {k.replace("engine.", "server."): v for k, v in spec.items()})


def with_cache_capacity(server: StudyBServer, capacity_gb: float) -> StudyBServer:
    """A copy of `server` with every offload store holding `capacity_gb` GB.

    B7 compares DRAM and SSD at equal capacity, so one number sets them all.
    """
    positive(capacity_gb=capacity_gb)
    paths = {f"tiers.{name}.stores.{i}.capacity_bytes": capacity_gb * 1e9
             for name, tier in server.tiers.items() for i in range(len(tier.stores))}
    return _with(server, paths, paths)


def microbench_profile(profile: StudyBServer, spec: MicrobenchSpec,
                       gpu_kv_tokens: int | None = None) -> StudyBServer:
    """The server with the GPU KV pool shrunk for B6 (see the module docstring).

    Default: one request of the longest prompt plus its output, rounded up to whole blocks,
    which is also the max_model_len the run needs; a smaller pool than the fill round's
    reuse distance makes every measured prompt come from the offload tier.
    """
    engine = profile.engine if isinstance(profile, ServerSpec) else profile.server
    block = engine.block_tokens
    need = max(spec.prompt_lengths) + spec.output_tokens
    if need > engine.max_model_len:
        raise ValueError(f"prompt_lengths up to {max(spec.prompt_lengths)} + output exceed "
                         f"the profile's max_model_len {engine.max_model_len}")
    need = -(-need // block) * block
    if gpu_kv_tokens is not None and gpu_kv_tokens < need:
        raise ValueError(f"parameter 'gpu_kv_tokens' ({gpu_kv_tokens}) must hold the longest "
                         f"request ({need} tokens)")
    return with_gpu_kv_tokens(profile, gpu_kv_tokens or need, max_model_len=need)


# --------------------------------------------------------------------------- B6


def _measure_round(workload: Workload, result_records: pd.DataFrame, tier: str) -> pd.DataFrame:
    """The measure round's records of one tier, with prompt length and offload tokens."""
    meta = workload.turns[["session_id", "round", "prompt_length"]]
    rec = result_records.merge(meta, on="session_id", how="left", validate="one_to_one")
    rec = rec[rec["round"] == "measure"].copy()
    rec["offload_tokens"] = rec[f"loaded_tokens_{tier}"]
    return rec


def _check_offload_served(rec: pd.DataFrame) -> None:
    """Raise if the GPU prefix cache served part of a measured prompt, or a request failed."""
    bad = rec[(rec["gpu_hit_tokens"] > 0) | (rec["error"] != "")
              | (rec["offload_tokens"] < rec["prompt_tokens"] - 1)]
    if len(bad):
        row = bad.iloc[0]
        raise RuntimeError(
            f"B6 tier {row['tier']!r}: {len(bad)} measure request(s) not fully served by the "
            f"offload tier (first: prompt {row['prompt_tokens']}, GPU hit "
            f"{row['gpu_hit_tokens']}, offload {row['offload_tokens']}, error "
            f"{row['error']!r}); lower gpu_kv_tokens or space the requests further apart")


def b6_records(profile: StudyBServer | None = None, spec: MicrobenchSpec | None = None,
               tiers: Sequence[str] = B6_TIERS,
               gpu_kv_tokens: int | None = None) -> pd.DataFrame:
    """Measure-round records of the B6 microbenchmark on each tier, concatenated.

    Each row is one measured request (`tier`, `prompt_length`, `ttft_s`, `gpu_hit_tokens`,
    `offload_tokens` = `loaded_tokens_<tier>`, ...). Raises if the GPU served any of them.
    """
    spec = spec or MicrobenchSpec(gap_s=B6_GAP_S)
    micro = _as_profile(microbench_profile(profile or study_b_spec(), spec, gpu_kv_tokens))
    workload = microbenchmark(spec)
    parts = []
    for tier in tiers:
        result = simulate(workload, micro, tier, progress=False)
        rec = _measure_round(workload, result.records, tier)
        _check_offload_served(rec)
        parts.append(rec)
    return pd.concat(parts, ignore_index=True)


def run_b6(profile: StudyBServer | None = None, spec: MicrobenchSpec | None = None,
           tiers: Sequence[str] = B6_TIERS, gpu_kv_tokens: int | None = None) -> pd.DataFrame:
    """B6 end to end: `b6_summary(b6_records(...))`."""
    return b6_summary(b6_records(profile, spec, tiers, gpu_kv_tokens))


# --------------------------------------------------------------------------- B7


def b7_workload(qps: float, num_users: int = 20, user_history_tokens: int = 16_000,
                shared_prefix_tokens: int = 1_000, rounds: int = 11,
                seed: int = 0) -> Workload:
    """ShareGPT-shaped conversations with a per-user history, at aggregate rate `qps`.

    The first turn of every conversation carries `user_history_tokens` more tokens (LMCache
    multi-round QA's user history); all sessions share a `shared_prefix_tokens` system
    prompt. `rounds` turns per user are scheduled (enough conversations that no user runs
    out); the caller cuts the run there.
    """
    positive(qps=qps, num_users=num_users, rounds=rounds)
    spec = MacrobenchSpec(source="synthetic", qps=qps, num_users=num_users,
                          max_conversations=num_users * rounds,
                          shared_prefix_tokens=shared_prefix_tokens, seed=seed)
    conversations = synthetic_conversations(spec)
    first = conversations["turn"] == 0
    conversations.loc[first, "append_tokens"] += user_history_tokens
    source = {"format": "synthetic", "user_history_tokens": user_history_tokens}
    return schedule_conversations(conversations, spec, source)


def _b7_point(records: pd.DataFrame, tier: str, qps: float, warmup_s: float,
              end_s: float) -> dict[str, float | str]:
    """TTFT and achieved throughput of one run, over its measurement window.

    TTFT: requests sent in [warmup_s, end_s). Throughput: prompt (cached included, as the
    LMCache benchmark counts them) + output tokens of requests finishing in the window,
    divided by its length, so a saturated server reads what it delivered, not what it got.
    """
    ok = records[records["error"] == ""]
    sent = ok[~ok["is_warmup"]]
    done = ok[(ok["finish_s"] >= warmup_s) & (ok["finish_s"] < end_s)]
    tokens = float((done["prompt_tokens"] + done["output_tokens"]).sum())
    prompt = float(sent["prompt_tokens"].sum())
    return {"qps": qps, "tier": tier, "label": B7_LABELS.get(tier, tier),
            "ttft_mean_s": float(sent["ttft_s"].mean()),
            "ttft_median_s": float(sent["ttft_s"].median()),
            "ttft_p90_s": float(sent["ttft_s"].quantile(0.9)),
            "throughput_tok_s": tokens / (end_s - warmup_s),
            "offload_hit_frac": float(sent[f"loaded_tokens_{tier}"].sum()) / prompt,
            "gpu_hit_frac": float(sent["gpu_hit_tokens"].sum()) / prompt,
            "n_requests": len(sent), "n_failed": int((records["error"] != "").sum())}


def run_b7(profile: StudyBServer | None = None,
           qps_values: Sequence[float] = (0.1, 0.2, 0.3, 0.4, 0.5),
           tiers: Sequence[str] = B7_TIERS, num_users: int = 20,
           user_history_tokens: int = 16_000, shared_prefix_tokens: int = 1_000,
           measure_rounds: int = 10, warmup_rounds: int = 1, seed: int = 0,
           cache_capacity_gb: float | None = None) -> pd.DataFrame:
    """B7's QPS sweep: one row per (qps, tier) with TTFT and achieved throughput.

    Each run lasts (warmup_rounds + measure_rounds) x num_users / qps seconds of sends (one
    turn per user per round); requests sent in the warm-up rounds (cold caches) are not
    measured. `cache_capacity_gb` sets every offload store to the same size (None: the
    profile's, already equal). Columns: see `_b7_point`, plus `throughput_ktok_s`.
    """
    server = profile or study_b_spec()
    if cache_capacity_gb is not None:
        server = with_cache_capacity(server, cache_capacity_gb)
    profile = _as_profile(server)
    rows = []
    for qps in qps_values:
        gap_s = num_users / qps
        warmup_s, end_s = warmup_rounds * gap_s, (warmup_rounds + measure_rounds) * gap_s
        workload = b7_workload(qps, num_users, user_history_tokens, shared_prefix_tokens,
                               warmup_rounds + measure_rounds + 1, seed)
        for tier in tiers:
            result = simulate(workload, profile, tier, duration_s=end_s, warmup_s=warmup_s,
                              progress=False)
            rows.append(_b7_point(result.records, tier, qps, warmup_s, end_s))
    table = pd.DataFrame(rows)
    table["throughput_ktok_s"] = table["throughput_tok_s"] / 1e3
    return table


def b7_differences(b7: pd.DataFrame, a: str = "opt", b: str = "mem",
                   column: str = "ttft_mean_s") -> pd.DataFrame:
    """Per QPS: TTFT of tier `a` vs tier `b` in % (study B7: OPT vs Memory)."""
    wide = b7.pivot(index="qps", columns="tier", values=column)
    missing = [t for t in (a, b) if t not in wide.columns]
    if missing:
        raise ValueError(f"B7 results lack tier(s) {missing}; have {list(wide.columns)}")
    out = pd.DataFrame({"qps": wide.index, f"{b}_s": wide[b].to_numpy(),
                        f"{a}_s": wide[a].to_numpy()})
    out["diff_pct"] = (out[f"{a}_s"] / out[f"{b}_s"] - 1.0) * 100.0
    return out.reset_index(drop=True)


def b7_versus_study(b7: pd.DataFrame) -> pd.DataFrame:
    """B7's per-QPS OPT-vs-Memory TTFT differences next to the study's, in percentage points
    (`gap_pp` = twin - study). Why points: the study's differences are a few percent either
    side of zero (one is 0), where a relative error means nothing."""
    ref = load_reference()["value"]
    twin = b7_differences(b7)
    study = [float(ref.get(f"B7.qps_{qps_id(q)}", np.nan)) for q in twin["qps"]]
    out = pd.DataFrame({"qps": twin["qps"], "study_pct": study, "twin_pct": twin["diff_pct"]})
    out["gap_pp"] = out["twin_pct"] - out["study_pct"]
    return out


# --------------------------------------------------------------------------- B7's scale

QWEN3_14B_CONTEXT_TOKENS = {"native": 40_960, "yarn": 131_072}
"""Qwen3-14B's longest context: `max_position_embeddings` 40,960 in its config.json (32,768
advertised natively), 131,072 with YaRN rope scaling (its model card)."""
H100_PCIE_HBM_BYTES = 80e9
PCIE_GEN5_X16_BYTES_S = 64e9
"""Host link of study B's H100 PCIe: Gen5 x16, ~64 GB/s each way (B4's 64 GB/s for H100)."""


def b7_scale(profile: StudyBServer | None = None, axis_throughput_tok_s: float = 300e3,
             axis_ttft_s: tuple[float, float] = (5.0, 20.0),
             qps_range: tuple[float, float] = (0.1, 0.5)) -> pd.DataFrame:
    """What B7's axes imply about its workload, read the way LMCache's multi-round QA
    benchmark counts them (`benchmarks/multi-round-qa/multi-round-qa.py`): "QPS" is the
    overall request rate (each of `num_users` users sends every num_users / qps s) and
    "Input tokens per second" is the prompt tokens of the finished requests (each turn's
    whole history) over the window. So tokens per request = throughput / QPS, at least
    `axis_throughput_tok_s` / the highest QPS. Each row: quantity, value, unit, what it is
    compared with. From the study's server (`study_b.yaml`) and `kvrepro.calc.roofline`."""
    from kvrepro.calc.roofline import prefill_time_s

    server = _as_profile(profile or study_b_spec()).server
    model, gpu = server.model_spec(), server.gpu_spec()
    kv = model.kv_bytes_per_token
    per_request = axis_throughput_tok_s / qps_range[1]

    def recompute_s(tokens: float) -> float:
        return prefill_time_s(model, gpu, int(tokens), 0, server.mfu)

    longest = QWEN3_14B_CONTEXT_TOKENS["yarn"]
    low, high = (_tokens_for_prefill_s(recompute_s, t) for t in axis_ttft_s)
    rows = [
        ("prompt tokens per request at the top of the axis", per_request, "tokens",
         f"{axis_throughput_tok_s / 1e3:.0f}K tok/s / {qps_range[1]} QPS"),
        ("... over Qwen3-14B's longest context (YaRN)", per_request / longest, "x",
         f"{longest:,} tokens"),
        ("KV bytes of one such request", per_request * kv / 1e9, "GB",
         f"H100 PCIe HBM {H100_PCIE_HBM_BYTES / 1e9:.0f} GB; engine KV budget "
         f"{server.kv_cache_bytes / 1e9:.0f} GB"),
        ("its recompute (prefill, no cache)", recompute_s(per_request), "s",
         f"axis {axis_ttft_s[0]:g}-{axis_ttft_s[1]:g} s"),
        ("its KV load over the host link", per_request * kv / PCIE_GEN5_X16_BYTES_S, "s",
         "PCIe Gen5 x16"),
        ("highest throughput any request fits at the top QPS", qps_range[1] * longest / 1e3,
         "K tok/s", f"{qps_range[1]} QPS x {longest:,} tokens"),
        ("prompt whose recompute takes the axis' TTFT range", low, "tokens",
         f"to {high:,.0f} tokens for {axis_ttft_s[1]:g} s (no cache at all)"),
    ]
    return pd.DataFrame(rows, columns=["quantity", "value", "unit", "compared_with"])


def _tokens_for_prefill_s(prefill_s, target_s: float) -> float:
    """Prompt length whose recompute takes `target_s` (bisection on a monotone function)."""
    low, high = 1.0, 1e8
    for _ in range(80):
        mid = (low * high) ** 0.5
        low, high = (mid, high) if prefill_s(mid) < target_s else (low, mid)
    return high


# --------------------------------------------------------------------------- headlines


def study_b_headlines(b6: pd.DataFrame, b7: pd.DataFrame | None = None,
                      untuned_prompt_tokens: int | None = None) -> dict[str, float]:
    """Study B's reference ids from the B6 summary and the B7 sweep.

    Definitions (B6 ratios are SSD TTFT / MEM TTFT):

    * B6.untuned_low / untuned_high: the smallest / largest ratio over the untuned drive
      counts (SSDx1..x4) at `untuned_prompt_tokens` (default: the longest prompt, 32K).
      The study's "1 -> 4 SSDs gave 1.26x-1.92x" names the drive count as what varies; the
      longest prompt is where loading dominates TTFT. With monotone scaling, low is SSDx4
      and high is SSDx1.
    * B6.opt_low / opt_high: smallest / largest OPT ratio over the prompt lengths (OPT is
      one configuration, so the length is the only thing its range can span).
    * B7.qps_<q>: (OPT / Memory - 1) x 100 of mean TTFT at each QPS in `b7`.
    """
    lengths = sorted(b6["prompt_tokens"].unique())
    at = untuned_prompt_tokens if untuned_prompt_tokens is not None else lengths[-1]
    untuned = b6[b6.tier.isin(UNTUNED_TIERS) & (b6.prompt_tokens == at)]["norm_ttft"]
    opt = b6[b6.tier == "opt"]["norm_ttft"]
    out: dict[str, float] = {}
    if len(untuned):
        out.update({"B6.untuned_low": float(untuned.min()),
                    "B6.untuned_high": float(untuned.max())})
    if len(opt):
        out.update({"B6.opt_low": float(opt.min()), "B6.opt_high": float(opt.max())})
    if b7 is not None and len(b7):
        for row in b7_differences(b7).itertuples():
            out[f"B7.qps_{qps_id(row.qps)}"] = float(row.diff_pct)
    return out


def qps_id(qps: float) -> str:
    """0.1 -> "0.1" (the reference ids' spelling)."""
    return f"{np.round(qps, 6):g}"


__all__ = ["B6_TIERS", "B7_LABELS", "B7_TIERS", "TIER_LABELS", "b6_records", "b6_summary",
           "b7_differences", "b7_scale", "b7_versus_study", "b7_workload",
           "microbench_profile", "qps_id", "run_b6", "run_b7",
           "study_b_headlines", "study_b_profile", "study_b_spec", "with_cache_capacity",
           "with_gpu_kv_tokens"]
