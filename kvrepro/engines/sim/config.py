"""The simulator's view of a server: what `kvrepro.tier_spec` renders for the digital twin.

A server is described once, in a server spec (`data/servers/*.yaml`, `kvrepro.tier_spec`),
for both engines and the cost model. `sim_profile(spec)` renders it to a `SimProfile`, what
the digital twin needs to stand in for one serving instance:

* `server` (`ServerProfile`): the model and the GPU group's roofline rates, the KV capacity in
  GPU memory and vLLM's scheduler limits;
* `tiers`: named `SimTier`s (baseline, dram, flash, ...), each a list of `OffloadTier`s below
  the GPU, fastest first (LMCache's CPU backend, then its local-disk backend);
* `sample_interval_s`: how often the engine writes a server sample.

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

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from kvrepro.calc.models import ModelSpec, get_model
from kvrepro.calc.roofline import GpuSpec
from kvrepro.tier_spec import (
    ServerSpec,
    StoreModel,
    StoreSpec,
    TierSpec,
    TwinRates,
    load_server,
)


class ServerProfile(TwinRates):
    """One vLLM instance: model, GPU-group rates for the roofline (the spec's `twin`), KV
    capacity and limits (the spec's `engine`)."""

    model_config = ConfigDict(extra="forbid")

    model: str | ModelSpec = Field(description="catalog name (data/models/catalog.yaml) or an "
                                               "inline ModelSpec mapping")
    gpu_kv_bytes: float = Field(gt=0, description="KV cache capacity in GPU memory, bytes")
    block_tokens: int = Field(16, gt=0, description="prefix-cache block size, tokens")
    max_batched_tokens: int = Field(8192, gt=0, description="token budget per step "
                                                            "(chunked prefill)")
    max_num_seqs: int = Field(256, gt=0, description="most requests running at once")
    max_model_len: int = Field(65_536, gt=0, description="prompt + output tokens allowed")

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
                f"gpu_kv_bytes {self.gpu_kv_bytes:.4g} holds {self.capacity_blocks()} blocks of "
                f"{self.block_tokens} tokens x {spec.kv_bytes_per_token} B, less than one "
                f"max_model_len ({self.max_model_len}) request; vLLM refuses to start so")
        return self

    def model_spec(self) -> ModelSpec:
        """The model as a ModelSpec (catalog lookup for a name)."""
        return get_model(self.model) if isinstance(self.model, str) else self.model

    def gpu_spec(self) -> GpuSpec:
        """A GpuSpec with this profile's rates, for `kvrepro.calc.roofline`.

        The roofline's step time reads only `fp16_tflops` and `mem_bw_tb_s`. GpuSpec also
        requires a host link and a memory size; offload loads use each tier's own read
        bandwidth instead of the link, so the link is set to a value nothing here reads.
        """
        return GpuSpec(name=f"sim:{self.model_spec().name}", fp16_tflops=self.fp16_tflops,
                       host_link_gb_s=1.0, mem_bw_tb_s=self.mem_bw_tb_s,
                       mem_gb=self.gpu_kv_bytes / 1e9, source="kvrepro.engines.sim profile")

    def block_bytes(self) -> int:
        """Bytes of one KV block."""
        return self.block_tokens * self.model_spec().kv_bytes_per_token

    def capacity_blocks(self) -> int:
        """How many KV blocks fit in `gpu_kv_bytes`."""
        return int(self.gpu_kv_bytes // self.block_bytes())


class OffloadTier(StoreModel):
    """One store below the GPU as the simulator runs it: the spec's store model plus the
    tier's chunk size (LMCache has one chunk size per tier)."""

    chunk_tokens: int = Field(256, gt=0, description="LMCache chunk size, tokens")
    hard_limit: bool = Field(True, description="when full, new chunks are dropped (LMCache's "
                                               "L1); False: a soft limit that writes overshoot "
                                               "until the eviction loop catches up (its "
                                               "fs_native disk tier)")


class SimTier(BaseModel):
    """A tier configuration: the offload stores below the GPU, fastest first."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("", description="filled from the key in SimProfile.tiers")
    offload: list[OffloadTier] = Field(default_factory=list, description="fastest first; "
                                                                          "empty for baseline")
    write_through: bool = Field(True, description="computed KV goes to every offload store "
                                                  "(LMCache); False: to the first only, and "
                                                  "evicted chunks move one store down")
    load_async: bool = Field(False, description="a request waiting for a load does not hold "
                                                "up the GPU step (LMCache's "
                                                "enable_async_loading; off by default)")
    save_decode_kv: bool = Field(False, description="chunks completed while decoding are "
                                                    "stored too (LMCache's save_decode_cache; "
                                                    "off by default: only the prompt's)")
    skip_l1: bool = Field(False, description="computed KV is written to the last store only, "
                                             "not the ones in front (l2_store_policy skip_l1)")
    gpu_kv_bytes: float | None = Field(None, gt=0, description="this tier's engine KV budget, "
                                                               "if not the server's")
    lookup_s: float = Field(0.0, ge=0, description="the offload lookup's round trip (LMCache "
                                                   "connector): with lookup_async the request "
                                                   "waits for it, else the step does")
    lookup_async: bool = Field(False, description="lookups run outside the step: a request is "
                                                  "skipped until its answer is in (LMCache's "
                                                  "multi-process connector)")
    connector_step_s: float = Field(0.0, ge=0, description="connector cost per engine step "
                                                           "(offload tiers)")
    connector_request_s: float = Field(0.0, ge=0, description="connector cost per request "
                                                              "scheduled in a step")

    @model_validator(mode="after")
    def _consistent(self) -> SimTier:
        names = [t.name for t in self.offload]
        if len(set(names)) != len(names):
            raise ValueError(f"offload store names must be unique, got {names}")
        chunks = {t.chunk_tokens for t in self.offload}
        if len(chunks) > 1:
            raise ValueError(f"all offload stores of a tier share one chunk_tokens (LMCache has "
                             f"one chunk size), got {sorted(chunks)}")
        if not self.write_through and any(t.async_eviction for t in self.offload):
            raise ValueError("write-back (evicted chunks move one store down) is modelled with "
                             "eviction on insert only; set async_eviction false on its stores")
        return self


class SimProfile(BaseModel):
    """Server + named tiers + sampling: everything one simulated campaign needs."""

    model_config = ConfigDict(extra="forbid")

    description: str = ""
    server: ServerProfile
    tiers: dict[str, SimTier] = Field(min_length=1)
    sample_interval_s: float = Field(10.0, gt=0, description="server sample period")

    @model_validator(mode="after")
    def _tier_names(self) -> SimProfile:
        for key, tier in self.tiers.items():
            if tier.name and tier.name != key:
                raise ValueError(f"tiers.{key}: name {tier.name!r} differs from its key")
            tier.name = key
        return self

    def server_for(self, name: str) -> ServerProfile:
        """The server serving tier `name` (its own KV budget where it has one)."""
        kv = self.tier(name).gpu_kv_bytes
        return self.server if kv is None else self.server.model_copy(update={"gpu_kv_bytes": kv})

    def tier(self, name: str) -> SimTier:
        """The tier called `name`; the error lists the known ones."""
        if name not in self.tiers:
            raise ValueError(f"unknown tier {name!r} (parameter 'tier_name'); "
                             f"known: {sorted(self.tiers)}")
        return self.tiers[name]


def _store(store: StoreSpec, chunk_tokens: int, multi_process: bool) -> OffloadTier:
    """A spec store for the twin; unset `async_eviction` follows the LMCache mode (the
    multi-process server evicts in a background loop, the in-process backend on insert)."""
    fields = store.model_dump(include=set(StoreModel.model_fields))
    if fields["async_eviction"] is None:
        fields["async_eviction"] = multi_process
    return OffloadTier(**fields, chunk_tokens=chunk_tokens, hard_limit=store.kind == "dram")


def sim_tier(tier: TierSpec, lmcache_mode: str = "in_process") -> SimTier:
    """The simulator's tier: its stores, and LMCache's behaviour as the spec's flags and the
    server's LMCache mode say."""
    if tier.lmcache.save_unfull_chunk:
        raise ValueError(f"tier {tier.name!r}: lmcache.save_unfull_chunk true is not modelled "
                         "by the simulator (partial chunks); leave it false for simulated runs")
    mp = lmcache_mode == "multi_process"
    return SimTier(name=tier.name,
                   offload=[_store(s, tier.chunk_tokens, mp) for s in tier.stores],
                   write_through=not tier.twin_write_back,
                   # the multi-process connector always answers vLLM's lookup later and
                   # loads asynchronously (lmcache_mp_connector.get_num_new_matched_tokens)
                   load_async=tier.lmcache.enable_async_loading or mp, lookup_async=mp,
                   save_decode_kv=tier.lmcache.save_decode_cache,
                   skip_l1=tier.lmcache.l2_store_policy == "skip_l1",
                   gpu_kv_bytes=tier.kv_cache_bytes, lookup_s=tier.twin_lookup_s,
                   connector_step_s=tier.twin_connector_step_s,
                   connector_request_s=tier.twin_connector_request_s)


def sim_profile(spec: ServerSpec) -> SimProfile:
    """Render a server spec for the simulator (model, engine limits, twin rates, tiers)."""
    e, w = spec.engine, spec.twin
    server = ServerProfile(
        model=spec.model, **w.model_dump(include=set(TwinRates.model_fields)),
        gpu_kv_bytes=e.kv_cache_bytes,
        block_tokens=e.block_tokens, max_batched_tokens=e.max_num_batched_tokens,
        max_num_seqs=e.max_num_seqs, max_model_len=e.max_model_len)
    return SimProfile(description=spec.description, server=server,
                      tiers={name: sim_tier(t, spec.live.lmcache_mode)
                             for name, t in spec.tiers.items()},
                      sample_interval_s=w.sample_interval_s)


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
    if not tier.offload:
        return 0
    return tier.offload[0].chunk_tokens * kv_bytes_per_token


def capacity_chunks(store: OffloadTier, kv_bytes_per_token: int) -> int:
    """Whole chunks that fit in a store (a partial chunk cannot be stored)."""
    size = store.chunk_tokens * kv_bytes_per_token
    return int(math.floor(store.capacity_bytes / size))
