"""Deploy one tier as a `vllm` server (and its LMCache server), and always take it down again.

`VllmServer` writes the exact command lines, the tier config and (for in-process LMCache
tiers) the LMCache YAML into the run folder. For a multi-process LMCache tier it starts the
`lmcache server` (its own process group, `lmcache_server.log`, free ports chosen, health from
its HTTP API) and vLLM with `LMCacheMPConnector` pointing at it side by side, and waits for
LMCache's health, then vLLM's: vLLM's connector first sends to LMCache when its worker
registers the KV caches, 25-30 s into vLLM's start on 2 cores, and LMCache answers after 5-6 s
(server.log and lmcache_server.log of data/live/cpu_tiny_prereg_eighth), so one start no
longer waits for the other. vLLM runs in its own
process group with its output in `server.log`. On exit (normal end, exception, Ctrl-C) both
groups are terminated (and any process of theirs that left its group), and the shared-memory
segments and store-folder files (each folder of `TierConfig.folders`: a flash store's, a
shared filesystem's) the run can prove it created are removed: a `Watcher` samples
what its processes hold while they run (`kvrepro.engines.live.ownership`). A process that
exits during start-up or mid-run raises `ServerError` naming it and quoting the end of its
log, so the reason is on screen, not buried in a file.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kvrepro.engines.live.ownership import DiskFolder, SharedMemory, Watcher, store_folder_owner
from kvrepro.engines.live.pins import BUILD_ENV
from kvrepro.engines.live.placement import (
    affinities,
    autogroup_enabled,
    pin_vllm,
    read_binding,
    union,
    vllm_env,
    vllm_processes,
)
from kvrepro.engines.live.processes import (
    ManagedProcess,
    ServerError,
    StartedOnEnter,
    free_port,
    http_ok,
    log_tail,
    port_in_use,
    wait_gone,
)
from kvrepro.engines.live.tiers import (
    REDACTED,
    TINY_MODEL,
    TierConfig,
    format_command,
    lmcache_config,
    lmcache_server_command,
    server_command,
    with_run_disk,
)

__all__ = ["DeployPlan", "ServerError", "VllmServer", "log_tail", "port_in_use"]

log = logging.getLogger(__name__)


def _resolve_model(tier: TierConfig, build: bool = True) -> str:
    """The model path vLLM gets; `kvrepro:tiny` is written locally first (unless `build` is
    False, as in a dry run: then its folder, written or not)."""
    if tier.model != TINY_MODEL:
        return tier.model
    from kvrepro.engines.tiny_model import ensure_tiny_model, tiny_model_dir

    return str(ensure_tiny_model() if build else tiny_model_dir())


@dataclass(frozen=True)
class DeployPlan:
    """What a deployment runs: written into its run folder before anything starts, and all a
    dry run does (`kvrepro run live --dry-run`)."""

    commands: dict[str, list[str]]  # what -> command line ("vLLM", "LMCache server", ...)
    env: dict[str, str]  # set on top of the caller's environment (not the whole environment)
    files: list[Path]  # written into the run folder
    secret: frozenset[str] = frozenset()  # keys of `env` whose values no file or screen shows

    def shown_env(self) -> dict[str, str]:
        """`env` as env.json, dry_run.txt and the screen show it: the `secret` values (the
        spec's `live.env`, `kvrepro.engines.live.tiers.REDACTED`) redacted."""
        return {key: REDACTED if key in self.secret else value
                for key, value in self.env.items()}

    def write_env(self, path: Path) -> None:
        """env.json: the shown environment."""
        path.write_text(json.dumps(self.shown_env(), indent=2) + "\n")

    def describe(self) -> str:
        """The plan as a person reads it: commands, environment, the LMCache config."""
        lines = [f"{what}: {format_command(command)}" for what, command in self.commands.items()]
        lines += [f"env: {key}={value}" for key, value in self.shown_env().items()]
        for path in self.files:
            if path.name == "lmcache.yaml":
                lines.append(f"{path}:")
                lines += [f"    {line}" for line in path.read_text().splitlines()]
        lines.append("files: " + " ".join(str(p) for p in self.files))
        return "\n".join(lines)


def with_free_ports(tier: TierConfig) -> TierConfig:
    """A copy of a multi-process LMCache tier with its unset LMCache ports chosen free."""
    mp = tier.lmcache_mp
    if mp is None:
        return tier
    ports = {"port": mp.port or free_port(mp.host), "http_port": mp.http_port}
    while ports["http_port"] in (None, ports["port"]):
        ports["http_port"] = free_port(mp.host)
    return tier.model_copy(update={"lmcache_mp": mp.model_copy(update=ports)})


class VllmServer(StartedOnEnter):
    """A running vLLM server for one tier (context manager: start on enter, stop on exit)."""

    def __init__(self, tier: TierConfig, run_dir: str | Path, python: str | None = None,
                 health_poll_s: float = 0.5, external_lmcache: bool = False,
                 own_shared_folders: bool = True):
        # external_lmcache: the LMCache server is someone else's (a fleet's shared pool,
        # kvrepro.engines.live.fleet_deploy): connect to its ports; start and clean up none of
        # it, nor its folders. own_shared_folders False: the folders of shared stores belong to
        # the fleet (one owner for the instances that share them); the rest are this server's
        self.external_lmcache = external_lmcache
        if external_lmcache and (tier.lmcache_mp is None or tier.lmcache_mp.port is None):
            raise ValueError(f"tier {tier.name!r}: an external LMCache server needs "
                             "lmcache_mp with its port set")
        self.run_dir = Path(run_dir)
        self.tier = with_run_disk(with_free_ports(tier), self.run_dir)
        self.python = python or os.environ.get("KVREPRO_VLLM_PYTHON") or sys.executable
        self.health_poll_s = health_poll_s
        self.log_path = self.run_dir / "server.log"
        self.vllm: ManagedProcess | None = None
        self.lmcache: ManagedProcess | None = None
        self.disks: list[DiskFolder] = [
            store_folder_owner(folder, self.run_dir) for folder in self.tier.folders
            if not external_lmcache and (own_shared_folders or not folder.shared)]
        self.shm: SharedMemory | None = None
        self.watcher: Watcher | None = None
        self.cleaned: dict[str, Any] = {}
        self.pinned_threads: dict[str, int] = {}
        self.started_at_s = float("nan")  # time.monotonic() at `start`

    @property
    def base_url(self) -> str:
        """http://host:port of the vLLM server."""
        return f"http://{self.tier.host}:{self.tier.port}"

    @property
    def lmcache_url(self) -> str | None:
        """http://host:port of the LMCache server's HTTP API (multi-process tiers)."""
        mp = self.tier.lmcache_mp
        return f"http://{mp.host}:{mp.http_port}" if mp else None

    @property
    def process(self) -> Any:
        """The vLLM process (None when not running)."""
        return self.vllm.process if self.vllm else None

    def plan(self, build_model: bool = True) -> DeployPlan:
        """Write the command lines, the environment kvrepro adds, the tier and the LMCache
        config into the run folder, and start nothing: `start` runs exactly this plan."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        command = server_command(self.tier, self.python, _resolve_model(self.tier, build_model))
        env = {**BUILD_ENV[self.tier.device], **vllm_env(self.tier.placement), **self.tier.env}
        files = [self.run_dir / "command.txt", self.run_dir / "tier.json"]
        cache_cfg = lmcache_config(self.tier)
        if cache_cfg is not None:
            from kvrepro.engines.live.lmcache_keys import validate_lmcache_config

            validate_lmcache_config(cache_cfg)
            cfg_path = self.run_dir / "lmcache.yaml"
            cfg_path.write_text(yaml.safe_dump(cache_cfg, sort_keys=False))
            env["LMCACHE_CONFIG_FILE"] = str(cfg_path.resolve())
            files.append(cfg_path)
        commands = {"vLLM": command}
        if self.tier.lmcache_mp is not None and not self.external_lmcache:
            commands["LMCache server"] = lmcache_server_command(self.tier, self.python)
            files.append(self.run_dir / "lmcache_command.txt")
            files[-1].write_text(format_command(commands["LMCache server"]) + "\n")
        files[0].write_text(format_command(command) + "\n")
        files[1].write_text(json.dumps(self.tier.meta_record(), indent=2))
        files.append(self.run_dir / "env.json")
        plan = DeployPlan(commands, env, files, secret=frozenset(self.tier.env))
        plan.write_env(files[-1])
        return plan

    def _start_lmcache(self, command: list[str], env: dict[str, str]) -> None:
        self.lmcache = ManagedProcess(
            f"LMCache server for tier {self.tier.name!r}", command,
            self.run_dir / "lmcache_server.log", {**env, "LMCACHE_DISABLE_BANNER": "1"},
            f"{self.lmcache_url}/healthcheck", cpus=self.tier.placement.cpus("lmcache"))
        self.lmcache.start()

    def start(self) -> None:
        """Start the LMCache server (multi-process tiers) and vLLM, waiting for neither
        (`wait_healthy` does; the module doc says why they start side by side)."""
        if port_in_use(self.tier.host, self.tier.port):
            raise ServerError(f"port {self.tier.port} on {self.tier.host} is already in use "
                              f"(tier {self.tier.name!r}: set another 'port')")
        plan = self.plan()
        self.shm = SharedMemory()
        env = self.shm.environment({**os.environ, **plan.env}, self.run_dir)
        for disk in self.disks:
            disk.prepare()
        self.watcher = Watcher(self._sample)
        self.watcher.start()
        self.started_at_s = time.monotonic()
        if "LMCache server" in plan.commands:
            self._start_lmcache(plan.commands["LMCache server"], env)
        placement = self.tier.placement
        # its worker must be allowed the engine CPUs to bind its OpenMP threads to them
        self.vllm = ManagedProcess(f"vLLM server for tier {self.tier.name!r}",
                                   plan.commands["vLLM"],
                                   self.log_path, env, f"{self.base_url}/health",
                                   cpus=union(placement.cpus("front"), placement.cpus("engine")))
        self.vllm.start()

    def _processes(self) -> list[ManagedProcess]:
        return [p for p in (self.vllm, self.lmcache) if p is not None]

    def _sample(self) -> None:
        """What the run's processes hold now (their families, segments, the store folders'
        new files): the proof of ownership the clean-up needs."""
        pids = set().union(*(p.track() for p in self._processes()))
        if self.shm is not None:
            self.shm.sample(pids)
        for disk in self.disks:
            disk.sample()

    def healthy(self) -> bool:
        """True when GET /health answers 200."""
        return http_ok(f"{self.base_url}/health")

    def wait_healthy(self, timeout_s: float | None = None) -> float:
        """Block until the LMCache server (if any) and then vLLM answer their health checks;
        return the seconds since `start`. Raise on either's exit or timeout."""
        if self.vllm is None:
            raise ServerError(f"vLLM server for tier {self.tier.name!r} was not started")
        if self.lmcache is not None and not self.lmcache.healthy:
            self.lmcache.wait_healthy(self.tier.lmcache_mp.startup_timeout_s, self.health_poll_s)
        self.vllm.wait_healthy(timeout_s or self.tier.startup_timeout_s, self.health_poll_s)
        self.pinned_threads = pin_vllm(self.vllm.process.pid, self.tier.placement)
        return time.monotonic() - self.started_at_s

    def roles(self) -> dict[int, str]:
        """The run's server processes now, pid -> role (api_server, engine_core, worker,
        lmcache_server): what `ProcessAccounting` and `placement_record` read."""
        pids = vllm_processes(self.vllm.process.pid) if self.vllm and self.vllm.process else {}
        if self.lmcache is not None and self.lmcache.process is not None:
            pids[self.lmcache.process.pid] = "lmcache_server"
        return pids

    def placement_record(self) -> dict[str, Any]:
        """What the run's meta.json keeps of its CPUs: the spec's placement, the binding
        vLLM logged, the threads pinned, each process's CPUs and autogroup as the kernel
        says, and whether the kernel groups by session at all."""
        return {"spec": self.tier.placement.model_dump(),
                "vllm_logged": read_binding(self.log_path),
                "pinned_threads": dict(self.pinned_threads),
                "sched_autogroup_enabled": autogroup_enabled(),
                "affinity": affinities(self.roles())}

    def check_alive(self) -> None:
        """Raise ServerError if vLLM or the LMCache server has exited (call it during a run)."""
        for proc in (self.lmcache, self.vllm):
            if proc is not None:
                proc.check_alive()
        if self.vllm is None:
            raise ServerError(f"vLLM server for tier {self.tier.name!r} is not running")

    def stop(self, grace_s: float = 20.0) -> int | None:
        """Stop vLLM, then the LMCache server; remove their leftovers; vLLM's exit code.

        Raises nothing of its own, so `__exit__` passes on the run's error: a failed clean-up
        step is logged and listed in `cleaned["errors"]` (the run's meta keeps it), and each
        step runs even when one before it failed or a Ctrl-C interrupted it.
        """
        code = None
        watcher, self.watcher = self.watcher, None
        try:
            if watcher is not None:
                watcher.stop()  # a last sample while the processes still run
                self.cleaned["sample_errors"] = watcher.errors
            code = self.vllm.stop(grace_s) if self.vllm else None
        finally:
            try:
                if self.lmcache is not None:
                    self.lmcache.stop(grace_s)
            finally:
                self._remove_leftovers()
        return code

    def _remove_leftovers(self) -> None:
        """Remove the stopped processes' shared memory and the run's store-folder files
        (`disk_files`: how many, over every folder; `folder_files`: per folder)."""
        procs = self._processes()
        self.vllm = self.lmcache = None
        # a segment is left alone while a dying process still maps it
        wait_gone(set().union(*(p.still_running() for p in procs)))
        if self.shm is not None:
            removed = self._clean_up_step("shm_segments", self.shm.cleanup, self.shm.problems)
            if removed is not None:
                self.cleaned["shm_segments"] = removed
        for disk in self.disks:
            removed = self._clean_up_step("disk_files", disk.cleanup, disk.problems)
            if removed is not None:
                self.cleaned["disk_files"] = self.cleaned.get("disk_files", 0) + removed
                self.cleaned.setdefault("folder_files", {})[str(disk.path)] = removed

    def _clean_up_step(self, key: str, step: Callable[[], Any], problems: list[str]) -> Any:
        """Run one clean-up step (`key` names it) and return what it returned (None when it
        failed); an OS error, and each item the step skipped (`problems`), is logged and kept
        in `cleaned["errors"]`."""
        done = None
        try:
            done = step()
        except OSError as err:
            problems.append(str(err))
        for problem in problems:
            log.warning("tier %r: clean-up of %s: %s", self.tier.name, key, problem)
            self.cleaned.setdefault("errors", []).append(f"{key}: {problem}")
        return done
