"""The fleet twin (`kvrepro.engines.sim.fleet`): routing, private vs shared pools, headlines.

Hand-made workloads give cases whose outcome can be reasoned out independently: which
instance each turn lands on, how many tokens a shared store holds, how long a load takes on
a FIFO channel.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvrepro.engines.sim import load_profile, simulate
from kvrepro.engines.sim.fleet import (
    FleetResult,
    PrefixTree,
    fleet_headlines,
    pool_tier,
    simulate_fleet,
)
from kvrepro.fleet_spec import FleetSpec
from kvrepro.workload import generate_agentic
from kvrepro.workload.base import Workload

from .conftest import PROFILE_PATH, small_spec, table_workload

KV_BYTES_PER_TOKEN = 2048  # profile_small.yaml's model: 2 x 4 layers x 2 heads x 64 x 2 B
CHUNK_TOKENS = 256  # the tier spec's default chunk
DRAM_READ_BW = 2.0e9  # profile_small.yaml's dram store
NAN = math.nan


def _fleet(**fields: object) -> FleetSpec:
    base = dict(server=str(PROFILE_PATH), tier="dram", n_servers=2, routing="round_robin",
                kv_pool="shared")
    base.update(fields)
    return FleetSpec.model_validate(base)




@pytest.fixture(scope="module")
def agentic() -> Workload:
    return generate_agentic(small_spec(duration_s=300))


def _row(result: FleetResult, session: int, turn: int) -> pd.Series:
    rec = result.records
    return rec[(rec.session_id == session) & (rec.turn == turn)].iloc[0]


# ---------------------------------------------------------------------- one server

@pytest.mark.parametrize(("tier", "pool"), [("dram", "shared"), ("dram", "private"),
                                            ("flash", "shared"), ("baseline", "private")])
def test_a_fleet_of_one_is_the_single_server(agentic: Workload, tier: str, pool: str) -> None:
    fleet = _fleet(tier=tier, kv_pool=pool, n_servers=1)
    got = simulate_fleet(agentic, fleet, warmup_s=30.0)
    want = simulate(agentic, PROFILE_PATH, tier, warmup_s=30.0, progress=False)
    assert len(want.records) > 100
    assert (got.records.instance == 0).all() and not got.records.routed_away.any()
    pd.testing.assert_frame_equal(got.records.drop(columns=["instance", "routed_away"]),
                                  want.records)
    pd.testing.assert_frame_equal(got.samples.drop(columns="instance"), want.samples)
    for key in ("arrived", "finished", "failed", "steps", "prefix_hits_tokens"):
        assert got.stats[key] == want.stats[key], key


# ---------------------------------------------------------------------- routing

def test_round_robin_alternates_in_the_order_turns_are_sent(agentic: Workload) -> None:
    result = simulate_fleet(agentic, _fleet(n_servers=3))
    rec = result.records.sort_values("send_s", kind="stable")
    assert rec.send_s.is_unique  # so the order of sending is the order of send_s
    assert rec.instance.tolist() == [i % 3 for i in range(len(rec))]
    # a session's next turn stays on its instance only when the turns sent in between
    # number 2 mod 3: most turns move
    assert rec.routed_away.mean() > 0.5


def test_session_affinity_keeps_every_session_on_one_instance(agentic: Workload) -> None:
    result = simulate_fleet(agentic, _fleet(n_servers=4, routing="session_affinity"))
    per_session = result.records.groupby("session_id").instance.nunique()
    assert (per_session == 1).all()
    assert result.records.instance.nunique() == 4  # the hash spreads sessions
    assert not result.records.routed_away.any()
    again = simulate_fleet(agentic, _fleet(n_servers=4, routing="session_affinity"))
    pd.testing.assert_frame_equal(result.records, again.records)  # deterministic


def _prefix_case() -> Workload:
    """s0 (1000 tokens, then +500) lands on instance 0, s1 (short) on 1, s2 (long decode) on
    0; when s0's second turn is sent s1 has finished and s2 still runs: instance 0 holds s0's
    prefix and one request, instance 1 none."""
    rows = [(0, 0, 0.0, 0.0, 1000, 2), (0, 1, 0.5, NAN, 500, 2),
            (1, 0, 0.0, 0.001, 300, 2),
            (2, 0, 0.0, 0.002, 300, 2000)]
    return table_workload(rows, {0: 0.0, 1: 0.001, 2: 0.002})


def test_prefix_aware_follows_the_prefix_while_balanced() -> None:
    result = simulate_fleet(_prefix_case(), _fleet(routing="prefix_aware", kv_pool="private"))
    assert [_row(result, s, 0).instance for s in (0, 1, 2)] == [0, 1, 0]
    second = _row(result, 0, 1)
    s2 = _row(result, 2, 0)
    assert s2.send_s < second.send_s < s2.finish_s  # instance 0 is busier when it is sent
    assert second.instance == 0 and not second.routed_away
    # on instance 0 its prefix is in the GPU cache: all 1000 tokens' full blocks hit
    assert second.gpu_hit_tokens == 1000 // 16 * 16
    assert result.stats["router_decisions"]["cache_affinity"] == 1


def test_prefix_aware_sends_to_the_least_loaded_when_imbalanced() -> None:
    fleet = _fleet(routing="prefix_aware", kv_pool="private",
                   prefix_aware={"balance_abs_threshold": 0, "balance_rel_threshold": 1.0})
    result = simulate_fleet(_prefix_case(), fleet)
    second = _row(result, 0, 1)
    assert second.instance == 1 and second.routed_away  # 1 in flight on 0, none on 1
    assert second.cached_prompt_tokens == 0  # a private pool on an empty instance
    assert result.stats["router_decisions"]["load_balance"] >= 1


def test_prefix_tree_matches_whole_segments_then_a_partial_one() -> None:
    tree = PrefixTree(max_tokens=10_000)
    tree.insert(((7, 0), (9, 100)), 400)  # a shared 100-token prefix, then a context
    assert tree.match_tokens(((7, 0), (9, 100)), 600) == 400  # the next turn: 400 of 600
    assert tree.match_tokens(((7, 0), (8, 100)), 300) == 100  # another session: the prefix
    assert tree.match_tokens(((5, 0),), 300) == 0
    small = PrefixTree(max_tokens=500)
    small.insert(((1, 0),), 400)
    small.insert(((2, 0),), 300)  # over budget: the least recently used segment goes
    assert small.match_tokens(((1, 0),), 400) == 0 and small.tokens == 300


# ---------------------------------------------------------------------- shared pool

def _cross_case(not_before_1: float = NAN, second_session: bool = True) -> Workload:
    """s0: 1000 tokens then +500 a second later; round robin sends its second turn to
    instance 1. s1 (one turn, long after) only makes it a two-session workload."""
    rows = [(0, 0, 0.0, 0.0, 1000, 2), (0, 1, 1.0, not_before_1, 500, 2)]
    arrivals = {0: 0.0}
    if second_session:
        rows.append((1, 0, 0.0, 5.0, 300, 2))
        arrivals[1] = 5.0
    return table_workload(rows, arrivals)


def test_shared_pool_serves_a_turn_routed_to_the_other_instance() -> None:
    shared = simulate_fleet(_cross_case(), _fleet(kv_pool="shared"))
    private = simulate_fleet(_cross_case(), _fleet(kv_pool="private"))
    for result in (shared, private):
        assert _row(result, 0, 0).instance == 0 and _row(result, 0, 1).instance == 1
        assert _row(result, 0, 1).routed_away
    # instance 0 stored the first prompt's whole chunks (3 of 256 tokens); instance 1's GPU
    # is empty, so all of them come from the store
    stored = 1000 // CHUNK_TOKENS * CHUNK_TOKENS
    hit = _row(shared, 0, 1)
    assert hit.cached_prompt_tokens == stored and hit.loaded_tokens_dram == stored
    assert hit.gpu_hit_tokens == 0
    miss = _row(private, 0, 1)
    assert miss.cached_prompt_tokens == 0 and miss.loaded_tokens_dram == 0
    heads = fleet_headlines(shared)
    assert heads["cross_instance_hit_share"] == pytest.approx(stored / 1500)
    assert fleet_headlines(private)["cross_instance_hit_share"] == 0.0


def test_network_latency_adds_its_value_to_each_load() -> None:
    latency_s = 0.0375
    plain = _row(simulate_fleet(_cross_case(), _fleet()), 0, 1)
    far = _row(simulate_fleet(_cross_case(), _fleet(shared_pool={
        "network_latency_s": latency_s})), 0, 1)
    chunk_bytes = CHUNK_TOKENS * KV_BYTES_PER_TOKEN
    assert plain.load_s == pytest.approx(3 * chunk_bytes / DRAM_READ_BW, rel=1e-9)
    assert far.load_s - plain.load_s == pytest.approx(latency_s, rel=1e-9)
    assert far.cached_prompt_tokens == plain.cached_prompt_tokens > 0


def test_pool_bandwidth_replaces_the_stores_and_transfers_contend() -> None:
    chunk_bytes = CHUNK_TOKENS * KV_BYTES_PER_TOKEN
    pool_bw = 1.0e8
    fleet = _fleet(shared_pool={"read_bw_bytes_s": pool_bw})
    alone = _row(simulate_fleet(_cross_case(), fleet), 0, 1)
    one_load_s = 3 * chunk_bytes / pool_bw
    assert alone.load_s == pytest.approx(one_load_s, rel=1e-9)
    # two sessions whose second turns are sent 1 us apart at t = 5 s, s1's first: round robin
    # sends s1's to instance 0 and s0's to instance 1, each away from its first turn
    rows = [(0, 0, 0.0, 0.0, 1000, 2), (0, 1, 0.0, 5.0 + 1e-6, 500, 2),
            (1, 0, 0.0, 0.001, 1000, 2), (1, 1, 0.0, 5.0, 500, 2)]
    both = simulate_fleet(table_workload(rows, {0: 0.0, 1: 0.001}), fleet)
    first, second = _row(both, 1, 1), _row(both, 0, 1)
    assert first.routed_away and second.routed_away
    assert first.load_s == pytest.approx(one_load_s, rel=1e-9)
    # the second read queues behind the first on the pool's one read channel (FIFO)
    assert second.load_s == pytest.approx(2 * one_load_s - 1e-6, rel=1e-6)
    private = simulate_fleet(table_workload(rows, {0: 0.0, 1: 0.001}),
                             _fleet(kv_pool="private"))
    assert _row(private, 0, 1).load_s == 0.0  # private stores: nothing to load there


def test_pool_tier_scales_capacity_and_keeps_unset_bandwidth() -> None:
    tier = load_profile(PROFILE_PATH).tier("flash")
    pooled = pool_tier(tier, FleetSpec.model_validate(
        {"server": str(PROFILE_PATH), "tier": "flash",
         "shared_pool": {"capacity_scale": 8.0, "write_bw_bytes_s": 3e9}}).shared_pool)
    for mine, theirs in zip(tier.stores, pooled.stores, strict=True):
        assert theirs.capacity_bytes == 8.0 * mine.capacity_bytes
        assert theirs.read_bw_bytes_s == mine.read_bw_bytes_s
        assert theirs.write_bw_bytes_s == 3e9
    assert tier.stores[0].capacity_bytes != pooled.stores[0].capacity_bytes  # a copy


def test_shared_pool_samples_report_one_pool(agentic: Workload) -> None:
    result = simulate_fleet(agentic, _fleet(n_servers=3))
    wide = result.samples.pivot(index="time_s", columns="instance", values="dram_bytes_used")
    assert (wide.nunique(axis=1) == 1).all() and wide[0].max() > 0
    assert set(result.samples.instance) == {0, 1, 2}


# ---------------------------------------------------------------------- headlines

def _window_tokens(ok: pd.DataFrame, t0: float, t1: float) -> float:
    """Prompt tokens whose first token falls in [t0, t1], plus output tokens times the share
    of each decode [first token, finish] inside the window."""
    prompt = ok.prompt_tokens[(ok.first_token_s >= t0) & (ok.first_token_s <= t1)].sum()
    output = 0.0
    for first, finish, n in zip(ok.first_token_s, ok.finish_s, ok.output_tokens, strict=True):
        if finish <= first:
            output += n if t0 <= first <= t1 else 0.0
        else:
            overlap = max(0.0, min(finish, t1) - max(first, t0))
            output += n * overlap / (finish - first)
    return float(prompt + output)


@pytest.mark.parametrize("pool", ["private", "shared"])
def test_fleet_headlines_match_the_records(agentic: Workload, pool: str) -> None:
    t0, t1 = 30.0, 300.0
    result = simulate_fleet(agentic, _fleet(kv_pool=pool), warmup_s=t0, duration_s=t1)
    heads = fleet_headlines(result)
    rec = result.records
    ok = rec[rec.error == ""]
    assert heads["throughput_tok_s"] == pytest.approx(_window_tokens(ok, t0, t1) / (t1 - t0))
    per = [_window_tokens(ok[ok.instance == i], t0, t1) / (t1 - t0) for i in (0, 1)]
    assert heads["throughput_min_server_tok_s"] == pytest.approx(min(per))
    assert heads["throughput_max_server_tok_s"] == pytest.approx(max(per))
    sent = ok[~ok.is_warmup]
    ttft = (sent.first_token_s - sent.send_s).to_numpy()
    assert heads["ttft_median_s"] == pytest.approx(np.median(ttft))
    assert heads["ttft_p90_s"] == pytest.approx(np.percentile(ttft, 90))
    offload = sent.cached_prompt_tokens - sent.gpu_hit_tokens  # what the stores served
    assert heads["cached_share_dram"] == pytest.approx(offload.sum() / sent.prompt_tokens.sum())
    away = sent[sent.routed_away]
    assert heads["cross_instance_hit_share"] == pytest.approx(
        (away.cached_prompt_tokens - away.gpu_hit_tokens).sum() / away.prompt_tokens.sum())
    assert heads["routed_away_share"] == pytest.approx(len(away) / len(sent))
    _check_store_headlines(result, heads, pool, t0, t1)


def _check_store_headlines(result: FleetResult, heads: dict[str, float], pool: str,
                           t0: float, t1: float) -> None:
    samples = result.samples
    interval = load_profile(PROFILE_PATH).sample_interval_s
    assert t0 % interval == 0 and t1 % interval == 0  # both on the sample grid
    at = samples.pivot(index="time_s", columns="instance", values="dram_bytes_written")
    used = samples.pivot(index="time_s", columns="instance", values="dram_bytes_used")
    if pool == "shared":  # one pool: instance 0's row is the pool
        written, used_total = at[0], used[0]
    else:
        written, used_total = at.sum(axis=1), used.sum(axis=1)
    per_day = (written[t1] - written[t0]) / (t1 - t0) * 86_400
    assert heads["dram_bytes_written_per_day"] == pytest.approx(per_day)
    assert heads["dram_bytes_written_per_day"] > 0
    assert heads["dram_peak_bytes_used"] == used_total.max()
    capacity = load_profile(PROFILE_PATH).tier("dram").stores[0].capacity_bytes
    chunks = capacity // (CHUNK_TOKENS * KV_BYTES_PER_TOKEN)
    n = 1 if pool == "shared" else 2
    assert heads["dram_capacity_bytes"] == n * chunks * CHUNK_TOKENS * KV_BYTES_PER_TOKEN


def test_simulate_fleet_takes_a_fleet_file(tmp_path: Path) -> None:
    workload = _cross_case()
    path = tmp_path / "fleet.yaml"
    path.write_text(f"server: {PROFILE_PATH}\ntier: dram\nn_servers: 2\n"
                    "routing: round_robin\n")
    from_path = simulate_fleet(workload, path)
    from_spec = simulate_fleet(workload, _fleet())
    pd.testing.assert_frame_equal(from_path.records, from_spec.records)
    with pytest.raises(ValueError, match="max_in_flight"):
        simulate_fleet(workload, _fleet(), max_in_flight=0)


# ---------------------------------------------------------------------- a shared store

SHARED_TIERS = """
  shared:
    stores:
      - {name: dram, kind: dram, capacity_bytes: 67108864, read_bw_bytes_s: 2.0e9,
         write_bw_bytes_s: 2.0e9}
      - {name: share, kind: shared_fs, capacity_bytes: 1.0e10, read_bw_bytes_s: 0.5e9,
         write_bw_bytes_s: 0.5e9, object_latency_s: 0.001, reads_in_flight: 4}
"""


def _shared_fs_fleet(tmp_path: Path, tier: str) -> FleetSpec:
    """The test server with a tier whose second store is a shared filesystem, as a fleet of
    two private pools serving `tier`."""
    server = tmp_path / "server.yaml"
    server.write_text(PROFILE_PATH.read_text() + SHARED_TIERS)
    return _fleet(server=str(server), tier=tier, kv_pool="private")


def _handed_over() -> Workload:
    """One session of two turns: round robin sends the first to instance 0 and the second
    (its 1000 tokens + 500) to instance 1."""
    return table_workload([(0, 0, 0.0, 0.0, 1000, 2), (0, 1, 0.5, NAN, 500, 2)], {0: 0.0})


def test_a_shared_fs_store_is_one_store_for_private_pools(tmp_path: Path) -> None:
    """A prompt computed on instance 0 is a hit on instance 1 through the shared filesystem,
    while each instance keeps its own DRAM store; with private flash stores instead (the
    same tier shape) it is not."""
    chunk_bytes = CHUNK_TOKENS * KV_BYTES_PER_TOKEN
    result = simulate_fleet(_handed_over(), _shared_fs_fleet(tmp_path, "shared"))
    assert result.shared_names == ["share"]
    second = _row(result, 0, 1)
    assert second.instance == 1 and second.routed_away
    assert second.loaded_tokens_share == 1000 // CHUNK_TOKENS * CHUNK_TOKENS  # 3 chunks
    assert second.loaded_tokens_dram == 0  # instance 1's own DRAM store never saw them
    assert second.cached_prompt_tokens == second.loaded_tokens_share
    heads = fleet_headlines(result)
    # the one store holds 5 chunks (3, then 2 more); counted once, not per instance
    assert heads["share_peak_bytes_used"] == 5 * chunk_bytes
    assert heads["share_capacity_bytes"] == pytest.approx(1.0e10 // chunk_bytes * chunk_bytes)
    # its traffic is each instance's own, summed: 3 chunks written by 0, 2 by 1
    assert result.samples.groupby("instance").share_bytes_written.max().sum() == 5 * chunk_bytes
    assert heads["cross_instance_hit_share"] == pytest.approx(768 / 1500)

    private = simulate_fleet(_handed_over(), _shared_fs_fleet(tmp_path, "flash"))
    assert private.shared_names == []
    assert _row(private, 0, 1).instance == 1
    assert _row(private, 0, 1).cached_prompt_tokens == 0  # instance 1's flash is its own
    assert fleet_headlines(private)["flash_peak_bytes_used"] == (3 + 5) * chunk_bytes


def test_a_shared_pool_keeps_a_shared_store_at_its_own_capacity() -> None:
    tier = load_profile(PROFILE_PATH).tier("dram")
    share = tier.stores[0].model_copy(update={"name": "share", "shared": True})
    both = tier.model_copy(update={"stores": [tier.stores[0], share]})
    pooled = pool_tier(both, FleetSpec(server=str(PROFILE_PATH), tier="dram",
                                       shared_pool={"capacity_scale": 4}).shared_pool)
    assert pooled.stores[0].capacity_bytes == 4 * tier.stores[0].capacity_bytes
    assert pooled.stores[1].capacity_bytes == share.capacity_bytes
