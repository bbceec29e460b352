"""The server spec (kvrepro.tier_spec.ServerSpec) of a case: its stated setup, the GPU and model
catalogs, and the shared constants. Nothing here is per case: every rate is a catalog value
times a constant, by the rules of `kvrepro.calc.gpu_rates` (tensor parallelism, step
overhead, pinned host DMA), which a study's server with a `hardware` block gets too.

* Offload to host memory: vLLM's native connector loads and stores asynchronously, in
  16-token blocks (its GPU block, the offload block by default).
* LMCache's fs L2 (multi-process server): one chunk file per 256 tokens, read back "hot" with
  nothing in the L1 (the twin's tier is the fs store alone); the twin's shared_fs store reads
  `reads_in_flight` chunks at once, each read `fs_read_latency_s`, then stages it at
  `lmcache_mp_staging_gb_s` in series with the device's rate (`fs_path`).
"""

from __future__ import annotations

from typing import Any

from kvrepro.calc.gpu_rates import Constants, group_rates, host_dma_bytes_s, load_constants
from kvrepro.calc.roofline import GpuSpec, get_gpu
from kvrepro.studies.external.case import ExternalCase, StoreSetup, TierSetup
from kvrepro.tier_spec import ServerSpec, override_server, server_named

LMCACHE_CHUNK_TOKENS = 256
"""LMCache's default chunk_size (MP server and in-process alike)."""


def case_gpu(case: ExternalCase) -> GpuSpec:
    return get_gpu(case.setup.gpu)


def twin_rates(case: ExternalCase, constants: Constants) -> dict[str, float]:
    """The spec's `twin` block: the TP group's rates and the step's fixed and per-token cost."""
    setup = case.setup
    return group_rates(case_gpu(case), setup.model_spec(), setup.tensor_parallel_size,
                       setup.engine.cuda_graphs, constants)


def kv_cache_bytes(case: ExternalCase) -> float:
    """The GPU KV pool of one replica: as stated, else what vLLM leaves of
    gpu_memory_utilization x memory after the weights and an activation reserve."""
    setup, engine = case.setup, case.setup.engine
    model = setup.model_spec()
    if engine.kv_cache_tokens is not None:
        return float(engine.kv_cache_tokens * model.kv_bytes_per_token)
    tp, gpu = setup.tensor_parallel_size, case_gpu(case)
    weights = model.params_total_b * 1e9 * model.weight_bytes_per_param
    free = tp * (gpu.mem_gb * 1e9 * engine.gpu_memory_utilization
                 - engine.activation_reserve_gb * 1e9) - weights
    if free <= 0:
        raise ValueError(f"case {case.name}: {setup.model_spec().name} does not fit "
                         f"{tp} x {gpu.name} at gpu_memory_utilization "
                         f"{engine.gpu_memory_utilization}")
    return free


def _dram_store(name: str, store: StoreSetup, case: ExternalCase, constants: Constants
                ) -> dict[str, Any]:
    dma_b_s = host_dma_bytes_s(case_gpu(case), case.setup.tensor_parallel_size, constants)
    return {"name": name, "kind": "dram", "capacity_bytes": store.capacity_bytes,
            "read_bw_bytes_s": dma_b_s, "write_bw_bytes_s": dma_b_s}


LMCACHE_READS_IN_FLIGHT: dict[str, tuple[int, str]] = {
    "local_disk-0.5.0": (1, "in-process LocalDiskBackend: one job per request reads its "
                            "chunks one after another (4-thread pool; synchronous path with "
                            "enable_async_loading false), through a pinned CPU buffer"),
    "fs-0.5": (1, "multi-process fs L2 adapter as released: a serial per-key loop per load "
                  "batch, one .data file per chunk"),
    "fs-pr4366": (16, "the fs adapter of LMCache PR 4366: io_concurrency reads of a batch at "
                      "once, default 16"),
    "fs_native-0.5": (4, "fs_native L2 adapter: num_workers C++ I/O threads, default 4"),
}
"""Reads LMCache keeps in flight per disk path and release, when a case does not set them
(read from each release's source; a deployment's io_concurrency / num_workers overrides)."""


def reads_in_flight(store: StoreSetup, case: ExternalCase) -> int:
    """The store's reads in flight: as set, else its adapter's default."""
    if store.reads_in_flight is not None:
        return store.reads_in_flight
    if store.adapter not in LMCACHE_READS_IN_FLIGHT:
        raise ValueError(f"case {case.name}: an fs store needs reads_in_flight or an adapter "
                         f"of {sorted(LMCACHE_READS_IN_FLIGHT)}")
    return LMCACHE_READS_IN_FLIGHT[store.adapter][0]


def _fs_store(name: str, store: StoreSetup, case: ExternalCase, constants: Constants
              ) -> dict[str, Any]:
    if store.device_read_gb_s is None:
        raise ValueError(f"case {case.name}: an fs store needs device_read_gb_s (a datasheet "
                         f"or fio figure)")
    device_b_s = store.device_read_gb_s * 1e9
    staging_b_s = constants.value("lmcache_mp_staging_gb_s") * 1e9
    read_b_s = 1 / (1 / device_b_s + 1 / staging_b_s)  # the two stages in series (fs_path)
    return {"name": name, "kind": "shared_fs", "capacity_bytes": store.capacity_bytes,
            "path": f"/tmp/kvrepro-external/{case.name}/{name}",
            "read_bw_bytes_s": read_b_s, "write_bw_bytes_s": device_b_s,
            "object_latency_s": constants.value("fs_read_latency_s"),
            "reads_in_flight": reads_in_flight(store, case)}


STORE_BUILDERS = {"dram": _dram_store, "fs": _fs_store}
"""A case's store kind -> the twin store it runs as (kvrepro.stores kinds dram, shared_fs)."""


def _store(name: str, store: StoreSetup, case: ExternalCase, constants: Constants
           ) -> dict[str, Any]:
    return STORE_BUILDERS[store.kind](name, store, case, constants)


def _tier(name: str, tier: TierSetup, case: ExternalCase, constants: Constants
          ) -> dict[str, Any]:
    if tier.connector == "none":
        return {}
    if tier.connector == "vllm_native":
        stores = [_store(name, s, case, constants) for s in tier.stores]
        return {"connector": "native", "chunk_tokens": case.setup.engine.block_tokens,
                "stores": stores, "lmcache": {"enable_async_loading": True}}
    stores = [_store(f"{name}_{i}" if i else name, s, case, constants)
              for i, s in enumerate(tier.stores)]
    return {"chunk_tokens": LMCACHE_CHUNK_TOKENS, "stores": stores}


def case_server(case: ExternalCase, constants: Constants | None = None) -> ServerSpec:
    """The case's server as a spec both engines read (the twin runs it here); a case that
    names a server spec runs that one with the constants' GPU rates."""
    constants = constants or load_constants()
    if case.setup.server_spec is not None:
        return _named_server(case, constants)
    setup, engine = case.setup, case.setup.engine
    model = setup.model_spec()
    spec = {
        "description": f"external case {case.name}: {case.title}",
        "model": setup.model if isinstance(setup.model, str) else model.model_dump(),
        "engine": {"kv_cache_bytes": kv_cache_bytes(case), "block_tokens": engine.block_tokens,
                   "max_num_batched_tokens": engine.max_num_batched_tokens,
                   "max_num_seqs": engine.max_num_seqs, "max_model_len": engine.max_model_len},
        "twin": {**twin_rates(case, constants), "sample_interval_s": 10.0},
        "live": {"model": setup.hf_model, "tensor_parallel_size": setup.tensor_parallel_size,
                 "lmcache_mode": "multi_process" if any(
                     t.connector == "lmcache_mp" for t in setup.tiers.values())
                 else "in_process"},
        "tiers": {name: _tier(name, tier, case, constants)
                  for name, tier in setup.tiers.items()},
    }
    return ServerSpec.model_validate(spec)


def _named_server(case: ExternalCase, constants: Constants) -> ServerSpec:
    """The named server spec, its `twin` rates replaced by the catalogs' and constants' (its
    engine and stores kept: what it states, and what a study's own fit set)."""
    return override_server(server_named(case.setup.server_spec), {f"twin.{k}": v
                                  for k, v in twin_rates(case, constants).items()})
