"""Events of the simulated engine and the queue that orders them.

One small dataclass per event type (not frozen: nothing changes an event, and a frozen
dataclass takes five times as long to make). The queue orders events by (time, kind, seq):
at equal times a finished load and an arriving turn are handled before a step ends, so the
step that starts then already sees them, and a sample comes last, seeing the state after
everything else at that instant. `seq` (order of pushing) breaks the remaining ties, so a run is
deterministic. In a fleet (`kvrepro.engines.sim.fleet`) all servers share one queue and one
clock; the events of one server carry its `instance` (0 for a single server).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar, Union

from kvrepro.engines.sim.entities import Request


class EventKind(IntEnum):
    """Tie-break order of events at the same time (lower first)."""

    LOAD_DONE = 0
    LOOKUP_DONE = 1
    ARRIVAL = 2
    STEP_END = 3
    SAMPLE = 4


@dataclass(slots=True)
class LoadDone:
    """An asynchronous KV load for `request` has landed in GPU memory."""

    time_s: float
    request: Request
    instance: int = 0
    kind: ClassVar[int] = EventKind.LOAD_DONE


@dataclass(slots=True)
class LookupDone:
    """An asynchronous offload lookup for `request` has its answer (the request can be
    admitted from the next step on)."""

    time_s: float
    request: Request
    instance: int = 0
    kind: ClassVar[int] = EventKind.LOOKUP_DONE


@dataclass(slots=True)
class TurnArrival:
    """Turn `turn_pos` (position within its session) of session `session_pos` is sent."""

    time_s: float
    session_pos: int
    turn_pos: int
    reserved: bool = False
    """Sent from the client's backlog: the slot it takes was reserved when it was freed, so
    no turn that became due later can take it first (FIFO)."""
    kind: ClassVar[int] = EventKind.ARRIVAL


@dataclass(slots=True)
class StepEnd:
    """The engine step started earlier finishes (its plan is the engine's current one)."""

    time_s: float
    step: int
    instance: int = 0
    kind: ClassVar[int] = EventKind.STEP_END


@dataclass(slots=True)
class Sample:
    """Time to write a server sample."""

    time_s: float
    kind: ClassVar[int] = EventKind.SAMPLE


Event = Union[LoadDone, LookupDone, TurnArrival, StepEnd, Sample]  # noqa: UP007 - runtime alias


class EventQueue:
    """A heap of (time_s, kind, seq, event); `seq` counts pushes."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Event]] = []
        self._seq = 0

    def push(self, event: Event) -> None:
        """Add an event."""
        heapq.heappush(self._heap, (event.time_s, event.kind, self._seq, event))
        self._seq += 1

    def pop(self) -> Event:
        """Remove and return the earliest event."""
        return heapq.heappop(self._heap)[3]

    def peek_time_s(self) -> float:
        """Time of the earliest event (inf when empty)."""
        return self._heap[0][0] if self._heap else float("inf")

    def step_end_limit(self, hard_end_s: float) -> tuple[float, bool]:
        """How late a step end pushed now could be and still be the next event handled (the
        engine's loop stops after `hard_end_s`): (limit_s, inclusive), i.e. a step end at
        t comes first iff t < limit_s, or t == limit_s and `inclusive`.

        At equal times a step end goes after a load, a lookup, an arrival and an earlier
        step end (kind, then push order) and before a sample."""
        if not self._heap:
            return hard_end_s, True
        head_s, kind = self._heap[0][0], self._heap[0][1]
        if hard_end_s < head_s:
            return hard_end_s, True
        return head_s, kind > EventKind.STEP_END

    def __len__(self) -> int:
        return len(self._heap)
