"""The `shared_fs` store kind: a POSIX filesystem several servers mount (NFS, Lustre, CephFS,
a cloud file volume), holding one pool of KV chunk files that every instance of a fleet
reads and writes.

What the pinned releases do with it, read from their source:

* multi-process LMCache 0.5.6: the `fs` L2 adapter
  (`lmcache/v1/distributed/l2_adapters/fs_l2_adapter.py`), one file per chunk named by its
  key; a lookup asks the filesystem whether the file exists (`_key_exists_on_disk`), so a
  chunk one instance wrote is found by every other. It declares no capacity, so LMCache never
  evicts from it ("the FS adapter declares no max capacity ... the eviction controller skips
  the adapter"): when the share is full, writes fail. Hence `eviction: none` here, and the
  twin drops new chunks when full;
* in-process LMCache: its `fs` remote connector (`remote_url: fs:///path`,
  `storage_backend/connector/fs_adapter.py`);
* vLLM 0.32's own offloading: the `TieringOffloadingSpec` with a CPU primary tier and an
  `fs` secondary tier (`vllm/v1/kv_offload/tiering/fs/manager.py`, "KV cache sharing
  between multiple vLLM instances using the same root_dir ... works by default").

The twin sees its network: `read_bw_bytes_s` / `write_bw_bytes_s` are the share's bandwidth
as one server gets it, and `object_latency_s` each chunk file's round trip, of which
`reads_in_flight` overlap (the per-chunk latency the twin adds is their quotient).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from kvrepro.stores.store_kind import (
    RUN_DIR,
    FolderFiles,
    StoreBase,
    StoreBill,
    StoreFolder,
    register,
)

RUN_SHARED_DIR = f"{RUN_DIR}/shared-fs"
"""A shared store without a `path` writes into its run's (or fleet run's) own folder."""


@register
class SharedFsStore(StoreBase, FolderFiles):
    """A filesystem shared by the servers of a fleet."""

    kind: Literal["shared_fs"] = Field("shared_fs", description="a shared filesystem")
    level = 2
    shared = True
    eviction: Literal["lru", "ttl", "none"] = Field(
        "none", description="none: LMCache's fs adapter never evicts (a full share fails new "
                            "writes, the twin drops them); lru/ttl: a simulator what-if")
    path: str | None = Field(None, description="the shared folder (a mount every instance "
                             "reaches; default: `shared-fs` in the run folder)")
    object_latency_s: float = Field(0.0, ge=0, description="twin: round trip of one chunk "
                                    "file (open, read, close) over the network")
    reads_in_flight: int = Field(1, gt=0, description="twin: chunk reads a server keeps in "
                                 "flight at once (their latencies overlap)")
    servers_sharing: int = Field(1, gt=0, description="cost: servers that share the "
                                 "filesystem; each is billed its share of the capacity")

    @model_validator(mode="after")
    def _latency_once(self) -> SharedFsStore:
        if self.chunk_read_latency_s or self.chunk_read_latency_samples_s:
            raise ValueError(f"{self.where()}: give object_latency_s (and reads_in_flight), "
                             "not chunk_read_latency_s: the twin's per-chunk latency is "
                             "derived from them")
        return self

    def folder(self) -> StoreFolder:
        return StoreFolder(store=self.name, path=self.path or RUN_SHARED_DIR,
                           keep_files=self.keep_files,
                           allow_existing_files=self.allow_existing_files, shared=True)

    def _live_eviction(self) -> None:
        if self.eviction != "none":
            raise ValueError(f"{self.where()}: eviction {self.eviction!r} has no LMCache "
                             "setting (its fs adapter never evicts); use 'none'")

    def check_eviction_rendered(self) -> None:
        self._live_eviction()

    def lmcache_in_process(self) -> dict[str, Any]:
        path = self.folder().path
        return {"remote_url": f"fs://{path}" if path.startswith("/") else f"fs:///{path}"}

    def lmcache_l2_adapter(self) -> dict[str, Any]:
        return {"type": "fs", "base_path": self.folder().path}

    def native_offload(self) -> dict[str, Any]:
        return {"secondary_tier": {"type": "fs", "root_dir": self.folder().path}}

    def twin_store(self) -> dict[str, Any]:
        return {**super().twin_store(),
                "chunk_read_latency_s": self.object_latency_s / self.reads_in_flight,
                "chunk_write_latency_s": self.chunk_write_latency_s or self.object_latency_s}

    def bill(self) -> StoreBill:
        return StoreBill(shared_fs_bytes=self.capacity_bytes / self.servers_sharing)
