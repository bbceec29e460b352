"""Asynchronous streaming load client for an OpenAI-compatible `/v1/completions` endpoint.

The live engine's half that talks to the server (a vLLM server in the studies). It replays a
`Workload` the way its users would: each session starts at its scheduled time, and within a
session each turn is sent at max(previous turn's finish + `pause_s`, `not_before_s`)
(`kvrepro.engines.send_rule`, the simulator's rule too), so the load is closed loop and slows
down when the server does.

Prompts are sent as token-id lists, and the server's own generated ids (`token_ids` in each
chunk, asked for with `"return_token_ids": true`) become the output part of the next turn's
prompt (`Workload.prompt_ids(..., outputs=...)`): the server's prefix cache sees exactly the
conversation it would see in production. When a server returns no ids, the workload's nominal
output ids stand in and `ClientStats.fallback_outputs` counts it.

Every request, failed or not, becomes one record (`kvrepro.records.RECORD_COLUMNS`) written
the moment it ends, so a killed run keeps all finished requests. A failed turn ends its
session (the later turns would need its output); the run goes on for the other sessions.

Time: a `Clock` gives the run's time, seconds since the run started (the workload's schedule
and every record use it). `RealClock` is wall time from 0 at its creation (`run_workload` makes
one as it starts unless given one, e.g. shared with the `/metrics` sampler); `FakeClock` is
virtual time for unit tests of the scheduling (with a fake `Transport`), which then run
without real waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import inspect
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple, Protocol

import aiohttp
import numpy as np
import pandas as pd

from kvrepro.engines.run_result import DRAIN_TIMEOUT_S
from kvrepro.engines.send_rule import send_time_s
from kvrepro.records import RunWriter
from kvrepro.workload.base import Workload

log = logging.getLogger(__name__)

ENGINE = "live"
ERROR_MAX_CHARS = 300
SERVER_KEEPALIVE_S = 5.0  # vLLM's default VLLM_HTTP_TIMEOUT_KEEP_ALIVE (vllm/envs.py)
CONNECTION_RETRIES = 1  # another try for a request whose connection broke before any answer
DRAIN_AFTER_DONE_S = 1.0  # read the rest of a finished body so its connection can be reused
_PROMPT_IDS_KEY = b'"prompt_token_ids":['

RecordHook = Callable[[dict[str, Any]], Awaitable[None] | None]


# --------------------------------------------------------------------------- clocks


class Clock(Protocol):
    """The run clock: seconds since the run started, and waiting until a moment.

    Records (and the `/metrics` sampler's samples) take their times from it, so one clock
    shared by the client and the sampler gives them a common time base.
    """

    def now_s(self) -> float: ...

    async def sleep_until(self, t_s: float) -> None: ...


class RealClock:
    """Wall time from `time.monotonic`, reading 0 when created; waits with `asyncio.sleep`."""

    def __init__(self) -> None:
        self._origin_s = time.monotonic()

    def now_s(self) -> float:
        return time.monotonic() - self._origin_s

    async def sleep_until(self, t_s: float) -> None:
        delay_s = t_s - self.now_s()
        await asyncio.sleep(delay_s if delay_s > 0 else 0)


class FakeClock:
    """Virtual time for unit tests: jumps to the next wake-up once every task waits on it.

    A driver task (started by the first sleep) lets the event loop settle for `settle_rounds`
    passes with no new sleeper, then moves the time to the earliest wake-up and wakes that
    sleeper. Hours of schedule thus run in milliseconds. Only for code that waits on nothing
    but this clock and pure asyncio (a fake `Transport`, events, tasks): the clock cannot see
    sockets, so it would jump ahead while a real request is in flight.
    """

    def __init__(self, start_s: float = 0.0, settle_rounds: int = 20):
        self._now_s = start_s
        self._settle_rounds = settle_rounds
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._pushes = 0
        self._driver: asyncio.Task[None] | None = None

    def now_s(self) -> float:
        return self._now_s

    async def sleep_until(self, t_s: float) -> None:
        if t_s <= self._now_s:
            await asyncio.sleep(0)
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._pushes += 1
        heapq.heappush(self._sleepers, (t_s, self._pushes, future))
        if self._driver is None or self._driver.done():
            self._driver = loop.create_task(self._drive())
        await future

    async def _drive(self) -> None:
        """Advance time whenever the loop has been quiet; stop when nobody sleeps."""
        quiet_rounds, seen = 0, self._pushes
        while True:
            await asyncio.sleep(0)
            if self._pushes != seen:
                quiet_rounds, seen = 0, self._pushes
                continue
            quiet_rounds += 1
            if quiet_rounds >= self._settle_rounds:
                quiet_rounds = 0
                if not self._wake_next():
                    return

    def _wake_next(self) -> bool:
        """Move to the earliest live sleeper's time and wake it; False when none is left."""
        while self._sleepers:
            t_s, _, future = heapq.heappop(self._sleepers)
            if future.done():  # its task was cancelled
                continue
            self._now_s = max(self._now_s, t_s)
            future.set_result(None)
            return True
        return False


# --------------------------------------------------------------------------- config, stats


@dataclass
class ClientConfig:
    """Where to send requests and how long to run.

    `base_url` is the server root (`http://host:8000`, with or without `/v1`). `extra_body`
    fields are merged over the default body fields (not over `prompt` and `max_tokens`).
    `max_connections` caps open connections; each session has at most one request in flight,
    so it only needs to exceed the number of concurrently active sessions.
    `keepalive_timeout_s` closes a pooled connection idle that long, below the server's own
    keep-alive (vLLM's uvicorn: `VLLM_HTTP_TIMEOUT_KEEP_ALIVE`, 5 s; aiohttp's default is
    15 s), so that a turn is not sent on a connection the server is closing. A request whose
    connection breaks before any answer all the same ("Can not write request body": 3 of
    held-out set d's requests, 3 of 2,106 in a saturated baseline run) is sent once more
    (`CONNECTION_RETRIES`, `ClientStats.connection_retries`); its `send_s` stays the first try's.
    `max_in_flight` is a load generator's concurrency limit (like `vllm bench serve
    --max-concurrency`): a turn due while that many requests are in flight waits in the
    client, and its `send_s` (so its TTFT) starts when it is sent. None: no limit.
    Behind a router (`kvrepro.engines.live.fleet_deploy`): `session_header` names the header that
    carries the session id (vllm-router's session-affinity key is `X-Session-ID`), and
    `record_served_model` keeps the model name each answer came with, which tells which
    instance served it when each instance's first served name is its own.
    """

    base_url: str
    model: str
    tier: str
    request_timeout_s: float = 600.0
    duration_s: float | None = None
    warmup_s: float = 0.0
    drain_timeout_s: float | None = DRAIN_TIMEOUT_S  # the rule of kvrepro.engines.run_result
    max_connections: int = 1024
    keepalive_timeout_s: float = SERVER_KEEPALIVE_S / 2
    max_in_flight: int | None = None
    extra_body: dict[str, Any] | None = None
    api_key: str | None = None
    session_header: str | None = None  # send each request's session id in this header
    record_served_model: bool = False  # add the `model` the server answered (`served_model`)


@dataclass
class ClientStats:
    """What happened in one run; `as_dict()` suits `RunWriter.close(**...)` or a log line."""

    sessions_planned: int = 0
    sessions_started: int = 0
    sessions_completed: int = 0
    sessions_ended_by_error: int = 0
    sessions_cut: int = 0  # started, then stopped by duration_s or stop_event
    turns_planned: int = 0
    requests_ok: int = 0
    requests_failed: int = 0
    requests_cancelled: int = 0  # part of requests_failed: cut off after the drain timeout
    connection_retries: int = 0  # requests sent again on a new connection (HttpTransport)
    fallback_outputs: int = 0  # ok requests whose output ids the server did not return
    usage_missing: int = 0  # ok requests without a usage chunk (token counts counted locally)
    hook_errors: int = 0
    task_crashes: int = 0  # client bugs, logged with a traceback
    max_send_lag_s: float = 0.0  # worst delay of a send behind its schedule
    stopped_by: str = ""  # completed / duration / stop_event
    elapsed_s: float = 0.0
    error_ended_sessions: list[int] = field(default_factory=list)

    @property
    def turns_not_sent(self) -> int:
        return self.turns_planned - self.requests_ok - self.requests_failed

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "turns_not_sent": self.turns_not_sent}


# --------------------------------------------------------------------------- transport


@dataclass
class Reply:
    """What one request has produced so far, filled in as chunks arrive.

    Partial on purpose: a request that times out or is cancelled is still recorded with its
    first-token time and the tokens that did arrive.
    """

    first_token_s: float = math.nan
    finish_s: float = math.nan  # when [DONE] arrived
    output_ids: list[int] = field(default_factory=list)
    text_chunks: int = 0
    chunks: int = 0
    usage: dict[str, Any] | None = None
    done: bool = False
    other_text: bytes = b""  # the first non-SSE line (a JSON error body sent with HTTP 200)
    model: str = ""  # the `model` of the first chunk: the answering server's first served name
    session_id: int | None = None  # the request's session (for a session-affinity header)
    retries: int = 0  # sent again after the connection broke before any answer


class RequestError(Exception):
    """A request failed in a way the response shows: HTTP status, error chunk, bad stream."""


class Transport(Protocol):
    """Sends one prompt and fills `reply` as the response streams in; raises on failure."""

    async def __call__(self, prompt_ids: list[int], max_tokens: int, reply: Reply,
                       now_s: Callable[[], float]) -> None: ...


def completions_url(base_url: str) -> str:
    """`/v1/completions` under a server root given with or without its `/v1`."""
    root = base_url.rstrip("/")
    return root + ("/completions" if root.endswith("/v1") else "/v1/completions")


def request_body(config: ClientConfig) -> dict[str, Any]:
    """Body fields shared by every request: greedy, exactly `max_tokens`, streamed, with
    usage (for cached-token counts) and the generated token ids (for the next prompt)."""
    body: dict[str, Any] = {
        "model": config.model, "ignore_eos": True, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}, "return_token_ids": True,
    }
    return {**body, **(config.extra_body or {})}


class HttpTransport:
    """Streams `/v1/completions` over one shared aiohttp session; a request whose connection
    broke before any answer goes once more on another (`_unanswered`)."""

    def __init__(self, session: aiohttp.ClientSession, config: ClientConfig):
        self.session = session
        self.url = completions_url(config.base_url)
        self.body = request_body(config)
        self.headers = {"Content-Type": "application/json"}
        if config.api_key:
            self.headers["Authorization"] = f"Bearer {config.api_key}"
        self.session_header = config.session_header

    async def __call__(self, prompt_ids: list[int], max_tokens: int, reply: Reply,
                       now_s: Callable[[], float]) -> None:
        data = json.dumps({**self.body, "prompt": prompt_ids, "max_tokens": max_tokens})
        headers = self.headers
        if self.session_header and reply.session_id is not None:
            headers = {**headers, self.session_header: str(reply.session_id)}
        for attempt in range(CONNECTION_RETRIES + 1):
            try:
                return await self._post(data.encode(), headers, reply, now_s)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as err:
                if not _unanswered(err, reply) or attempt == CONNECTION_RETRIES:
                    raise
                reply.retries += 1
                log.info("retrying a request the server closed before answering: %s", err)

    async def _post(self, data: bytes, headers: dict[str, str], reply: Reply,
                    now_s: Callable[[], float]) -> None:
        async with self.session.post(self.url, data=data, headers=headers) as resp:
            if resp.status >= 400:
                body = await resp.text(errors="replace")
                raise RequestError(f"HTTP {resp.status}: {_error_message(body)}")
            await _read_stream(resp.content, reply, now_s)
            if not reply.done:
                said = reply.other_text.decode(errors="replace")
                raise RequestError(f"stream ended without [DONE] after {reply.chunks} chunk(s), "
                                   f"{len(reply.output_ids)} token id(s)"
                                   + (f"; the server said: {_error_message(said)}"
                                      if said else ""))
            await _drain(resp.content)


def _unanswered(err: Exception, reply: Reply) -> bool:
    """The connection broke before any answer, on a connection that was open: nothing reached
    the engine or it never answered, so the request can go again (as the OpenAI client does).
    Not a refused connection: no server is there, and another try only delays the error."""
    return reply.chunks == 0 and not isinstance(err, aiohttp.ClientConnectorError)


async def _read_stream(content: aiohttp.StreamReader, reply: Reply,
                       now_s: Callable[[], float]) -> None:
    """Apply SSE lines to `reply` until `[DONE]` or the end of the body.

    Splits lines itself: vLLM's first chunk repeats the whole prompt (`prompt_token_ids`),
    which for long contexts exceeds the line limit of aiohttp's `readline`.
    """
    buffer = bytearray()
    async for data in content.iter_any():
        buffer += data
        if b"\n" not in data:
            continue
        *lines, tail = bytes(buffer).split(b"\n")
        buffer = bytearray(tail)
        for line in lines:
            if _apply_line(line, reply, now_s):
                return
    if buffer.strip():
        _apply_line(bytes(buffer), reply, now_s)


async def _drain(content: aiohttp.StreamReader) -> None:
    """Read what follows `[DONE]` (the end of the chunked body) so the connection is reused."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(DRAIN_AFTER_DONE_S):
            while await content.readany():
                pass


def _apply_line(line: bytes, reply: Reply, now_s: Callable[[], float]) -> bool:
    """Apply one SSE line to `reply`; True at the closing `[DONE]`."""
    line = line.strip()
    if not line.startswith(b"data:"):  # blank separators, comments (": ping"), other fields,
        if line and not line.startswith(b":") and not reply.other_text:  # or a plain body
            reply.other_text = line[:2000]
        return False
    payload = line[5:].strip()
    if payload == b"[DONE]":
        reply.done, reply.finish_s = True, now_s()
        return True
    chunk = _parse_chunk(payload)
    reply.chunks += 1
    if not reply.model and isinstance(chunk.get("model"), str):
        reply.model = chunk["model"]
    for choice in chunk.get("choices") or ():
        ids, text = choice.get("token_ids"), choice.get("text")
        if ids:
            reply.output_ids.extend(ids)
        if text:
            reply.text_chunks += 1
        if (ids or text) and math.isnan(reply.first_token_s):
            reply.first_token_s = now_s()
    if chunk.get("usage"):
        reply.usage = chunk["usage"]
    return False


def _parse_chunk(payload: bytes) -> dict[str, Any]:
    """Decode one chunk, skipping the echoed prompt ids (we sent them; parsing them is slow)."""
    start = payload.find(_PROMPT_IDS_KEY)
    if start >= 0 and (end := payload.find(b"]", start)) >= 0:
        payload = payload[:start] + b'"prompt_token_ids":null' + payload[end + 1:]
    try:
        chunk = json.loads(payload)
    except ValueError as err:
        raise RequestError(f"malformed JSON chunk ({err}): {payload[:60]!r}") from None
    if not isinstance(chunk, dict):
        raise RequestError(f"malformed chunk (not a JSON object): {payload[:60]!r}")
    if "error" in chunk or chunk.get("object") == "error":
        raise RequestError(f"server error in stream: {_error_message(json.dumps(chunk))}")
    return chunk


def _error_message(body: str) -> str:
    """The `message` of an OpenAI-style error body (nested or flat), else the raw body."""
    try:
        obj = json.loads(body)
    except ValueError:
        return body.strip()
    inner = obj.get("error", obj) if isinstance(obj, dict) else obj
    if isinstance(inner, dict) and "message" in inner:
        return str(inner["message"])
    return inner if isinstance(inner, str) else body.strip()


def error_text(err: BaseException) -> str:
    """A short, one-line description of why a request failed."""
    if isinstance(err, RequestError):
        text = str(err)
    elif isinstance(err, aiohttp.ClientConnectorError):
        refused = isinstance(err.os_error, ConnectionRefusedError)
        text = f"connection {'refused' if refused else 'failed'}: {err}"
    elif isinstance(err, aiohttp.ServerDisconnectedError):
        text = "stream broken mid-response: server closed the connection"
    elif isinstance(err, aiohttp.ClientPayloadError):
        text = f"stream broken mid-response: {err}"
    elif isinstance(err, aiohttp.ClientOSError | ConnectionError):
        text = f"connection error: {err}"
    else:
        text = f"{type(err).__name__}: {err}"
    text = " ".join(text.split())
    return text if len(text) <= ERROR_MAX_CHARS else text[:ERROR_MAX_CHARS - 3] + "..."


# --------------------------------------------------------------------------- the run


class SessionPlan(NamedTuple):
    """One session's turns in order and the time its first turn is due."""

    session_id: int
    start_s: float
    rows: list[Any]  # namedtuples of the `turns` table


def session_plans(workload: Workload) -> list[SessionPlan]:
    """Sessions with at least one turn, ordered by their first turn's send time.

    One `itertuples` over the whole table: one per session (each builds its own namedtuple
    class) cost 0.3 ms a session, which 5,000 one-turn sessions paid before the first send.
    """
    arrivals = dict(zip(workload.sessions.session_id, workload.sessions.arrival_s, strict=True))
    turns = workload.turns.sort_values(["session_id", "turn"], kind="stable")
    by_session: dict[int, list[Any]] = {}
    for row in turns.itertuples(index=False):
        by_session.setdefault(int(row.session_id), []).append(row)
    plans = [SessionPlan(sid, _due_s(rows[0], None, float(arrivals.get(sid, 0.0))), rows)
             for sid, rows in by_session.items()]
    return sorted(plans, key=lambda p: (p.start_s, p.session_id))


def _due_s(row: Any, prev_finish_s: float | None, arrival_s: float) -> float:
    """`send_rule.send_time_s` for a row of the `turns` table (the simulator's rule too)."""
    return send_time_s(float(row.pause_s), float(getattr(row, "not_before_s", math.nan)),
                       prev_finish_s, arrival_s)


class _Run:
    """One run's state: clock, session tasks, requests in flight, counters."""

    def __init__(self, workload: Workload, writer: RunWriter, config: ClientConfig,
                 clock: Clock, transport: Transport, on_record: RecordHook | None):
        self.workload, self.writer, self.config = workload, writer, config
        self.clock, self.transport, self.on_record = clock, transport, on_record
        self.stats = ClientStats()
        self.stopping = False
        self.sessions: set[asyncio.Task[None]] = set()
        self.in_flight: set[asyncio.Task[Any]] = set()
        self.all_done = asyncio.Event()
        self.launcher: asyncio.Task[None] | None = None
        limit = config.max_in_flight
        if limit is not None and limit < 1:
            raise ValueError(f"max_in_flight must be >= 1 or None, got {limit}")
        self.slots = asyncio.Semaphore(limit) if limit is not None else None

    def now_s(self) -> float:
        return self.clock.now_s()

    async def sleep_until(self, t_s: float) -> None:
        await self.clock.sleep_until(t_s)

    def closed(self) -> bool:
        """No new turn may be sent: stopping, or the run's duration is over."""
        duration_s = self.config.duration_s
        return self.stopping or (duration_s is not None and self.now_s() >= duration_s)

    async def run(self, plans: list[SessionPlan], stop_event: asyncio.Event | None) -> ClientStats:
        """Launch sessions, wait for the end (all done, duration, stop), drain, count."""
        self.stats.sessions_planned = len(plans)
        self.stats.turns_planned = sum(len(p.rows) for p in plans)
        self.launcher = asyncio.create_task(self._launch(plans))
        self.launcher.add_done_callback(self._task_done)
        self.stats.stopped_by = await self._wait_for_end(stop_event)
        self.stopping = True
        self.launcher.cancel()
        for task in self.sessions - self.in_flight:
            task.cancel()  # waiting for their next turn: nothing is lost
        await self._drain()
        self.stats.elapsed_s = self.now_s()
        return self.stats

    async def _wait_for_end(self, stop_event: asyncio.Event | None) -> str:
        """Why the run ends: every session done, the duration reached, or `stop_event` set."""
        waiters: dict[asyncio.Task[Any], str] = {}
        if stop_event is not None:
            waiters[asyncio.create_task(stop_event.wait())] = "stop_event"
        if self.config.duration_s is not None:
            waiters[asyncio.create_task(self.sleep_until(self.config.duration_s))] = "duration"
        waiters[asyncio.create_task(self.all_done.wait())] = "completed"
        done, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        reason = next(reason for task, reason in waiters.items() if task in done)
        if reason == "completed" and self.stats.sessions_cut and self.closed():
            # Sessions saw the duration pass and ended themselves before its timer fired.
            return "duration"
        return reason

    async def _drain(self) -> None:
        """Let requests in flight finish (for at most `drain_timeout_s` when it is set; each is
        bounded by its request timeout anyway), then cancel what is left (recorded)."""
        if self.in_flight:
            finished = asyncio.gather(*self.in_flight, return_exceptions=True)
            limit_s = self.config.drain_timeout_s
            waiters: set[asyncio.Future[Any]] = {finished}
            if limit_s is not None:
                waiters.add(asyncio.create_task(self.sleep_until(self.now_s() + limit_s)))
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for waiter in waiters - {finished}:
                waiter.cancel()
            await asyncio.gather(*(waiters - {finished}), return_exceptions=True)
        for task in list(self.sessions):
            task.cancel()
        await asyncio.gather(*self.sessions, self.launcher, return_exceptions=True)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        """Forget a finished session task; log client bugs; notice when all work is done."""
        self.sessions.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.stats.task_crashes += 1
            log.error("live client task crashed", exc_info=task.exception())
        if self.launcher is not None and self.launcher.done() and not self.sessions:
            self.all_done.set()

    async def _launch(self, plans: list[SessionPlan]) -> None:
        """Start each session at its first turn's time, its first prompt built beforehand."""
        for plan in plans:
            prompt = self.prompt(plan, 0, [])
            if plan.start_s > self.now_s():  # sessions already due start without a yield
                await self.sleep_until(plan.start_s)
            if self.closed():
                return
            task = asyncio.create_task(self._session(plan, prompt))
            self.sessions.add(task)
            task.add_done_callback(self._task_done)

    async def _session(self, plan: SessionPlan, prompt: list[int]) -> None:
        """Send a session's turns in order; each next prompt carries the server's output."""
        self.stats.sessions_started += 1
        outputs: list[np.ndarray] = []
        due_s, finish_s = plan.start_s, 0.0
        try:
            for k, row in enumerate(plan.rows):
                if k:
                    if self.closed():  # checked before waiting too, so draining is quick
                        self.stats.sessions_cut += 1
                        return
                    prompt = self.next_prompt(plan, k, prompt, outputs)
                    due_s = _due_s(row, finish_s, plan.start_s)
                    await self.sleep_until(due_s)
                    if self.closed():
                        self.stats.sessions_cut += 1
                        return
                record, output = await self._send_turn(plan.session_id, row, prompt, due_s)
                if record is None:  # the run closed while the turn waited for a slot
                    self.stats.sessions_cut += 1
                    return
                if record["error"]:
                    self._end_by_error(plan.session_id, record)
                    return
                outputs.append(output)
                finish_s = record["finish_s"]
        except asyncio.CancelledError:
            self.stats.sessions_cut += 1
            raise
        self.stats.sessions_completed += 1

    def prompt(self, plan: SessionPlan, k: int, outputs: list[np.ndarray]) -> list[int]:
        """Token ids of turn k's prompt, with the real outputs of the turns before it.

        `Workload.prompt_ids` takes `outputs` by position within the current context (from
        the turn in `context_start_turn`), so the list is cut to start there.
        """
        row = plan.rows[k]
        first = next(i for i, r in enumerate(plan.rows) if r.turn >= _context_start(plan, k))
        ids = self.workload.prompt_ids(plan.session_id, int(row.turn), outputs=outputs[first:k])
        return ids.tolist()

    def next_prompt(self, plan: SessionPlan, k: int, prompt: list[int],
                    outputs: list[np.ndarray]) -> list[int]:
        """Turn k's prompt from turn k-1's: that prompt + its real output + turn k's append.

        The same ids as `prompt` (`Workload.prompt_ids`; the tests check it), but without
        rebuilding the whole context with pandas each turn: that costs milliseconds, growing
        with the session, on the event loop, where it would delay other requests' timestamps.
        A turn that starts a new context (a compaction) goes through `prompt`.
        """
        if _context_start(plan, k) != _context_start(plan, k - 1):
            return self.prompt(plan, k, outputs)
        append = self.workload.tokens.append_ids(pd.Series(plan.rows[k]._asdict()))
        return prompt + outputs[k - 1].tolist() + append.tolist()

    def _end_by_error(self, session_id: int, record: dict[str, Any]) -> None:
        self.stats.sessions_ended_by_error += 1
        self.stats.error_ended_sessions.append(session_id)
        log.warning("session %d ends: turn %d failed: %s", session_id, record["turn"],
                    record["error"])

    async def _send_turn(self, session_id: int, row: Any, prompt: list[int], due_s: float
                         ) -> tuple[dict[str, Any] | None, np.ndarray | None]:
        """`_request`, after waiting for a slot when `max_in_flight` is set (None: closed)."""
        if self.slots is None:
            return await self._request(session_id, row, prompt, due_s)
        async with self.slots:
            if self.closed():
                return None, None
            return await self._request(session_id, row, prompt, due_s)

    async def _request(self, session_id: int, row: Any, prompt: list[int],
                       due_s: float) -> tuple[dict[str, Any], np.ndarray | None]:
        """Send one turn and record it; the output ids to build the next prompt from."""
        task = asyncio.current_task()
        assert task is not None
        self.in_flight.add(task)
        send_s, reply = self.now_s(), Reply(session_id=session_id)
        self.stats.max_send_lag_s = max(self.stats.max_send_lag_s, send_s - due_s)
        try:
            error = await self._send(prompt, int(row.output_tokens), reply)
        except asyncio.CancelledError:
            self.stats.requests_cancelled += 1
            note = "cancelled: run stopped before the response finished (drain timeout)"
            await self._record(session_id, row, len(prompt), send_s, reply, note)
            raise
        finally:
            self.in_flight.discard(task)
        record = await self._record(session_id, row, len(prompt), send_s, reply, error)
        return record, None if error else self._output_ids(row, reply)

    async def _send(self, prompt: list[int], max_tokens: int, reply: Reply) -> str:
        """Run the transport under the request timeout; the error text, "" on success."""
        timeout_s = self.config.request_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                await self.transport(prompt, max_tokens, reply, self.now_s)
        except TimeoutError:
            return f"timeout: no complete response within {timeout_s:g} s"
        except Exception as err:  # noqa: BLE001 - any failure is recorded, the run goes on
            return error_text(err)
        return ""

    def _output_ids(self, row: Any, reply: Reply) -> np.ndarray:
        """The server's generated ids, or the nominal ones when it returned none."""
        if reply.output_ids:
            return np.asarray(reply.output_ids, dtype=np.int64)
        if not self.stats.fallback_outputs:
            log.warning("server returned no token_ids (does it support return_token_ids?): "
                        "next prompts use the workload's nominal output ids, so they will "
                        "not match what the server cached")
        self.stats.fallback_outputs += 1
        return self.workload.tokens.output_ids(pd.Series(row._asdict()))

    async def _record(self, session_id: int, row: Any, prompt_len: int, send_s: float,
                      reply: Reply, error: str) -> dict[str, Any]:
        """Build, write (flushed) and hand on one request record."""
        record = build_record(session_id, row, self.config, prompt_len, send_s, reply, error,
                              finish_s=reply.finish_s if reply.done else self.now_s())
        self.stats.connection_retries += reply.retries
        if error:
            self.stats.requests_failed += 1
        else:
            self.stats.requests_ok += 1
            self.stats.usage_missing += reply.usage is None
        self.writer.write_record(record)
        if self.on_record is not None:
            try:
                result = self.on_record(record)
                if inspect.isawaitable(result):
                    await result
            except Exception:  # noqa: BLE001 - a broken hook must not stop the run
                self.stats.hook_errors += 1
                log.exception("on_record hook failed")
        return record


def _context_start(plan: SessionPlan, k: int) -> int:
    """The turn whose append starts turn k's context (`context_start_turn`, else the first)."""
    return int(getattr(plan.rows[k], "context_start_turn", plan.rows[0].turn))


def build_record(session_id: int, row: Any, config: ClientConfig, prompt_len: int,
                 send_s: float, reply: Reply, error: str, finish_s: float) -> dict[str, Any]:
    """One `RECORD_COLUMNS` row: token counts from the usage chunk, else counted locally."""
    usage = reply.usage or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    counted = len(reply.output_ids) or reply.text_chunks
    served = {"served_model": reply.model} if config.record_served_model else {}
    return {
        "session_id": session_id, "turn": int(row.turn), "tier": config.tier, "engine": ENGINE,
        "send_s": send_s, "first_token_s": reply.first_token_s, "finish_s": finish_s,
        "prompt_tokens": int(usage.get("prompt_tokens", prompt_len)),
        "cached_prompt_tokens": math.nan if cached is None else float(cached),
        "output_tokens": int(usage.get("completion_tokens", counted)),
        "is_resume": bool(row.is_resume), "is_warmup": bool(send_s < config.warmup_s),
        "error": error, **served,
    }


async def run_workload(workload: Workload, writer: RunWriter, config: ClientConfig,
                       clock: Clock | None = None, stop_event: asyncio.Event | None = None,
                       on_record: RecordHook | None = None,
                       transport: Transport | None = None) -> ClientStats:
    """Replay `workload` against the server in `config`, writing one record per request.

    Returns when every session is done, at `config.duration_s` (after draining requests in
    flight), or when `stop_event` is set; every finished request is on disk by then.
    `on_record` (sync or async) sees each record after it is written. `transport` replaces
    HTTP (tests, with a `FakeClock`).
    """
    clock = clock or RealClock()
    plans = session_plans(workload)
    if transport is not None:
        return await _Run(workload, writer, config, clock, transport, on_record).run(
            plans, stop_event)
    connector = aiohttp.TCPConnector(limit=config.max_connections, limit_per_host=0,
                                     keepalive_timeout=config.keepalive_timeout_s)
    timeout = aiohttp.ClientTimeout(total=None)  # request_timeout_s applies per request
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        run = _Run(workload, writer, config, clock, HttpTransport(session, config), on_record)
        return await run.run(plans, stop_event)


def run_workload_sync(workload: Workload, writer: RunWriter, config: ClientConfig,
                      **kwargs: Any) -> ClientStats:
    """`run_workload` in a fresh event loop, for scripts and notebooks without one."""
    return asyncio.run(run_workload(workload, writer, config, **kwargs))
