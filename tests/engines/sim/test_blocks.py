"""Block identity: which blocks and chunks two prompts share, per workload kind."""

from __future__ import annotations

import pandas as pd
import pytest

from kvrepro.engines.sim.prefix_units import (
    OPEN,
    SEGMENT_SHIFT,
    BlockIdentity,
    block_ids,
    unit_ids,
    unit_ranges,
)
from kvrepro.workload import AgenticSpec, MicrobenchSpec, generate_agentic, microbenchmark
from kvrepro.workload.trace_replay import trace_to_workload
from tests.engines.sim.conftest import small_spec

BT = 16


def _row(workload, session_id: int, turn: int) -> int:
    t = workload.turns
    return int(t.index[(t.session_id == session_id) & (t.turn == turn)][0])


def test_unit_ranges_and_ids_arithmetic() -> None:
    segments = ((7, 0), (9, 100))
    assert unit_ranges(segments, 16) == ((7, 0, 6), (9, 6, OPEN))
    ids = unit_ids(unit_ranges(segments, 16), 4, 9)
    # blocks 4, 5 end inside segment 7 (tokens < 100); block 6 ends at token 111 -> segment 9
    assert ids == [(7 << SEGMENT_SHIFT) + 4, (7 << SEGMENT_SHIFT) + 5,
                   (9 << SEGMENT_SHIFT) + 0, (9 << SEGMENT_SHIFT) + 1, (9 << SEGMENT_SHIFT) + 2]


def test_next_turn_extends_previous_prompt_and_output(workload) -> None:
    identity = BlockIdentity(workload)
    assert identity.rule == "context"
    t = workload.turns
    r0, r1 = _row(workload, 0, 0), _row(workload, 0, 1)
    kv_tokens = int(t.prompt_tokens[r0] + t.output_tokens[r0])
    assert t.prompt_tokens[r1] >= kv_tokens
    first = block_ids(identity, r0, kv_tokens, BT)
    second = block_ids(identity, r1, int(t.prompt_tokens[r1]), BT)
    assert second[:len(first)] == first
    assert len(second) > len(first)


def test_sessions_do_not_share_without_a_shared_prefix(workload) -> None:
    identity = BlockIdentity(workload)
    a = block_ids(identity, _row(workload, 0, 0), 512, BT)
    b = block_ids(identity, _row(workload, 1, 0), 512, BT)
    assert not set(a) & set(b)


def test_shared_prefix_is_shared_up_to_its_last_full_unit() -> None:
    workload = generate_agentic(small_spec(shared_prefix_tokens=100, duration_s=120))
    identity = BlockIdentity(workload)
    a = block_ids(identity, _row(workload, 0, 0), 256, BT)
    b = block_ids(identity, _row(workload, 1, 0), 256, BT)
    # 100 shared tokens: blocks 0-5 (tokens 0-95) are shared, block 6 (96-111) is not
    assert a[:6] == b[:6]
    assert a[6] != b[6]
    # chunks of 64 tokens: only chunk 0 lies wholly in the shared prefix
    ca = unit_ids(unit_ranges(identity.segments(_row(workload, 0, 0)), 64), 0, 4)
    cb = unit_ids(unit_ranges(identity.segments(_row(workload, 1, 0)), 64), 0, 4)
    assert ca[0] == cb[0] and ca[1] != cb[1]


def test_compacted_context_starts_a_new_segment() -> None:
    spec = AgenticSpec(seed=3, duration_s=600, context_cap_tokens=6000, at_cap="compact",
                       compact_tokens=1000, session_rate_per_min=4)
    workload = generate_agentic(spec)
    t = workload.turns
    compacted = t[t.context_start_turn > 0].iloc[0]
    sid, k = int(compacted.session_id), int(compacted.turn)
    identity = BlockIdentity(workload)
    before = block_ids(identity, _row(workload, sid, k - 1), 512, BT)
    after = block_ids(identity, _row(workload, sid, k), 512, BT)
    assert not set(before) & set(after)
    if k + 1 in set(t[t.session_id == sid].turn):
        later = block_ids(identity, _row(workload, sid, k + 1), 512, BT)
        assert later == after


def test_equal_prompt_keys_share_every_block() -> None:
    workload = microbenchmark(MicrobenchSpec(prompt_lengths=[1024, 2048], prompts_per_length=2))
    identity = BlockIdentity(workload)
    assert identity.rule == "keyed"
    t = workload.turns
    fill = t[t["round"] == "fill"].iloc[1]
    measure = t[(t["round"] == "measure") & (t.prompt_key == fill.prompt_key)].iloc[0]
    other = t[(t["round"] == "fill") & (t.prompt_key != fill.prompt_key)].iloc[0]
    ids = {name: block_ids(identity, int(row.name), int(row.prompt_tokens), BT)
           for name, row in (("fill", fill), ("measure", measure), ("other", other))}
    assert ids["fill"] == ids["measure"]
    assert not set(ids["fill"]) & set(ids["other"])


@pytest.fixture()
def trace_workload():
    frame = pd.DataFrame({
        "arrival_s": [0.0, 1.0, 2.0],
        "input_length": [1100, 1300, 1100],
        "output_length": [10, 10, 10],
        "hash_ids": [(1, 2, 3), (1, 2, 4), (1, 2, 3)],
    })
    return trace_to_workload(frame, block_size=512)


def test_trace_blocks_follow_hash_ids(trace_workload) -> None:
    identity = BlockIdentity(trace_workload)
    assert identity.rule == "trace"
    a, b, c = (block_ids(identity, row, 1100, BT) for row in range(3))
    # two full 512-token trace blocks = 64 sub-blocks of 16 shared; the tails differ
    assert a[:64] == b[:64]
    assert a[64] != b[64]
    # the same partial last hash: identical prompts share everything
    assert a == c
    assert len(a) == 1100 // BT


def test_trace_block_size_smaller_than_sim_block() -> None:
    frame = pd.DataFrame({"arrival_s": [0.0, 1.0], "input_length": [40, 40],
                          "output_length": [1, 1], "hash_ids": [(5, 6, 7), (5, 6, 8)]})
    workload = trace_to_workload(frame, block_size=16)
    identity = BlockIdentity(workload)
    a, b = (block_ids(identity, row, 40, 32) for row in range(2))
    assert a == b and len(a) == 1  # block 0 (tokens 0-31) ends in trace block 1 (hash 6)
