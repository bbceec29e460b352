"""A live fleet's runs as one tidy table: per (pool, tier, routing) and instance, and in total.

A fleet run (`kvrepro.engines.live.fleet_deploy`) writes one folder: records of every instance
(`instance`, `routed_away`, `kv_pool`, `routing` on each) and samples per instance
(`instance` = i; the shared LMCache server's are `instance` = -1). `fleet_live_summary`
reads one run folder, a campaign folder of them, or records (and samples) already loaded.

Definitions (the twin's `fleet_headlines` names the same quantities):

* measured turns: succeeded (no error, a first token) and not warm-up; the window is from
  the first measured send to the last measured finish of the run, the same for every
  instance of a run, so instances' throughputs add up to the total;
* throughput: (prompt + output tokens) / window, prompt tokens counted whole (cached ones
  too, as `kvrepro.analysis.runs` counts them); `output_tok_s` the output part alone;
* TTFT: first_token_s - send_s of measured turns, median and 90th percentile;
* cached share: cached prompt tokens / prompt tokens, from each answer's usage
  (`cached_tokens`: the engine's own prefix cache and LMCache together);
* cross-instance hit share: the same over routed-away turns only (a turn sent to another
  instance than its session's previous one). On a private pool such a turn can only hit
  what that instance cached itself; on a shared pool also what the other one stored;
* prompt tokens by source: from each instance's vLLM counters (`prompt_tokens_by_source`:
  computed, engine prefix cache, external = LMCache) over the samples from the warm-up on;
  a per-turn split is not reported by vLLM, so these are per instance, not per turn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from kvrepro._checks import require_columns
from kvrepro.analysis.runs import (
    PROCESS_COLUMNS,
    fleet_turn_stats,
    process_cpu,
    prompt_tokens_by_source,
    share,
)
from kvrepro.records import read_run

GROUP_KEYS = ("kv_pool", "tier", "routing")
FLEET_COLUMNS = (*GROUP_KEYS, "router", "instance", "n_turns", "n_failed", "window_s",
                 "throughput_tok_s", "output_tok_s", "ttft_median_s", "ttft_p90_s",
                 "cached_share", "routed_away_turns", "cross_instance_hit_share",
                 "computed_tokens", "engine_hit_tokens", "offload_hit_tokens",
                 "offload_share")
_RECORD_NEEDS = [*GROUP_KEYS, "instance", "routed_away", "send_s", "first_token_s",
                 "finish_s", "prompt_tokens", "cached_prompt_tokens", "output_tokens",
                 "is_warmup", "error"]


def _is_run(path: Path) -> bool:
    return (path / "records.jsonl").is_file()


def load_fleet_runs(path: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Records and samples of one fleet run folder or of every run folder under `path`;
    each gets the run's router kind (`router`) and its pool, tier and routing labels."""
    root = Path(path)
    dirs = [root] if _is_run(root) else sorted(p for p in root.iterdir() if _is_run(p))
    if not dirs:
        raise FileNotFoundError(f"{root}: no fleet run folder (records.jsonl) in or under it")
    records, samples = [], []
    for run_dir in dirs:
        run = read_run(run_dir)
        if run.meta.get("kind") != "fleet":
            raise ValueError(f"{run_dir}: not a fleet run (meta.json kind "
                             f"{run.meta.get('kind')!r})")
        labels = {"kv_pool": run.meta["kv_pool"], "tier": run.meta["tier"],
                  "routing": run.meta["routing"], "router": run.meta["router"]["kind"]}
        records.append(run.records.assign(**labels))
        if len(run.samples):
            samples.append(run.samples.assign(**labels,
                                              warmup_s=run.meta["options"]["warmup_s"]))
    return (pd.concat(records, ignore_index=True),
            pd.concat(samples, ignore_index=True) if samples else pd.DataFrame())


def _turn_stats(part: pd.DataFrame, window_s: float) -> dict[str, Any]:
    """Throughput, TTFT and cached shares of one instance's (or the fleet's) measured turns
    (TTFT and shares: `kvrepro.analysis.runs.fleet_turn_stats`, the twin's recipe too)."""
    tokens = part["prompt_tokens"].sum() + part["output_tokens"].sum()
    return {"n_turns": len(part), "window_s": window_s,
            "throughput_tok_s": share(float(tokens), window_s),
            "output_tok_s": share(float(part["output_tokens"].sum()), window_s),
            **fleet_turn_stats(part)}


def _source_stats(samples: pd.DataFrame) -> dict[int, dict[str, float]]:
    """Prompt tokens by source per instance over the samples from the warm-up on."""
    if samples.empty or "instance" not in samples:
        return {}
    warmup_s = samples["warmup_s"] if "warmup_s" in samples else 0.0
    vllm = samples[(samples["instance"] >= 0) & (samples["time_s"] >= warmup_s)]
    if vllm.empty:
        return {}
    table = prompt_tokens_by_source(vllm.assign(tier=vllm["instance"].astype(int)))
    out = {}
    for row in table.itertuples(index=False):
        total = row.computed_tokens + row.engine_hit_tokens + row.offload_hit_tokens
        out[int(row.tier)] = {"computed_tokens": row.computed_tokens,
                              "engine_hit_tokens": row.engine_hit_tokens,
                              "offload_hit_tokens": row.offload_hit_tokens,
                              "offload_share": share(row.offload_hit_tokens, total)}
    return out


def _total_sources(per_instance: dict[int, dict[str, float]]) -> dict[str, float]:
    if not per_instance:
        return {}
    sums = {k: sum(v[k] for v in per_instance.values())
            for k in ("computed_tokens", "engine_hit_tokens", "offload_hit_tokens")}
    total = sum(sums.values())
    return {**sums, "offload_share": share(sums["offload_hit_tokens"], total)}


def _one_run(records: pd.DataFrame, samples: pd.DataFrame,
             labels: dict[str, Any]) -> list[dict[str, Any]]:
    ok = (records["error"].fillna("") == "") & records["first_token_s"].notna()
    measured = records[ok & ~records["is_warmup"].astype(bool)]
    window_s = (float(measured["finish_s"].max() - measured["send_s"].min())
                if len(measured) else float("nan"))
    sources = _source_stats(samples)
    failed = records[~ok]
    rows = []
    for instance in sorted(int(i) for i in measured["instance"].unique() if i >= 0):
        part = measured[measured["instance"] == instance]
        rows.append({**labels, "instance": str(instance),
                     "n_failed": int((failed["instance"] == instance).sum()),
                     **_turn_stats(part, window_s), **sources.get(instance, {})})
    rows.append({**labels, "instance": "total", "n_failed": len(failed),
                 **_turn_stats(measured, window_s), **_total_sources(sources)})
    return rows


def fleet_live_summary(run: str | Path | pd.DataFrame,
                       samples: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (kv_pool, tier, routing) and instance ("0", "1", ..., "total"):
    throughput, TTFT, cached and cross-instance hit shares, prompt tokens by source
    (columns `FLEET_COLUMNS`; the module doc defines each). `run` is a fleet run folder, a
    folder of them, or their records (with `samples` for the by-source columns)."""
    if isinstance(run, (str, Path)):
        records, samples = load_fleet_runs(run)
    else:
        records, samples = run, samples if samples is not None else pd.DataFrame()
    require_columns(records, _RECORD_NEEDS, "fleet_live_summary")
    if "router" not in records:
        records = records.assign(router="unknown")
    rows: list[dict[str, Any]] = []
    for key, part in records.groupby([*GROUP_KEYS, "router"], sort=False):
        labels = dict(zip([*GROUP_KEYS, "router"], key, strict=True))
        mine = samples
        if len(samples) and all(k in samples for k in GROUP_KEYS):
            mine = samples[(samples[list(GROUP_KEYS)] == pd.Series(labels)[list(GROUP_KEYS)])
                           .all(axis=1)]
        rows.extend(_one_run(part, mine, labels))
    return pd.DataFrame(rows).reindex(columns=list(FLEET_COLUMNS))


def fleet_process_cpu(path: str | Path) -> pd.DataFrame:
    """What each process of a live fleet campaign (or one run) did, per run and sampler
    (`instance`: an instance's own processes; the shared one, -1, or instance 0 without a
    shared pool, also the router, shared LMCache server and client): `runs.process_cpu`'s
    CPUs busy, involuntary context switches, run queue wait and timeslices per second and
    wait per timeslice (NaN in runs that predate them) by role."""
    root = Path(path)
    dirs = [root] if _is_run(root) else sorted(p for p in root.iterdir() if _is_run(p))
    parts = []
    for run_dir in dirs:
        samples = read_run(run_dir).samples
        for instance, part in samples.groupby("instance", sort=True):
            own = part.dropna(axis=1, how="all")  # the other samplers' processes
            parts.append(process_cpu(own).assign(run=run_dir.name, instance=int(instance)))
    columns = ["run", "instance", *PROCESS_COLUMNS]
    return pd.concat(parts, ignore_index=True)[columns] if parts else pd.DataFrame(
        columns=columns)
