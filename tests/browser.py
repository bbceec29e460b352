"""Headless Chromium driven over the Chrome DevTools Protocol, for the browser tests.

Why CDP and not `chromium --dump-dom`: a test must see console errors, uncaught exceptions and
every request the page makes, and wait for a single-page app (JupyterLab) to render; the
protocol reports all of these as events. It needs only `websocket-client`, which
jupyter_server already depends on. Debian's `chromium` is installed by `make chromium`.

Every process started here is stopped, with its whole tree, on every exit path: Chromium's
helpers, and kernels that jupyter_server starts in sessions of their own.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NO_CHROMIUM = "Debian's chromium is not installed (make chromium, or apt-get install chromium)"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def free_port() -> int:
    """A TCP port free on the loopback interface now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_tree(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM a process started with start_new_session=True, its group and every
    descendant (some start sessions of their own), then SIGKILL what is left."""
    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    for member in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.terminate()
    _, alive = psutil.wait_procs(family, timeout=grace_s)
    for member in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)


class Page:
    """One browser tab over its DevTools websocket: commands, and the events seen so far."""

    def __init__(self, ws_url: str, timeout_s: float = 30.0) -> None:
        import websocket

        self._ws = websocket.create_connection(ws_url, timeout=timeout_s, suppress_origin=True)
        self._ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")

    def close(self) -> None:
        self._ws.close()

    def _receive(self) -> dict[str, Any]:
        message = json.loads(self._ws.recv())
        if "method" in message:
            self.events.append(message)
        return message

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Run one protocol command and return its result (raising on a protocol error)."""
        call_id = next(self._ids)
        self._ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = self._receive()
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def navigate(self, url: str, timeout_s: float = 30.0) -> None:
        """Open `url` and wait for its load event."""
        seen = len(self.events)
        self.send("Page.navigate", url=url)
        deadline = time.monotonic() + timeout_s
        while not any(e["method"] == "Page.loadEventFired" for e in self.events[seen:]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not fire its load event within {timeout_s} s")
            self._receive()

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression in the page (promises awaited)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float, poll_s: float = 0.5) -> Any:
        """Poll an expression until it is truthy; its last value (falsy) after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expression)
            if value or time.monotonic() > deadline:
                return value
            time.sleep(poll_s)

    def console_errors(self) -> list[str]:
        """Uncaught exceptions, console.error calls and error-level log entries so far."""
        errors = []
        for event in self.events:
            params = event.get("params", {})
            if event["method"] == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                errors.append(details.get("exception", {}).get("description")
                              or details.get("text", "exception"))
            elif event["method"] == "Runtime.consoleAPICalled" and params["type"] == "error":
                errors.append(" ".join(str(a.get("value", a.get("description", "")))
                                       for a in params.get("args", [])))
            elif event["method"] == "Log.entryAdded" and params["entry"]["level"] == "error":
                errors.append(f"{params['entry'].get('url', '')}: {params['entry']['text']}")
        return errors

    def requested_urls(self) -> list[str]:
        """Every URL the page requested so far (Network.requestWillBeSent)."""
        return [e["params"]["request"]["url"] for e in self.events
                if e["method"] == "Network.requestWillBeSent"]

    def screenshot(self, path: Path) -> Path:
        """Save the viewport as a PNG."""
        data = base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"])
        path.write_bytes(data)
        return path


def _devtools_port(profile: Path, proc: subprocess.Popen, timeout_s: float) -> int:
    """Chromium writes the port it chose for --remote-debugging-port=0 to its profile."""
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout_s
    while not (marker.is_file() and marker.read_text().strip()):
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited with {proc.returncode} before DevTools "
                               f"started; see {profile.parent / 'chromium.log'}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"chromium did not open DevTools within {timeout_s} s")
        time.sleep(0.1)
    return int(marker.read_text().split()[0])


def _page_target(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as reply:
        targets = json.load(reply)
    return next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")


@contextlib.contextmanager
def headless_chromium(work_dir: Path, width: int = 1280, height: int = 2000,
                      start_timeout_s: float = 30.0) -> Iterator[Page]:
    """A fresh headless Chromium (its own profile under `work_dir`) and its first tab."""
    if CHROMIUM is None:
        raise FileNotFoundError(NO_CHROMIUM)
    profile = work_dir / "chromium-profile"
    profile.mkdir(parents=True, exist_ok=True)
    args = [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
            "--no-default-browser-check", "--disable-extensions", "--disable-sync",
            "--disable-background-networking", "--remote-debugging-port=0",
            "--remote-allow-origins=*", f"--user-data-dir={profile}",
            f"--window-size={width},{height}", "about:blank"]
    with open(work_dir / "chromium.log", "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    page = None
    try:
        page = Page(_page_target(_devtools_port(profile, proc, start_timeout_s)))
        yield page
    finally:
        if page is not None:
            page.close()
        stop_tree(proc)


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; raises if `data` is not a PNG."""
    if not data.startswith(PNG_SIGNATURE) or data[12:16] != b"IHDR":
        raise ValueError("not a PNG (bad signature or no IHDR chunk first)")
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
