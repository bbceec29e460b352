"""Events and entities: queue order, request bookkeeping, turn send times."""

from __future__ import annotations

import math

import pandas as pd

from kvrepro.engines.sim.entities import Request, TurnTable
from kvrepro.engines.sim.events import EventKind, EventQueue, LoadDone, Sample, StepEnd, TurnArrival
from kvrepro.engines.sim.prefix_units import OPEN
from kvrepro.workload.base import TURN_COLUMNS, SeededTokens, Workload


def _request() -> Request:
    return Request(rid=0, session_id=3, turn=1, row=0, send_s=0.0, prompt_tokens=100,
                   output_tokens=5, is_resume=False, segments=((0, 0),),
                   block_ranges=((0, 0, OPEN),), segment_numbers=[0])


def test_queue_orders_by_time_then_kind_then_push_order() -> None:
    queue = EventQueue()
    req = _request()
    events = [Sample(1.0), StepEnd(1.0, 7), TurnArrival(1.0, 0, 1), LoadDone(1.0, req),
              TurnArrival(0.5, 2, 0), TurnArrival(1.0, 0, 2), Sample(2.0)]
    for event in events:
        queue.push(event)
    assert queue.peek_time_s() == 0.5
    popped = [queue.pop() for _ in range(len(events))]
    assert [type(e).__name__ for e in popped] == [
        "TurnArrival", "LoadDone", "TurnArrival", "TurnArrival", "StepEnd", "Sample", "Sample"]
    assert [e.turn_pos for e in popped if isinstance(e, TurnArrival)] == [0, 1, 2]
    assert not queue and queue.peek_time_s() == math.inf
    assert EventKind.LOAD_DONE < EventKind.ARRIVAL < EventKind.STEP_END < EventKind.SAMPLE


def test_request_num_tokens_counts_generated() -> None:
    req = _request()
    assert req.num_tokens == 100
    req.generated_tokens = 3
    assert req.num_tokens == 103
    assert math.isnan(req.first_token_s) and req.cached_prompt_tokens == -1


def test_turn_table_groups_sessions_and_applies_the_send_rule() -> None:
    turns = pd.DataFrame({
        "session_id": [5, 2, 5, 2], "turn": [1, 0, 0, 1], "pause_s": [3.0, 0.0, 0.0, 1.0],
        "not_before_s": [math.nan, 10.0, 20.0, 15.0], "append_tokens": 10,
        "output_tokens": 5, "prompt_tokens": [25, 10, 10, 25], "is_resume": False,
        "append_kind": "x", "output_kind": "y"}).astype(TURN_COLUMNS)
    sessions = pd.DataFrame({"session_id": [2, 5], "arrival_s": [10.0, 20.0], "n_turns": 2,
                             "cohort": "c", "is_warmup": False, "end_reason": "e"})
    table = TurnTable.from_workload(Workload({}, sessions, turns, SeededTokens(0)))
    assert table.session_ids == [2, 5]
    assert table.rows == [[1, 3], [2, 0]]
    assert table.arrival_s == [10.0, 20.0]
    assert table.send_s(1, None, 10.0) == 10.0
    assert table.send_s(3, 11.0, 10.0) == 15.0  # not_before wins over finish + pause
    assert table.send_s(3, 20.0, 10.0) == 21.0  # finish + pause wins
    assert table.send_s(0, 30.0, 20.0) == 33.0  # closed loop: no not_before
