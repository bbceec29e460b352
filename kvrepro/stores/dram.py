"""The `dram` store kind: host memory (LMCache's CPU backend, its L1; vLLM's CPU offload).

LMCache allocates it whole at start, so its capacity is bought DRAM (the bill) and checked
against the host's free memory (the doctor). When full it drops new chunks (a hard limit,
`lmcache/v1/distributed/l1_manager.py`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from kvrepro.stores.store_kind import StoreBase, StoreBill, gib, register


@register
class DramStore(StoreBase):
    """Host DRAM: the DRAM tier's store, or a flash tier's staging buffer."""

    kind: Literal["dram"] = Field("dram", description="host memory")
    level = 0
    l1 = True
    host_memory = True

    def lmcache_in_process(self) -> dict[str, Any]:
        return {"local_cpu": True, "max_local_cpu_size_gib": gib(self.capacity_bytes)}

    def native_offload(self) -> dict[str, Any]:
        return {"cpu_bytes_to_use": int(self.capacity_bytes)}

    @classmethod
    def deployed_capacity_bytes(cls, lmcache_mp: dict[str, Any], position: int
                                ) -> float | None:
        return lmcache_mp["l1_size_gib"] * 2**30 if position == 0 else None

    def bill(self) -> StoreBill:
        return StoreBill(dram_bytes=self.capacity_bytes)
