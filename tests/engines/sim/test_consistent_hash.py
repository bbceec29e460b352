"""vllm-router's consistent hash in the twin (`kvrepro.engines.sim.consistent_hash`): every
session of every recorded live session-affinity run is where the twin's ring puts it."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from kvrepro._paths import data_dir
from kvrepro.engines.sim.consistent_hash import (
    HashRing,
    furc_hash,
    session_key,
)
from kvrepro.engines.sim.fleet import make_router
from kvrepro.fleet_spec import FleetSpec

LIVE_RUNS = sorted(p.parent for p in (data_dir() / "live").glob("cpu_tiny_fleet*/**/meta.json")
                   if p.parent.name.endswith("session_affinity"))


def _live_instances(run_dir: Path) -> tuple[FleetSpec, pd.Series]:
    """The run's fleet and, per session, the instances that served its turns live."""
    fleet = FleetSpec.model_validate(json.loads((run_dir / "meta.json").read_text())["fleet"])
    records = pd.read_json(run_dir / "records.jsonl", lines=True)
    served = records[records.instance >= 0].groupby("session_id").instance.agg(
        lambda s: sorted(set(s)))
    return fleet, served


def _agree(ring: HashRing, served: pd.Series, key=session_key) -> int:
    return sum(served[s] == [ring.instance(key(s))] for s in served.index)


def test_the_shipped_runs_hold_session_affinity_runs() -> None:
    assert len(LIVE_RUNS) >= 6, LIVE_RUNS


@pytest.mark.parametrize("run_dir", LIVE_RUNS,
                         ids=lambda p: str(p.relative_to(data_dir() / "live")))
def test_every_live_session_is_where_the_ring_puts_it(run_dir: Path) -> None:
    fleet, served = _live_instances(run_dir)
    ring = HashRing(fleet.worker_urls())
    assert _agree(ring, served) == len(served) > 50
    # the twin's router is that ring
    router = make_router(fleet.model_copy(update={"routing": "session_affinity"}))
    assert router.ring.positions == ring.positions


def test_a_ring_that_differs_in_any_part_misses_sessions() -> None:
    """The check above can fail: another key, another node count or other URLs send a
    quarter to a half of the sessions elsewhere (one node less moves almost none: that is
    what a consistent hash is for)."""
    fleet, served = _live_instances(LIVE_RUNS[0])
    urls = fleet.worker_urls()
    misses = {
        "raw session id": _agree(HashRing(urls), served, key=lambda s: str(s)),
        "header name as sent": _agree(HashRing(urls), served,
                                      key=lambda s: f"header:X-Session-ID:{s}"),
        "100 virtual nodes": _agree(HashRing(urls, 100), served),
        "other ports": _agree(HashRing([u.replace(":85", ":95") for u in urls]), served),
    }
    assert all(n < 0.8 * len(served) for n in misses.values()), misses


def test_furc_hash_stays_in_range_and_moves_few_keys_when_a_bucket_is_added() -> None:
    keys = [f"key-{i}".encode() for i in range(2000)]
    for m in (1, 2, 3, 7, 8, 1000):
        assert all(0 <= furc_hash(k, m) < m for k in keys)
    moved = sum(furc_hash(k, 8) != furc_hash(k, 9) for k in keys)
    # consistent: about 1/9 of the keys move to the new bucket, none between old ones
    assert 0.05 < moved / len(keys) < 0.2
    assert all(furc_hash(k, 9) == 8 for k in keys if furc_hash(k, 8) != furc_hash(k, 9))
