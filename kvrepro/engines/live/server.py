"""Deploy one tier as a `vllm` server process, and always take it down again.

`VllmServer` writes the exact command line, the tier config and (for LMCache tiers) the
LMCache YAML into the run folder, starts the server in its own process group with its output
in `server.log`, waits for `/health`, and on exit (normal end, exception, Ctrl-C) terminates
the whole process group. A server that exits during start-up or mid-run raises
`ServerError` quoting the end of its log, so the reason is on screen, not buried in a file.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path
from typing import IO, Any

import yaml

from kvrepro.engines.live.tiers import (
    TINY_MODEL,
    TierConfig,
    format_command,
    lmcache_config,
    server_command,
)


class ServerError(RuntimeError):
    """The vLLM server could not start, or died while serving."""


def port_in_use(host: str, port: int) -> bool:
    """True when something already listens on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def log_tail(path: Path, lines: int = 30) -> str:
    """The last `lines` lines of a log file (empty if it does not exist)."""
    if not path.is_file():
        return ""
    with path.open(errors="replace") as handle:
        return "".join(deque(handle, maxlen=lines))


def _resolve_model(tier: TierConfig) -> str:
    if tier.model != TINY_MODEL:
        return tier.model
    from kvrepro.engines.tiny_model import ensure_tiny_model

    return str(ensure_tiny_model())


class VllmServer:
    """A running vLLM server for one tier (context manager: start on enter, stop on exit)."""

    def __init__(self, tier: TierConfig, run_dir: str | Path, python: str | None = None,
                 health_poll_s: float = 0.5):
        self.tier = tier
        self.run_dir = Path(run_dir)
        self.python = python or os.environ.get("KVREPRO_VLLM_PYTHON") or sys.executable
        self.health_poll_s = health_poll_s
        self.log_path = self.run_dir / "server.log"
        self.process: subprocess.Popen | None = None
        self._log: IO[bytes] | None = None

    @property
    def base_url(self) -> str:
        """http://host:port of the server."""
        return f"http://{self.tier.host}:{self.tier.port}"

    def _disk_dir(self) -> Path | None:
        if self.tier.kind != "flash":
            return None
        return Path(self.tier.lmcache.local_disk_path.removeprefix("file://"))

    def _prepare(self) -> tuple[list[str], dict[str, str]]:
        """Write command, tier and LMCache config into the run folder; return cmd and env."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        command = server_command(self.tier, self.python, _resolve_model(self.tier))
        env = {**os.environ, **self.tier.env}
        cache_cfg = lmcache_config(self.tier)
        if cache_cfg is not None:
            from kvrepro.engines.live.lmcache_keys import validate_lmcache_config

            validate_lmcache_config(cache_cfg)
            cfg_path = self.run_dir / "lmcache.yaml"
            cfg_path.write_text(yaml.safe_dump(cache_cfg, sort_keys=False))
            env["LMCACHE_CONFIG_FILE"] = str(cfg_path.resolve())
        disk = self._disk_dir()
        if disk is not None:
            if self.tier.clean_disk_dir and disk.exists():
                shutil.rmtree(disk)
            disk.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "command.txt").write_text(format_command(command) + "\n")
        (self.run_dir / "tier.json").write_text(self.tier.model_dump_json(indent=2))
        return command, env

    def start(self) -> None:
        """Start the server process (in its own process group) without waiting for health."""
        if port_in_use(self.tier.host, self.tier.port):
            raise ServerError(f"port {self.tier.port} on {self.tier.host} is already in use "
                              f"(tier {self.tier.name!r}: set another 'port')")
        command, env = self._prepare()
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env,
                                        start_new_session=True)

    def _died(self, when: str) -> ServerError:
        code = self.process.poll() if self.process else None
        return ServerError(f"vLLM server for tier {self.tier.name!r} exited {when} with code "
                           f"{code}; last lines of {self.log_path}:\n{log_tail(self.log_path)}")

    def healthy(self) -> bool:
        """True when GET /health answers 200."""
        try:
            with urllib.request.urlopen(f"{self.base_url}/health", timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def wait_healthy(self, timeout_s: float | None = None) -> float:
        """Block until /health answers; return the seconds it took. Raise on exit/timeout."""
        timeout_s = timeout_s or self.tier.startup_timeout_s
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if self.process is None or self.process.poll() is not None:
                raise self._died("during start-up")
            if self.healthy():
                return time.monotonic() - start
            time.sleep(self.health_poll_s)
        raise ServerError(f"vLLM server for tier {self.tier.name!r} not healthy after "
                          f"{timeout_s:g} s; last lines of {self.log_path}:\n"
                          f"{log_tail(self.log_path)}")

    def check_alive(self) -> None:
        """Raise ServerError if the server process has exited (call it during a run)."""
        if self.process is None or self.process.poll() is not None:
            raise self._died("mid-run")

    def stop(self, grace_s: float = 20.0) -> int | None:
        """Terminate the server's whole process group; return its exit code."""
        proc, self.process = self.process, None
        if proc is not None:
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(timeout=grace_s)
            _signal_group(proc, signal.SIGKILL)  # stray children of the group
        if self._log is not None:
            self._log.close()
            self._log = None
        disk = self._disk_dir()
        if disk is not None and self.tier.clean_disk_dir and disk.exists():
            shutil.rmtree(disk)
        return proc.returncode if proc is not None else None

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass

