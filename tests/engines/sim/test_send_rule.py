"""The send rule both engines follow (`kvrepro.engines.send_rule`), on hand-written cases, and
the live client and the simulator planning the same send times for the same workload."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from kvrepro.engines import send_rule
from kvrepro.engines.live import client
from kvrepro.engines.live.client import session_plans
from kvrepro.engines.sim import entities, simulate
from kvrepro.engines.sim.entities import TurnTable
from kvrepro.workload import generate_agentic
from tests.engines.live.test_live_client import (
    SCHEDULE_ARRIVALS,
    SCHEDULE_ROWS,
    fake_run,
    table_workload,
)
from tests.engines.sim.conftest import PROFILE_PATH, small_spec

NAN = math.nan


@pytest.mark.parametrize(("pause_s", "not_before_s", "prev_finish_s", "arrival_s", "expected"), [
    (0.0, NAN, None, 7.0, 7.0),      # first turn, no bound: at arrival
    (0.0, 12.0, None, 7.0, 12.0),    # first turn with a bound: at the bound
    (0.0, 3.0, None, 7.0, 3.0),      # ... even one before the arrival
    (5.0, NAN, 20.0, 7.0, 25.0),     # closed loop: finish + pause
    (NAN, NAN, 20.0, 7.0, 20.0),     # an unknown pause counts as none
    (5.0, 30.0, 20.0, 7.0, 30.0),    # the bound comes later than finish + pause
    (5.0, 22.0, 20.0, 7.0, 25.0),    # finish + pause comes later than the bound
    (NAN, 18.0, 20.0, 7.0, 20.0),
    (5.0, 25.0, 20.0, 7.0, 25.0),    # a tie
])
def test_send_time_hand_cases(pause_s, not_before_s, prev_finish_s, arrival_s,
                              expected) -> None:
    assert send_rule.send_time_s(pause_s, not_before_s, prev_finish_s, arrival_s) == expected


def test_both_engines_call_the_one_rule() -> None:
    assert client.send_time_s is send_rule.send_time_s
    assert entities.send_time_s is send_rule.send_time_s


# session 3: NaN pause, open-loop second turn; session 4: first turn without a bound
ROWS = [(3, 0, 0.0, 15.0, 20, 4), (3, 1, np.nan, 40.0, 20, 4), (3, 2, 2.0, np.nan, 20, 4),
        (4, 0, 0.0, np.nan, 20, 4), (4, 1, 6.0, np.nan, 20, 4)]
ARRIVALS = {3: 15.0, 4: 9.0}
# (session, turn, previous finish) -> due time, worked out by hand
EXPECTED = {(3, 0, None): 15.0, (3, 1, 10.0): 40.0, (3, 1, 45.0): 45.0,
            (3, 2, 50.0): 52.0, (4, 0, None): 9.0, (4, 1, 30.0): 36.0}


def test_sim_table_and_live_plan_agree_with_hand_worked_times() -> None:
    wl = table_workload(ROWS, ARRIVALS)
    table = TurnTable.from_workload(wl)
    plans = {p.session_id: p for p in session_plans(wl)}
    assert [p.start_s for p in session_plans(wl)] == [9.0, 15.0]
    for (session_id, turn, prev_s), due_s in EXPECTED.items():
        pos = table.session_ids.index(session_id)
        sim_s = table.send_s(table.rows[pos][turn], prev_s, table.arrival_s[pos])
        plan = plans[session_id]
        live_s = (plan.start_s if prev_s is None
                  else client._due_s(plan.rows[turn], prev_s, plan.start_s))
        assert sim_s == live_s == due_s, (session_id, turn, prev_s)


def test_sim_sends_a_live_run_s_turns_when_the_live_client_did(tmp_path: Path) -> None:
    # the live client on virtual time sends each turn; given the same finishes, the
    # simulator's turn table puts every turn at the same moment
    _, rec, _ = fake_run(tmp_path)
    table = TurnTable.from_workload(table_workload(SCHEDULE_ROWS, SCHEDULE_ARRIVALS))
    for pos, session_id in enumerate(table.session_ids):
        prev_s = None
        for k, row in enumerate(table.rows[pos]):
            got = table.send_s(row, prev_s, table.arrival_s[pos])
            assert got == pytest.approx(rec.loc[(session_id, k), "send_s"])
            prev_s = float(rec.loc[(session_id, k), "finish_s"])


def test_live_plan_sends_a_simulated_run_s_turns_when_the_simulator_did() -> None:
    # the other way round: the simulator's records (finish as the client sees it) through
    # the live client's planning give the simulator's send times
    wl = generate_agentic(small_spec(duration_s=300))
    rec = simulate(wl, PROFILE_PATH, "dram", progress=False).records
    rec = rec.set_index(["session_id", "turn"]).sort_index()
    checked = 0
    for plan in session_plans(wl):
        prev_s = None
        for row in plan.rows:
            key = (plan.session_id, int(row.turn))
            if key not in rec.index:
                break  # not sent before the end of the run
            due_s = plan.start_s if prev_s is None else client._due_s(row, prev_s,
                                                                      plan.start_s)
            assert due_s == pytest.approx(rec.loc[key, "send_s"]), key
            prev_s = float(rec.loc[key, "finish_s"])
            checked += 1
    assert checked > 20
