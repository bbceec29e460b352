"""Run a workload on live vLLM tiers: deploy, drive, sample, record, tear down.

`run_tier` is one tier: a fresh server (empty cache), the load client replaying the workload,
a `/metrics` sampler and a watchdog that ends the run with `ServerError` (quoting the server
log) if the server dies. Records go to `<run_dir>/records.jsonl` as requests finish, so a
crash keeps every finished request. `run_campaign` runs several tiers one after another on the
same workload, one run folder per tier.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvrepro.engines.live.client import ClientConfig, ClientStats, RealClock, run_workload
from kvrepro.engines.live.metrics import sample_metrics
from kvrepro.engines.live.server import ServerError, VllmServer
from kvrepro.engines.live.tiers import TierConfig
from kvrepro.records import RunWriter
from kvrepro.workload.base import Workload


@dataclass
class LiveOptions:
    """How long and how hard to drive each tier (the workload says what to send)."""

    duration_s: float | None = None
    warmup_s: float = 0.0
    request_timeout_s: float = 600.0
    drain_timeout_s: float = 60.0
    sample_interval_s: float = 2.0
    max_in_flight: int | None = None
    python: str | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)


async def _watch(server: VllmServer, stop: asyncio.Event, poll_s: float = 0.5,
                 ) -> ServerError | None:
    """Poll the server process; on death set `stop` and return the error."""
    while not stop.is_set():
        try:
            server.check_alive()
        except ServerError as err:
            stop.set()
            return err
        await asyncio.sleep(poll_s)
    return None


async def _drive(server: VllmServer, workload: Workload, writer: RunWriter,
                 config: ClientConfig, interval_s: float) -> ClientStats:
    clock, stop = RealClock(), asyncio.Event()
    watchdog = asyncio.create_task(_watch(server, stop))
    sampler = asyncio.create_task(sample_metrics(server.base_url, writer, clock, interval_s,
                                                 stop))
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
    return {"engine": "live", "tier": tier.name, "tier_config": tier.model_dump(),
            "workload": workload.spec, "workload_digest": workload.digest(),
            "options": {k: v for k, v in vars(options).items() if k != "python"}}


def run_tier(tier: TierConfig, workload: Workload, run_dir: str | Path,
             options: LiveOptions | None = None) -> ClientStats:
    """Deploy `tier`, replay `workload` against it, and write the run folder."""
    options = options or LiveOptions()
    run_dir = Path(run_dir)
    with RunWriter(run_dir, _meta(tier, workload, options)) as writer:
        with VllmServer(tier, run_dir, python=options.python) as server:
            writer.meta["startup_s"] = server.wait_healthy()
            config = ClientConfig(
                base_url=server.base_url, model=tier.served_model_name or tier.model,
                tier=tier.name, request_timeout_s=options.request_timeout_s,
                duration_s=options.duration_s, warmup_s=options.warmup_s,
                drain_timeout_s=options.drain_timeout_s, extra_body=options.extra_body or None,
                max_in_flight=options.max_in_flight)
            stats = asyncio.run(_drive(server, workload, writer, config,
                                       options.sample_interval_s))
        writer.meta["client"] = stats.as_dict()
    return stats


def run_campaign(tiers: list[TierConfig], workload: Workload, out_dir: str | Path,
                 options: LiveOptions | None = None) -> dict[str, ClientStats | Exception]:
    """Run each tier in turn (fresh server, empty cache), one folder per tier.

    A tier that fails is reported and the campaign goes on; the result maps tier names to
    their stats or their error.
    """
    results: dict[str, ClientStats | Exception] = {}
    for tier in tiers:
        try:
            results[tier.name] = run_tier(tier, workload, Path(out_dir) / tier.name, options)
        except (ServerError, OSError) as err:
            results[tier.name] = err
    return results
