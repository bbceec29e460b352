"""Run a workload on live vLLM tiers: deploy, drive, sample, record, tear down.

`run(workload, server, tier, run_dir)` is the live engine's side of the interface both engines
share (`kvrepro.engines.run_result`): the tier of a server spec rendered to a vLLM command, run, and
read back as a `RunResult`. `run_tier` is one rendered tier: a fresh server (empty cache), the
load client replaying the workload,
a `/metrics` sampler and a watchdog that ends the run with `ServerError` (quoting the server
log) if the server dies. Records go to `<run_dir>/records.jsonl` as requests finish, so a
crash keeps every finished request. `run_campaign` runs several tiers one after another on the
same workload, one run folder per tier.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from kvrepro._paths import child_path, empty_folder
from kvrepro._signals import stop_on_signals
from kvrepro.engines.live.client import ClientConfig, ClientStats, RealClock, run_workload
from kvrepro.engines.live.metrics import sample_metrics
from kvrepro.engines.live.placement import (
    ProcessAccounting,
    affinities,
    affinity_summary,
    autogroups,
    pinned_client,
    speed_probe,
)
from kvrepro.engines.live.server import ServerError, VllmServer
from kvrepro.engines.live.tiers import TierConfig, live_tier, server_record
from kvrepro.engines.run_result import DRAIN_TIMEOUT_S, RunResult
from kvrepro.records import RunWriter, read_run
from kvrepro.tier_spec import ServerSpec
from kvrepro.workload.base import Workload


@dataclass
class LiveOptions:
    """How long and how hard to drive each tier (the workload says what to send)."""

    duration_s: float | None = None
    warmup_s: float = 0.0
    request_timeout_s: float = 600.0
    drain_timeout_s: float | None = DRAIN_TIMEOUT_S  # the rule of kvrepro.engines.run_result
    sample_interval_s: float = 2.0
    max_in_flight: int | None = None
    python: str | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)


class Alive(Protocol):
    """What a watchdog polls: a server, or a fleet of them (`check_alive` raises ServerError
    naming what died)."""

    def check_alive(self) -> None: ...


async def watch_alive(target: Alive, stop: asyncio.Event, poll_s: float = 0.5,
                      ) -> ServerError | None:
    """Poll `target`'s processes (a server, a fleet); on a death set `stop` and return the
    error."""
    while not stop.is_set():
        try:
            target.check_alive()
        except ServerError as err:
            stop.set()
            return err
        await asyncio.sleep(poll_s)
    return None


async def _drive(server: VllmServer, workload: Workload, writer: RunWriter,
                 config: ClientConfig, interval_s: float) -> ClientStats:
    clock, stop = RealClock(), asyncio.Event()
    watchdog = asyncio.create_task(watch_alive(server, stop))
    extra = [server.lmcache_url] if server.lmcache_url else []
    accounting = ProcessAccounting(lambda: {**server.roles(), os.getpid(): "client"})
    sampler = asyncio.create_task(sample_metrics(server.base_url, writer, clock, interval_s,
                                                 stop, extra_urls=extra,
                                                 extra_values=accounting.sample))
    try:
        stats = await run_workload(workload, writer, config, clock=clock, stop_event=stop)
    finally:
        died = stop.is_set() and watchdog.done() and watchdog.result()
        stop.set()
        await asyncio.gather(sampler, watchdog, return_exceptions=True)
    if died:
        raise died
    return stats


def _meta(tier: TierConfig, workload: Workload, options: LiveOptions) -> dict[str, Any]:
    return {"engine": "live", "tier": tier.name, "tier_config": tier.meta_record(),
            "workload": workload.spec, "workload_digest": workload.digest(),
            "options": {k: v for k, v in vars(options).items() if k != "python"}}


def run_tier(tier: TierConfig, workload: Workload, run_dir: str | Path,
             options: LiveOptions | None = None,
             server: ServerSpec | None = None) -> ClientStats:
    """Deploy `tier`, replay `workload` against it, and write the run folder (with the
    server spec it was rendered from, when given)."""
    options = options or LiveOptions()
    run_dir = Path(run_dir)
    meta = _meta(tier, workload, options)
    if server is not None:
        meta["server_spec"] = server_record(server)
    meta["started_utc"] = datetime.now(UTC).isoformat(timespec="seconds")
    meta["speed_probe"] = {"before": speed_probe()}
    with RunWriter(run_dir, meta) as writer:
        with VllmServer(tier, run_dir, python=options.python) as deployed:
            writer.meta["startup_s"] = deployed.wait_healthy()
            config = ClientConfig(
                base_url=deployed.base_url, model=tier.served_model_name or tier.model,
                tier=tier.name, request_timeout_s=options.request_timeout_s,
                duration_s=options.duration_s, warmup_s=options.warmup_s,
                drain_timeout_s=options.drain_timeout_s, extra_body=options.extra_body or None,
                max_in_flight=options.max_in_flight)
            with pinned_client(tier.placement.cpus("client")):
                writer.meta["placement"] = deployed.placement_record()
                writer.meta["placement"]["affinity"].update(
                    affinities({os.getpid(): "client"}))
                stats = asyncio.run(_drive(deployed, workload, writer, config,
                                           options.sample_interval_s))
        writer.meta["cleaned_up"] = deployed.cleaned
        writer.meta["client"] = stats.as_dict()
        writer.meta["speed_probe"]["after"] = speed_probe()
    return stats


class PlacementMismatch(ValueError):
    """Two tiers of one campaign ran on different CPUs: not a tier comparison."""


def placement_signature(meta: Mapping[str, Any]) -> dict[str, Any]:
    """What every tier of a campaign must share: the OpenMP binding vLLM logged (its bind
    setting and core ids), the CPU sets of each process role's threads, and how many
    autogroups the processes were in (one: they shared their CPUs thread by thread)."""
    record = meta.get("placement") or {}
    logged = record.get("vllm_logged") or {}
    return {"omp_threads_bind": logged.get("omp_threads_bind"),
            "core_ids": logged.get("core_ids"),
            "autogroups": len(autogroups(record.get("affinity") or {})),
            **{f"cpus_{role}": sets for role, sets in
               affinity_summary(record.get("affinity") or {}).items()}}


def check_same_placement(metas: Mapping[str, Mapping[str, Any]]) -> None:
    """Raise PlacementMismatch naming the tiers and the setting when the run metas of one
    campaign differ in their placement; a role only some tiers have (the LMCache server) is
    compared among those that have it."""
    signatures = {name: placement_signature(meta) for name, meta in metas.items()}
    keys = sorted(set().union(*signatures.values())) if signatures else []
    problems = []
    for key in keys:
        seen = {name: sig[key] for name, sig in signatures.items() if key in sig}
        if len({repr(v) for v in seen.values()}) > 1:
            problems.append(f"{key}: " + ", ".join(f"{n} {v}" for n, v in seen.items()))
    if problems:
        raise PlacementMismatch("tiers of one campaign ran on different CPUs: "
                                + "; ".join(problems))


def run_campaign(tiers: list[TierConfig], workload: Workload, out_dir: str | Path,
                 options: LiveOptions | None = None) -> dict[str, ClientStats | Exception]:
    """Run each tier in turn (fresh server, empty cache), one folder per tier.

    A tier that fails is reported and the campaign goes on; the result maps tier names to
    their stats or their error. SIGINT or SIGTERM stops the whole campaign (after tearing
    the running tier down; what it recorded stays in its folder). Every tier's folder is
    checked to lie inside `out_dir` before the first tier starts (ValueError otherwise).
    At the end the tiers that ran must have run on the same CPUs (`check_same_placement`:
    PlacementMismatch otherwise, with every folder kept).
    """
    folders = {tier.name: child_path(out_dir, tier.name, "tier") for tier in tiers}
    results: dict[str, ClientStats | Exception] = {}
    with stop_on_signals() as seen:
        for tier in tiers:
            try:
                results[tier.name] = run_tier(tier, workload, folders[tier.name], options)
            except (ServerError, OSError) as err:
                results[tier.name] = err
            if seen:
                raise KeyboardInterrupt(f"campaign stopped by signal {seen[0]}")
    check_same_placement({name: read_run(folders[name]).meta for name, stats in results.items()
                          if not isinstance(stats, Exception)})
    return results


def describe_plans(plans: Mapping[str, Any], prefix: str = "") -> str:
    """Each deployment's plan (`DeployPlan.describe`) under a heading with its name."""
    parts = [f"== {prefix}{name}\n{plan.describe()}" for name, plan in plans.items()]
    return "\n\n".join(parts) + "\n"


def dry_run_campaign(tiers: list[TierConfig], out_dir: str | Path,
                     options: LiveOptions | None = None) -> str:
    """What `run_campaign` would start, tier by tier, written into the same folders
    (command lines, the environment kvrepro adds, tier.json, the LMCache config) and into
    `dry_run.txt`; nothing is started. Multi-process LMCache ports are chosen free now and
    again at deployment. Returns the text of `dry_run.txt`."""
    empty_folder(out_dir, "dry run")
    options = options or LiveOptions()
    folders = {tier.name: child_path(out_dir, tier.name, "tier") for tier in tiers}
    plans = {tier.name: VllmServer(tier, folders[tier.name], options.python).plan(
        build_model=False) for tier in tiers}
    text = describe_plans(plans)
    (Path(out_dir) / "dry_run.txt").write_text(text)
    return text


def run(workload: Workload, server: ServerSpec, tier: str, run_dir: str | Path, *,
        duration_s: float | None = None, warmup_s: float = 0.0,
        max_in_flight: int | None = None, drain_timeout_s: float | None = DRAIN_TIMEOUT_S,
        options: LiveOptions | None = None) -> RunResult:
    """Serve tier `tier` of `server` for real, replay `workload`, return the run read back.

    The same signature as the simulator's `kvrepro.engines.sim.campaign.run`; `options`
    holds what only a live run has (request timeout, sampling period, python).
    """
    base = options or LiveOptions()
    opts = LiveOptions(**{**vars(base), "duration_s": duration_s, "warmup_s": warmup_s,
                          "max_in_flight": max_in_flight, "drain_timeout_s": drain_timeout_s})
    with stop_on_signals():
        stats = run_tier(live_tier(server, tier), workload, run_dir, opts, server)
    done = read_run(run_dir)
    return RunResult(done.records, done.samples, {**done.meta, "stats": stats.as_dict()})
