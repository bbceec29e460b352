"""Entities of the simulated engine: requests and the workload's turn table.

A `Request` follows vLLM v1's bookkeeping: `num_tokens` = prompt + tokens generated so far,
`computed_tokens` = tokens whose KV is on the GPU. Each step schedules
num_tokens - computed_tokens tokens (capped by the budget); when a step brings
computed_tokens up to num_tokens, it samples one token. A prefill is the first such stretch,
a decode step schedules exactly one token, and a preempted request restarts from
computed_tokens = 0 with its generated tokens kept (so its recompute covers them too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from kvrepro.engines.send_rule import send_time_s
from kvrepro.engines.sim.prefix_units import Segments, UnitRanges
from kvrepro.workload.base import Workload


class RequestState(IntEnum):
    """Where a request is: queued, loading KV from offload, running, or done."""

    WAITING = 0
    LOADING = 1
    RUNNING = 2
    FINISHED = 3


@dataclass(slots=True, eq=False)
class Request:
    """One turn being served, with what the records report about it."""

    rid: int
    session_id: int
    turn: int
    row: int
    send_s: float
    prompt_tokens: int
    output_tokens: int
    is_resume: bool
    segments: Segments
    block_ranges: UnitRanges
    segment_numbers: list[int]
    state: RequestState = RequestState.WAITING
    computed_tokens: int = 0
    generated_tokens: int = 0
    blocks: int = 0
    committed_blocks: int = 0
    saved_chunks: int = 0
    pending_tokens: int = 0
    chunk_ranges: UnitRanges = ()
    chunk_ids: list[int] = field(default_factory=list)
    chunk_ids_end: int = -1
    """Ids of the request's first `chunk_ids_end` chunks (the scheduler's lookups keep them)."""
    queued_s: float = math.nan
    """When vLLM's engine core would take it in (`Scheduler.add_request`, its QUEUED stamp):
    its arrival, or the end of the step then in flight (`EngineCore.run_busy_loop` reads its
    input queue, then steps; vLLM's queue time ends at the `schedule()` that admits it)."""
    admitted_s: float = math.nan
    first_token_s: float = math.nan
    finish_s: float = math.nan
    cached_prompt_tokens: int = -1
    gpu_hit_tokens: int = 0
    loaded_tokens: list[int] = field(default_factory=list)
    recomputed_tokens: int = 0
    load_s: float = 0.0
    front_stretch: float = 1.0  # the API server's (host_cpu) when it arrived
    lookup_stretch: float = 1.0  # the LMCache server's (host_cpu) at its lookup
    host_stretch: float = 1.0  # the steps' host part's (host_cpu) at its first token
    lookup_ready_s: float = math.nan
    lookup_round: int = 0
    preemptions: int = 0
    load_seq: int = 0
    """Order of the request's asynchronous load among the server's (they queue in it)."""
    session_pos: int = 0
    turn_pos: int = 0

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens (what a recompute after preemption must cover)."""
        return self.prompt_tokens + self.generated_tokens


@dataclass
class TurnTable:
    """The workload's turns as plain lists, per session in turn order (fast scalar access)."""

    session_ids: list[int]
    arrival_s: list[float]
    rows: list[list[int]]
    turn: list[int]
    pause_s: list[float]
    not_before_s: list[float]
    prompt_tokens: list[int]
    output_tokens: list[int]
    is_resume: list[bool]

    @classmethod
    def from_workload(cls, workload: Workload) -> TurnTable:
        """Group `workload.turns` by session (positions index the original table)."""
        turns = workload.turns
        order = np.lexsort((turns["turn"].to_numpy(), turns["session_id"].to_numpy()))
        sessions = turns["session_id"].to_numpy()[order]
        cut = np.flatnonzero(np.diff(sessions)) + 1
        groups = np.split(order, cut) if len(order) else []
        arrivals = dict(zip(workload.sessions["session_id"].tolist(),
                            workload.sessions["arrival_s"].tolist(), strict=True))
        ids = sessions[np.r_[0, cut]].tolist() if len(order) else []
        return cls(
            session_ids=ids, arrival_s=[float(arrivals.get(s, 0.0)) for s in ids],
            rows=[g.tolist() for g in groups], turn=turns["turn"].astype("int64").tolist(),
            pause_s=turns["pause_s"].astype("float64").tolist(),
            not_before_s=turns["not_before_s"].astype("float64").tolist(),
            prompt_tokens=turns["prompt_tokens"].astype("int64").tolist(),
            output_tokens=turns["output_tokens"].astype("int64").tolist(),
            is_resume=turns["is_resume"].astype(bool).tolist())

    def send_s(self, row: int, prev_finish_s: float | None, arrival_s: float) -> float:
        """When turn `row` is due: `kvrepro.engines.send_rule.send_time_s`, the live
        client's rule (max(previous finish + pause, not_before); a first turn without a
        not_before goes at arrival)."""
        return send_time_s(self.pause_s[row], self.not_before_s[row], prev_finish_s, arrival_s)
