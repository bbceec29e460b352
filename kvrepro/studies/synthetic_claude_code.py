"""A synthetic Claude Code telemetry export: agentic sessions under prompt-caching rules.

Study A's token mix (figure A1) comes from a private week of Claude Code traffic. This module
makes a stand-in by a mechanism, not by copying the study's shares:

1. Sessions: study A's agentic workload (`kvrepro.workload.generate_agentic`) with a few
   parameters changed for a week of coding with a 1M-token context model (`week_of_coding`):
   a week of Poisson session arrivals, a shared system prompt + tool definitions at the start
   of every context, a 1M context cap, heavier-tailed pauses (tool runs and human think time).
   The agentic workload has no session-length rule besides the cap, so each session here also
   draws a task length in turns (`SessionLengthSpec`) and ends there.
2. Timing: requests are closed loop, each sent a pause after the previous response; a response
   takes `first_token_s` + output / `output_tok_per_s`.
3. Prompt caching like Anthropic's (`apply_prompt_cache`): every request puts a cache
   breakpoint at the end of its last message, so the cached prefix grows with the session.
   A request within `ttl_s` of the previous one in its session reads the previous request's
   prefix (cache_read_tokens), writes the new part up to its breakpoint
   (cache_creation_tokens) and sends a few tokens after the breakpoint uncached (input_tokens).
   A longer gap is a miss: the whole prefix is written again, except the system prompt, which
   is read if any session used it within the TTL (it is byte-identical across sessions).
   Reads refresh the TTL. A compacted context starts a new prefix.
4. Export: `claude_code.api_request` log events in OTLP JSON lines as a collector's file
   exporter writes them (one line per session and 5-second log export interval), marked
   synthetic in the resource attributes; deterministic from the seed.

Not modelled: subagents and background Haiku calls, per-project system prompts, the minimum
cacheable prompt length, working hours (arrivals are uniform over the week), cost_usd.
"""

from __future__ import annotations

import gzip
import json
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from itertools import groupby
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from kvrepro.analysis.token_mix import token_mix
from kvrepro.workload.agentic import AgenticSpec, PauseSpec, generate_agentic
from kvrepro.workload.base import Workload

WEEK_S = 7 * 86_400


def week_of_coding(**changes: object) -> AgenticSpec:
    """Study A's agentic rules with the changes a week of Claude Code coding needs.

    Changed from `AgenticSpec()`: one week instead of 90 minutes, ~30 sessions a day (a few
    projects in parallel), no warm-up, a 1M-token context cap (Opus with 1M context),
    a 15K-token system prompt + tool definitions shared by all sessions, and pauses with a
    mean of 20 s and a heavy tail (lognormal, sigma 1.5: median 6.5 s for tool runs, ~7 %
    over a minute, ~0.5 % over 5 minutes for a human away). These are this package's
    assumptions; `changes` overrides any field.
    """
    params: dict[str, object] = {
        "duration_s": WEEK_S, "warmup_s": 0.0, "session_rate_per_min": 30 / 1440,
        "context_cap_tokens": 1_000_000,
        "shared_prefix_tokens": 15_000,
        "pause": PauseSpec(kind="lognormal", mean_s=20.0, sigma=1.5),
    }
    params.update(changes)
    return AgenticSpec(**params)


class SessionLengthSpec(BaseModel):
    """How many requests (turns) a session's task takes before the developer moves on."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["lognormal", "geometric", "fixed"] = "lognormal"
    mean_turns: float = Field(60.0, ge=1, description="mean requests per session")
    sigma: float = Field(1.0, ge=0, description="lognormal shape (std of log turns)")

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Draw `n` session lengths in turns (at least 1)."""
        if self.kind == "lognormal":
            mu = np.log(self.mean_turns) - self.sigma**2 / 2
            turns = rng.lognormal(mu, self.sigma, n)
        elif self.kind == "geometric":
            turns = rng.geometric(1 / self.mean_turns, n)
        else:
            turns = np.full(n, self.mean_turns)
        return np.maximum(np.rint(turns), 1).astype(np.int64)


class PromptCacheSpec(BaseModel):
    """Prompt-caching rules (Anthropic: 5-minute TTL by default, 1 hour optional)."""

    model_config = ConfigDict(extra="forbid")

    ttl_s: float = Field(300.0, gt=0, description="cache lifetime, refreshed by every read")
    uncached_tail_tokens: tuple[int, int] = Field(
        (1, 9), description="uniform range of tokens after the breakpoint, sent uncached")
    share_system_prompt: bool = Field(
        True, description="the system prompt prefix is one cache entry for all sessions")


class SyntheticClaudeCodeSpec(BaseModel):
    """Everything that determines a synthetic export; same spec, same bytes."""

    model_config = ConfigDict(extra="forbid")

    seed: int = Field(0, ge=0, description="one seed for everything (overrides agentic.seed)")
    agentic: AgenticSpec = Field(default_factory=week_of_coding)
    session_length: SessionLengthSpec = Field(default_factory=SessionLengthSpec)
    cache: PromptCacheSpec = Field(default_factory=PromptCacheSpec)
    first_token_s: float = Field(2.0, ge=0, description="time to first token per request")
    output_tok_per_s: float = Field(60.0, gt=0, description="decode rate of the model")
    model: str = Field("claude-opus-4-8[1m]", description="the `model` attribute (1M context)")
    start_unix_s: int = Field(1_772_409_600, description="time 0 (2026-03-02 00:00 UTC)")
    export_interval_s: float = Field(5.0, gt=0, description="Claude Code's log export interval")


# ----------------------------------------------------------------------------- requests


def session_requests(spec: SyntheticClaudeCodeSpec,
                     workload: Workload | None = None) -> pd.DataFrame:
    """One row per API request: the agentic turns cut to each session's task length, with
    send times from the closed-loop timing and the uncached tail after the breakpoint.

    `workload`: the agentic workload of `spec` if already generated (a sweep over session
    lengths reuses it)."""
    workload = workload or generate_agentic(spec.agentic.model_copy(update={"seed": spec.seed}))
    lengths = spec.session_length.draw(np.random.default_rng([spec.seed, 7]),
                                       len(workload.sessions))
    turns = workload.turns
    keep = turns.turn.to_numpy() < lengths[turns.session_id.to_numpy()]
    req = turns.loc[keep, ["session_id", "turn", "pause_s", "prompt_tokens", "output_tokens",
                           "context_start_turn", "is_resume"]].reset_index(drop=True)
    arrival_s = workload.sessions.set_index("session_id").arrival_s
    req["response_s"] = spec.first_token_s + req.output_tokens / spec.output_tok_per_s
    step_s = req.groupby("session_id").response_s.shift(1).fillna(0.0) + req.pause_s
    step_s = step_s.where(req.turn > 0, 0.0)
    req["send_s"] = req.session_id.map(arrival_s) + step_s.groupby(req.session_id).cumsum()
    low, high = spec.cache.uncached_tail_tokens
    tail = np.random.default_rng([spec.seed, 8]).integers(low, high + 1, len(req))
    req["tail_tokens"] = np.minimum(tail, req.prompt_tokens.to_numpy() - 1).clip(0)
    return req


def apply_prompt_cache(requests: pd.DataFrame, ttl_s: float,
                       shared_prefix_tokens: int = 0) -> pd.DataFrame:
    """Token counts of each request under prompt caching (rules in the module docstring).

    `requests` needs session_id, turn, send_s, prompt_tokens, tail_tokens and optionally
    context_start_turn (a change starts a new prefix). Adds cache_read_tokens,
    cache_creation_tokens, input_tokens (= tail) and cache_status: "first", "hit",
    "expired" (gap > TTL) or "compacted". Requests are replayed in time order because the
    shared system prompt's entry is kept warm by every session.
    """
    req = requests.reset_index(drop=True)
    start = req.context_start_turn if "context_start_turn" in req else pd.Series(0, req.index)
    order = np.lexsort((req.turn.to_numpy(), req.session_id.to_numpy(), req.send_s.to_numpy()))
    out = np.zeros((len(req), 2), dtype=np.int64)
    status = np.empty(len(req), dtype=object)
    sessions: dict[int, tuple[int, float, int]] = {}  # session -> (breakpoint, last use, start)
    shared_last_s = -np.inf
    cols = (req.session_id.to_numpy(), req.send_s.to_numpy(), req.prompt_tokens.to_numpy(),
            req.tail_tokens.to_numpy(), start.to_numpy())
    for i in order:
        session, send_s, prompt, tail, ctx = (c[i] for c in cols)
        breakpoint_tokens = int(prompt - tail)
        prev = sessions.get(session)
        if prev is not None and prev[2] == ctx and send_s - prev[1] <= ttl_s:
            read, status[i] = prev[0], "hit"
        else:
            warm = shared_prefix_tokens and ctx == 0 and send_s - shared_last_s <= ttl_s
            read = min(shared_prefix_tokens, breakpoint_tokens) if warm else 0
            status[i] = "first" if prev is None else ("compacted" if prev[2] != ctx else "expired")
        out[i] = (read, breakpoint_tokens - read)
        sessions[session] = (breakpoint_tokens, send_s, ctx)
        if ctx == 0:
            shared_last_s = max(shared_last_s, send_s)
    return req.assign(cache_read_tokens=out[:, 0], cache_creation_tokens=out[:, 1],
                      input_tokens=req.tail_tokens.astype("int64"), cache_status=status)


def synthetic_requests(spec: SyntheticClaudeCodeSpec | None = None) -> pd.DataFrame:
    """Requests with their cache token counts, for `spec` (default: a week of coding)."""
    spec = spec or SyntheticClaudeCodeSpec()
    shared = spec.agentic.shared_prefix_tokens if spec.cache.share_system_prompt else 0
    return apply_prompt_cache(session_requests(spec), spec.cache.ttl_s, shared)


# ----------------------------------------------------------------------------- OTLP export


def _attr(key: str, value: object) -> dict:
    """One OTLP attribute as proto3 JSON writes it (int64 as a string)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return {"key": key, "value": {"stringValue": str(value)}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"doubleValue": value}}


def _session_ids(seed: int, n: int) -> list[str]:
    raw = np.random.default_rng([seed, 9]).bytes(16 * n)
    return [str(uuid.UUID(bytes=raw[16 * i:16 * i + 16], version=4)) for i in range(n)]


class _Request(NamedTuple):
    send_s: float
    turn: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_creation_tokens: int
    response_s: float


def _log_record(row: _Request, session: str, spec: SyntheticClaudeCodeSpec,
                user_id: str) -> dict:
    """One `claude_code.api_request` log record with the attributes Claude Code sends."""
    time_ns = int(round((spec.start_unix_s + row.send_s) * 1e9))
    stamp = datetime.fromtimestamp(time_ns / 1e9, tz=UTC).isoformat(timespec="milliseconds")
    attrs = [("user.id", user_id), ("session.id", session), ("terminal.type", "vscode"),
             ("event.name", "api_request"), ("event.timestamp", stamp.replace("+00:00", "Z")),
             ("event.sequence", row.turn), ("model", spec.model),
             ("input_tokens", row.input_tokens), ("output_tokens", row.output_tokens),
             ("cache_read_tokens", row.cache_read_tokens),
             ("cache_creation_tokens", row.cache_creation_tokens),
             ("duration_ms", int(round(row.response_s * 1000))),
             ("request_id", f"req_synthetic_{session[:8]}_{row.turn:05d}")]
    return {"timeUnixNano": str(time_ns), "observedTimeUnixNano": str(time_ns + 1_000_000),
            "body": {"stringValue": "claude_code.api_request"},
            "attributes": [_attr(k, v) for k, v in attrs]}


def _resource() -> dict:
    return {"attributes": [_attr("service.name", "claude-code"),
                           _attr("service.version", "synthetic"), _attr("os.type", "linux"),
                           _attr("host.arch", "amd64"), _attr("kvrepro.synthetic", "true")]}


def otlp_log_lines(requests: pd.DataFrame, spec: SyntheticClaudeCodeSpec) -> list[str]:
    """OTLP JSON lines, one per session and log export interval, in time order (Claude Code
    exports each session's events every `export_interval_s`)."""
    ids = _session_ids(spec.seed, int(requests.session_id.max()) + 1)
    user_id = uuid.UUID(bytes=np.random.default_rng([spec.seed, 10]).bytes(16)).hex * 2
    window = np.floor(requests.send_s.to_numpy() / spec.export_interval_s).astype(np.int64)
    req = requests.assign(_window=window).sort_values(["_window", "session_id", "turn"])
    columns = [req[c].to_numpy().tolist() for c in _Request._fields]
    keys = zip(req._window.tolist(), req.session_id.tolist(), strict=True)
    rows = zip(keys, map(_Request._make, zip(*columns, strict=True)), strict=True)
    scope = {"name": "com.anthropic.claude_code.events", "version": "synthetic"}
    lines = []
    for (_, sid), batch in groupby(rows, key=lambda kv: kv[0]):
        records = [_log_record(row, ids[sid], spec, user_id) for _, row in batch]
        doc = {"resourceLogs": [{"resource": _resource(),
                                 "scopeLogs": [{"scope": scope, "logRecords": records}]}]}
        lines.append(json.dumps(doc, separators=(",", ":")))
    return lines


def write_otlp_export(requests: pd.DataFrame, path: str | Path,
                      spec: SyntheticClaudeCodeSpec) -> Path:
    """Write the requests as OTLP JSON lines (gzip if the name ends in .gz, fixed mtime so
    the same spec gives the same bytes)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = ("\n".join(otlp_log_lines(requests, spec)) + "\n").encode()
    if out.suffix == ".gz":
        with open(out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0,
                                                   filename="", compresslevel=6) as gz:
            gz.write(text)
    else:
        out.write_bytes(text)
    return out


def generate_claude_code_export(path: str | Path,
                                spec: SyntheticClaudeCodeSpec | None = None) -> pd.DataFrame:
    """Generate a synthetic export at `path`; returns the requests it holds."""
    spec = spec or SyntheticClaudeCodeSpec()
    requests = synthetic_requests(spec)
    write_otlp_export(requests, path, spec)
    return requests


# ----------------------------------------------------------------------------- analysis


def sample_spec() -> SyntheticClaudeCodeSpec:
    """The spec of the shipped sample `data/samples/claude_code_otlp_sample.jsonl.gz`: the
    default week's rules for one day (small enough to ship, same mechanism)."""
    return SyntheticClaudeCodeSpec(agentic=week_of_coding(duration_s=86_400))


def spec_table(spec: SyntheticClaudeCodeSpec) -> pd.DataFrame:
    """The parameters that shape the mix, one row each, for a notebook to show."""
    a, length, cache = spec.agentic, spec.session_length, spec.cache
    rows = [
        ("sessions per day", a.session_rate_per_min * 1440), ("days", a.duration_s / 86_400),
        ("session length: mean turns", length.mean_turns),
        (f"session length: {length.kind} sigma", length.sigma),
        ("system prompt + tools (tokens)", a.shared_prefix_tokens),
        ("context cap (tokens)", a.context_cap_tokens),
        ("tool result append (tokens)", str(a.tool_tokens)),
        ("file append (tokens), probability", f"{a.file_tokens}, {a.p_file}"),
        ("short output (tokens)", str(a.short_output_tokens)),
        ("code output (tokens), probability", f"{a.code_tokens}, {a.p_code}"),
        (f"pause: {a.pause.kind} mean (s), sigma", f"{a.pause.mean_s}, {a.pause.sigma}"),
        ("returning users: share, idle (s)", f"{a.p_returning}, {a.idle_s}"),
        ("cache TTL (s)", cache.ttl_s),
        ("uncached tail after breakpoint (tokens)", str(cache.uncached_tail_tokens)),
        ("response: first token (s), decode (tok/s)",
         f"{spec.first_token_s}, {spec.output_tok_per_s}"),
        ("seed", spec.seed),
    ]
    return pd.DataFrame(rows, columns=["parameter", "value"]).astype({"value": str})


def _with(spec: SyntheticClaudeCodeSpec, mean_turns: float, pause_mean_s: float,
          ttl_s: float) -> SyntheticClaudeCodeSpec:
    pause = spec.agentic.pause.model_copy(update={"mean_s": pause_mean_s})
    return spec.model_copy(update={
        "agentic": spec.agentic.model_copy(update={"pause": pause}),
        "session_length": spec.session_length.model_copy(update={"mean_turns": mean_turns}),
        "cache": spec.cache.model_copy(update={"ttl_s": ttl_s})})


def mix_sweep(spec: SyntheticClaudeCodeSpec | None = None,
              mean_turns: Sequence[float] = (15, 30, 60, 120, 240),
              pause_means_s: Sequence[float] = (5, 20, 60),
              ttls_s: Sequence[float] = (300, 3600)) -> pd.DataFrame:
    """The token mix as a function of session length, pause distribution and TTL.

    Every other parameter stays as in `spec`; the same seed gives every point the same
    sessions, so differences come from the swept parameter alone. Tidy frame: mean_turns,
    pause_mean_s, ttl_s, token_type, tokens, share_pct (plus requests and miss_pct).
    """
    spec = spec or SyntheticClaudeCodeSpec()
    frames = []
    for pause_mean_s in pause_means_s:
        base = _with(spec, spec.session_length.mean_turns, pause_mean_s, ttls_s[0])
        workload = generate_agentic(base.agentic.model_copy(update={"seed": spec.seed}))
        for turns in mean_turns:
            point = _with(spec, turns, pause_mean_s, ttls_s[0])
            requests = session_requests(point, workload)
            shared = point.agentic.shared_prefix_tokens if point.cache.share_system_prompt else 0
            for ttl_s in ttls_s:
                replay = apply_prompt_cache(requests, ttl_s, shared)
                miss_pct = float((replay.cache_status == "expired").mean() * 100)
                frames.append(token_mix(replay).assign(
                    mean_turns=turns, pause_mean_s=pause_mean_s, ttl_s=ttl_s,
                    requests=len(replay), miss_pct=miss_pct))
    columns = ["mean_turns", "pause_mean_s", "ttl_s", "token_type", "tokens", "share_pct",
               "requests", "miss_pct"]
    return pd.concat(frames, ignore_index=True)[columns]


__all__ = ["PromptCacheSpec", "SessionLengthSpec",
           "SyntheticClaudeCodeSpec", "apply_prompt_cache", "generate_claude_code_export",
           "mix_sweep", "otlp_log_lines", "sample_spec", "session_requests", "spec_table",
           "synthetic_requests", "week_of_coding", "write_otlp_export"]
