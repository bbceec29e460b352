"""Study A's agentic coding workload: long multi-turn sessions with returning users.

Rules (STUDY.md, study A), each a parameter of `AgenticSpec` with the study's value as
default: Poisson session arrivals (2.5/min); per turn an input append (tool result 250-600
tokens, or a file of 1,500-3,500 with probability `p_file`) and an output (40-200 tokens, or a
code block of 400-900 with probability `p_code`), each +-100 tokens of jitter; a pause between
turns; contexts grow monotonically up to a cap (65,536 tokens). A returning-user cohort goes
idle after about 20 turns for about 15 minutes, then resumes where it stopped.

At the cap a session ends by default (`at_cap="end"`): the next turn would not fit the model's
context. `at_cap="compact"` instead models an agent that summarises its history: that turn's
append is a `compact_tokens` summary that starts a new context (no shared prefix with before).

Study A does not give p_file, p_code or the pause distribution; the defaults here are this
package's choice. Turns are closed loop (sent a pause after the previous response); the
`planned_send_s` column is a nominal schedule assuming `nominal_turn_s` of server time per
turn, used only to decide which resumes fall inside the window and to end sessions that
would run far past it.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvrepro.workload.base import (
    SESSION_COLUMNS,
    TURN_COLUMNS,
    Workload,
    token_source_from_spec,
)

TokenRange = tuple[int, int]


class PauseSpec(BaseModel):
    """Distribution of the tool/think time between a response and the next turn."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["lognormal", "exponential", "uniform", "fixed"] = "lognormal"
    mean_s: float = Field(5.0, gt=0, description="mean pause (lognormal/exponential/fixed)")
    sigma: float = Field(1.0, ge=0, description="lognormal shape (std of log pause)")
    low_s: float = Field(1.0, ge=0, description="uniform lower bound")
    high_s: float = Field(10.0, gt=0, description="uniform upper bound")

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Draw `n` pauses in seconds."""
        if self.kind == "lognormal":
            mu = np.log(self.mean_s) - self.sigma**2 / 2
            return rng.lognormal(mu, self.sigma, n)
        if self.kind == "exponential":
            return rng.exponential(self.mean_s, n)
        if self.kind == "uniform":
            return rng.uniform(self.low_s, self.high_s, n)
        return np.full(n, self.mean_s)


class AgenticSpec(BaseModel):
    """Parameters of the agentic workload; defaults reproduce study A's rules."""

    model_config = ConfigDict(extra="forbid")

    seed: int = Field(0, ge=0, description="one seed for everything; same seed, same workload")
    session_rate_per_min: float = Field(2.5, gt=0, description="Poisson session arrivals")
    duration_s: float = Field(5400, gt=0, description="run length (90 min)")
    warmup_s: float = Field(180, ge=0, description="cache warm-up at the start, flagged")
    tool_tokens: TokenRange = Field((250, 600), description="tool/command result append")
    file_tokens: TokenRange = Field((1500, 3500), description="file append")
    p_file: float = Field(0.1, ge=0, le=1, description="probability an append is a file")
    short_output_tokens: TokenRange = Field((40, 200), description="tool call / short answer")
    code_tokens: TokenRange = Field((400, 900), description="code block output")
    p_code: float = Field(0.1, ge=0, le=1, description="probability an output is code")
    jitter_tokens: int = Field(100, ge=0, description="+- uniform jitter on every size")
    pause: PauseSpec = Field(default_factory=PauseSpec)
    context_cap_tokens: int = Field(65_536, gt=0, description="max prompt + output tokens")
    at_cap: Literal["end", "compact"] = "end"
    compact_tokens: int = Field(4096, gt=0, description="summary length when compacting")
    p_returning: float = Field(0.06, ge=0, le=1, description="share of sessions that go idle")
    idle_after_turns: int = Field(20, gt=0)
    idle_after_jitter_turns: int = Field(2, ge=0)
    idle_s: float = Field(900, gt=0, description="idle time before the resume (15 min)")
    idle_jitter_s: float = Field(60, ge=0)
    nominal_turn_s: float = Field(3.0, gt=0, description="server time per turn, for planning")
    plan_margin: float = Field(2.0, ge=1, description="end sessions planned past margin x run")
    vocab_size: int = Field(32_000, gt=16)
    shared_prefix_tokens: int = Field(0, ge=0, description="system prompt shared by sessions")

    @model_validator(mode="after")
    def _ranges_ordered(self) -> AgenticSpec:
        for name in ("tool_tokens", "file_tokens", "short_output_tokens", "code_tokens"):
            low, high = getattr(self, name)
            if not 0 < low <= high:
                raise ValueError(f"parameter {name!r} must be (low, high) with 0 < low <= high")
        if self.compact_tokens >= self.context_cap_tokens:
            raise ValueError("parameter 'compact_tokens' must be below 'context_cap_tokens'")
        return self


def _arrivals(spec: AgenticSpec) -> np.ndarray:
    """Poisson arrival times in [0, duration_s), from the arrivals' own generator."""
    rng = np.random.default_rng([spec.seed, 0])
    mean_gap_s = 60.0 / spec.session_rate_per_min
    expected = int(spec.duration_s / mean_gap_s)
    gaps = rng.exponential(mean_gap_s, expected + 10 * int(np.sqrt(expected + 1)) + 20)
    times = np.cumsum(gaps)
    while times[-1] < spec.duration_s:  # vanishingly rare: draw more
        times = np.concatenate([times, times[-1] + np.cumsum(rng.exponential(mean_gap_s, 100))])
    return times[times < spec.duration_s]


def _sizes(rng: np.random.Generator, n: int, base: TokenRange, alt: TokenRange, p_alt: float,
           jitter: int) -> tuple[np.ndarray, np.ndarray]:
    """Mixture of two uniform size ranges plus jitter; returns sizes and the alt flags."""
    is_alt = rng.random(n) < p_alt
    size = np.where(is_alt, rng.integers(alt[0], alt[1] + 1, n),
                    rng.integers(base[0], base[1] + 1, n))
    size = size + rng.integers(-jitter, jitter + 1, n)
    # Jitter can push a short size below zero; fold it back above half the smallest lower
    # bound instead of clipping, which would pile turns up at one value.
    floor = max(1, min(base[0], alt[0]) // 2)
    size = np.where(size < floor, 2 * floor - size, size)
    return np.maximum(size, 1), is_alt


class _Draws:
    """Per-session size and pause draws, produced in chunks from the session's generators."""

    def __init__(self, spec: AgenticSpec, session_id: int, chunk: int = 128):
        self.spec, self.chunk = spec, chunk
        self.sizes_rng = np.random.default_rng([spec.seed, 1, session_id])
        self.pause_rng = np.random.default_rng([spec.seed, 2, session_id])
        self.buffer: list[tuple] = []

    def next(self) -> tuple[int, str, int, str, float]:
        if not self.buffer:
            s, n = self.spec, self.chunk
            append, is_file = _sizes(self.sizes_rng, n, s.tool_tokens, s.file_tokens, s.p_file,
                                     s.jitter_tokens)
            output, is_code = _sizes(self.sizes_rng, n, s.short_output_tokens, s.code_tokens,
                                     s.p_code, s.jitter_tokens)
            pause = s.pause.draw(self.pause_rng, n)
            self.buffer = list(zip(append.tolist(), np.where(is_file, "file", "tool").tolist(),
                                   output.tolist(), np.where(is_code, "code", "short").tolist(),
                                   pause.tolist(), strict=True))[::-1]
        return self.buffer.pop()


def _resume_plan(spec: AgenticSpec, session_id: int) -> tuple[int, float]:
    """(turn index of the resume or -1, idle seconds) from the session's own generator."""
    rng = np.random.default_rng([spec.seed, 3, session_id])
    if rng.random() >= spec.p_returning:
        return -1, 0.0
    jitter = spec.idle_after_jitter_turns
    turn = spec.idle_after_turns + int(rng.integers(-jitter, jitter + 1))
    return max(turn, 1), spec.idle_s + float(rng.uniform(-spec.idle_jitter_s, spec.idle_jitter_s))


def _session_turns(spec: AgenticSpec, session_id: int, arrival_s: float) -> tuple[list, str]:
    """Turn rows of one session and why it ended ("cap" or "window")."""
    draws, (resume_turn, idle_s) = _Draws(spec, session_id), _resume_plan(spec, session_id)
    rows: list[tuple] = []
    context, start, clock_s = spec.shared_prefix_tokens, 0, arrival_s
    horizon_s = spec.plan_margin * spec.duration_s
    while True:
        turn = len(rows)
        append, a_kind, output, o_kind, pause_s = draws.next()
        pause_s = 0.0 if turn == 0 else (idle_s if turn == resume_turn else pause_s)
        planned_s = clock_s + pause_s
        if turn and planned_s > horizon_s:
            return rows, "window"
        if context + append + output > spec.context_cap_tokens:
            if spec.at_cap == "end" or turn == 0:
                return rows, "cap"
            append, a_kind, context, start = spec.compact_tokens, "summary", 0, turn
        prompt = context + append
        rows.append((session_id, turn, pause_s, arrival_s if turn == 0 else np.nan, append,
                     output, prompt, turn == resume_turn, a_kind, o_kind, start, planned_s))
        context, clock_s = prompt + output, planned_s + spec.nominal_turn_s


def generate_agentic(spec: AgenticSpec | None = None) -> Workload:
    """Generate study A's agentic workload; deterministic in `spec.seed`.

    Each component has its own generator (arrivals; per session: sizes, pauses, the
    returning-user plan; token ids), so lengthening the run or changing one session's rules
    leaves the other draws unchanged.
    """
    spec = spec or AgenticSpec()
    turn_rows: list[tuple] = []
    session_rows = []
    for session_id, arrival_s in enumerate(_arrivals(spec)):
        rows, end_reason = _session_turns(spec, session_id, float(arrival_s))
        turn_rows.extend(rows)
        resumed = any(r[7] for r in rows)
        session_rows.append((session_id, float(arrival_s), len(rows),
                             "returning" if resumed else "normal", arrival_s < spec.warmup_s,
                             end_reason))
    turn_cols = [*TURN_COLUMNS, "context_start_turn", "planned_send_s"]
    turns = pd.DataFrame(turn_rows, columns=turn_cols).astype(
        {**TURN_COLUMNS, "context_start_turn": "int64", "planned_send_s": "float64"})
    sessions = pd.DataFrame(session_rows, columns=list(SESSION_COLUMNS)).astype(SESSION_COLUMNS)
    spec_dict = {"kind": "agentic", "params": spec.model_dump(mode="json"),
                 "tokens": {"kind": "seeded", "seed": spec.seed, "vocab_size": spec.vocab_size,
                            "shared_prefix_tokens": spec.shared_prefix_tokens}}
    return Workload(spec_dict, sessions, turns, token_source_from_spec(spec_dict["tokens"], turns))


def resumes_in_window(workload: Workload) -> pd.DataFrame:
    """Resume turns whose planned send time lies inside the run (after warm-up)."""
    params = workload.spec["params"]
    t = workload.turns
    inside = (t.planned_send_s >= params["warmup_s"]) & (t.planned_send_s < params["duration_s"])
    return t[t.is_resume & inside]
