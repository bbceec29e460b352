"""A live fleet: N vLLM instances of one tier behind vllm-router, with private or shared KV.

Built from a fleet spec (`kvrepro.fleet_spec.FleetSpec`, `data/fleets/*.yaml`) the way one
server is built from its tier spec: instance i is the fleet's tier rendered by
`kvrepro.engines.live.tiers.live_tier`, listening on `base_port + i`. Its KV pool is

* `private`: its own `lmcache server`, started and cleaned up by its `VllmServer` as for a
  single server. A store folder of its own kind (a flash store's) becomes the instance's own
  sub-folder `i<i>` of the store's path; a shared store's folder (`shared_fs`: one filesystem
  for the whole fleet) stays the same for every instance, in the fleet's run folder by
  default, and is owned once, by the deployment (`SharedFolders`: one lock, one clean-up),
  so a chunk one instance wrote is found by the other;
* `shared`: one `lmcache server` for all (`LMCachePool`, the tier's own LMCache command
  line), which every instance's `LMCacheMPConnector` talks to; a prompt computed on one
  instance can then be loaded by another (../shared/spec/LMCACHE_CPU.md saw it here).

In front, `vllm-router` (PyPI `vllm-router==0.1.17`) with the policy of
`kvrepro.fleet_spec.LIVE_ROUTER_POLICY`. The load client sends each request's session id in
the `X-Session-ID` header, the first key vllm-router's `consistent_hash` looks at (its docs
and source: headers x-session-id, x-user-id, ..., then body fields, then a hash of the body),
so `session_affinity` is per session and not per request body.

Which instance served a turn: instance i's first served model name is its own
(`tiny-i0`, `tiny-i1`) and all share a second one (`tiny`) that the client asks for; vLLM
answers with the first (`OpenAIServingModels.model_name`), so each record's `served_model`
names the instance. Records get `instance` (-1: unknown, e.g. a failed request) and
`routed_away` (the session's previous turn went to another instance), plus `kv_pool` and
`routing`; samples are scraped per instance (`instance` = i, each instance's own `/metrics`
with vLLM's prompt tokens by source; a private pool's LMCache counters go with its instance)
and, for a shared pool, from its LMCache server (`instance` = -1).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import zlib
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Literal

import aiohttp
from pydantic import ValidationError

from kvrepro._paths import child_path, empty_folder
from kvrepro._signals import stop_on_signals
from kvrepro.engines.live.client import (
    ClientConfig,
    ClientStats,
    HttpTransport,
    RealClock,
    run_workload,
)
from kvrepro.engines.live.metrics import sample_metrics
from kvrepro.engines.live.ownership import (
    DiskFolder,
    SharedMemory,
    Watcher,
    store_folder_owner,
)
from kvrepro.engines.live.pins import requirement
from kvrepro.engines.live.placement import ProcessAccounting, pinned_client, speed_probe
from kvrepro.engines.live.processes import (
    ManagedProcess,
    ServerError,
    StartedOnEnter,
    free_port,
    port_in_use,
    wait_gone,
)
from kvrepro.engines.live.runner import LiveOptions, describe_plans, watch_alive
from kvrepro.engines.live.server import DeployPlan, VllmServer, with_free_ports
from kvrepro.engines.live.tiers import (
    TierConfig,
    format_command,
    live_tier,
    lmcache_server_command,
    with_folder_paths,
    with_run_disk,
)
from kvrepro.fleet_spec import LIVE_ROUTER_POLICY, SESSION_HEADER, FleetSpec
from kvrepro.records import RunWriter
from kvrepro.tier_spec import Placement
from kvrepro.workload.base import Workload

ROUTER_SCRIPT = "vllm-router"
ROUTER_PACKAGE = requirement("vllm-router")
POOL_INSTANCE = -1
"""`instance` of the shared LMCache server's samples (and of records no instance claimed)."""


def instance_model_name(name: str, index: int) -> str:
    """Instance `index`'s own (first) served model name."""
    return f"{name}-i{index}"


def run_name(fleet: FleetSpec) -> str:
    """The run folder of one fleet configuration: `<kv_pool>-<tier>-<routing>`."""
    return f"{fleet.kv_pool}-{fleet.tier}-{fleet.routing}"


# --------------------------------------------------------------------------- tiers


def _private_folders(tier: TierConfig, index: int) -> TierConfig:
    """A private pool's instance `index`: each folder of a store of its own (not `shared`)
    in its own sub-folder `i<index>` (two LMCache servers must not share one folder of chunk
    files they each evict); a shared store's folder stays the fleet's one."""
    return with_folder_paths(tier, {f.path: f"{f.path.rstrip('/')}/i{index}"
                                    for f in tier.folders if not f.shared})


def fleet_placement(fleet: FleetSpec, index: int, pin_cpus: bool) -> Placement:
    """Instance `index`'s placement (`Placement.for_instance`); without `pin_cpus`, none at all
    (vLLM's and the OS's choice, what a GPU fleet does)."""
    if not pin_cpus:
        return Placement()
    return Placement.for_instance(index, os.cpu_count() or 1)


def fleet_tiers(fleet: FleetSpec, pool: TierConfig | None = None,
                pin_cpus: bool = False, run_dir: str | Path | None = None) -> list[TierConfig]:
    """Each instance's tier: the fleet's tier as one server runs it, on its own port, with its
    own first served name; with a shared `pool` (its ports set), connected to it; with private
    pools, each in its own sub-folders but for the shared stores' folders (`{run_dir}` in
    those is the fleet's `run_dir`, when given)."""
    base = live_tier(fleet.server_spec(), fleet.tier)
    if run_dir is not None:
        base = with_run_disk(base, run_dir, lambda folder: folder.shared)
    if fleet.kv_pool == "shared" and base.lmcache_mp is not None and pool is None:
        raise ValueError(f"fleet tier {fleet.tier!r}: a shared pool's LMCache tier is needed "
                         "(LMCachePool.tier, with its ports)")
    name = base.served_model_name or "model"
    tiers = []
    for i in range(fleet.n_servers):
        update: dict[str, Any] = {
            "name": f"{fleet.tier}@{i}", "port": fleet.base_port + i,
            "served_model_name": instance_model_name(name, i), "served_model_aliases": [name],
            "placement": fleet_placement(fleet, i, pin_cpus)}
        if pool is not None:  # its LMCache server, and the folders it writes to
            update.update(lmcache_mp=pool.lmcache_mp, folders=pool.folders)
        tier = base.model_copy(update=update)
        if pool is None and fleet.kv_pool == "private":
            tier = _private_folders(tier, i)
        tiers.append(tier)
    return tiers


def shared_pool_tier(fleet: FleetSpec, pin_cpus: bool = False) -> TierConfig | None:
    """The shared LMCache server's tier (the fleet's tier, on the instances' shared CPUs;
    None: private pools or a tier without LMCache)."""
    base = live_tier(fleet.server_spec(), fleet.tier)
    if fleet.kv_pool != "shared" or base.lmcache_mp is None:
        return None
    return base.model_copy(update={"name": f"{fleet.tier}@pool",
                                   "placement": fleet_placement(fleet, 0, pin_cpus)})


# --------------------------------------------------------------------------- processes


class LMCachePool:
    """The shared KV pool: one `lmcache server` (the tier's own command line, free ports) that
    every instance connects to; its store folders and shared memory are cleaned up on stop."""

    def __init__(self, tier: TierConfig, run_dir: str | Path, python: str):
        self.run_dir, self.python = Path(run_dir), python
        self.tier = with_run_disk(with_free_ports(tier), self.run_dir)
        self.disks = [store_folder_owner(f, self.run_dir) for f in self.tier.folders]
        self.process: ManagedProcess | None = None
        self.shm: SharedMemory | None = None
        self.watcher: Watcher | None = None
        self.cleaned: dict[str, Any] = {}

    @property
    def url(self) -> str:
        """http://host:port of the LMCache server's HTTP API (health, /metrics)."""
        mp = self.tier.lmcache_mp
        return f"http://{mp.host}:{mp.http_port}"

    def _sample(self) -> None:
        """What the server holds now: the proof of ownership its clean-up needs."""
        pids = self.process.track() if self.process is not None else set()
        if self.shm is not None:
            self.shm.sample(pids)
        for disk in self.disks:
            disk.sample()

    def plan(self) -> DeployPlan:
        """Write its command line, environment and tier into its folder; start nothing."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        command = lmcache_server_command(self.tier, self.python)
        env = {**self.tier.env, "LMCACHE_DISABLE_BANNER": "1"}
        files = [self.run_dir / name for name in ("lmcache_command.txt", "tier.json", "env.json")]
        files[0].write_text(format_command(command) + "\n")
        files[1].write_text(json.dumps(self.tier.meta_record(), indent=2))
        plan = DeployPlan({"LMCache server": command}, env, files,
                          secret=frozenset(self.tier.env))
        plan.write_env(files[2])
        return plan

    def start(self) -> None:
        """Start the LMCache server without waiting for it (`wait_healthy` does): the
        instances start beside it (`kvrepro.engines.live.server` says why that is safe)."""
        plan = self.plan()
        self.shm = SharedMemory()
        for disk in self.disks:
            disk.prepare()
        command = plan.commands["LMCache server"]
        env = self.shm.environment({**os.environ, **plan.env}, self.run_dir)
        self.process = ManagedProcess("shared LMCache server", command,
                                      self.run_dir / "lmcache_server.log", env,
                                      f"{self.url}/healthcheck",
                                      cpus=self.tier.placement.cpus("lmcache"))
        self.watcher = Watcher(self._sample)
        self.watcher.start()
        self.process.start()

    def wait_healthy(self) -> float:
        """Block until the server's health check answers; the seconds it took."""
        if self.process is None:
            raise ServerError(f"LMCache server of tier {self.tier.name!r} was not started")
        return self.process.wait_healthy(self.tier.lmcache_mp.startup_timeout_s)

    def check_alive(self) -> None:
        """Raise ServerError if the LMCache server has exited."""
        if self.process is not None:
            self.process.check_alive()

    def stop(self, grace_s: float = 20.0) -> None:
        """Stop the server, then remove its shared memory and the files it wrote; never
        raises (a failed or skipped step is kept in `cleaned["errors"]`)."""
        watcher, self.watcher = self.watcher, None
        if watcher is not None:
            watcher.stop()  # a last sample while the server still runs
        proc, self.process = self.process, None
        try:
            if proc is not None:
                proc.stop(grace_s)
        finally:
            if proc is not None:
                wait_gone(proc.still_running())
            if self.shm is not None:
                removed = _clean_up(self.cleaned, "shm_segments", self.shm)
                if removed is not None:
                    self.cleaned["shm_segments"] = removed
            _clean_folders(self.cleaned, self.disks)


def _clean_up(cleaned: dict[str, Any], key: str, owner: SharedMemory | DiskFolder) -> Any:
    """`owner.cleanup()` (None when it failed), its problems into `cleaned["errors"]`, each
    named by `key`."""
    done = None
    try:
        done = owner.cleanup()
    except OSError as err:
        owner.problems.append(str(err))
    cleaned.setdefault("errors", []).extend(f"{key}: {problem}" for problem in owner.problems)
    return done


def _clean_folders(cleaned: dict[str, Any], disks: list[DiskFolder]) -> None:
    """Each folder's clean-up: `disk_files` (how many, over all) and `folder_files` (each)."""
    for disk in disks:
        removed = _clean_up(cleaned, "disk_files", disk)
        if removed is not None:
            cleaned["disk_files"] = cleaned.get("disk_files", 0) + removed
            cleaned.setdefault("folder_files", {})[str(disk.path)] = removed


class SharedFolders:
    """The folders of a private-pool fleet's shared stores (`shared_fs`): every instance's
    LMCache server writes there, so the deployment owns each once (one `DiskFolder`: the
    folder lock would refuse a second owner), from before the first instance starts to after
    the last one stopped, sampling what appears there while they run."""

    def __init__(self, tier: TierConfig, run_dir: Path):
        self.disks = [store_folder_owner(f, run_dir) for f in tier.folders if f.shared]
        self.watcher: Watcher | None = None
        self.cleaned: dict[str, Any] = {}

    def start(self) -> None:
        """Make and lock every shared folder, and sample them every second."""
        for disk in self.disks:
            disk.prepare()
        if self.disks:
            self.watcher = Watcher(lambda: [disk.sample() for disk in self.disks])
            self.watcher.start()

    def stop(self) -> None:
        """A last sample, then remove the files the instances wrote (call it after they
        stopped); never raises."""
        watcher, self.watcher = self.watcher, None
        if watcher is not None:
            watcher.stop()
        _clean_folders(self.cleaned, self.disks)
        self.disks = []


def router_command(worker_urls: list[str], policy: str, host: str, port: int,
                   python: str | None = None, prometheus_port: int | None = None) -> list[str]:
    """vllm-router's command line: the console script next to `python` (pip puts it there).
    Its own Prometheus exporter listens on a fixed default port unless given one (a second
    router on the machine then dies with "Address already in use")."""
    script = Path(python or sys.executable).with_name(ROUTER_SCRIPT)
    metrics = ([] if prometheus_port is None else
               ["--prometheus-host", host, "--prometheus-port", str(prometheus_port)])
    return [str(script), "--worker-urls", *worker_urls, "--policy", policy,
            "--host", host, "--port", str(port), *metrics]


def _router_plan(fleet: FleetSpec, urls: list[str], run_dir: Path, python: str) -> list[str]:
    """The router's command line (its metrics port chosen free), written into `run_dir`."""
    command = router_command(urls, LIVE_ROUTER_POLICY[fleet.routing], "127.0.0.1",
                             fleet.router_port, python, free_port())
    (run_dir / "router_command.txt").write_text(format_command(command) + "\n")
    return command


def _router_process(fleet: FleetSpec, urls: list[str], run_dir: Path,
                    python: str, pin_cpus: bool) -> ManagedProcess:
    """The router as a managed process (its log `router.log`), not started yet."""
    command = _router_plan(fleet, urls, run_dir, python)
    cpus = fleet_placement(fleet, 0, pin_cpus).cpus("router")
    if not Path(command[0]).is_file():
        raise ServerError(f"{command[0]} not found: install the router next to vLLM "
                          f"(pip install {ROUTER_PACKAGE}; make live-cpu does)")
    if port_in_use("127.0.0.1", fleet.router_port):
        raise ServerError(f"router_port {fleet.router_port} is already in use (fleet spec "
                          "key router_port)")
    return ManagedProcess(f"vllm-router ({fleet.routing})", command, run_dir / "router.log",
                          dict(os.environ), f"http://127.0.0.1:{fleet.router_port}/health",
                          cpus=cpus)


# --------------------------------------------------------------------------- the fleet


class FleetDeployment(StartedOnEnter):
    """The whole fleet (context manager): a shared LMCache server when the pool is shared,
    the N instances (started together, each waited for), then the router in front. `stop`
    takes it down in the reverse order and never raises; `cleaned` says what it removed."""

    def __init__(self, fleet: FleetSpec, run_dir: str | Path, python: str | None = None,
                 pin_cpus: bool = False, router: Literal["vllm-router", "client"] = "vllm-router"):
        self.fleet, self.run_dir = fleet, Path(run_dir)
        self.python = python or os.environ.get("KVREPRO_VLLM_PYTHON") or sys.executable
        self.pin_cpus, self.router_kind = pin_cpus, router
        self.pool: LMCachePool | None = None
        self.shared_folders: SharedFolders | None = None
        self.instances: list[VllmServer] = []
        self.router: ManagedProcess | None = None
        self.startup_s: dict[str, float] = {}
        self.cleaned: dict[str, Any] = {}

    @property
    def tiers(self) -> list[TierConfig]:
        """The instances' tiers as deployed (ports chosen)."""
        return [server.tier for server in self.instances]

    @property
    def served_names(self) -> list[str]:
        """Instance i's own served model name, in order."""
        return [t.served_model_name or "" for t in self.tiers]

    @property
    def model(self) -> str:
        """The name all instances answer to (what the client asks for)."""
        return self.tiers[0].served_model_aliases[0]

    @property
    def base_url(self) -> str:
        """Where the client sends requests: the router (instance 0 with client routing)."""
        if self.router_kind == "client":
            return self.instances[0].base_url
        return f"http://127.0.0.1:{self.fleet.router_port}"

    def _instances(self) -> list[VllmServer]:
        """The instances' servers (not started), on the pool when there is one."""
        tiers = fleet_tiers(self.fleet, self.pool.tier if self.pool else None, self.pin_cpus,
                            self.run_dir)
        return [VllmServer(t, self.run_dir / f"i{i}", self.python,
                           external_lmcache=self.pool is not None, own_shared_folders=False)
                for i, t in enumerate(tiers)]

    def _new_shared_folders(self) -> SharedFolders | None:
        """The owner of the shared stores' folders (private pools; a shared pool owns its
        own), not started."""
        if self.pool is not None:
            return None
        base = with_run_disk(live_tier(self.fleet.server_spec(), self.fleet.tier),
                             self.run_dir, lambda folder: folder.shared)
        return SharedFolders(base, self.run_dir) if any(f.shared for f in base.folders) else None

    def _new_pool(self) -> LMCachePool | None:
        """The shared LMCache server (not started), when the pool is shared."""
        shared = shared_pool_tier(self.fleet, self.pin_cpus)
        return None if shared is None else LMCachePool(shared, self.run_dir / "pool",
                                                        self.python)

    def plan(self) -> dict[str, DeployPlan]:
        """Write every process's command line, environment and config into the run folder
        (pool/, i<N>/, router_command.txt) as `start` would, and start nothing."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.pool = self._new_pool()
        plans = {"pool": self.pool.plan()} if self.pool else {}
        plans |= {f"i{i}": server.plan(build_model=False)
                  for i, server in enumerate(self._instances())}
        if self.router_kind == "vllm-router":
            command = _router_plan(self.fleet, self.fleet.worker_urls(), self.run_dir, self.python)
            plans["router"] = DeployPlan({"vllm-router": command}, {},
                                         [self.run_dir / "router_command.txt"])
        return plans

    def start(self) -> None:
        """Pool and instances side by side, then the router once they are healthy."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        router = (_router_process(self.fleet, self.fleet.worker_urls(), self.run_dir, self.python,
                                  self.pin_cpus)
                  if self.router_kind == "vllm-router" else None)  # checked before starting
        self.pool = self._new_pool()
        if self.pool is not None:
            self.pool.start()
        self.shared_folders = self._new_shared_folders()
        if self.shared_folders is not None:
            self.shared_folders.start()
        self.instances = self._instances()
        for server in self.instances:
            server.start()
        if self.pool is not None:
            self.startup_s["pool"] = self.pool.wait_healthy()
        for i, server in enumerate(self.instances):
            self.startup_s[f"i{i}"] = server.wait_healthy()
        if router is not None:
            self.router = router
            self.router.start()
            self.startup_s["router"] = self.router.wait_healthy(120.0)

    def check_alive(self) -> None:
        """Raise ServerError if the router, an instance or the pool has exited."""
        if self.router is not None:
            self.router.check_alive()
        for server in self.instances:
            server.check_alive()
        if self.pool is not None:
            self.pool.check_alive()

    def stop(self) -> None:
        """Router, instances, the shared stores' folders, pool; each step runs even when one
        before it failed."""
        try:
            if self.router is not None:
                self.cleaned["router_exit"] = self.router.stop()
                wait_gone(self.router.pids)
        finally:
            try:
                for i, server in enumerate(self.instances):
                    server.stop()
                    self.cleaned[f"i{i}"] = server.cleaned
            finally:
                try:
                    if self.shared_folders is not None:
                        self.shared_folders.stop()
                        self.cleaned["shared_folders"] = self.shared_folders.cleaned
                finally:
                    if self.pool is not None:
                        self.pool.stop()
                        self.cleaned["pool"] = self.pool.cleaned

    def process_roles(self, instance: int) -> dict[int, str]:
        """pid -> role of the processes whose CPU the sampler of `instance` accounts: an
        instance's own (vLLM's API server, engine core, worker, a private LMCache server);
        for the shared target (POOL_INSTANCE, or instance 0 without a shared pool) also the
        router, the shared LMCache server and this load client."""
        roles = dict(self.instances[instance].roles()) if instance >= 0 else {}
        if instance == (POOL_INSTANCE if self.pool is not None else 0):
            if self.router is not None:
                roles.update(dict.fromkeys(self.router.pids, "router"))
            if self.pool is not None and self.pool.process is not None:
                roles.update(dict.fromkeys(self.pool.process.pids, "lmcache_server"))
            roles[os.getpid()] = "client"
        return roles

    def scrape_targets(self) -> list[tuple[int, str, list[str]]]:
        """(instance, URL, extra URLs) of each `/metrics` sampler: each instance (with its
        private LMCache server), and the shared pool as instance -1."""
        targets = [(i, s.base_url, [s.lmcache_url] if s.lmcache_url and self.pool is None
                    else []) for i, s in enumerate(self.instances)]
        if self.pool is not None:
            targets.append((POOL_INSTANCE, self.pool.url, []))
        return targets


# --------------------------------------------------------------------------- records


class FleetRecords:
    """The run's writer as the load client sees it: each record gets the instance that served
    it (from `served_model`), `routed_away` (its session's previous answered turn came from
    another instance) and the fleet's labels; samples pass through."""

    def __init__(self, writer: RunWriter, served_names: list[str], labels: dict[str, Any]):
        self.writer, self.labels = writer, labels
        self.index = {name: i for i, name in enumerate(served_names)}
        self.last: dict[int, int] = {}

    def write_record(self, record: dict[str, Any]) -> None:
        instance = self.index.get(record.get("served_model", ""), POOL_INSTANCE)
        session = int(record["session_id"])
        previous = self.last.get(session)
        routed_away = instance >= 0 and previous is not None and instance != previous
        if instance >= 0:
            self.last[session] = instance
        self.writer.write_record({**record, **self.labels, "instance": instance,
                                  "routed_away": routed_away})

    def write_sample(self, sample: dict[str, Any]) -> None:
        self.writer.write_sample(sample)


@dataclass
class InstanceSamples:
    """A sampler's writer: its samples tagged with the instance they were scraped from."""

    writer: RunWriter
    instance: int

    def write_sample(self, sample: dict[str, Any]) -> None:
        self.writer.write_sample({**sample, "instance": self.instance})


class ClientRouting:
    """The load client's own routing, for where vllm-router cannot run (named `client` in
    the run's meta): a transport that sends each request to one instance, `round_robin` by
    a counter over requests, `session_affinity` by a CRC-32 of the session id. There is no
    client form of `prefix_aware`."""

    def __init__(self, session: Any, config: ClientConfig, urls: list[str], routing: str):
        if routing not in ("round_robin", "session_affinity"):
            raise ValueError(f"routing {routing!r} has no client-side form (round_robin, "
                             "session_affinity)")
        self.transports = [HttpTransport(session, replace(config, base_url=u)) for u in urls]
        self.routing, self.sent = routing, 0

    def pick(self, session_id: int | None) -> int:
        """The instance the next request of `session_id` goes to."""
        if self.routing == "round_robin" or session_id is None:
            self.sent += 1
            return (self.sent - 1) % len(self.transports)
        return zlib.crc32(str(session_id).encode()) % len(self.transports)

    async def __call__(self, prompt_ids: list[int], max_tokens: int, reply: Any,
                       now_s: Any) -> None:
        await self.transports[self.pick(reply.session_id)](prompt_ids, max_tokens, reply, now_s)


# --------------------------------------------------------------------------- runs


@dataclass
class FleetOptions(LiveOptions):
    """A fleet run's options: a single server's (`LiveOptions`), the router, CPU pinning."""

    router: Literal["vllm-router", "client"] = "vllm-router"
    pin_cpus: bool = True


async def _workload_through(deployment: FleetDeployment, workload: Workload,
                            records: FleetRecords, config: ClientConfig, clock: RealClock,
                            stop: asyncio.Event) -> ClientStats:
    """The load client, through the router or with its own routing."""
    if deployment.router_kind == "vllm-router":
        return await run_workload(workload, records, config, clock=clock, stop_event=stop)
    urls = [s.base_url for s in deployment.instances]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        transport = ClientRouting(session, config, urls, deployment.fleet.routing)
        return await run_workload(workload, records, config, clock=clock, stop_event=stop,
                                  transport=transport)


async def _drive_fleet(deployment: FleetDeployment, workload: Workload, records: FleetRecords,
                       config: ClientConfig, interval_s: float) -> ClientStats:
    """Replay the workload with a watchdog over every process and one sampler per target."""
    clock, stop = RealClock(), asyncio.Event()
    watchdog = asyncio.create_task(watch_alive(deployment, stop))
    samplers = [asyncio.create_task(sample_metrics(
        url, InstanceSamples(records.writer, i), clock, interval_s, stop, extra_urls=extra,
        extra_values=ProcessAccounting(partial(deployment.process_roles, i)).sample))
        for i, url, extra in deployment.scrape_targets()]
    try:
        stats = await _workload_through(deployment, workload, records, config, clock, stop)
    finally:
        died = stop.is_set() and watchdog.done() and watchdog.result()
        stop.set()
        await asyncio.gather(*samplers, watchdog, return_exceptions=True)
    if died:
        raise died
    return stats


def _fleet_meta(fleet: FleetSpec, workload: Workload, options: FleetOptions) -> dict[str, Any]:
    router = ({"kind": "vllm-router", "package": ROUTER_PACKAGE,
               "policy": LIVE_ROUTER_POLICY[fleet.routing]} if options.router == "vllm-router"
              else {"kind": "client", "policy": fleet.routing,
                    "note": "the load client's own routing (kvrepro ClientRouting), no router"})
    return {"engine": "live", "kind": "fleet", "fleet": fleet.model_dump(mode="json"),
            "tier": fleet.tier, "kv_pool": fleet.kv_pool, "routing": fleet.routing,
            "n_servers": fleet.n_servers, "router": router, "session_header": SESSION_HEADER,
            "workload": workload.spec, "workload_digest": workload.digest(),
            "options": {k: v for k, v in vars(options).items() if k != "python"}}


def run_fleet(fleet: FleetSpec, workload: Workload, run_dir: str | Path,
              options: FleetOptions | None = None) -> ClientStats:
    """Deploy the fleet, replay `workload` through its router, write one run folder (records
    of every instance, samples per instance and pool, each process's log in a sub-folder)."""
    options = options or FleetOptions()
    run_dir = Path(run_dir)
    labels = {"kv_pool": fleet.kv_pool, "routing": fleet.routing}
    meta = {**_fleet_meta(fleet, workload, options), "speed_probe": {"before": speed_probe()}}
    with RunWriter(run_dir, meta) as writer:
        deployment = FleetDeployment(fleet, run_dir, options.python, options.pin_cpus,
                                     options.router)
        try:
            with deployment:
                writer.meta.update(started_utc=datetime.now(UTC).isoformat(timespec="seconds"),
                                   startup_s=deployment.startup_s,
                                   served_names=deployment.served_names,
                                   tier_configs=[t.meta_record() for t in deployment.tiers],
                                   instance_placements=[s.placement_record()
                                              for s in deployment.instances])
                records = FleetRecords(writer, deployment.served_names, labels)
                client_cpus = fleet_placement(fleet, 0, options.pin_cpus).cpus("client")
                with pinned_client(client_cpus):
                    stats = asyncio.run(_drive_fleet(deployment, workload, records,
                                                     _client_config(deployment, options),
                                                     options.sample_interval_s))
        finally:
            writer.meta["cleaned_up"] = deployment.cleaned
        writer.meta["client"] = stats.as_dict()
        writer.meta["speed_probe"]["after"] = speed_probe()
    return stats


def _client_config(deployment: FleetDeployment, options: FleetOptions) -> ClientConfig:
    """The load client's settings: the router's URL, the common model name, the session
    header, and each answer's model name kept (which instance served it)."""
    return ClientConfig(
        base_url=deployment.base_url, model=deployment.model, tier=deployment.fleet.tier,
        request_timeout_s=options.request_timeout_s, duration_s=options.duration_s,
        warmup_s=options.warmup_s, drain_timeout_s=options.drain_timeout_s,
        extra_body=options.extra_body or None, max_in_flight=options.max_in_flight,
        session_header=SESSION_HEADER, record_served_model=True)


def override_fleet(fleet: FleetSpec, overrides: dict[str, Any], source: str = "") -> FleetSpec:
    """The fleet with some of its top-level keys replaced (`-p routing=prefix_aware`);
    errors name each bad key."""
    try:
        changed = FleetSpec.model_validate({**fleet.model_dump(), **overrides})
    except ValidationError as err:
        problems = "; ".join(f"key {'.'.join(map(str, e['loc']))}: {e['msg']}"
                             for e in err.errors())
        raise ValueError(f"{source or 'fleet'} -p overrides: {problems}") from err
    changed.server_spec().tier(changed.tier)  # a ValueError naming the known tiers
    return changed


def fleet_grid(fleet: FleetSpec, routings: list[str] | None = None,
               pools: list[str] | None = None) -> list[FleetSpec]:
    """The fleet under each routing x pool (default: the spec's own)."""
    return [fleet.model_copy(update={"routing": r, "kv_pool": p})
            for p in (pools or [fleet.kv_pool]) for r in (routings or [fleet.routing])]


def dry_run_fleet_campaign(fleets: list[FleetSpec], out_dir: str | Path,
                           options: FleetOptions | None = None) -> str:
    """What `run_fleet_campaign` would start, fleet by fleet (`FleetDeployment.plan`: pool,
    instances, router), written into the same folders and `dry_run.txt`; nothing starts."""
    empty_folder(out_dir, "dry run")
    options = options or FleetOptions()
    lines = []
    for fleet in fleets:
        folder = child_path(out_dir, run_name(fleet), "fleet run")
        plans = FleetDeployment(fleet, folder, options.python, options.pin_cpus,
                                options.router).plan()
        lines.append(describe_plans(plans, f"{run_name(fleet)}/"))
    text = "\n".join(lines)
    (Path(out_dir) / "dry_run.txt").write_text(text)
    return text


def run_fleet_campaign(fleets: list[FleetSpec], workload: Workload, out_dir: str | Path,
                       options: FleetOptions | None = None
                       ) -> dict[str, ClientStats | Exception]:
    """Run each fleet in turn (fresh processes, empty caches), one folder each
    (`run_name`); a failed one is reported and the campaign goes on; SIGINT or SIGTERM
    stops it after tearing the running fleet down. Every fleet's folder is checked to lie
    inside `out_dir` before the first fleet starts (ValueError otherwise)."""
    folders = {run_name(f): child_path(out_dir, run_name(f), "fleet run") for f in fleets}
    results: dict[str, ClientStats | Exception] = {}
    with stop_on_signals() as seen:
        for fleet in fleets:
            name = run_name(fleet)
            try:
                results[name] = run_fleet(fleet, workload, folders[name], options)
            except (ServerError, OSError, ValueError) as err:
                results[name] = err
            if seen:
                raise KeyboardInterrupt(f"campaign stopped by signal {seen[0]}")
    return results
