"""When a turn is sent: the one rule the live load client and the simulator both follow.

Both engines replay a `Workload` closed loop per session, so they must agree on when each
turn goes out; the rule lives here, under their common parent, so that neither engine
imports the other. It takes plain numbers (the simulator calls it once per turn).
"""

from __future__ import annotations

import math


def send_time_s(pause_s: float, not_before_s: float, prev_finish_s: float | None,
                arrival_s: float) -> float:
    """The time a turn is due: max(previous finish + pause, not_before).

    `prev_finish_s` is when the session's previous turn finished as the client saw it
    (None for a session's first turn); `pause_s` is the user's pause after it (NaN counts as
    0); `not_before_s` is the earliest time the turn may go (NaN: no such bound). A first
    turn is due at its `not_before_s` when it has one, else at the session's `arrival_s`.
    """
    if prev_finish_s is None:
        return arrival_s if math.isnan(not_before_s) else not_before_s
    due_s = prev_finish_s + (0.0 if math.isnan(pause_s) else pause_s)
    return not_before_s if due_s < not_before_s else due_s  # False when either is NaN
