"""The `flash` store kind: a local disk folder on NVMe drives (LMCache's local-disk backend
in process, its `fs_native` L2 adapter in the `lmcache server`).

Its chunk files go to a folder the run owns (default: `lmcache-l2` in the run folder); its
drives are priced (a RAID array) and their endurance is the cost the studies weigh. LMCache's
disk eviction is a background loop that lets writes overshoot the limit (a soft limit,
`storage_controllers/eviction_controller.py`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from kvrepro.stores.drives import DriveArray
from kvrepro.stores.store_kind import (
    RUN_DIR,
    FolderFiles,
    StoreBase,
    StoreBill,
    StoreFolder,
    gib,
    register,
)

RUN_DISK_DIR = f"{RUN_DIR}/lmcache-l2"
"""A flash store without a `path` writes into its run's own folder."""


@register
class FlashStore(StoreBase, FolderFiles, DriveArray):
    """A local flash folder and the drives under it."""

    kind: Literal["flash"] = Field("flash", description="a local disk folder")
    level = 1
    hard_limit = False
    path: str | None = Field(None, description="the folder LMCache writes chunk files to "
                             "(default: `lmcache-l2` in the run folder, the run's own)")
    io_mode: Literal["buffered", "o_direct"] = Field("buffered", description="page cache or "
                                                     "O_DIRECT")
    io_workers: int = Field(4, gt=0, description="multi-process LMCache: I/O worker threads "
                            "of the disk adapter (fs_native num_workers; its default 4)")

    @model_validator(mode="after")
    def _fits_drives(self) -> FlashStore:
        if self.drives and self.capacity_bytes > self.usable_bytes():
            raise ValueError(f"{self.where()}: capacity_bytes {self.capacity_bytes:.4g} "
                             f"exceeds the {self.drives} drives' usable "
                             f"{self.usable_bytes():.4g} B in {self.raid_level}")
        return self

    def folder(self) -> StoreFolder:
        return StoreFolder(store=self.name, path=self.path or RUN_DISK_DIR,
                           keep_files=self.keep_files,
                           allow_existing_files=self.allow_existing_files)

    def lmcache_in_process(self) -> dict[str, Any]:
        if self.io_mode != "buffered":
            raise ValueError(f"{self.where()}: io_mode {self.io_mode!r} has no in-process "
                             "LMCache setting")
        return {"local_disk_path": self.folder().path,
                "max_local_disk_size_gib": gib(self.capacity_bytes)}

    def lmcache_l2_adapter(self) -> dict[str, Any]:
        return {"type": "fs_native", "base_path": self.folder().path,
                "num_workers": self.io_workers, "use_odirect": self.io_mode == "o_direct",
                "max_capacity_gb": gib(self.capacity_bytes),
                "eviction": {"eviction_policy": "LRU"}}

    @classmethod
    def deployed_capacity_bytes(cls, lmcache_mp: dict[str, Any], position: int
                                ) -> float | None:
        adapters = lmcache_mp.get("l2_adapters") or []
        if 0 < position <= len(adapters) and adapters[position - 1].get("max_capacity_gb"):
            return adapters[position - 1]["max_capacity_gb"] * 2**30
        return None

    def bill(self) -> StoreBill:
        return StoreBill(drives=self.drives, drive_tb=self.drive_tb,
                         raid_level=self.raid_level)
