"""The simulated engine: a heapq event loop around the scheduler, and `simulate`.

Events (`events`): turn arrivals, step ends, asynchronous load completions and samples. The
engine runs one step at a time: when a step ends, it applies it, issues the next turns of
sessions whose request finished (closed loop: finish + pause, or the turn's not_before_s,
whichever is later, as the live client does), and plans the next step right away; with
nothing to run it idles until an arrival or a load completion. Steps that only decode run
in batches (`kvrepro.engines.sim.decode_run`): the same results, fewer events.

Ending a run: no turn is sent at or after `duration_s`; requests already sent run to the end
unless `hard_end_s` stops the clock first. Every request that arrived is then either in the
records (finished, or failed because it exceeds max_model_len) or counted in the stats as
still running, waiting or loading at the end: stats["arrived"] == stats["finished"] +
stats["failed"] + stats["unfinished"].

The loop runs a list of servers (`schedulers`, one plan each) on one clock: one here, N in a
fleet (`kvrepro.engines.sim.fleet.FleetEngine`, which overrides the hooks `_make_schedulers`,
`_route`, `_record`, `_sample_rows` and `stats`). Events of a server carry its `instance`.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from kvrepro.engines.sim.config import ServerProfile, SimProfile, SimTier, as_profile
from kvrepro.engines.sim.decode_run import DecodeRun
from kvrepro.engines.sim.entities import Request, TurnTable
from kvrepro.engines.sim.events import (
    EventQueue,
    LoadDone,
    LookupDone,
    Sample,
    StepEnd,
    TurnArrival,
)
from kvrepro.engines.sim.host_cpu import HostCpu
from kvrepro.engines.sim.outputs import OutputSink, sample_row
from kvrepro.engines.sim.prefix_units import BlockIdentity, unit_ranges
from kvrepro.engines.sim.scheduler import Scheduler, StepPlan
from kvrepro.engines.sim.steptime import StepTimer
from kvrepro.tier_spec import Placement, ServerSpec
from kvrepro.workload.base import Workload

ENGINE = "sim"
UNFINISHED_KEYS = ("running_at_end", "waiting_at_end", "loading_at_end", "unfinished")
"""Stats of the requests still in a server at the end (their sum: `unfinished`)."""


@dataclass
class SimResult:
    """Records (one row per finished request, as `read_run` returns them), server samples,
    and run statistics."""

    records: pd.DataFrame
    samples: pd.DataFrame
    stats: dict[str, Any]


class Engine:
    """One simulated server running one workload on one tier."""

    def __init__(self, workload: Workload, profile: SimProfile, tier: SimTier,
                 duration_s: float, warmup_s: float, hard_end_s: float,
                 sink: OutputSink, max_in_flight: int | None = None):
        server = profile.server_for(tier.name)
        self.table = TurnTable.from_workload(workload)
        self.identity = BlockIdentity(workload)
        self.schedulers = self._make_schedulers(server, tier)
        self.plans: list[StepPlan | None] = [None] * len(self.schedulers)
        # a server's run of decode steps suspended with a step in progress (its end queued)
        self.runs: list[DecodeRun | None] = [None] * len(self.schedulers)
        self.step_end_s = [0.0] * len(self.schedulers)  # each server's step in flight's end
        self.tier_name, self.sink = tier.name, sink
        self.block_tokens, self.max_model_len = server.block_tokens, server.max_model_len
        self.store_names = [store.name for store in tier.stores]
        self.loaded_keys = [f"loaded_tokens_{name}" for name in self.store_names]
        self.duration_s, self.warmup_s, self.hard_end_s = duration_s, warmup_s, hard_end_s
        self.sample_interval_s = profile.sample_interval_s
        self.server = server  # its front end: what the client sees on top (`_front_end`)
        # the load client's concurrency limit: turns due while it is reached wait, unsent
        self.max_in_flight, self.in_flight = max_in_flight, 0
        self.backlog: deque[TurnArrival] = deque()
        self.queue = EventQueue()
        self.now_s = 0.0
        self.counts = {"arrived": 0, "finished": 0, "failed": 0, "turns_not_sent": 0}
        self._next_rid = 0
        self.host = self._make_host(profile, tier)
        self._host_seen: dict[tuple[int, str], float] = {}

    def _make_host(self, profile: SimProfile, tier: SimTier) -> HostCpu | None:
        """The host CPUs the processes share (None: not modelled): the spec's placement."""
        if profile.host_cpu is None:
            return None
        return HostCpu(profile.host_cpu, self._host_placements(profile),
                       forward_on_cpu=profile.forward_on_cpu, has_lmcache=bool(tier.stores),
                       **self._host_sharing())

    def _host_placements(self, profile: SimProfile) -> list[Placement]:
        """Each server's placement: the spec's (a fleet: `Placement.for_instance`)."""
        return [profile.placement]

    def _host_sharing(self) -> dict[str, bool]:
        """Whether the servers share one LMCache server, and whether a router runs."""
        return {"shared_lmcache": True, "router": False}

    def _make_schedulers(self, server: ServerProfile, tier: SimTier) -> list[Scheduler]:
        """The servers this engine runs: one."""
        return [Scheduler(server, tier, StepTimer(server))]

    @property
    def scheduler(self) -> Scheduler:
        """The first (for a single-server engine: the only) server."""
        return self.schedulers[0]

    # ------------------------------------------------------------------ the loop

    def run(self, progress: bool = True) -> None:
        """Process events until none are left or the hard end is reached."""
        for pos, row_list in enumerate(self.table.rows):
            send_s = self.table.send_s(row_list[0], None, self.table.arrival_s[pos])
            self._issue(pos, 0, send_s)
        self.queue.push(Sample(0.0))
        total = self.duration_s if math.isfinite(self.duration_s) else None
        with tqdm(total=total, unit="sim s", disable=not progress, leave=False,
                  desc=f"sim {self.tier_name}") as bar:
            self._loop(bar)
        if not self.sink.samples or self.sink.samples[-1]["time_s"] != self.now_s:
            for row in self._sample_rows():
                self.sink.add_sample(row)

    def _loop(self, bar: Any) -> None:
        queue, handlers = self.queue, {
            TurnArrival: self._arrive, StepEnd: self._step_end, LoadDone: self._load_done,
            LookupDone: self._lookup_done,
            Sample: self._take_sample}
        while queue:
            if queue.peek_time_s() > self.hard_end_s:
                self.now_s = self.hard_end_s
                break
            event = queue.pop()
            self.now_s = event.time_s
            handlers[type(event)](event)
            if type(event) is Sample:
                limit_s = self.now_s if bar.total is None else min(self.now_s, bar.total)
                bar.update(max(0.0, limit_s - bar.n))
        self._settle_all()

    def _issue(self, session_pos: int, turn_pos: int, send_s: float) -> None:
        """Queue a turn's arrival, or count the session's remaining turns as not sent."""
        rows = self.table.rows[session_pos]
        if send_s >= self.duration_s:
            self.counts["turns_not_sent"] += len(rows) - turn_pos
            return
        self.queue.push(TurnArrival(send_s, session_pos, turn_pos))

    def _wake(self, instance: int) -> None:
        if self.plans[instance] is None:
            self._start_step(instance)

    def _start_step(self, instance: int, run: DecodeRun | None = None) -> None:
        """Plan server `instance`'s next step and queue its end (with `run`: resume that
        suspended run, whose step in progress ends now). Decode steps whose ends would be the
        next events anyway run at once (`kvrepro.engines.sim.decode_run`), so the step
        queued is the first one something else may come before."""
        sched = self.schedulers[instance]
        resume = run is not None
        while True:
            if run is None:
                plan = self.plans[instance] = sched.schedule(self.now_s)
                for load in sched.take_new_loads():
                    self.queue.push(load)
                if plan is None:
                    return
                end_s: float | None = self.now_s + plan.duration_s
                if not plan.prefill_chunks and self._may_run(end_s):
                    run = sched.decode_run(plan, self.now_s, end_s)
            if run is not None:
                end_s = self._decode_run(instance, run, resume)
                run, resume = None, False
            if end_s is not None:
                break
            # the run ended a step and stopped before the next: plan that one step by step
        self.step_end_s[instance] = end_s
        self.queue.push(StepEnd(end_s, sched.counters.steps, instance))

    def _may_run(self, end_s: float) -> bool:
        """Whether to start a run of decode steps with a step ending at `end_s`: when that
        end is the next event (else the event before it would settle the run at once)."""
        limit_s, inclusive = self.queue.step_end_limit(self.hard_end_s)
        return end_s < limit_s or (end_s == limit_s and inclusive)

    def _decode_run(self, instance: int, run: DecodeRun, resume: bool) -> float | None:
        """Drive a run of decode steps: the requests it finishes are handled as at a step
        end. Returns the end of the step in progress when it is suspended (`self.runs`), or
        None when a step ended and the next must be planned step by step."""
        while True:
            outcome, finished = run.advance(*self.queue.step_end_limit(self.hard_end_s),
                                            resume)
            resume = False
            if outcome == "in_progress":
                self.now_s, self.plans[instance] = run.start_s, run.plan
                self.runs[instance] = run
                return run.end_s
            self.now_s, self.plans[instance] = run.end_s, None
            for req in finished:
                self._finished(req)
            if outcome == "replan":
                return None

    def _settle(self, instance: int) -> None:
        """Something is about to read or change server `instance`: a suspended run writes
        its state back first (`DecodeRun.settle`); its step in progress then ends as any."""
        run = self.runs[instance]
        if run is not None:
            self.runs[instance] = None
            run.settle()

    def _settle_all(self) -> None:
        for instance in range(len(self.runs)):
            self._settle(instance)

    # ------------------------------------------------------------------ handlers

    def _arrive(self, event: TurnArrival) -> None:
        if not event.reserved:
            if self.max_in_flight is not None and self.in_flight >= self.max_in_flight:
                self.backlog.append(event)  # sent when a request in flight finishes
                return
            self.in_flight += 1
        table, row = self.table, self.table.rows[event.session_pos][event.turn_pos]
        self.counts["arrived"] += 1
        prompt, output = table.prompt_tokens[row], max(1, table.output_tokens[row])
        req = self._request(event, row, prompt, output)
        instance = self._route(req)
        req.queued_s = self.now_s if self.plans[instance] is None else self.step_end_s[instance]
        if prompt + output > self.max_model_len:
            req.finish_s = self.now_s
            self.counts["failed"] += 1
            self.sink.add_record(self._record(req, error=(
                f"prompt_tokens + output_tokens = {prompt + output} exceeds max_model_len "
                f"{self.max_model_len}")))
            self.counts["turns_not_sent"] += len(table.rows[event.session_pos]) - \
                event.turn_pos - 1  # like the live client, an error ends the session
            self._release_slot()
            self._left(req)
            return
        if self.host is not None:
            self.host.work(instance, "requests", 1)
            req.front_stretch = self.host.stretch("api_server", instance)
        # a suspended run goes on: it tries a new head of the queue at its next step
        self.schedulers[instance].waiting.append(req)
        self._wake(instance)

    def _route(self, req: Request) -> int:
        """The server a new request goes to (the router's choice): here the only one."""
        return 0

    def _left(self, req: Request) -> None:
        """A request left its server (finished or failed): nothing to do here; a fleet's
        router counts the requests in flight per server."""

    def _release_slot(self) -> None:
        """A request left the server: send the longest-waiting turn, if the run is still on.

        The freed slot goes to that turn at once (`TurnArrival.reserved`): were it left free
        until the turn's arrival event, a turn becoming due at the same instant (the next
        turn of a session that finished in the same step) could take it first and push the
        waiting turn to the back of the backlog."""
        self.in_flight -= 1
        while self.backlog:
            waiting = self.backlog.popleft()
            if self.now_s < self.duration_s:
                self.in_flight += 1
                self.queue.push(TurnArrival(self.now_s, waiting.session_pos, waiting.turn_pos,
                                            reserved=True))
                return
            rows = self.table.rows[waiting.session_pos]
            self.counts["turns_not_sent"] += len(rows) - waiting.turn_pos

    def _request(self, event: TurnArrival, row: int, prompt: int, output: int) -> Request:
        segments = self.identity.segments(row)
        sched = self.scheduler
        req = Request(
            rid=self._next_rid, session_id=self.table.session_ids[event.session_pos],
            turn=self.table.turn[row], row=row, send_s=self.now_s, prompt_tokens=prompt,
            output_tokens=output, is_resume=self.table.is_resume[row], segments=segments,
            block_ranges=unit_ranges(segments, self.block_tokens),
            segment_numbers=[number for number, _ in segments],
            loaded_tokens=[0] * len(self.store_names))
        if sched.offload is not None:
            req.chunk_ranges = unit_ranges(segments, sched.chunk_tokens)
        req.session_pos, req.turn_pos = event.session_pos, event.turn_pos
        self._next_rid += 1
        return req

    def _step_end(self, event: StepEnd) -> None:
        instance = event.instance
        run = self.runs[instance]
        if run is not None:  # a suspended run's step: it goes on
            self.runs[instance] = None
            self._start_step(instance, run)
            return
        finished = self.schedulers[instance].complete(self.plans[instance], self.now_s)
        self.plans[instance] = None
        for req in finished:
            self._finished(req)
        self._start_step(instance)

    def _finished(self, req: Request) -> None:
        """A request finished now: counted, its client slot freed, recorded, and its
        session's next turn issued."""
        self.counts["finished"] += 1
        self._release_slot()
        self.sink.add_record(self._record(req))
        self._left(req)
        rows = self.table.rows[req.session_pos]
        nxt = req.turn_pos + 1
        if nxt < len(rows):
            send_s = self.table.send_s(rows[nxt], self.now_s + self._front_end(req), 0.0)
            self._issue(req.session_pos, nxt, send_s)

    def _load_done(self, event: LoadDone) -> None:
        self._settle(event.instance)
        self.schedulers[event.instance].on_load_done(event.request)
        self._wake(event.instance)

    def _lookup_done(self, event: LookupDone) -> None:
        self._settle(event.instance)
        self._wake(event.instance)

    def _take_sample(self, event: Sample) -> None:
        for run in self.runs:  # a sample reads the counters; the runs go on
            if run is not None:
                run.flush_counters()
        self._roll_host()
        for row in self._sample_rows():
            self.sink.add_sample(row)
        if self.queue or any(plan is not None for plan in self.plans):
            self.queue.push(Sample(self.now_s + self.sample_interval_s))
            return
        for instance, sched in enumerate(self.schedulers):
            if not sched.has_work():
                continue
            raise RuntimeError(
                f"simulation stalled at {self.now_s:.3f} s on server {instance}: "
                f"{len(sched.waiting)} waiting, "
                f"{len(sched.ready)} loaded, no step can run and no event is due "
                f"(GPU blocks used {sched.gpu.used_blocks} of {sched.gpu.capacity_blocks}, "
                f"{sched.gpu.evictable_blocks} evictable)")

    # ------------------------------------------------------------------ outputs

    def _sample_rows(self) -> list[dict[str, Any]]:
        """The server samples taken now: one row (a fleet: one per server)."""
        return [sample_row(self.now_s, self.scheduler)]

    def _roll_host(self) -> None:
        """At a sample: the work each server did since the last one, to the host's
        processes; then every server's stretches for the next interval (`host_cpu`)."""
        host = self.host
        if host is None:
            return
        pools: set[int] = set()
        for i, sched in enumerate(self.schedulers):
            c, off = sched.counters, sched.offload
            work = {"prompt_tokens": c.prompt_tokens, "output_tokens": c.generation_tokens,
                    "lookup_tokens": c.lmcache_lookup_tokens}
            if off is not None and id(off) not in pools:
                pools.add(id(off))
                work["chunks_moved"] = off.l1_read_chunks() + off.l1_write_chunks()
            for unit, total in work.items():
                host.work(i, unit, total - self._host_seen.get((i, unit), 0.0))
                self._host_seen[i, unit] = total
            spent = {"host": c.host_part_cpu_s, "forward": c.forward_cpu_s}
            host.steps(i, *(total - self._host_seen.get((i, part), 0.0)
                            for part, total in spent.items()))
            self._host_seen.update({(i, part): total for part, total in spent.items()})
        host.roll(self.now_s)
        for i, sched in enumerate(self.schedulers):
            forward = host.stretch("worker", i) if host.forward_on_cpu else 1.0
            stretches = (forward, host.host_stretch(i), host.handoff_s(i))
            if stretches != sched.timer.stretches():
                self._settle(i)  # the steps planned from now on take the new stretches
                sched.timer.set_stretch(*stretches)
            sched.lookup_stretch = host.stretch("lmcache_server", i)

    def _front_end(self, req: Request) -> float:
        return self.server.front_end_s(req.prompt_tokens, req.front_stretch)

    def _record(self, req: Request, error: str = "") -> dict[str, Any]:
        cached = max(req.cached_prompt_tokens, 0)
        front_end_s = self._front_end(req)
        record = {
            "session_id": req.session_id, "turn": req.turn, "tier": self.tier_name,
            "engine": ENGINE, "send_s": req.send_s,
            "first_token_s": req.first_token_s + front_end_s,
            "finish_s": req.finish_s + front_end_s, "prompt_tokens": req.prompt_tokens,
            "cached_prompt_tokens": float(cached) if not error else math.nan,
            "output_tokens": req.generated_tokens, "is_resume": req.is_resume,
            "is_warmup": req.send_s < self.warmup_s, "error": error,
            "gpu_hit_tokens": req.gpu_hit_tokens}
        for key, tokens in zip(self.loaded_keys, req.loaded_tokens, strict=True):
            record[key] = tokens
        record.update(recomputed_tokens=req.recomputed_tokens, load_s=req.load_s,
                      queue_s=req.admitted_s - req.send_s,
                      engine_queue_s=(req.admitted_s - req.queued_s
                                      + self.server.engine_intake_s), preemptions=req.preemptions,
                      front_stretch=req.front_stretch, lookup_stretch=req.lookup_stretch,
                      host_stretch=req.host_stretch)
        return record

    def stats(self) -> dict[str, Any]:
        """Counts that account for every request, plus cache and tier totals."""
        server = self.server_stats(self.scheduler)
        unfinished = {key: server.pop(key) for key in UNFINISHED_KEYS}
        return {**self.counts, **unfinished, "end_s": self.now_s,
                "client_waiting_at_end": len(self.backlog), **server, **self.host_stats()}

    def host_stats(self) -> dict[str, Any]:
        """The CPU seconds each role's processes spent (all servers' together) over the
        host model's closed intervals, and how long those were (none without the model)."""
        return {} if self.host is None else {"host_cpu_s": {
            role: round(cpu_s, 6) for role, cpu_s in self.host.spent_s.items()},
            "host_cpu_window_s": self.host.last_s}

    def server_stats(self, sched: Scheduler) -> dict[str, Any]:
        """One server's unfinished requests, GPU cache, counters and store totals."""
        unfinished = {"running_at_end": len(sched.running),
                      "waiting_at_end": len(sched.waiting) + len(sched.ready),
                      "loading_at_end": sched.loading}
        out: dict[str, Any] = {**unfinished, "unfinished": sum(unfinished.values()),
                               "gpu_capacity_blocks": sched.gpu.capacity_blocks,
                               "gpu_evicted_blocks": sched.gpu.evicted_blocks}
        out.update({k: getattr(sched.counters, k) for k in sched.counters.__slots__})
        for key in ("forward_cpu_s", "host_part_cpu_s"):  # sums in step or run order
            out[key] = round(out[key], 6)
        if sched.offload is not None:
            for store in sched.offload.stores:
                out[f"{store.name}_first_eviction_s"] = store.first_eviction_s
                out[f"{store.name}_first_refusal_s"] = store.first_refusal_s
                out[f"{store.name}_evicted_chunks"] = store.evicted_chunks
                out[f"{store.name}_rejected_chunks"] = store.rejected_chunks
        return out


def default_duration_s(workload: Workload, duration_s: float | None) -> float:
    if duration_s is not None:
        return float(duration_s)
    value = (workload.spec.get("params") or {}).get("duration_s")
    return float(value) if value is not None else math.inf


def simulate(workload: Workload, profile: SimProfile | ServerSpec | str | Path, tier_name: str,
             duration_s: float | None = None, warmup_s: float = 0.0,
             run_dir: str | Path | None = None, *, hard_end_s: float | None = None,
             max_in_flight: int | None = None, progress: bool = True) -> SimResult:
    """Simulate `workload` on tier `tier_name` of `profile` (a SimProfile, a server spec or
    its YAML path).

    `duration_s`: no turn is sent at or after it (None: the workload spec's `duration_s`
    when it has one, else no limit). `hard_end_s`: the clock stops there and requests still
    in the server are counted, not recorded (None: run until every sent request finished).
    `max_in_flight`: the load client's concurrency limit (None: none, each session has at
    most one request in flight); a turn due while it is reached waits in the client and its
    `send_s`, hence its TTFT, starts when it is actually sent.
    `warmup_s` flags records sent earlier (`is_warmup`). With `run_dir`, the run folder
    (records.jsonl, samples.jsonl, meta.json) is written as a live run's would be.
    """
    profile = as_profile(profile)
    tier = profile.tier(tier_name)
    duration = default_duration_s(workload, duration_s)
    hard_end = math.inf if hard_end_s is None else float(hard_end_s)
    meta = {"engine": ENGINE, "tier": tier_name, "tier_config": tier.meta_record(),
            "profile": profile.meta_record(), "workload": workload.spec,
            "workload_digest": workload.digest(),
            "options": {"duration_s": duration, "warmup_s": warmup_s, "hard_end_s": hard_end,
                        "max_in_flight": max_in_flight}}
    started = time.perf_counter()
    with OutputSink(run_dir, meta) as sink:
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1 or None, got {max_in_flight}")
        engine = Engine(workload, profile, tier, duration, warmup_s, hard_end, sink,
                        max_in_flight)
        engine.run(progress)
        stats = {**engine.stats(), "wall_s": time.perf_counter() - started}
        sink.finish(stats)
    return SimResult(sink.records_frame(), sink.samples_frame(), stats)


__all__ = ["ENGINE", "Engine", "SimResult", "default_duration_s", "simulate"]
