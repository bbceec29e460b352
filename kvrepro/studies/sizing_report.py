"""The analytic study figures in one place: validated parameters, tables and headline numbers.

`notebooks/01_sizing_endurance.ipynb` is a thin shell around this module: it builds
`SizingParams` from its papermill parameters, calls `sizing_tables()` for the figure data and
`sizing_headlines()` for the numbers shown next to the studies' values.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, field_validator

from kvrepro._paths import data_file
from kvrepro.calc import endurance, roofline, sizing
from kvrepro.calc.economics import TierHardware, tier_hardware
from kvrepro.model_spec import get_model
from kvrepro.tier_spec import shipped_server


def _study_a_bill(tier: str) -> TierHardware:
    """What study A's tier `tier` adds, from its stores' bills (the DRAM tier's DRAM, the
    flash tier's drive array)."""
    return tier_hardware(shipped_server("study_a").tier(tier))


class SizingParams(BaseModel):
    """Inputs of figures A6-A8, B3, B4, B8; defaults are the studies' setups."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field("MiniMax-M2.7-FP8", description="catalog model for A6")
    token_rate_tok_s: float = Field(4200, gt=0, description="operating point for A6, tok/s")
    token_rates_tok_s: list[float] = Field([1000, 2000, 4200, 8000], min_length=1)
    ttls_s: list[float] = Field([300, 3600], min_length=1, description="TTLs to mark, s")
    max_ttl_s: float = Field(7200, gt=0)
    dram_tier_bytes: float = Field(default_factory=lambda: _study_a_bill("dram").dram_bytes,
                                   gt=0, description="DRAM tier size drawn on A6 (default: "
                                   "study A's server spec)")
    n_drives: int = Field(default_factory=lambda: _study_a_bill("flash").drives, gt=0,
                          description="drives of the flash array (default: study A's spec)")
    drive_capacity_bytes: float = Field(
        default_factory=lambda: _study_a_bill("flash").drive_tb * 1e12, gt=0)
    drive_rating_dwpd: float = Field(3.0, gt=0)
    raid_level: str = Field(default_factory=lambda: _study_a_bill("flash").raid_level,
                            description="layout of the flash array")
    compare_raid_level: str = Field("RAID0", description="second layout on A7")
    write_rate_bytes_s: float = Field(1.9e9, gt=0, description="sustained KV writes (A7)")
    peak_write_bytes_s: float = Field(4.1e9, gt=0)
    peak_read_bytes_s: float = Field(1.1e9, gt=0)
    array_bw_bytes_s: float = Field(114e9, gt=0, description="fio-measured array bandwidth")
    study_b_model: str = "Qwen3-14B-BF16"
    gpus: list[str] = Field(["A100", "H100", "GH200"], min_length=1)
    prompt_tokens: list[int] = Field([16384, 32768], min_length=1)
    mfu: float = Field(0.5, gt=0, le=1, description="prefill FLOPs utilisation")
    daily_writes_bytes: float = Field(57.5e12, gt=0, description="KV writes per GPU per day")
    max_daily_writes_bytes: float = Field(100e12, gt=0)

    @classmethod
    def from_parameters(cls, **values: object) -> SizingParams:
        """From notebook parameters, where None means the default (study A's server spec)."""
        return cls(**{k: v for k, v in values.items() if v is not None})

    @field_validator("model", "study_b_model")
    @classmethod
    def _known_model(cls, name: str) -> str:
        get_model(name)
        return name

    @field_validator("raid_level", "compare_raid_level")
    @classmethod
    def _known_raid(cls, level: str) -> str:
        return endurance.normalize_raid_level(level)

    @field_validator("gpus")
    @classmethod
    def _known_gpus(cls, gpus: list[str]) -> list[str]:
        for name in gpus:
            roofline.get_gpu(name)
        return gpus

    @field_validator("token_rates_tok_s", "ttls_s", "prompt_tokens")
    @classmethod
    def _all_positive(cls, values: list[float]) -> list[float]:
        if any(v <= 0 for v in values):
            raise ValueError(f"all values must be > 0, got {values}")
        return values


def sizing_tables(p: SizingParams) -> dict[str, pd.DataFrame]:
    """Tidy data for each analytic figure, keyed by figure id."""
    spec = get_model(p.model)
    rates = np.linspace(0.1e9, max(4e9, 2 * p.write_rate_bytes_s), 60).tolist()
    rates.append(p.write_rate_bytes_s)
    hierarchy = pd.read_csv(data_file("hardware", "memory_hierarchy.csv"), comment="#")
    daily = np.linspace(0, p.max_daily_writes_bytes / 1e12, 101).tolist() + [
        p.daily_writes_bytes / 1e12]
    return {
        "A6": sizing.capacity_vs_ttl(spec, p.token_rates_tok_s, p.max_ttl_s),
        "A7": endurance.dwpd_by_raid(sorted(rates), p.n_drives, p.drive_capacity_bytes,
                                     [p.raid_level, p.compare_raid_level]),
        "A8": sizing.headroom_table(p.array_bw_bytes_s, {
            "peak KV write": p.peak_write_bytes_s, "peak KV read": p.peak_read_bytes_s}),
        "B3": hierarchy,
        "B4": roofline.prefill_ttft_by_gpu(get_model(p.study_b_model), p.gpus,
                                           p.prompt_tokens, p.mfu),
        "B8": endurance.c_bound_curves(sorted(daily)),
    }


def sizing_headlines(p: SizingParams) -> dict[str, float]:
    """Headline numbers of A6-A8 and B2/B8, computed from `p`, in the reference units."""
    spec = get_model(p.model)
    held = sizing.kv_capacity(p.token_rate_tok_s, 3600, spec.kv_bytes_per_token)
    dwpd = {level: endurance.dwpd_from_write_rate(p.write_rate_bytes_s, p.n_drives,
                                                  p.drive_capacity_bytes, level)
            for level in ("RAID10", "RAID0")}
    presets = endurance.nand_presets().set_index("name").dwpd
    cbound = {name: endurance.c_bound_bytes(p.daily_writes_bytes, presets[name]) / 1e12
              for name in presets.index}
    return {
        "A6.kv_bytes_minimax": get_model("MiniMax-M2.7-FP8").kv_bytes_per_token,
        "A6.tokens_1h": held["tokens"] / 1e6,
        "A6.capacity_1h": held["kv_bytes"] / 1e12,
        "A7.dwpd_raid10": dwpd["RAID10"],
        "A7.dwpd_raid0": dwpd["RAID0"],
        "A8.headroom": sizing.bandwidth_headroom(p.array_bw_bytes_s, p.peak_write_bytes_s),
        "B2.kv_bytes_qwen3_14b": get_model(p.study_b_model).kv_bytes_per_token,
        "B8.cbound_slc": cbound["SLC"],
        "B8.cbound_tlc": cbound["TLC"],
        "B8.cbound_qlc": cbound["QLC"],
        "B8.cbound_tlc_op": cbound["TLC+OP"],
        "B8.cbound_qlc_zns": cbound["QLC+ZNS"],
    }
