"""A fleet on the twin: N simulated servers of one tier behind a router, on one clock.

`simulate_fleet(workload, fleet)` runs the `FleetSpec` (`kvrepro.fleet_spec`): N copies of
the server `fleet.server_spec()` serving tier `fleet.tier`, and one load client whose turns a
router spreads over them. As Vidur simulates a cluster, every server is a scheduler of its
own (`scheduler.Scheduler`: queues, GPU prefix cache, step plan) and all of them share ONE
event queue and clock (`engine.Engine`'s loop, events ordered by (time, kind, seq)); a step
end, load or lookup event carries its server's `instance`. With N = 1 the fleet is
`engine.simulate` (same events in the same order: the same records).

Where KV lives:

* the GPU prefix cache is per server, always;
* `kv_pool: private`: each server has its own offload stores (`offload.OffloadHierarchy`),
  as a single server does, except a store whose kind is `shared` (a shared filesystem,
  `kvrepro.stores.shared_fs`): that one is ONE store object in every server's hierarchy (the
  same files on one share), read and written by each server through its own channels;
* `kv_pool: shared`: ONE set of store objects that every server reads and writes (one LMCache
  server for all, live). Its capacity is the tier's x `shared_pool.capacity_scale` (a shared
  store's: its own, it is already the whole share's); its read
  and write channels run at the pool's bandwidth where given (else the stores' own) and are
  shared, so transfers of different servers queue behind each other (contention); and
  `shared_pool.network_latency_s` is added to every load and store transfer. A chunk
  computed on one server is then found by the others: a turn routed to another instance
  than its session's previous turn (`routed_away`) can still load its context.

The router assigns each turn when it is sent (the client's arrival), by `fleet.routing`:

* `round_robin`: the i-th turn sent goes to instance i mod N;
* `session_affinity`: vllm-router's `consistent_hash` ring of the fleet's worker URLs
  (`consistent_hash.HashRing`, `FleetSpec.worker_urls`), keyed by the session id the live
  client sends: each session lands on the instance it lands on live;
* `prefix_aware`: vllm-router's `cache_aware` (`PrefixAwareRouter`).

Records are `engine.simulate`'s plus `instance` (int) and `routed_away` (bool: the turn went
to another instance than its session's previous turn; False for a first turn); samples are
one row per server per sample time with `instance` (with a shared pool every row reports the
pool's store columns: the same numbers). `fleet_headlines(result)` reduces a run to the
numbers a sweep tabulates.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvrepro.analysis.runs import fleet_turn_stats, share, window_throughput_tok_s
from kvrepro.calc import endurance
from kvrepro.engines.sim.config import ServerProfile, SimProfile, SimTier, sim_profile
from kvrepro.engines.sim.consistent_hash import HashRing, session_key
from kvrepro.engines.sim.engine import UNFINISHED_KEYS, Engine, default_duration_s
from kvrepro.engines.sim.entities import Request
from kvrepro.engines.sim.offload import ChunkStore, OffloadHierarchy
from kvrepro.engines.sim.outputs import OutputSink, sample_row
from kvrepro.engines.sim.prefix_units import Segments
from kvrepro.engines.sim.scheduler import Scheduler
from kvrepro.engines.sim.steptime import StepTimer
from kvrepro.fleet_spec import FleetSpec, PrefixAware, SharedPool, load_fleet, shipped_fleet
from kvrepro.tier_spec import Placement, is_shipped_name, override_server
from kvrepro.workload.base import Workload

# ---------------------------------------------------------------------- routers

class Router:
    """Picks the instance of each request sent and counts requests in flight per instance
    (vllm-router's worker load: routed, not yet answered)."""

    def __init__(self, n_servers: int):
        self.n_servers = n_servers
        self.load = [0] * n_servers
        self.decisions: dict[str, int] = {}

    def choose(self, req: Request) -> int:
        """The instance for `req` (policies override this)."""
        raise NotImplementedError

    def route(self, req: Request) -> int:
        """Choose an instance for `req` and count it in flight there."""
        instance = self.choose(req)
        self.load[instance] += 1
        return instance

    def left(self, instance: int) -> None:
        """A request routed to `instance` was answered (finished or failed)."""
        self.load[instance] -= 1

    def least_loaded(self) -> int:
        """The instance with the fewest requests in flight (the first on ties, as
        vllm-router's `min_by_key`)."""
        load = self.load
        return load.index(min(load))

    def _decided(self, decision: str) -> None:
        self.decisions[decision] = self.decisions.get(decision, 0) + 1


class RoundRobinRouter(Router):
    """Turn i (in the order they are sent) goes to instance i mod N."""

    def __init__(self, n_servers: int):
        super().__init__(n_servers)
        self.sent = 0

    def choose(self, req: Request) -> int:
        instance = self.sent % self.n_servers
        self.sent += 1
        return instance


class SessionAffinityRouter(Router):
    """Every turn of a session goes to the instance vllm-router's ring gives its session
    (`consistent_hash`), looked up once per session."""

    def __init__(self, worker_urls: list[str]):
        super().__init__(len(worker_urls))
        self.ring = HashRing(worker_urls)
        self.sessions: dict[int, int] = {}

    def choose(self, req: Request) -> int:
        instance = self.sessions.get(req.session_id)
        if instance is None:
            instance = self.sessions[req.session_id] = self.ring.instance(
                session_key(req.session_id))
        return instance


class PrefixTree:
    """The router's approximate tree of what it sent to one instance, in tokens.

    vllm-router keeps a radix tree of the request texts it routed to each worker. Here a
    prompt is its segments (`prefix_units`: token ranges whose names fix the whole prefix
    before them, so equal names mean equal token prefixes) and the tree maps each segment to
    the furthest token of it routed here: a prefix match walks the prompt's segments while
    they are held in full. Least recently used segments are dropped beyond `max_tokens`."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self.held: OrderedDict[int, tuple[int, int]] = OrderedDict()  # seg -> (start, end)
        self.tokens = 0

    def match_tokens(self, segments: Segments, prompt_tokens: int) -> int:
        """Length of the prompt's prefix held here, tokens."""
        matched = 0
        for start, end, number in _spans(segments, prompt_tokens):
            span = self.held.get(number)
            if span is None:
                return matched
            matched = min(end, span[1])
            if matched < end:
                return max(matched, start)
        return matched

    def insert(self, segments: Segments, prompt_tokens: int) -> None:
        """Record a prompt routed here (its segments become the most recently used)."""
        held = self.held
        for start, end, number in _spans(segments, prompt_tokens):
            old_end = held[number][1] if number in held else start
            if end > old_end:
                self.tokens += end - old_end
            held[number] = (start, max(end, old_end))
            held.move_to_end(number)
        keep = len(segments)
        while self.tokens > self.max_tokens and len(held) > keep:
            _, (start, end) = held.popitem(last=False)
            self.tokens -= end - start


def _spans(segments: Segments, prompt_tokens: int) -> list[tuple[int, int, int]]:
    """(first token, end token, segment number) of each non-empty segment of a prompt."""
    out = []
    for k, (number, start) in enumerate(segments):
        end = segments[k + 1][1] if k + 1 < len(segments) else prompt_tokens
        end = min(end, prompt_tokens)
        if end > start:
            out.append((start, end, number))
    return out


class PrefixAwareRouter(Router):
    """vllm-router's `cache_aware` policy (src/policies/cache_aware.rs), as the twin runs it.

    Modelled as there: (1) the load of an instance is its requests in flight; the load is
    *imbalanced* when max - min > `balance_abs_threshold` and max > min x
    `balance_rel_threshold`, and then the least-loaded instance gets the request; (2) else
    the instance whose tree holds the longest prefix of the prompt gets it when matched /
    prompt length > `cache_threshold`, and the least-loaded one otherwise; (3) the chosen
    instance's tree learns the prompt in every case.

    Simplified: the tree holds tokens, not characters (vllm-router matches the request text
    character by character; the ratio is the same up to token lengths); it is one tree per
    instance instead of one multi-tenant tree, and ties between instances with equally long
    matches go to the least loaded, then the lowest index (vllm-router takes the tenant
    its tree returns first); its periodic eviction (every `--eviction-interval-secs`, to a
    character budget) is LRU by segment on insert, to `max_tree_tokens`; the session-id
    map of its chat path is not modelled (the load client sends completions)."""

    def __init__(self, n_servers: int, settings: PrefixAware):
        super().__init__(n_servers)
        self.settings = settings
        self.trees = [PrefixTree(settings.max_tree_tokens) for _ in range(n_servers)]

    def imbalanced(self) -> bool:
        """vllm-router's test: both thresholds exceeded."""
        high, low = max(self.load), min(self.load)
        return (high - low > self.settings.balance_abs_threshold
                and high > low * self.settings.balance_rel_threshold)

    def choose(self, req: Request) -> int:
        segments, prompt = req.segments, req.prompt_tokens
        if self.imbalanced():
            instance, decision = self.least_loaded(), "load_balance"
        else:
            matched = [tree.match_tokens(segments, prompt) for tree in self.trees]
            best = max(range(self.n_servers), key=lambda i: (matched[i], -self.load[i], -i))
            if prompt and matched[best] / prompt > self.settings.cache_threshold:
                instance, decision = best, "cache_affinity"
            else:
                instance, decision = self.least_loaded(), "low_match_min_load"
        self.trees[instance].insert(segments, prompt)
        self._decided(decision)
        return instance


def make_router(fleet: FleetSpec) -> Router:
    """The router of `fleet.routing`."""
    if fleet.routing == "round_robin":
        return RoundRobinRouter(fleet.n_servers)
    if fleet.routing == "session_affinity":
        return SessionAffinityRouter(fleet.worker_urls())
    return PrefixAwareRouter(fleet.n_servers, fleet.prefix_aware)


# ---------------------------------------------------------------------- the shared pool

def pool_tier(tier: SimTier, pool: SharedPool) -> SimTier:
    """The tier's stores as one shared pool: capacity x `capacity_scale` (a `shared` store
    keeps its own: it is the whole share's already), and the pool's read / write bandwidth
    where given (for every store of the pool: all of its traffic crosses the pool's
    channels)."""
    stores = []
    for store in tier.stores:
        scale = 1.0 if store.shared else pool.capacity_scale
        update: dict[str, float] = {"capacity_bytes": store.capacity_bytes * scale}
        if pool.read_bw_bytes_s is not None:
            update["read_bw_bytes_s"] = pool.read_bw_bytes_s
        if pool.write_bw_bytes_s is not None:
            update["write_bw_bytes_s"] = pool.write_bw_bytes_s
        stores.append(store.model_copy(update=update))
    return tier.model_copy(update={"stores": stores})


# ---------------------------------------------------------------------- the engine

class FleetEngine(Engine):
    """N servers of one tier behind a router, on one event loop (see the module doc)."""

    def __init__(self, workload: Workload, profile: SimProfile, fleet: FleetSpec,
                 duration_s: float, warmup_s: float, hard_end_s: float, sink: OutputSink,
                 max_in_flight: int | None = None):
        self.fleet = fleet
        self.router = make_router(fleet)
        self.placed: dict[int, tuple[int, bool]] = {}  # rid -> (instance, routed away)
        self.last_instance: dict[int, int] = {}  # session position -> its last instance
        self.pool: OffloadHierarchy | None = None
        self.shared_names: list[str] = []  # stores one object for all servers (kind `shared`)
        super().__init__(workload, profile, profile.tier(fleet.tier), duration_s, warmup_s,
                         hard_end_s, sink, max_in_flight)

    def _make_schedulers(self, server: ServerProfile, tier: SimTier) -> list[Scheduler]:
        kv_bytes = server.model_spec().kv_bytes_per_token
        if self.fleet.kv_pool == "shared" and tier.stores:
            pool = self.fleet.shared_pool
            self.pool = OffloadHierarchy(pool_tier(tier, pool), kv_bytes,
                                         pool.network_latency_s)
            self.shared_names = [s.name for s in tier.stores]
        shared = {s.name: ChunkStore(s, kv_bytes) for s in tier.stores if s.shared}
        if self.pool is not None or not shared:
            return [Scheduler(server, tier, StepTimer(server), offload=self.pool, instance=i)
                    for i in range(self.fleet.n_servers)]
        self.shared_names = list(shared)
        return [Scheduler(server, tier, StepTimer(server), instance=i,
                          offload=OffloadHierarchy(tier, kv_bytes, shared_stores=shared))
                for i in range(self.fleet.n_servers)]

    def _host_placements(self, profile: SimProfile) -> list[Placement]:
        """Each instance's CPUs as the live fleet pins them (`Placement.for_instance` on the
        host's CPUs) when the server's placement is pinned; unpinned otherwise."""
        n, host = self.fleet.n_servers, profile.host_cpu
        if profile.placement.engine_cpus is None or host is None:
            return [Placement()] * n
        return [Placement.for_instance(i, host.cpus) for i in range(n)]

    def _host_sharing(self) -> dict[str, bool]:
        return {"shared_lmcache": self.fleet.kv_pool == "shared", "router": True}

    def _may_run(self, end_s: float) -> bool:
        """Always: the next event is mostly another server's step end, which leaves this
        server's run suspended, not settled (`Engine._settle`)."""
        return True

    def _route(self, req: Request) -> int:
        instance = self.router.route(req)
        previous = self.last_instance.get(req.session_pos)
        self.placed[req.rid] = (instance, previous is not None and previous != instance)
        self.last_instance[req.session_pos] = instance
        return instance

    def _left(self, req: Request) -> None:
        instance, _ = self.placed.pop(req.rid)
        self.router.left(instance)

    def _record(self, req: Request, error: str = "") -> dict[str, Any]:
        record = super()._record(req, error)
        record["instance"], record["routed_away"] = self.placed[req.rid]
        return record

    def _sample_rows(self) -> list[dict[str, Any]]:
        now_s = self.now_s
        return [{"time_s": now_s, "instance": i, **sample_row(now_s, sched)}
                for i, sched in enumerate(self.schedulers)]

    def stats(self) -> dict[str, Any]:
        """The fleet's counts (every request accounted for, as a single server's), the
        servers' counters summed, store totals (the pool's, or the private stores' summed),
        the router's decisions and each server's own stats (`instances`). A store that is one
        object for every server (the pool's, or a shared store of private pools) is
        reported once."""
        per = [self.server_stats(sched) for sched in self.schedulers]
        out: dict[str, Any] = {**self.counts}
        out.update({key: sum(p[key] for p in per) for key in UNFINISHED_KEYS})
        out.update(end_s=self.now_s, client_waiting_at_end=len(self.backlog),
                   n_servers=self.fleet.n_servers, routing=self.fleet.routing,
                   kv_pool=self.fleet.kv_pool, **self.host_stats())
        shared = tuple(f"{name}_" for name in self.shared_names)
        for key, value in per[0].items():
            if key in UNFINISHED_KEYS:
                continue
            if shared and key.startswith(shared):
                out[key] = value  # one store for all: every server reports it
            elif key.endswith(("_first_eviction_s", "_first_refusal_s")):
                out[key] = _earliest_s([p[key] for p in per])
            else:
                out[key] = sum(p[key] for p in per)
        out["router_decisions"] = dict(self.router.decisions)
        out["instances"] = per
        return out


def _earliest_s(times_s: list[float]) -> float:
    """The first of some event times (NaN: never happened)."""
    happened = [t for t in times_s if t == t]
    return min(happened) if happened else math.nan


@dataclass
class FleetResult:
    """A fleet run: records (+ `instance`, `routed_away`), samples (+ `instance`), stats, and
    what `fleet_headlines` needs to read them."""

    records: pd.DataFrame
    samples: pd.DataFrame
    stats: dict[str, Any]
    fleet: FleetSpec
    store_names: list[str] = field(default_factory=list)
    warmup_s: float = 0.0
    duration_s: float = math.inf
    shared_names: list[str] = field(default_factory=list)
    """Stores that are one object for every server (the shared pool's, or a shared store of
    private pools): their samples are the same in every server's rows."""


def _as_fleet(fleet: FleetSpec | str | Path) -> FleetSpec:
    if isinstance(fleet, FleetSpec):
        return fleet
    text = str(fleet)
    if is_shipped_name(text):
        return shipped_fleet(text)
    return load_fleet(text)


def _default_warmup_s(workload: Workload, warmup_s: float | None) -> float:
    if warmup_s is not None:
        return float(warmup_s)
    return float((workload.spec.get("params") or {}).get("warmup_s") or 0.0)


def simulate_fleet(workload: Workload, fleet: FleetSpec | str | Path, *,
                   duration_s: float | None = None, warmup_s: float | None = None,
                   hard_end_s: float | None = None, max_in_flight: int | None = None,
                   progress: bool = False,
                   profile_overrides: dict[str, Any] | None = None) -> FleetResult:
    """Simulate `workload` on `fleet` (a FleetSpec, a shipped fleet's name or a YAML path).

    `duration_s`, `hard_end_s`, `max_in_flight`: as `engine.simulate` (the client's limit is
    the fleet's: one load client in front of the router). `warmup_s` flags records sent
    earlier (None: the workload spec's `warmup_s`, else 0). `profile_overrides`: what-if
    overrides of the server spec (`kvrepro.tier_spec.override_server`, e.g. {"dram_gb":
    1024}) applied to every server. Deterministic: no seed, the same inputs give the same
    records.
    """
    fleet = _as_fleet(fleet)
    spec = fleet.server_spec()
    if profile_overrides:
        spec = override_server(spec, profile_overrides)
    profile = sim_profile(spec)
    duration = default_duration_s(workload, duration_s)
    warmup = _default_warmup_s(workload, warmup_s)
    hard_end = math.inf if hard_end_s is None else float(hard_end_s)
    if max_in_flight is not None and max_in_flight < 1:
        raise ValueError(f"max_in_flight must be >= 1 or None, got {max_in_flight}")
    started = time.perf_counter()
    sink = OutputSink(None, {})
    engine = FleetEngine(workload, profile, fleet, duration, warmup, hard_end, sink,
                         max_in_flight)
    engine.run(progress)
    records = sink.records_frame()
    stats = {**engine.stats(), "routed_away_turns": int(records.routed_away.sum()),
             "wall_s": time.perf_counter() - started}
    return FleetResult(records, sink.samples_frame(), stats, fleet, list(engine.store_names),
                       warmup, duration, list(engine.shared_names))


# ---------------------------------------------------------------------- headlines

def measurement_window_s(result: FleetResult) -> tuple[float, float]:
    """The run's measurement window: [warmup, duration] (no duration: the last finish)."""
    end_s = result.duration_s
    if not math.isfinite(end_s):
        end_s = float(result.records.finish_s.max()) if len(result.records) else 0.0
    if end_s <= result.warmup_s:
        raise ValueError(f"fleet_headlines: the window [{result.warmup_s}, {end_s}] s is "
                         "empty (warmup_s >= duration_s)")
    return result.warmup_s, end_s


_TRAFFIC = ("bytes_written", "bytes_read", "writes_dropped")
"""Store columns each server's hierarchy counts itself: a shared store of private pools
(its own channels per server) sums them; its other columns are the one store's."""


def _fleet_store_series(result: FleetResult, store: str, column: str) -> pd.Series:
    """Column `<store>_<column>` over time for the whole fleet: the pool's (shared), a
    shared store's (one object; its traffic summed over the servers that made it), or the
    private stores' summed."""
    samples, name = result.samples, f"{store}_{column}"
    if result.fleet.kv_pool == "shared" or (store in result.shared_names
                                            and column not in _TRAFFIC):
        return samples[samples.instance == 0].set_index("time_s")[name]
    return samples.groupby("time_s")[name].sum()


def _store_headlines(result: FleetResult, t0_s: float, t1_s: float) -> dict[str, float]:
    out: dict[str, float] = {}
    for store in result.store_names:
        written = _fleet_store_series(result, store, "bytes_written")
        used = _fleet_store_series(result, store, "bytes_used")
        times = written.index.to_numpy(dtype=float)
        w0, w1 = np.interp([t0_s, t1_s], times, written.to_numpy(dtype=float))
        out[f"{store}_bytes_written_per_day"] = float((w1 - w0) / (t1_s - t0_s)
                                                      * endurance.SECONDS_PER_DAY)
        out[f"{store}_peak_bytes_used"] = float(used.max())
        out[f"{store}_capacity_bytes"] = float(
            _fleet_store_series(result, store, "capacity_bytes").iloc[-1])
    return out


def fleet_headlines(result: FleetResult) -> dict[str, float]:
    """The run's headline numbers, over the measurement window [warmup_s, duration_s]
    (`measurement_window_s`; TTFT and shares by `kvrepro.analysis.runs.fleet_turn_stats`,
    the recipe a live fleet's summary uses too).

    Throughput (`throughput_tok_s`, and per server: mean, min, max) counts the tokens every
    request delivered in the window (`kvrepro.analysis` rule). TTFT and cached shares are
    over the requests sent in the window that succeeded: `cached_share` = cached / prompt
    tokens, split by source (`cached_share_gpu`, `cached_share_<store>`);
    `cross_instance_hit_share` = tokens of routed-away turns loaded from an offload store /
    their prompt tokens (NaN when no turn was routed away); `routed_away_share` = routed-away
    turns / turns. Stores (fleet totals: the pool, or the private stores summed):
    `<store>_bytes_written_per_day` in the window, `<store>_peak_bytes_used`,
    `<store>_capacity_bytes`.
    """
    t0_s, t1_s = measurement_window_s(result)
    rec = result.records
    ok = rec[(rec.error == "") & rec.first_token_s.notna()]
    total = window_throughput_tok_s(ok, t0_s, t1_s)
    per_server = [window_throughput_tok_s(ok[ok.instance == i], t0_s, t1_s)
                  for i in range(result.fleet.n_servers)]
    sent = ok[(ok.send_s >= t0_s) & (ok.send_s < t1_s)]
    prompt = float(sent.prompt_tokens.sum())
    loaded = [f"loaded_tokens_{s}" for s in result.store_names]
    turns = fleet_turn_stats(sent, hit_columns=loaded)
    out = {"n_servers": float(result.fleet.n_servers), "requests": float(len(sent)),
           "failed_requests": float((rec.error != "").sum()),
           "throughput_tok_s": total,
           "throughput_per_server_tok_s": total / result.fleet.n_servers,
           "throughput_min_server_tok_s": min(per_server),
           "throughput_max_server_tok_s": max(per_server),
           "ttft_median_s": turns["ttft_median_s"], "ttft_p90_s": turns["ttft_p90_s"],
           "cached_share": turns["cached_share"],
           "cached_share_gpu": share(sent.gpu_hit_tokens.sum(), prompt)}
    for store, column in zip(result.store_names, loaded, strict=True):
        out[f"cached_share_{store}"] = share(sent[column].sum(), prompt)
    out["routed_away_share"] = share(turns["routed_away_turns"], len(sent))
    out["cross_instance_hit_share"] = turns["cross_instance_hit_share"]
    out.update(_store_headlines(result, t0_s, t1_s))
    return out


__all__ = ["FleetEngine", "FleetResult", "PrefixAwareRouter", "PrefixTree", "Router",
           "fleet_headlines", "make_router", "measurement_window_s", "pool_tier",
           "simulate_fleet"]
