"""Offload store kinds: one module per kind, registered by name (`KINDS`).

A store kind is where KV goes below the GPU: `dram` (host memory), `flash` (a local NVMe
folder), `shared_fs` (a filesystem several servers share). Each module owns its spec fields
and rules, its speed `level`, its LMCache renderings (in-process, multi-process), vLLM's
native one where it has one, the inverse a validation reads back, the twin's view, its
hardware bill and its folder for the preflight. `StoreSpec` is the union the server spec
reads (`kind` picks the class). CONTRIBUTING's recipe 1 lists the files a new kind touches.
"""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import Field

from kvrepro.stores.dram import DramStore
from kvrepro.stores.flash import RUN_DISK_DIR, FlashStore
from kvrepro.stores.shared_fs import RUN_SHARED_DIR, SharedFsStore
from kvrepro.stores.store_kind import (
    GIB,
    KINDS,
    RUN_DIR,
    StoreBase,
    StoreBill,
    StoreFolder,
    StoreModel,
    StrictModel,
    gib,
)

StoreSpec = Annotated[Union[tuple(KINDS.values())], Field(discriminator="kind")]  # noqa: UP007
"""One offload store of a server spec, of any registered kind."""

__all__ = ["GIB", "KINDS", "RUN_DIR", "RUN_DISK_DIR", "RUN_SHARED_DIR", "DramStore",
           "FlashStore", "SharedFsStore", "StoreBase", "StoreBill", "StoreFolder", "StoreModel",
           "StoreSpec", "StrictModel", "gib"]
