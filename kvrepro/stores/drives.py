"""Flash drive arrays: RAID layouts and the drives a store adds.

Here, in the specs layer, because a spec's drive array is checked when it is read:
`kvrepro.calc.endurance` (write factors) and `kvrepro.calc.economics` (usable capacity)
use these same tables.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, model_validator

from kvrepro.stores.store_kind import StrictModel

_MIN_DRIVES = {"RAID0": 1, "RAID1": 2, "RAID10": 4, "RAID5": 3, "RAID6": 4}
_RAID_DATA_DRIVES = {"RAID0": lambda n: n, "RAID1": lambda n: 1, "RAID10": lambda n: n // 2,
                     "RAID5": lambda n: n - 1, "RAID6": lambda n: n - 2}


def normalize_raid_level(raid_level: str | int) -> str:
    """Accept 10, "10", "raid10" or "RAID10"; reject anything else naming the parameter."""
    text = str(raid_level).strip().upper()
    text = text if text.startswith("RAID") else f"RAID{text}"
    if text not in _MIN_DRIVES:
        raise ValueError(f"unknown RAID level {raid_level!r} (parameter 'raid_level'); "
                         f"known: {sorted(_MIN_DRIVES)}")
    return text


def raid_write_factor(raid_level: str | int, n_drives: int) -> float:
    """Physical bytes written to the drives per byte the host writes.

    RAID0 stripes (1x); RAID1 mirrors to every drive (n x); RAID10 mirrors pairs (2x);
    RAID5/6 add one/two parity strips per stripe, n/(n-1) and n/(n-2) for full-stripe writes,
    which is what large sequential KV-chunk writes are.
    """
    level = normalize_raid_level(raid_level)
    if n_drives < _MIN_DRIVES[level] or (level == "RAID10" and n_drives % 2):
        raise ValueError(f"parameter 'n_drives' = {n_drives} is not valid for {level} "
                         f"(needs >= {_MIN_DRIVES[level]}{', even' if level == 'RAID10' else ''})")
    if level == "RAID1":
        return float(n_drives)
    if level == "RAID5":
        return n_drives / (n_drives - 1)
    if level == "RAID6":
        return n_drives / (n_drives - 2)
    return 2.0 if level == "RAID10" else 1.0


def raid_data_drives(raid_level: str | int, n_drives: int) -> int:
    """How many of `n_drives` hold data in the layout (mirrors and parity excluded); a count
    the layout cannot use is an error (`raid_write_factor`'s check)."""
    level = normalize_raid_level(raid_level)
    raid_write_factor(level, n_drives)
    return _RAID_DATA_DRIVES[level](n_drives)


class DriveArray(StrictModel):
    """The flash drives a tier adds (the cost model prices them; `calc.economics.TierHardware`
    is this plus host DRAM)."""

    drives: int = Field(0, ge=0, description="cost: NVMe drives of the flash array")
    drive_tb: float = Field(12.8, gt=0, description="cost: capacity per drive, TB")
    raid_level: Annotated[str, AfterValidator(normalize_raid_level)] = Field(
        "RAID10", description="cost: layout of the flash array")

    @model_validator(mode="after")
    def _drive_count_fits_layout(self) -> DriveArray:
        if self.drives:
            raid_write_factor(self.raid_level, self.drives)  # a count the layout can't use
        return self

    def usable_bytes(self) -> float:
        """Capacity after the RAID layout, bytes (0 without drives)."""
        if not self.drives:
            return 0.0
        return _RAID_DATA_DRIVES[self.raid_level](self.drives) * self.drive_tb * 1e12
