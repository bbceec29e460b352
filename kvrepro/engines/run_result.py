"""What every engine returns, and the rule both follow at the end of a run.

Both engines have the same entry point, `run(workload, server, tier, run_dir, ...)`
(`kvrepro.engines.live.runner.run` and `kvrepro.engines.sim.campaign.run`; `kvrepro.engines.run`
picks one by name), and return a `RunResult`: the records and samples as `kvrepro.records`
reads them from a run folder, the run's meta, and one row of counters per offload store.
Analysis and figures take either engine's result unchanged.

End of a run (both engines): no turn is sent at or after `duration_s`. Requests already sent
run to completion; `drain_timeout_s` (default None: no limit) stops waiting that long after
`duration_s`, and what is still in flight then is not a finished request: the live client
cancels it and records it as failed ("cancelled: ..."), the simulator stops its clock and
counts it in `meta["stats"]["unfinished"]`. A live request is always bounded by its own
`request_timeout_s`, so waiting for all of them cannot hang.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

DRAIN_TIMEOUT_S: float | None = None
"""Default for both engines: requests sent before the end are waited for until they finish."""

STORE_COUNTER_COLUMNS = ("tier", "store", "capacity_bytes", "bytes_used", "bytes_written",
                         "bytes_read", "evicted_chunks", "rejected_chunks", "first_eviction_s")
"""Per-store counters at the end of a run (NaN where an engine cannot observe one)."""


@dataclass
class RunResult:
    """One tier's run on one engine."""

    records: pd.DataFrame
    samples: pd.DataFrame
    meta: dict[str, Any]
    store_counters: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=list(STORE_COUNTER_COLUMNS)))

    @property
    def tier(self) -> str:
        """The tier this run served."""
        return str(self.meta.get("tier", ""))


def store_counters_from_samples(samples: pd.DataFrame, tier: str, stores: list[str],
                                first_eviction_s: dict[str, float] | None = None
                                ) -> pd.DataFrame:
    """Per-store counters from the last server sample's `<store>_<counter>` columns."""
    rows = []
    last = samples.iloc[-1] if len(samples) else pd.Series(dtype=float)
    for store in stores:
        row: dict[str, Any] = {"tier": tier, "store": store}
        for column in STORE_COUNTER_COLUMNS[2:-1]:
            row[column] = float(last.get(f"{store}_{column}", float("nan")))
        row["first_eviction_s"] = float((first_eviction_s or {}).get(store, float("nan")))
        rows.append(row)
    return pd.DataFrame(rows, columns=list(STORE_COUNTER_COLUMNS))


def concat_results(results: dict[str, RunResult]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """All tiers' records and samples, each with its `tier` column (for `kvrepro.analysis`)."""
    records = pd.concat([r.records for r in results.values()], ignore_index=True)
    samples = pd.concat([r.samples.assign(tier=name) for name, r in results.items()],
                        ignore_index=True)
    return records, samples
