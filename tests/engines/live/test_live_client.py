"""The live load client against a local fake `/v1/completions` server, and its scheduling on
a fake clock.

The fake server streams like vLLM 0.32 (first chunk echoes `prompt_token_ids`, every chunk has
the new `token_ids`, a final usage chunk with `prompt_tokens_details.cached_tokens`, then
`[DONE]`) and can be told to misbehave for one (session, turn). It identifies a session by its
prompt's first token and a turn by how many requests that session sent before.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import socket
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from aiohttp import web

from kvrepro.engines.live.client import (
    SERVER_KEEPALIVE_S,
    ClientConfig,
    ClientStats,
    FakeClock,
    Reply,
    completions_url,
    run_workload,
    run_workload_sync,
    session_plans,
)
from kvrepro.records import RunWriter, read_run
from kvrepro.workload.agentic import AgenticSpec, PauseSpec, generate_agentic
from kvrepro.workload.base import TURN_COLUMNS, SeededTokens, Workload

BLOCK = 16
OUT_BASE = 40_000  # server output ids lie above the workload's vocabulary: easy to spot


# --------------------------------------------------------------------------- fake server


class FakeServer:
    """Streaming completions endpoint; `modes[(first_token, turn)]` picks a misbehaviour."""

    def __init__(self, tokens_per_chunk: int = 4, chunk_delay_s: float = 0.0):
        self.tokens_per_chunk, self.chunk_delay_s = tokens_per_chunk, chunk_delay_s
        self.modes: dict[tuple[int, int], str] = {}
        self.requests: dict[tuple[int, int], dict[str, Any]] = {}
        self.counts: Counter[int] = Counter()
        self.history: list[list[int]] = []
        self.dropped = 0
        self.release = asyncio.Event()
        self.url = ""

    async def __aenter__(self) -> FakeServer:
        app = web.Application()
        app.router.add_post("/v1/completions", self.handle)
        self.runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                                    shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        await self.runner.cleanup()

    def cached_tokens(self, prompt: list[int]) -> int:
        """Longest shared prefix with an earlier prompt + output, in whole 16-token blocks."""
        best = 0
        for seq in self.history:
            n = min(len(seq), len(prompt))
            diff = np.flatnonzero(np.asarray(seq[:n]) != np.asarray(prompt[:n]))
            best = max(best, int(diff[0]) if len(diff) else n)
        return min(best, len(prompt) - 1) // BLOCK * BLOCK

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt, n_out = body["prompt"], body["max_tokens"]
        key = (prompt[0], self.counts[prompt[0]])
        mode = self.modes.get(key, "ok")
        if mode.startswith("drop"):  # close without an answer: "drop" once, "drop_all" always
            self.modes[key] = mode if mode == "drop_all" else "ok"
            self.dropped += 1
            request.transport.close()
            return web.Response()
        self.counts[prompt[0]] += 1
        out = [OUT_BASE + (len(prompt) * 7 + j) % 1000 for j in range(n_out)]
        usage = {"prompt_tokens": len(prompt), "completion_tokens": n_out,
                 "total_tokens": len(prompt) + n_out,
                 "prompt_tokens_details": {"cached_tokens": self.cached_tokens(prompt)}}
        self.requests[key] = {"body": body, "mode": mode, "output_ids": out, "usage": usage,
                              "peer": request.transport.get_extra_info("peername")}
        if mode == "http500":
            error = {"message": "boom: engine died", "type": "InternalServerError", "code": 500}
            return web.json_response({"error": error}, status=500)
        if mode == "json200":  # an error body with a success status, not an event stream
            error = {"message": "prompt too long for this model", "type": "BadRequestError"}
            return web.json_response({"error": error}, status=200)
        self.history.append(prompt + out)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await self.stream(request, resp, mode, prompt, out, usage)
        return resp

    async def stream(self, request: web.Request, resp: web.StreamResponse, mode: str,
                     prompt: list[int], out: list[int], usage: dict[str, Any]) -> None:
        if mode == "hang":
            await self.release.wait()
            return
        step = self.tokens_per_chunk
        for i in range(0, len(out), step):
            ids = out[i:i + step]
            choice = {"index": 0, "text": "".join(f" t{t}" for t in ids), "logprobs": None,
                      "finish_reason": "length" if i + step >= len(out) else None,
                      "prompt_token_ids": prompt if i == 0 else None}
            if mode != "no_ids":
                choice["token_ids"] = ids
            await send(resp, {"id": "cmpl-1", "object": "text_completion", "choices": [choice]})
            if mode == "break":
                request.transport.close()
                return
            if mode == "error_chunk":
                error = {"message": "request aborted", "type": "BadRequestError", "code": 400}
                await send(resp, {"error": error})
                return
            if mode == "malformed":
                await resp.write(b'data: {"id": "cmpl-1", "choices": [\n\n')
            if self.chunk_delay_s:
                await asyncio.sleep(self.chunk_delay_s)
        if mode != "no_usage":
            await send(resp, {"id": "cmpl-1", "object": "text_completion", "choices": [],
                              "usage": usage})
        await resp.write(b"data: [DONE]\n\n")


async def send(resp: web.StreamResponse, chunk: dict[str, Any]) -> None:
    await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")


# --------------------------------------------------------------------------- workloads


def small_workload(n_sessions: int, spread_s: float = 0.02, pause_s: float = 0.005) -> Workload:
    """A few short agentic sessions squeezed into real-time milliseconds."""
    spec = AgenticSpec(seed=3, duration_s=60, session_rate_per_min=30, context_cap_tokens=700,
                       compact_tokens=256, tool_tokens=(40, 90), file_tokens=(120, 200),
                       short_output_tokens=(6, 12), code_tokens=(20, 30), jitter_tokens=2,
                       pause=PauseSpec(kind="fixed", mean_s=1.0), p_returning=0.0)
    wl = generate_agentic(spec)
    sessions = wl.sessions[wl.sessions.session_id < n_sessions].copy()
    assert len(sessions) == n_sessions
    sessions["arrival_s"] = sessions.session_id * spread_s
    turns = wl.turns[wl.turns.session_id < n_sessions].copy()
    turns["pause_s"] = np.where(turns.turn == 0, 0.0, pause_s)
    turns["not_before_s"] = np.where(turns.turn == 0, turns.session_id * spread_s, np.nan)
    out = dataclasses.replace(wl, sessions=sessions.reset_index(drop=True),
                              turns=turns.reset_index(drop=True))
    firsts = [first_token(out, s) for s in range(n_sessions)]
    assert len(set(firsts)) == n_sessions  # the fake server tells sessions apart by these
    return out


def table_workload(turn_rows: list[tuple], arrivals: dict[int, float],
                   extra: dict[str, list] | None = None) -> Workload:
    """A hand-written workload: rows of (session, turn, pause_s, not_before_s, append, out)."""
    turns = pd.DataFrame(turn_rows, columns=["session_id", "turn", "pause_s", "not_before_s",
                                             "append_tokens", "output_tokens"])
    turns["prompt_tokens"] = turns.append_tokens
    turns["is_resume"], turns["append_kind"], turns["output_kind"] = False, "tool", "short"
    turns = turns[list(TURN_COLUMNS)].astype(TURN_COLUMNS)
    for name, values in (extra or {}).items():
        turns[name] = values
    sessions = pd.DataFrame({"session_id": list(arrivals), "arrival_s": list(arrivals.values())})
    sessions["n_turns"] = sessions.session_id.map(turns.groupby("session_id").size())
    sessions["cohort"], sessions["is_warmup"], sessions["end_reason"] = "normal", False, "cap"
    return Workload({"kind": "table"}, sessions, turns, SeededTokens(seed=11))


def first_token(wl: Workload, session_id: int) -> int:
    return int(wl.prompt_ids(session_id, 0)[0])


def config(url: str, **kwargs: Any) -> ClientConfig:
    return ClientConfig(**{"base_url": url, "model": "/m", "tier": "test",
                           "request_timeout_s": 5.0, "drain_timeout_s": 2.0, **kwargs})


def run(wl: Workload, run_dir: Path, cfg: ClientConfig, **kwargs: Any) -> ClientStats:
    """One run writing into `run_dir`; returns the stats (records are read back by tests)."""
    async def go() -> ClientStats:
        with RunWriter(run_dir, {"engine": "live"}) as writer:
            return await run_workload(wl, writer, cfg, **kwargs)
    return asyncio.run(go())


def with_server(server: FakeServer, wl: Workload, run_dir: Path,
                cfg_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> ClientStats:
    async def go() -> ClientStats:
        async with server:
            with RunWriter(run_dir, {"engine": "live"}) as writer:
                cfg = config(server.url, **(cfg_kwargs or {}))
                return await run_workload(wl, writer, cfg, **kwargs)
    return asyncio.run(go())


def server_request(server: FakeServer, wl: Workload, sid: int, turn: int) -> dict[str, Any]:
    return server.requests[(first_token(wl, sid), turn)]


# --------------------------------------------------------------------------- HTTP tests


def test_records_prompts_and_body_against_a_streaming_server(tmp_path: Path) -> None:
    # Sessions 0.4 s apart and a 0.2 s warm-up: session 0's first send falls inside it and
    # session 3's outside, even where the client takes 100 ms to start (CI once took > 30 ms).
    wl = small_workload(4, spread_s=0.4)
    server = FakeServer()
    stats = with_server(server, wl, tmp_path, {"warmup_s": 0.2, "extra_body": {"seed": 7}})
    records = read_run(tmp_path).records
    assert stats.requests_ok == len(wl.turns) == len(records) == len(server.requests)
    assert stats.sessions_completed == 4 and stats.requests_failed == 0
    assert stats.fallback_outputs == stats.usage_missing == stats.task_crashes == 0
    assert stats.stopped_by == "completed"
    for rec in records.itertuples():
        req = server_request(server, wl, rec.session_id, rec.turn)
        planned = wl.turns[(wl.turns.session_id == rec.session_id) & (wl.turns.turn == rec.turn)]
        assert rec.error == "" and rec.engine == "live" and rec.tier == "test"
        assert rec.prompt_tokens == len(req["body"]["prompt"]) == req["usage"]["prompt_tokens"]
        cached = req["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert rec.cached_prompt_tokens == cached
        assert rec.output_tokens == int(planned.output_tokens.iloc[0]) == req["body"]["max_tokens"]
        assert rec.send_s < rec.first_token_s <= rec.finish_s
        assert rec.is_warmup == (rec.send_s < 0.2)
    assert records.is_warmup.any() and not records.is_warmup.all()
    body = server_request(server, wl, 0, 0)["body"]
    assert body["model"] == "/m" and body["ignore_eos"] is True and body["temperature"] == 0
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["return_token_ids"] is True and body["seed"] == 7


def test_next_prompt_carries_the_servers_own_output_ids(tmp_path: Path) -> None:
    wl = small_workload(3)
    server = FakeServer()
    with_server(server, wl, tmp_path)
    records = read_run(tmp_path).records
    for sid in range(3):
        n_turns = int((wl.turns.session_id == sid).sum())
        assert n_turns >= 3
        outs = []
        for turn in range(n_turns - 1):
            req, nxt = (server_request(server, wl, sid, t) for t in (turn, turn + 1))
            prompt, out = req["body"]["prompt"], req["output_ids"]
            outs.append(np.asarray(out))
            assert nxt["body"]["prompt"][:len(prompt) + len(out)] == prompt + out
            expected = wl.prompt_ids(sid, turn + 1, outputs=outs).tolist()
            assert nxt["body"]["prompt"] == expected
            rec = records[(records.session_id == sid) & (records.turn == turn + 1)].iloc[0]
            assert rec.cached_prompt_tokens >= len(prompt) // BLOCK * BLOCK > 0


def test_failures_are_recorded_the_session_ends_and_the_run_goes_on(tmp_path: Path) -> None:
    wl = small_workload(8)
    server = FakeServer()
    plan = {(0, 1): "http500", (1, 0): "break", (2, 2): "malformed", (3, 1): "hang",
            (4, 0): "no_usage", (5, 1): "no_ids", (7, 1): "error_chunk"}
    server.modes = {(first_token(wl, s), t): mode for (s, t), mode in plan.items()}
    # 1 s: the hanging request times out, a loaded CI machine's answers do not
    stats = with_server(server, wl, tmp_path, {"request_timeout_s": 1.0})
    rec = read_run(tmp_path).records.set_index(["session_id", "turn"]).sort_index()
    expected = {(0, 1): "HTTP 500: boom: engine died", (1, 0): "stream broken mid-response",
                (2, 2): "malformed JSON chunk", (3, 1): "timeout: no complete response within",
                (7, 1): "server error in stream: request aborted"}
    for (sid, turn), text in expected.items():
        assert rec.loc[(sid, turn), "error"].startswith(text), rec.loc[(sid, turn), "error"]
        assert rec.loc[sid].index.max() == turn  # nothing sent after the failed turn
        assert (first_token(wl, sid), turn + 1) not in server.requests
    assert math.isnan(rec.loc[(0, 1), "first_token_s"])
    assert rec.loc[(1, 0), "first_token_s"] > rec.loc[(1, 0), "send_s"]  # partial reply kept
    assert stats.sessions_ended_by_error == 5
    assert sorted(stats.error_ended_sessions) == [0, 1, 2, 3, 7]
    assert stats.requests_failed == 5 and stats.sessions_completed == 3
    for sid in (4, 5, 6):  # the other sessions ran to the end
        assert len(rec.loc[sid]) == int((wl.turns.session_id == sid).sum())
        assert (rec.loc[sid, "error"] == "").all()
    no_usage = rec.loc[(4, 0)]
    assert math.isnan(no_usage.cached_prompt_tokens) and stats.usage_missing == 1
    assert no_usage.output_tokens == int(wl.turns.output_tokens[wl.turns.session_id == 4].iloc[0])
    assert no_usage.prompt_tokens == len(server_request(server, wl, 4, 0)["body"]["prompt"])
    assert stats.fallback_outputs == 1  # session 5 turn 1: no ids, nominal ones stand in
    outs = [np.asarray(server_request(server, wl, 5, 0)["output_ids"])]
    assert server_request(server, wl, 5, 2)["body"]["prompt"] == wl.prompt_ids(
        5, 2, outputs=outs).tolist()


def test_http_200_with_a_json_error_body_keeps_the_servers_message(tmp_path: Path) -> None:
    wl = small_workload(2)
    server = FakeServer()
    server.modes = {(first_token(wl, 0), 0): "json200"}
    with_server(server, wl, tmp_path)
    rec = read_run(tmp_path).records.set_index(["session_id", "turn"])
    error = rec.loc[(0, 0), "error"]
    assert error.startswith("stream ended without [DONE] after 0 chunk(s)"), error
    assert error.endswith("the server said: prompt too long for this model"), error
    assert (rec.loc[1, "error"] == "").all()


def test_refused_connection_is_recorded(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    wl = small_workload(3)
    stats = run(wl, tmp_path, config(f"http://127.0.0.1:{port}"))
    records = read_run(tmp_path).records
    assert len(records) == 3 and (records.turn == 0).all()
    assert records.error.str.startswith("connection refused").all()
    assert stats.requests_failed == 3 and stats.sessions_ended_by_error == 3
    assert stats.turns_not_sent == len(wl.turns) - 3


@pytest.mark.parametrize("keepalive_s", [0.2, 2.0])
def test_a_connection_idle_past_the_keepalive_is_not_reused(tmp_path: Path,
                                                           keepalive_s: float) -> None:
    """A server closes idle connections after its keep-alive (vLLM: 5 s); a client that
    reuses one it is closing loses the request, so the client's pool lets them go first."""
    rows = [(0, 0, 0.0, 0.0, 40, 4), (0, 1, 0.6, np.nan, 20, 4)]
    wl = table_workload(rows, {0: 0.0})
    server = FakeServer()
    with_server(server, wl, tmp_path, {"keepalive_timeout_s": keepalive_s})
    peers = [server_request(server, wl, 0, turn)["peer"] for turn in (0, 1)]
    assert (peers[0] != peers[1]) == (keepalive_s < 0.6)  # a new connection after the pause


@pytest.mark.parametrize("mode", ["drop", "drop_all"])
def test_a_request_the_server_closed_unanswered_goes_once_more(tmp_path: Path,
                                                              mode: str) -> None:
    wl = small_workload(2)
    server = FakeServer()
    server.modes[(first_token(wl, 1), 1)] = mode
    stats = with_server(server, wl, tmp_path)
    records = read_run(tmp_path).records
    failed = records[records.error != ""]
    if mode == "drop":  # the second try is answered: nothing is lost
        assert server.dropped == 1 and stats.connection_retries == 1
        assert failed.empty and stats.requests_ok == len(wl.turns)
    else:  # one retry, then the failure is recorded and the session ends
        assert server.dropped == 2 and stats.connection_retries == 1
        assert list(zip(failed.session_id, failed.turn, strict=True)) == [(1, 1)]
        assert failed.error.iloc[0].startswith("stream broken")


def test_a_stream_broken_after_its_first_chunk_is_not_sent_again(tmp_path: Path) -> None:
    wl = small_workload(1)
    server = FakeServer()
    server.modes[(first_token(wl, 0), 1)] = "break"
    stats = with_server(server, wl, tmp_path)
    assert stats.connection_retries == 0 and stats.requests_failed == 1


def test_the_default_keepalive_is_below_vllms() -> None:
    envs = pytest.importorskip("vllm.envs")
    default_s = ClientConfig(base_url="x", model="m", tier="t").keepalive_timeout_s
    assert default_s < envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE
    assert SERVER_KEEPALIVE_S == envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE


def test_stop_event_stops_the_run_with_every_finished_request_on_disk(tmp_path: Path) -> None:
    wl = small_workload(4, spread_s=0.0)
    server = FakeServer(chunk_delay_s=0.005)
    stop = asyncio.Event()
    seen: list[dict[str, Any]] = []

    async def hook(record: dict[str, Any]) -> None:
        seen.append(record)
        if len(seen) == 5:
            stop.set()

    stats = with_server(server, wl, tmp_path, stop_event=stop, on_record=hook)
    records = read_run(tmp_path).records
    assert stats.stopped_by == "stop_event"
    assert 5 <= len(records) == len(seen) == len(server.requests) < len(wl.turns)
    assert len(records) <= 5 + 4  # at most one more turn per session was in flight
    assert (records.error == "").all() and stats.sessions_cut == 4


def test_duration_cuts_new_turns_and_lets_requests_in_flight_finish(tmp_path: Path) -> None:
    wl = small_workload(4, spread_s=0.0)
    server = FakeServer(tokens_per_chunk=2, chunk_delay_s=0.01)
    stats = with_server(server, wl, tmp_path, {"duration_s": 0.25})
    records = read_run(tmp_path).records
    assert stats.stopped_by == "duration" and stats.turns_not_sent > 0
    assert (records.send_s < 0.25).all() and (records.error == "").all()
    assert (records.finish_s > 0.25).any()  # in flight at the cut, allowed to finish
    assert len(records) == len(server.requests)


def test_drain_timeout_cancels_and_records_requests_in_flight(tmp_path: Path) -> None:
    wl = small_workload(2, spread_s=0.0)
    server = FakeServer()
    server.modes = {(first_token(wl, 0), 1): "hang"}
    start = time.monotonic()  # 1 s: session 0's second turn is sent by then, even on CI
    stats = with_server(server, wl, tmp_path, {"duration_s": 1.0, "drain_timeout_s": 0.2})
    assert time.monotonic() - start < 4.0
    rec = read_run(tmp_path).records.set_index(["session_id", "turn"])
    assert rec.loc[(0, 1), "error"].startswith("cancelled: run stopped")
    assert stats.requests_cancelled == 1 and stats.stopped_by == "duration"


def test_client_set_up_reads_the_turns_table_once_not_once_per_session(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Planning a run and building every first prompt (what the client does before its first
    send when all sessions are due) must not cost a pass over the turns table per session: a
    scan per prompt made 5,000 one-turn sessions cost 7.5 s of CPU, slicing the table per
    prompt and one `itertuples` per session 1.5 ms a session (benchmarks/bench_client.py)."""
    n_sessions = 200
    rows = [(s, 0, 0.0, 0.0, 50, 4) for s in range(n_sessions)]
    workload = table_workload(rows, dict.fromkeys(range(n_sessions), 0.0))
    passes: Counter[str] = Counter()
    real_itertuples = pd.DataFrame.itertuples

    def counted(self: pd.DataFrame, *args: Any, **kwargs: Any) -> Any:
        passes["itertuples"] += 1
        return real_itertuples(self, *args, **kwargs)

    def no_slicing(self: pd.DataFrame, *args: Any) -> Any:
        raise AssertionError("prompt_ids sliced the turns table")

    monkeypatch.setattr(pd.DataFrame, "itertuples", counted)
    plans = session_plans(workload)
    first = workload.prompt_ids(plans[0].session_id, 0)  # builds the session index
    assert passes["itertuples"] == 2  # one for the plans, one for the index
    for name in ("__getitem__", "iloc", "loc", "groupby", "sort_values"):
        monkeypatch.setattr(pd.DataFrame, name,
                            no_slicing if name[0] == "_" else property(no_slicing))
    prompts = [workload.prompt_ids(plan.session_id, 0) for plan in plans]
    assert passes["itertuples"] == 2 and len(prompts) == n_sessions
    assert prompts[0].tolist() == first.tolist() and all(len(p) == 50 for p in prompts)
    assert len({tuple(p[:8]) for p in prompts}) == n_sessions  # each session its own ids


def test_completions_url_accepts_roots_with_or_without_v1() -> None:
    assert completions_url("http://h:8000/") == "http://h:8000/v1/completions"
    assert completions_url("http://h:8000/v1") == "http://h:8000/v1/completions"


# --------------------------------------------------------------------------- fake clock


class FakeTransport:
    """Answers after `ttft_s` / `service_s` of virtual time; fails chosen (prompt length) calls."""

    def __init__(self, clock: FakeClock, service_s: float = 2.0, ttft_s: float = 0.5,
                 slow: dict[int, float] | None = None, fail_call: int = -1):
        self.clock, self.service_s, self.ttft_s = clock, service_s, ttft_s
        self.slow, self.fail_call = slow or {}, fail_call
        self.prompts: list[list[int]] = []
        self.outputs: list[list[int]] = []

    async def __call__(self, prompt_ids: list[int], max_tokens: int, reply: Reply,
                       now_s: Any) -> None:
        call = len(self.prompts)
        self.prompts.append(prompt_ids)
        service_s = self.slow.get(call, self.service_s)
        await self.clock.sleep_until(self.clock.now_s() + self.ttft_s)
        reply.first_token_s = now_s()
        if call == self.fail_call:
            raise ConnectionResetError("reset by peer")
        await self.clock.sleep_until(self.clock.now_s() + service_s - self.ttft_s)
        reply.output_ids = [OUT_BASE + 100 * call + j for j in range(max_tokens)]
        self.outputs.append(reply.output_ids)
        reply.usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": max_tokens}
        reply.done, reply.finish_s = True, now_s()


# Session 0 arrives at 10 s (pauses 5 and 7 s); session 1 at 3 s, its 2nd turn is open loop
# (not before 100 s) and its 3rd follows 1 s after that one finishes.
SCHEDULE_ROWS = [(0, 0, 0.0, 10.0, 20, 4), (0, 1, 5.0, np.nan, 20, 4), (0, 2, 7.0, np.nan, 20, 4),
                 (1, 0, 0.0, 3.0, 20, 4), (1, 1, 1.0, 100.0, 20, 4), (1, 2, 1.0, np.nan, 20, 4)]
SCHEDULE_ARRIVALS = {0: 10.0, 1: 3.0}


def fake_run(tmp_path: Path, cfg_kwargs: dict[str, Any] | None = None,
             clock: FakeClock | None = None,
             **transport_kwargs: Any) -> tuple[ClientStats, pd.DataFrame, FakeTransport]:
    """The schedule workload on virtual time; asserts it took no real waiting."""
    clock = clock or FakeClock()
    transport = FakeTransport(clock, **transport_kwargs)
    wl = table_workload(SCHEDULE_ROWS, SCHEDULE_ARRIVALS)
    start = time.monotonic()
    stats = run(wl, tmp_path, config("http://unused", **(cfg_kwargs or {})), clock=clock,
                transport=transport)
    assert time.monotonic() - start < 1.0
    return stats, read_run(tmp_path).records.set_index(["session_id", "turn"]), transport


def test_fake_clock_schedule_of_sessions_and_pauses(tmp_path: Path) -> None:
    stats, rec, _ = fake_run(tmp_path, {"warmup_s": 5.0})
    expected_send_s = {(0, 0): 10.0, (0, 1): 17.0, (0, 2): 26.0,
                       (1, 0): 3.0, (1, 1): 100.0, (1, 2): 103.0}
    for key, send_s in expected_send_s.items():
        assert rec.loc[key, "send_s"] == pytest.approx(send_s)
        assert rec.loc[key, "first_token_s"] == pytest.approx(send_s + 0.5)
        assert rec.loc[key, "finish_s"] == pytest.approx(send_s + 2.0)
    assert rec.is_warmup.sum() == 1 and rec.loc[(1, 0), "is_warmup"]
    assert stats.stopped_by == "completed" and stats.elapsed_s == pytest.approx(105.0)
    assert stats.max_send_lag_s == pytest.approx(0.0)
    assert [p.session_id for p in session_plans(table_workload(SCHEDULE_ROWS,
                                                               SCHEDULE_ARRIVALS))] == [1, 0]


def test_fake_clock_concurrency_limit_holds_due_turns_in_the_client(tmp_path: Path) -> None:
    # Session 1's first turn (sent at 3 s) takes 20 s; with one slot, session 0's first turn,
    # due at 10 s, is sent when it finishes, at 23 s, and its TTFT counts from then.
    stats, rec, _ = fake_run(tmp_path, {"max_in_flight": 1}, slow={0: 20.0})
    assert rec.loc[(1, 0), "finish_s"] == pytest.approx(23.0)
    assert rec.loc[(0, 0), "send_s"] == pytest.approx(23.0)
    assert rec.loc[(0, 0), "ttft_s"] == pytest.approx(0.5)
    assert rec.loc[(0, 1), "send_s"] == pytest.approx(30.0)  # 25 s finish + 5 s pause
    spans = sorted(zip(rec.send_s, rec.finish_s, strict=True))
    assert all(nxt[0] >= prev[1] - 1e-9 for prev, nxt in zip(spans, spans[1:], strict=False))
    assert stats.stopped_by == "completed" and stats.requests_ok == 6
    with pytest.raises(ValueError, match="max_in_flight"):
        fake_run(tmp_path / "zero", {"max_in_flight": 0})


def test_fake_clock_duration_stops_new_turns_and_drains(tmp_path: Path) -> None:
    # Session 0's last turn (sent at 26 s) takes 30 s: in flight at the 50 s cut, it finishes.
    stats, rec, _ = fake_run(tmp_path, {"duration_s": 50.0, "drain_timeout_s": 100.0},
                             slow={3: 30.0})
    assert rec.loc[(0, 2), "finish_s"] == pytest.approx(56.0) and rec.loc[(0, 2), "error"] == ""
    assert (1, 1) not in rec.index  # due at 100 s, after the cut
    assert stats.stopped_by == "duration" and stats.turns_not_sent == 2
    assert stats.sessions_cut == 1 and stats.sessions_completed == 1
    assert stats.elapsed_s == pytest.approx(56.0)


class LateTimerClock(FakeClock):
    """A loaded event loop: the wake-up at `late_at_s` comes `lag_s` late, others on time."""

    def __init__(self, late_at_s: float, lag_s: float):
        super().__init__()
        self.late_at_s, self.lag_s = late_at_s, lag_s

    async def sleep_until(self, t_s: float) -> None:
        await super().sleep_until(t_s + self.lag_s if t_s == self.late_at_s else t_s)


def test_fake_clock_sessions_that_see_the_duration_pass_end_the_run_by_duration(
        tmp_path: Path) -> None:
    # CI, stop 35: the duration's timer fired after every session had seen the cut and ended
    # itself, and the run said "completed". Session 1 wakes at 100 s, past the 50 s cut.
    stats, rec, _ = fake_run(tmp_path, {"duration_s": 50.0, "drain_timeout_s": 100.0},
                             clock=LateTimerClock(late_at_s=50.0, lag_s=60.0))
    assert (1, 1) not in rec.index and stats.sessions_cut == 1
    assert stats.stopped_by == "duration" and stats.turns_not_sent == 2


def test_fake_clock_default_end_rule_waits_for_every_request_sent(tmp_path: Path) -> None:
    # kvrepro.engines.run_result: no drain limit by default; a request sent before the end
    # runs to completion (here 1,000 s after it, within its 5,000 s request timeout).
    stats, rec, _ = fake_run(tmp_path, {"duration_s": 50.0, "drain_timeout_s": None,
                                        "request_timeout_s": 5000.0}, slow={3: 1000.0})
    assert rec.loc[(0, 2), "error"] == "" and rec.loc[(0, 2), "finish_s"] == pytest.approx(1026.0)
    assert stats.requests_cancelled == 0 and stats.elapsed_s == pytest.approx(1026.0)
    from kvrepro.engines.live.client import ClientConfig

    assert ClientConfig(base_url="x", model="m", tier="t").drain_timeout_s is None


def test_fake_clock_drain_timeout_cancels_the_request(tmp_path: Path) -> None:
    stats, rec, _ = fake_run(tmp_path, {"duration_s": 50.0, "drain_timeout_s": 10.0},
                             slow={3: 1000.0})
    assert rec.loc[(0, 2), "error"].startswith("cancelled")
    assert rec.loc[(0, 2), "finish_s"] == pytest.approx(60.0)
    assert stats.requests_cancelled == 1 and stats.elapsed_s == pytest.approx(60.0)


def test_fake_clock_failed_turn_ends_only_its_session(tmp_path: Path) -> None:
    # Calls in time order: 1/0 at 3 s, 0/0 at 10 s, 0/1 at 17 s (fails), 1/1, 1/2.
    stats, rec, _ = fake_run(tmp_path, fail_call=2)
    assert rec.loc[(0, 1), "error"] == "connection error: reset by peer"
    assert rec.loc[(0, 1), "first_token_s"] == pytest.approx(17.5)
    assert (0, 2) not in rec.index and len(rec.loc[1]) == 3
    assert stats.sessions_ended_by_error == 1 and stats.error_ended_sessions == [0]


def test_fake_clock_stop_event(tmp_path: Path) -> None:
    clock = FakeClock()
    stop = asyncio.Event()
    wl = table_workload(SCHEDULE_ROWS, SCHEDULE_ARRIVALS)
    stats = run(wl, tmp_path, config("http://unused"), clock=clock, stop_event=stop,
                transport=FakeTransport(clock), on_record=lambda r: stop.set())
    records = read_run(tmp_path).records
    assert stats.stopped_by == "stop_event" and len(records) == 1
    assert stats.elapsed_s == pytest.approx(5.0)


def test_fake_clock_compacted_context_uses_the_outputs_since_its_start(tmp_path: Path) -> None:
    rows = [(0, t, 1.0, 0.0 if t == 0 else np.nan, 10, 3) for t in range(4)]
    wl = table_workload(rows, {0: 0.0}, extra={"context_start_turn": [0, 0, 2, 2]})
    clock = FakeClock()
    transport = FakeTransport(clock)
    with RunWriter(tmp_path, {"engine": "live"}) as writer:
        run_workload_sync(wl, writer, config("http://unused"), clock=clock, transport=transport)
    out = [np.asarray(o) for o in transport.outputs]
    appends = [SeededTokens(seed=11).append_ids(wl.turns.iloc[t]) for t in range(4)]
    assert transport.prompts[1] == [*appends[0], *out[0], *appends[1]]
    assert transport.prompts[2] == list(appends[2])  # the summary starts a new context
    assert transport.prompts[3] == [*appends[2], *out[2], *appends[3]]


def test_empty_workload_ends_at_once(tmp_path: Path) -> None:
    wl = table_workload([(0, 0, 0.0, 1.0, 5, 2)], {0: 1.0})
    wl = dataclasses.replace(wl, turns=wl.turns.iloc[:0], sessions=wl.sessions.iloc[:0])
    stats = run(wl, tmp_path, config("http://unused"), clock=FakeClock(),
                transport=FakeTransport(FakeClock()))
    assert stats.stopped_by == "completed" and stats.turns_planned == 0
