"""The simulator's view of a server: what `kvrepro.tier_spec` renders for the digital twin.

A server is described once, in a server spec (`data/servers/*.yaml`, `kvrepro.tier_spec`),
for both engines and the cost model. `sim_profile(spec)` renders it to a `SimProfile`, what
the digital twin needs to stand in for one serving instance:

* `server` (`ServerProfile`): the model and the GPU group's roofline rates, the KV capacity in
  GPU memory and vLLM's scheduler limits;
* `tiers`: named `SimTier`s (baseline, dram, flash, ...), each a list of `OffloadTier`s below
  the GPU, fastest first (LMCache's CPU backend, then its local-disk backend);
* `sample_interval_s`: how often the engine writes a server sample.

The simulator's types extend the spec's (`ServerProfile` is `TwinRates` + `EngineSpec`,
`SimTier` is a `TierModel` like `TierSpec`), so a setting has one name in the YAML, the spec
and the twin; what the simulator derives from them (`SimTier.load_async`, ...) are read-only
properties, not settings. Run folders record them under the same names (`meta_record`);
run folders written before the twin took the spec's names (`gpu_kv_bytes`,
`max_batched_tokens`, `offload`, `save_decode_kv`, `lookup_s`, `connector_*_s`,
`write_through`) are read under the spec's names by `server_record` and `tier_record`.

`load_profile(path)` reads a server spec file and renders it; a wrong or missing key is
reported with the file and the key's dotted path. Where the simulator models an LMCache
behaviour it follows the spec's `LMCacheFlags`: synchronous or asynchronous loads
(`enable_async_loading`), whether decode KV is saved (`save_decode_cache`), and whether stores
skip L1 (`l2_store_policy: skip_l1`). Partial chunks (`save_unfull_chunk: true`) are not
modelled and are refused.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from kvrepro.calc.gpu_rates import derived_server
from kvrepro.calc.roofline import GpuSpec
from kvrepro.model_spec import ModelSpec, get_model
from kvrepro.tier_spec import (
    EngineSpec,
    HostCpuSpec,
    LMCacheMode,
    Placement,
    ServerSpec,
    StoreModel,
    StoreSpec,
    TierModel,
    TierSpec,
    TwinRates,
    load_server,
)


class ServerProfile(TwinRates, EngineSpec):
    """One vLLM instance: model, GPU-group rates for the roofline (the spec's `twin`), KV
    capacity and limits (the spec's `engine`, under its names)."""

    model_config = ConfigDict(extra="forbid")

    model: str | ModelSpec = Field(description="catalog name (data/models/catalog.yaml) or an "
                                               "inline ModelSpec mapping")

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str | ModelSpec) -> str | ModelSpec:
        if isinstance(value, str):
            get_model(value)  # ValueError listing the catalog's names
        return value

    @model_validator(mode="after")
    def _capacity_fits_one_request(self) -> ServerProfile:
        spec = self.model_spec()
        if self.capacity_blocks() * self.block_tokens < self.max_model_len:
            raise ValueError(
                f"kv_cache_bytes {self.kv_cache_bytes:.4g} holds {self.capacity_blocks()} blocks "
                f"of {self.block_tokens} tokens x {spec.kv_bytes_per_token} B, less than one "
                f"max_model_len ({self.max_model_len}) request; vLLM refuses to start so")
        return self

    def model_spec(self) -> ModelSpec:
        """The model as a ModelSpec (catalog lookup for a name)."""
        return get_model(self.model) if isinstance(self.model, str) else self.model

    def front_end_s(self, prompt_tokens: Any, stretch: Any = 1.0) -> Any:
        """The API server's time on a request, on top of the engine's (a constant, and the
        per-token work of a prompt sent as text), stretched by its share of its CPUs; a
        number, or a column for columns (`validate.lone_split` takes the twin's apart)."""
        return (self.front_end_latency_s + self.front_end_per_token_s * prompt_tokens) * stretch

    def gpu_spec(self) -> GpuSpec:
        """A GpuSpec with this profile's rates, for `kvrepro.calc.roofline`.

        The roofline's step time reads only `fp16_tflops` and `mem_bw_tb_s`. GpuSpec also
        requires a host link and a memory size; offload loads use each tier's own read
        bandwidth instead of the link, so the link is set to a value nothing here reads.
        """
        return GpuSpec(name=f"sim:{self.model_spec().name}", fp16_tflops=self.fp16_tflops,
                       host_link_gb_s=1.0, mem_bw_tb_s=self.mem_bw_tb_s,
                       mem_gb=self.kv_cache_bytes / 1e9, source="kvrepro.engines.sim profile")

    def block_bytes(self) -> int:
        """Bytes of one KV block."""
        return self.block_tokens * self.model_spec().kv_bytes_per_token

    def capacity_blocks(self) -> int:
        """How many KV blocks fit in `kv_cache_bytes`."""
        return int(self.kv_cache_bytes // self.block_bytes())

    def meta_record(self) -> dict[str, Any]:
        """The server as run folders record it (meta.json `profile.server`), under the
        spec's names (`server_record` reads older records too)."""
        return self.model_dump(mode="json")


class OffloadTier(StoreModel):
    """One store below the GPU as the simulator runs it: the spec's store model plus the
    tier's chunk size (LMCache has one chunk size per tier)."""

    chunk_tokens: int = Field(256, gt=0, description="LMCache chunk size, tokens")
    kind: str | None = Field(None, description="the spec store's kind (kvrepro.stores.KINDS): "
                             "how a validation reads its deployed size back; None: a store "
                             "made for the twin only")
    hard_limit: bool = Field(True, description="when full, new chunks are dropped (LMCache's "
                                               "L1); False: a soft limit that writes overshoot "
                                               "until the eviction loop catches up (its "
                                               "fs_native disk tier)")
    shared: bool = Field(False, description="one store for every instance of a fleet (a "
                                            "shared filesystem), even with private pools")


class SimTier(TierModel[OffloadTier]):
    """A tier as the simulator runs it: the spec's tier settings under the spec's names
    (`TierModel`), its stores with the tier's chunk size, and the server's LMCache mode.
    What LMCache does asynchronously and where it writes follow from them (the properties)."""

    lmcache_mode: LMCacheMode = Field("in_process", description="the server's "
                                      "live.lmcache_mode: the multi-process connector answers "
                                      "lookups later and loads asynchronously")

    @property
    def load_async(self) -> bool:
        """A request waiting for a load does not hold up the GPU step: LMCache's
        `enable_async_loading`, always so in multi-process mode
        (lmcache_mp_connector.get_num_new_matched_tokens)."""
        return self.lmcache.enable_async_loading or self.lmcache_mode == "multi_process"

    @property
    def lookup_async(self) -> bool:
        """Lookups run outside the step, a request skipped until its answer is in (LMCache's
        multi-process connector); else the step waits for `twin_lookup_s`."""
        return self.lmcache_mode == "multi_process"

    @property
    def skip_l1(self) -> bool:
        """Computed KV is written to the last store only (`l2_store_policy: skip_l1`)."""
        return self.lmcache.l2_store_policy == "skip_l1"

    @model_validator(mode="after")
    def _consistent(self) -> SimTier:
        if self.lmcache.save_unfull_chunk:
            raise ValueError(f"tier {self.name!r}: lmcache.save_unfull_chunk true is not "
                             "modelled by the simulator (partial chunks); leave it false for "
                             "simulated runs")
        chunks = {t.chunk_tokens for t in self.stores}
        if len(chunks) > 1:
            raise ValueError(f"all offload stores of a tier share one chunk_tokens (LMCache has "
                             f"one chunk size), got {sorted(chunks)}")
        if self.twin_write_back and any(t.async_eviction for t in self.stores):
            raise ValueError("write-back (evicted chunks move one store down) is modelled with "
                             "eviction on insert only; set async_eviction false on its stores")
        return self

    def meta_record(self) -> dict[str, Any]:
        """The tier as run folders record it (meta.json `tier_config`, `profile.tiers`): its
        settings under the spec's names, and what the twin derives from them (`load_async`,
        `lookup_async`, `skip_l1`). `tier_record` reads older records too."""
        return {**self.model_dump(mode="json"), "load_async": self.load_async,
                "lookup_async": self.lookup_async, "skip_l1": self.skip_l1}


class SimProfile(BaseModel):
    """Server + named tiers + sampling: everything one simulated campaign needs."""

    model_config = ConfigDict(extra="forbid")

    description: str = ""
    server: ServerProfile
    tiers: dict[str, SimTier] = Field(min_length=1)
    sample_interval_s: float = Field(10.0, gt=0, description="server sample period")
    placement: Placement = Field(default_factory=Placement, description="the live server's "
                                 "CPUs: the twin's rates hold for the placement they were "
                                 "fitted on, and a live run is compared only on it")
    host_cpu: HostCpuSpec | None = Field(None, description="the host CPUs the processes "
                                         "share (kvrepro.engines.sim.host_cpu); None: not "
                                         "modelled")
    forward_on_cpu: bool = Field(False, description="the model's forward pass runs on the "
                                 "worker's CPUs (the spec's live.device cpu), not on GPUs")

    @model_validator(mode="after")
    def _tier_names(self) -> SimProfile:
        for key, tier in self.tiers.items():
            if tier.name and tier.name != key:
                raise ValueError(f"tiers.{key}: name {tier.name!r} differs from its key")
            tier.name = key
        return self

    def server_for(self, name: str) -> ServerProfile:
        """The server serving tier `name` (its own KV budget where it has one)."""
        kv = self.tier(name).kv_cache_bytes
        return self.server if kv is None else self.server.model_copy(
            update={"kv_cache_bytes": kv})

    def tier(self, name: str) -> SimTier:
        """The tier called `name`; the error lists the known ones."""
        if name not in self.tiers:
            raise ValueError(f"unknown tier {name!r} (parameter 'tier_name'); "
                             f"known: {sorted(self.tiers)}")
        return self.tiers[name]

    def meta_record(self) -> dict[str, Any]:
        """The profile as run folders record it (meta.json `profile`), with the keys it was
        always written with (`SimTier.meta_record`, `ServerProfile.meta_record`)."""
        return {"description": self.description, "server": self.server.meta_record(),
                "tiers": {name: tier.meta_record() for name, tier in self.tiers.items()},
                "sample_interval_s": self.sample_interval_s}


def _store(store: StoreSpec, chunk_tokens: int, multi_process: bool) -> OffloadTier:
    """A spec store for the twin, as its kind models it (`StoreBase.twin_store`, with its
    `shared` flag); unset `async_eviction` follows the LMCache mode (the multi-process
    server evicts in a background loop, the in-process backend on insert)."""
    fields = store.twin_store()
    if fields["async_eviction"] is None:
        fields["async_eviction"] = multi_process
    return OffloadTier(**fields, chunk_tokens=chunk_tokens, shared=store.shared)


def sim_tier(tier: TierSpec, lmcache_mode: LMCacheMode = "in_process") -> SimTier:
    """The simulator's tier: the spec's tier settings, its stores with the tier's chunk size,
    and the server's LMCache mode (what LMCache does asynchronously follows from it)."""
    mp = lmcache_mode == "multi_process"
    shared = tier.model_dump(include=set(TierModel.model_fields) - {"stores"})
    return SimTier(**shared, stores=[_store(s, tier.chunk_tokens, mp) for s in tier.stores],
                   lmcache_mode=lmcache_mode)


def sim_profile(spec: ServerSpec) -> SimProfile:
    """Render a server spec for the simulator (model, engine limits, twin rates, tiers); a
    spec that gives its hardware gets its rates derived first (`derived_server`)."""
    spec = derived_server(spec)
    e, w = spec.engine, spec.twin
    server = ServerProfile(model=spec.model, **w.model_dump(include=set(TwinRates.model_fields)),
                           **e.model_dump())
    return SimProfile(description=spec.description, server=server,
                      tiers={name: sim_tier(t, spec.live.lmcache_mode)
                             for name, t in spec.tiers.items()},
                      sample_interval_s=w.sample_interval_s, placement=spec.placement,
                      host_cpu=spec.host_cpu, forward_on_cpu=spec.live.device == "cpu")


_OLD_SERVER_KEYS = {"gpu_kv_bytes": "kv_cache_bytes",
                    "max_batched_tokens": "max_num_batched_tokens"}
"""meta.json `profile.server` keys written before the twin took the spec's names."""
_OLD_TIER_KEYS = {"offload": "stores", "gpu_kv_bytes": "kv_cache_bytes",
                  "lookup_s": "twin_lookup_s", "connector_step_s": "twin_connector_step_s",
                  "connector_request_s": "twin_connector_request_s"}
"""meta.json `tier_config` keys written before the twin took the spec's names (and
`save_decode_kv` -> `lmcache.save_decode_cache`, `write_through` -> not `twin_write_back`)."""


def server_record(record: dict[str, Any]) -> dict[str, Any]:
    """A simulated run's recorded server (meta.json `profile.server`) under the spec's
    names, whether it was written with them or with the twin's former ones."""
    return {_OLD_SERVER_KEYS.get(key, key): value for key, value in record.items()}


def tier_record(record: dict[str, Any]) -> dict[str, Any]:
    """A simulated run's recorded tier (meta.json `tier_config`, `profile.tiers.<name>`)
    under the spec's names, whether it was written with them or with the twin's former ones
    (`offload`, `gpu_kv_bytes`, `lookup_s`, `connector_*_s`, `save_decode_kv`,
    `write_through`)."""
    out = {_OLD_TIER_KEYS.get(key, key): value for key, value in record.items()
           if key not in ("save_decode_kv", "write_through")}
    if "save_decode_kv" in record:
        out["lmcache"] = {**out.get("lmcache", {}), "save_decode_cache": record["save_decode_kv"]}
    if "write_through" in record:
        out["twin_write_back"] = not record["write_through"]
    return out


def load_profile(path: str | Path) -> SimProfile:
    """Read a server spec (`data/servers/*.yaml`) and render it for the simulator.

    Errors name the file and each bad key's dotted path (`kvrepro.tier_spec.load_server`).
    """
    return sim_profile(load_server(path))


def as_profile(profile: SimProfile | ServerSpec | str | Path) -> SimProfile:
    """A SimProfile from itself, a server spec, or a server spec file."""
    if isinstance(profile, SimProfile):
        return profile
    return sim_profile(profile) if isinstance(profile, ServerSpec) else load_profile(profile)


def chunk_bytes(tier: SimTier, kv_bytes_per_token: int) -> int:
    """Bytes of one offload chunk of `tier` (0 when it has no offload store)."""
    if not tier.stores:
        return 0
    return tier.stores[0].chunk_tokens * kv_bytes_per_token


def capacity_chunks(store: OffloadTier, kv_bytes_per_token: int) -> int:
    """Whole chunks that fit in a store (a partial chunk cannot be stored)."""
    size = store.chunk_tokens * kv_bytes_per_token
    return int(math.floor(store.capacity_bytes / size))
