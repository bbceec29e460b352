"""The twin's speed-ups change no result.

* Digests: the records and samples of a 20-minute study-A campaign (three tiers), written as
  CSV with a fixed float format, hash to what the step-by-step twin of commit e68b3c6 gave.
* Slow path: with `Scheduler.decode_run` switched off (every decode step an event of its
  own, the loop before the speed-up), cpu_tiny's tiers (multi-process LMCache: asynchronous
  lookups and eviction loop, skip_l1 staging) and a two-server fleet give exactly the same
  records, samples and stats, while the fast path did skip steps.
* The pieces the runs stand on: the decode step time is `StepTimer.step_s`'s, bit for bit;
  a step end pushed now is next exactly when `EventQueue.step_end_limit` says so; a batch
  of chunks inserted at once is the inserts one by one.

This module imports nothing from the tests package, so that the digests can be recomputed
on any checkout: `PYTHONPATH=<checkout> python tests/engines/sim/test_decode_runs.py` prints them.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from kvrepro._paths import data_file
from kvrepro.engines.sim import load_profile, simulate
from kvrepro.engines.sim.campaign import campaign, simulate_campaign
from kvrepro.engines.sim.config import OffloadTier, ServerProfile
from kvrepro.engines.sim.events import EventQueue, LoadDone, Sample, StepEnd, TurnArrival
from kvrepro.engines.sim.fleet import simulate_fleet
from kvrepro.engines.sim.offload import ChunkStore
from kvrepro.engines.sim.scheduler import Scheduler
from kvrepro.engines.sim.steptime import StepTimer
from kvrepro.fleet_spec import load_fleet
from kvrepro.records import read_run
from kvrepro.workload import AgenticSpec, build_workload, generate_agentic
from kvrepro.workload.base import Workload

# sha256 of `_frame_digest` of study A's 20-minute campaign (`_study_a_campaign`), computed
# with the twin of commit e68b3c6 (before the decode runs): `PYTHONPATH=<a checkout of
# e68b3c6> .venv/bin/python tests/engines/sim/test_decode_runs.py`. A deliberate change of the model
# (step time, scheduling, caches, stores, records) changes them: recompute and update them
# with the same command on the changed code, and say why in the commit.
# Recomputed for issue 26 item 3 (the scheduler follows vLLM 0.32's admission: the whole
# sequence must fit, the null block, the in-flight prefills' reservation of async loads,
# loads issued at the end of the admitting step, no LMCache-MP load after a preemption).
# Recomputed for issue [host-cpu]: the records carry the host-CPU stretches each request saw
# (front_stretch, lookup_stretch, host_stretch; 1.0 on this server, which models no host);
# without those three columns the records' digest is the one before (1c18d314...), and the
# samples' is unchanged.
# Recomputed for issue [host-cpu] on 2026-12-05: the samples carry LMCache's counters as
# LMCache counts them (lmcache_lookup_tokens, lmcache_l1_read_chunks, _write_chunks);
# without those three columns the samples' digest is the one before (1f69f17f...), and the
# records' is unchanged.
# Recomputed for issue [host-cpu] on 2026-12-06: the records carry `engine_queue_s` (vLLM's
# queue time, from the engine core's intake after the step in flight); without it the
# records' digest is the one before (03ea2476...), and the samples' is unchanged.
STUDY_A_20MIN_RECORDS_SHA256 = "9179c8239c94a8aec57b36b81f049d6af3e77467ecc14d82875c53a82ec69325"
STUDY_A_20MIN_SAMPLES_SHA256 = "1f99495661b0df16acb034662adc37a41b7da9a419381daedcba086f4a42fb45"
STUDY_A_20MIN_RECORDS = 1347


def _frame_digest(frame: pd.DataFrame) -> str:
    """sha256 of the frame as CSV, floats with 17 significant digits (exact)."""
    text = frame.to_csv(index=False, float_format="%.17g", lineterminator="\n")
    return hashlib.sha256(text.encode()).hexdigest()


DIGEST_SERVER = Path(__file__).resolve().parents[2] / "data" / "study_a_digest_server.yaml"
"""Study A's server as it was when the digests were taken (frozen: a refit of the shipped
spec must not move a check of the twin's code)."""
DIGEST_PAUSE = {"kind": "lognormal", "mean_s": 60.0, "sigma": 1.0}
"""The pause of that time (the shipped one is refitted by `kvrepro calibrate`)."""


def _study_a_campaign() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Notebook 04's campaign as of the digests (seed 0, 2.5 sessions/min, a 60 s pause,
    180 s warm-up, `DIGEST_SERVER`, three tiers), 20 minutes long."""
    workload = generate_agentic(AgenticSpec(seed=0, duration_s=1200.0, warmup_s=180.0,
                                            pause=DIGEST_PAUSE, session_rate_per_min=2.5))
    profile = load_profile(DIGEST_SERVER)
    return simulate_campaign(workload, profile, ["baseline", "dram", "flash"], warmup_s=180.0,
                             progress=False)


def test_study_a_campaign_matches_the_stored_digests() -> None:
    records, samples = _study_a_campaign()
    assert len(records) == STUDY_A_20MIN_RECORDS
    assert _frame_digest(records) == STUDY_A_20MIN_RECORDS_SHA256
    assert _frame_digest(samples) == STUDY_A_20MIN_SAMPLES_SHA256


def test_frame_digest_sees_one_ulp() -> None:
    frame = pd.DataFrame({"t_s": [0.1, 2.5], "n": [1, 2]})
    nudged = frame.assign(t_s=[math.nextafter(0.1, 1.0), 2.5])
    assert _frame_digest(frame) != _frame_digest(nudged)
    assert _frame_digest(frame) == _frame_digest(frame.copy())


# ---------------------------------------------------------------------- the slow path

class _Counted:
    """Wraps `Scheduler.decode_run`, counting the runs that ended steps; with
    `enabled=False` it starts none (the step-by-step loop)."""

    # taken at import, before any test replaces it (None on checkouts before the runs)
    original = getattr(Scheduler, "decode_run", None)

    def __init__(self, enabled: bool):
        self.enabled, self.runs = enabled, []

    def __call__(self, sched: Scheduler, plan: Any, start_s: float, end_s: float) -> Any:
        if not self.enabled:
            return None
        run = _Counted.original(sched, plan, start_s, end_s)
        if run is not None:
            self.runs.append(run)
        return run

    @property
    def skips(self) -> int:
        """Steps the runs planned without an event each."""
        return sum(run.step - 1 for run in self.runs)


@pytest.fixture
def decode_runs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """`decode_runs(enabled)` installs a `_Counted` decode_run and returns it."""
    def install(enabled: bool) -> _Counted:
        counted = _Counted(enabled)

        def decode_run(sched: Scheduler, plan: Any, start_s: float, end_s: float) -> Any:
            return counted(sched, plan, start_s, end_s)
        monkeypatch.setattr(Scheduler, "decode_run", decode_run)
        return counted
    yield install


def _tiny_workload(duration_s: float = 120.0, **overrides: Any) -> Workload:
    """The cpu_tiny fit run's workload (data/live/cpu_tiny_fit/dram), shortened."""
    params = read_run(data_file("live", "cpu_tiny_fit", "dram")).meta["workload"]["params"]
    return build_workload("agentic", {**params, "duration_s": duration_s, **overrides})


def _tiny_campaign() -> dict[str, Any]:
    runs = campaign(_tiny_workload(), load_profile(data_file("servers", "cpu_tiny.yaml")),
                    progress=False)
    return {tier: (run.records, run.samples, _stats(run.meta["stats"]))
            for tier, run in runs.items()}


def _tiny_fleets() -> dict[str, Any]:
    """cpu_tiny_2x (round robin, shared DRAM pool) and a prefix-aware fleet on flash."""
    base = load_fleet(data_file("fleets", "cpu_tiny_2x.yaml"))
    fleets = {"dram": base,
              "flash": base.model_copy(update={"tier": "flash", "routing": "prefix_aware"})}
    out = {}
    for name, fleet in fleets.items():
        result = simulate_fleet(_tiny_workload(), fleet)
        out[name] = (result.records, result.samples, _stats(result.stats))
    return out


def _stats(stats: dict[str, Any]) -> str:
    """Stats without the wall time, as text (NaN equals NaN)."""
    return repr({k: v for k, v in stats.items() if k != "wall_s"})


def _assert_same(slow: dict[str, Any], fast: dict[str, Any]) -> None:
    assert list(slow) == list(fast)
    for name in slow:
        for a, b in zip(slow[name][:2], fast[name][:2], strict=True):
            pd.testing.assert_frame_equal(a, b, check_exact=True)
        assert slow[name][2] == fast[name][2], name


@pytest.mark.parametrize("runs", [_tiny_campaign, _tiny_fleets], ids=["tiers", "fleets"])
def test_decode_runs_change_nothing(decode_runs: Any, runs: Any) -> None:
    decode_runs(False)
    slow = runs()
    counted = decode_runs(True)
    fast = runs()
    _assert_same(slow, fast)
    assert counted.skips > 0  # the fast path did run


def test_fleet_runs_go_on_past_the_other_servers_steps(decode_runs: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """In a fleet the next event is mostly another server's step end: a server's run is
    suspended there and resumed at its own step's end (not settled, which would write its
    requests back and plan the next step step by step), and the records are the same
    (`test_decode_runs_change_nothing[fleets]`)."""
    from kvrepro.engines.sim.decode_run import DecodeRun  # not at the top: see the module doc

    resumed = []
    original = DecodeRun.advance

    def advance(run: Any, limit_s: float, inclusive: bool, resume: bool = False) -> Any:
        resumed.append(resume)
        return original(run, limit_s, inclusive, resume)
    monkeypatch.setattr(DecodeRun, "advance", advance)
    counted = decode_runs(True)
    simulate_fleet(_tiny_workload(60.0), load_fleet(data_file("fleets", "cpu_tiny_2x.yaml")))
    assert sum(resumed) > 0.5 * len(resumed)  # most advances resume a suspended run
    assert counted.skips > 0


def test_decode_runs_stop_where_the_loop_would_preempt(decode_runs: Any) -> None:
    """cpu_tiny's small-kv tier (the server's own small GPU cache) preempts: runs of decode
    steps end at allocations that would preempt, and the results are the step-by-step
    ones."""
    profile = load_profile(data_file("servers", "cpu_tiny.yaml"))
    # twice the saturating held-out set's rate: the fit run's 6 sessions / min hardly preempts
    workload = _tiny_workload(60.0, session_rate_per_min=40)
    results = []
    for enabled in (False, True):
        counted = decode_runs(enabled)
        results.append(simulate(workload, profile, "small-kv", progress=False))
    slow, fast = results
    assert slow.stats["preemptions"] > 0
    pd.testing.assert_frame_equal(slow.records, fast.records, check_exact=True)
    pd.testing.assert_frame_equal(slow.samples, fast.samples, check_exact=True)
    assert _stats(slow.stats) == _stats(fast.stats)
    assert counted.skips > 0


# ---------------------------------------------------------------------- the pieces

@pytest.mark.parametrize("model", ["MiniMax-M2.7-FP8-KV-BF16", None])
@pytest.mark.parametrize("combine", ["max", "sum"])
def test_decode_step_time_is_step_s_bit_for_bit(model: str | None, combine: str) -> None:
    server = load_profile(data_file("servers", "study_a.yaml")).server
    update: dict[str, Any] = {"step_combine": combine}
    if model is None:
        update["model"] = load_profile(data_file("servers", "cpu_tiny.yaml")).server.model
    timer = StepTimer(ServerProfile.model_validate({**server.model_dump(), **update}))
    for kv_tokens in (1, 17, 4_097, 315_001):
        for batch in (1, 2, 7, 64, 256):
            slow = timer.step_s([], kv_tokens, 0.0, batch)
            assert timer.decode_step_s(kv_tokens, batch) == slow
            assert timer.decode_step_fn(batch)(kv_tokens) == slow


def _first_after_push(queue_events: list[Any], end_s: float) -> bool:
    """Whether a step end at `end_s` pushed after `queue_events` is popped first."""
    queue = EventQueue()
    for event in queue_events:
        queue.push(event)
    marker = StepEnd(end_s, -1)
    queue.push(marker)
    return queue.pop() is marker


@pytest.mark.parametrize("head", [
    TurnArrival(1.0, 0, 0), Sample(1.0), StepEnd(1.0, 3, 1), LoadDone(1.0, None),  # type: ignore[arg-type]
])
def test_step_end_limit_orders_ties_as_the_queue(head: Any) -> None:
    queue = EventQueue()
    queue.push(head)
    limit_s, inclusive = queue.step_end_limit(math.inf)
    for end_s in (math.nextafter(1.0, 0.0), 1.0, math.nextafter(1.0, 2.0)):
        comes_first = end_s < limit_s or (end_s == limit_s and inclusive)
        assert comes_first == _first_after_push([head], end_s), (head, end_s)


def test_step_end_limit_stops_at_the_hard_end() -> None:
    queue = EventQueue()
    queue.push(Sample(5.0))
    assert queue.step_end_limit(2.0) == (2.0, True)
    assert EventQueue().step_end_limit(3.0) == (3.0, True)


def _lru_store(chunks: int) -> ChunkStore:
    return ChunkStore(OffloadTier(name="dram", capacity_bytes=chunks * 4 * 1000,
                                  read_bw_bytes_s=1e6, write_bw_bytes_s=1e6, chunk_tokens=4),
                      1000)


def _one_by_one(store: ChunkStore, ids: list[int], ready_s: list[float]) -> list[int]:
    """The reference: `insert` of each absent chunk in turn."""
    evicted = []
    for cid, when_s in zip(ids, ready_s, strict=True):
        if cid not in store.entries:
            out = store.insert(cid, when_s, 9.0)
            if out >= 0:
                evicted.append(out)
    return evicted


def test_a_batch_insert_is_the_inserts_one_by_one() -> None:
    stores = [_lru_store(5), _lru_store(5)]
    for store in stores:
        for cid in (10, 11, 12, 13):
            store.insert(cid, 1.0, 1.0)
    ids, ready_s = [12, 20, 21, 22], [2.0, 2.5, 3.0, 3.5]
    new = stores[0].absent_for_batch(ids)
    assert new == [20, 21, 22]
    evicted = stores[0].insert_batch(new, ready_s[1:], 9.0)
    assert evicted == _one_by_one(stores[1], ids, ready_s) == [10, 11]
    assert list(stores[0].entries.items()) == list(stores[1].entries.items())
    assert stores[0].evicted_chunks == stores[1].evicted_chunks == 2
    assert stores[0].first_eviction_s == stores[1].first_eviction_s == 9.0


def test_no_batch_when_an_insert_would_evict_a_chunk_of_the_batch() -> None:
    store = _lru_store(4)
    for cid in (10, 11, 12, 13):
        store.insert(cid, 1.0, 1.0)
    assert store.absent_for_batch([20, 10]) is None  # inserting 20 evicts 10, then 10 again
    assert store.absent_for_batch([20, 11]) == [20]  # 20 evicts 10: 11 stays
    ttl = ChunkStore(OffloadTier(name="dram", capacity_bytes=4000, read_bw_bytes_s=1e6,
                                 write_bw_bytes_s=1e6, chunk_tokens=4, eviction="ttl",
                                 ttl_s=5.0), 1000)
    assert ttl.absent_for_batch([1]) is None  # not a plain LRU store: one by one


def _digests() -> dict[str, Any]:
    records, samples = _study_a_campaign()
    return {"records": len(records), "records_sha256": _frame_digest(records),
            "samples_sha256": _frame_digest(samples)}


if __name__ == "__main__":
    print(_digests())
