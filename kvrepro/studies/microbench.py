"""Study B's prompt-caching microbenchmark (B6) read from any engine's records.

The same summary serves the simulator's B6 (`kvrepro.studies.study_b`) and the live one
(`kvrepro.studies.microbench_live`): mean measure-round TTFT per tier and prompt length,
normalised to the MEM tier's, as study B draws it.
"""

from __future__ import annotations

import pandas as pd

TIER_LABELS = {"mem": "MEM", "ssd1": "SSDx1", "ssd2": "SSDx2", "ssd3": "SSDx3",
               "ssd4": "SSDx4", "opt": "OPT"}
"""Study B's names of the B6 tiers."""


def b6_summary(records: pd.DataFrame) -> pd.DataFrame:
    """Mean measure-round TTFT per tier and prompt length, and its ratio to MEM's.

    `records` are the measure round's requests with `tier`, `prompt_length` and `ttft_s`.
    Columns: tier, label, prompt_tokens, ttft_s, ttft_mem_s, norm_ttft (= ttft_s /
    ttft_mem_s, so MEM is 1 by definition), n_requests.
    """
    if "mem" not in set(records["tier"]):
        raise ValueError("B6 normalizes to MEM: the records need tier 'mem'")
    table = (records.groupby(["tier", "prompt_length"], sort=False)
             .agg(ttft_s=("ttft_s", "mean"), n_requests=("ttft_s", "size")).reset_index()
             .rename(columns={"prompt_length": "prompt_tokens"}))
    mem = table[table.tier == "mem"].set_index("prompt_tokens")["ttft_s"]
    table["ttft_mem_s"] = table["prompt_tokens"].map(mem)
    table["norm_ttft"] = table["ttft_s"] / table["ttft_mem_s"]
    table.insert(1, "label", table["tier"].map(TIER_LABELS).fillna(table["tier"]))
    return table
