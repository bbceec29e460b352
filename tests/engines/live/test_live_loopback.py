"""Every loopback HTTP call of the live engine ignores proxy settings in the environment.

The health check (`http_ok`, urllib), the metrics sampler and the load client (aiohttp) talk to
servers on this machine. A machine with `http_proxy` set (common behind a corporate proxy)
must not route them through the proxy: it cannot reach our loopback servers, so the health
check would wait out its timeout and every request would fail. Each test points the proxy
variables at a trap that answers 502 and counts what reached it, and checks, as a control,
that a client which honours the environment really is sent to the trap.
"""

from __future__ import annotations

import asyncio
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import aiohttp
import pytest

from kvrepro.engines.live.client import run_workload
from kvrepro.engines.live.metrics import sample_metrics
from kvrepro.engines.live.processes import http_ok
from kvrepro.records import RunWriter, read_run
from tests.engines.live.test_live_client import FakeServer, config, small_workload
from tests.engines.live.test_live_metrics import REAL_SCRAPE, FakeVllm, StepClock, _serve, _until

PROXY_VARS = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy",
              "ALL_PROXY")


class _Server:
    """A threaded HTTP server on 127.0.0.1 answering every GET/POST with `status`."""

    def __init__(self, status: int) -> None:
        self.hits: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                owner.hits.append(f"{self.command} {self.path}")
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:  # keep pytest's output quiet
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> _Server:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def trap(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Server]:
    """A 'proxy' that answers 502, named by every proxy variable; no loopback bypass."""
    with _Server(502) as proxy:
        for name in PROXY_VARS:
            monkeypatch.setenv(name, proxy.url)
        for name in ("no_proxy", "NO_PROXY"):
            monkeypatch.delenv(name, raising=False)
        yield proxy


def test_health_check_ignores_proxy_variables(trap: _Server) -> None:
    with _Server(200) as target:
        # control: an opener built now honours the env (`urlopen`'s global opener keeps the
        # proxies of whenever an earlier caller first built it, so it is not a control)
        with pytest.raises(urllib.error.HTTPError, match="502"):
            urllib.request.build_opener().open(f"{target.url}/health", timeout=5)
        assert len(trap.hits) == 1 and not target.hits
        assert http_ok(f"{target.url}/health", timeout_s=5)
        assert target.hits == ["GET /health"] and len(trap.hits) == 1


def test_metrics_sampler_ignores_proxy_variables(trap: _Server, tmp_path: Path) -> None:
    fake = FakeVllm(REAL_SCRAPE.read_text())

    async def scenario() -> int:
        runner, base_url = await _serve(fake)
        try:
            async with aiohttp.ClientSession(trust_env=True) as honours_env:  # control
                async with honours_env.get(base_url + "/metrics") as resp:
                    assert resp.status == 502
            assert len(trap.hits) == 1 and fake.hits == 0
            stop = asyncio.Event()
            with RunWriter(tmp_path, {"tier": "test"}) as writer:
                task = asyncio.create_task(
                    sample_metrics(base_url, writer, StepClock(), 0.01, stop))
                await _until(lambda: fake.hits >= 2)
                stop.set()
                return await asyncio.wait_for(task, timeout=5)
        finally:
            await runner.cleanup()

    written = asyncio.run(scenario())
    samples = read_run(tmp_path).samples
    assert written == len(samples) >= 2 and len(trap.hits) == 1
    assert "scrape_error" not in samples or samples["scrape_error"].isna().all()
    assert (samples["prefix_cache_queries_tokens"] == 30000.0).all()


def test_load_client_ignores_proxy_variables(trap: _Server, tmp_path: Path) -> None:
    workload = small_workload(2)

    async def scenario() -> int:
        async with FakeServer() as server:
            with RunWriter(tmp_path, {"engine": "live"}) as writer:
                stats = await run_workload(workload, writer, config(server.url))
            return stats.requests_ok

    requests_ok = asyncio.run(scenario())
    records = read_run(tmp_path).records
    assert requests_ok == len(workload.turns) == len(records)
    assert (records["error"] == "").all() and not trap.hits
