"""The numbers studies A and B quote from the cost model (A9, B1), and study A's tiers.

`kvrepro.calc.economics` prices any server and any run and reads no run itself; what the
studies make of it is here, so that a study's tiers, its "late in the run" reading of a run
and the B1 point it is compared with are written once, above the calculators:

* `study_a_tiers`: study A's three configurations (baseline, dram, flash) from its spec;
* `served_rates`: what each tier serves when it is sized to hold its sessions' KV, read off
  a run's late plateau as study A's mechanic says (`tokens_per_dollar_vs_ttl`'s input);
* `late_per_dollar`, `a9_quote`: A9's numbers; `study_b1_point`, `prefill_at`, `b1_quote`:
  B1's prefill latency next to the study's point.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from kvrepro._checks import require_columns
from kvrepro.analysis import plateau
from kvrepro.calc import economics
from kvrepro.calc.economics import TIER_KINDS, TierHardware
from kvrepro.studies.reference import load_reference
from kvrepro.tier_spec import ServerSpec, shipped_server

LATE_PER_DOLLAR_COLUMNS = ("total_tok_s", "tok_per_usd_server", "tok_per_usd_tier")
QUOTE_COLUMNS = ("quantity", "tier", "value", "unit")


def study_a_tiers(spec: ServerSpec | None = None) -> dict[str, TierHardware]:
    """Study A's configurations (baseline, dram, flash) from its server spec, or from `spec`
    (e.g. a what-if with `override_server(spec, {"dram_gb": 1024})`)."""
    return economics.server_hardware(spec or shipped_server("study_a"), list(TIER_KINDS))


def served_rates(binned: pd.DataFrame, column: str = "total_tok_s", never_full: str = "flash",
                 baseline: str = "baseline") -> dict[str, float]:
    """What each tier serves when it is sized to hold its sessions' KV, from a run's curves.

    A tier that never fills is that case: in study A's runs, flash (its late plateau, the last
    third of the run). A DRAM tier big enough to hold the same KV is charged the same rate:
    study A's own mechanic is that which tier a hit comes from barely changes throughput (A3:
    DRAM and flash within ~10 % until DRAM fills). The baseline keeps its own late plateau:
    VRAM never holds the sessions. Pass your own rates to `economics.tokens_per_dollar_vs_ttl`
    instead to give DRAM an edge.
    """
    late = plateau(binned, column)
    return {"baseline": float(late[baseline]), "dram": float(late[never_full]),
            "flash": float(late[never_full])}


def late_per_dollar(per_dollar: pd.DataFrame) -> pd.DataFrame:
    """Per tier (index): throughput and tokens per dollar late in the run, the plateau over
    `analysis.late_window` (the package's one "late in the run"). `per_dollar` is
    `economics.tokens_per_dollar` output."""
    require_columns(per_dollar, ["tier", "bin_start_s", "bin_end_s",
                                 *LATE_PER_DOLLAR_COLUMNS], "late_per_dollar")
    return pd.DataFrame({col: plateau(per_dollar, col)
                         for col in LATE_PER_DOLLAR_COLUMNS})


def a9_quote(costs: pd.DataFrame, late: pd.DataFrame, crossover_s: Mapping[str, float],
             cross_ttl_s: float, retention: economics.Retention,
             bill: economics.ServerBill, prices: economics.PriceSet) -> pd.DataFrame:
    """A9's numbers to quote, one row each (`QUOTE_COLUMNS`; `tier` empty when a number is
    not a tier's): each tier's server $/h (`economics.cost_table`) and late tokens per $
    (`late_per_dollar`), the run's cross-overs (`crossover_s`: "server" / "tier" ->
    `analysis.crossover_time_s` of the two tokens-per-$ columns, in s), the break-even KV and
    TTL, and the TTL from which flash stays ahead (`crossover_ttl_s`). Study A gives no
    numbers for A9, so none is compared."""
    missing = sorted({"server", "tier"} - set(crossover_s))
    if missing:
        raise ValueError(f"parameter 'crossover_s' lacks {missing} (keys: 'server', 'tier')")
    usd_h = costs.set_index("tier")["server_usd_per_h"]
    rows = [("server cost", t, float(usd_h[t]), "$/h") for t in usd_h.index]
    rows += [("tokens per $ late in the run (whole server)", t,
              float(late.at[t, "tok_per_usd_server"]) / 1e6, "M tok/$") for t in late.index]
    rate = f"{retention.kv_rate_tok_s:,.0f} tok/s x {retention.kv_bytes_per_token:,.0f} B/token"
    rows += [("flash overtakes DRAM per $ (whole server) at", "",
              crossover_s["server"] / 60, "min of run"),
             ("flash overtakes DRAM per $ (cache tier alone) at", "",
              crossover_s["tier"] / 60, "min of run"),
             ("break-even retained KV (flash tier costs no more than DRAM)", "",
              economics.break_even_kv_bytes(retention, bill, prices) / 1e12, "TB"),
             (f"break-even TTL at {rate}", "",
              economics.break_even_ttl_s(retention, bill, prices) / 60, "min"),
             ("flash ahead per $ (whole server) for TTLs from", "", cross_ttl_s / 60, "min")]
    return pd.DataFrame(rows, columns=list(QUOTE_COLUMNS))


def study_b1_point() -> tuple[float, float]:
    """(sequence tokens, prefill ms) of study B's B1 point (~600 ms at 15K tokens), read from
    `data/reference/reference_numbers.csv` (`B1.seq_tokens`, `B1.prefill_ms`). Only ever
    drawn or compared against: nothing is computed from it."""
    ref = load_reference()["value"]
    return float(ref["B1.seq_tokens"]), float(ref["B1.prefill_ms"])


def prefill_at(anatomy: pd.DataFrame, seq_tokens: float | None = None) -> dict[str, float]:
    """Latency (ms, the parts summed) and attention share of a `roofline.prefill_anatomy`
    frame at `seq_tokens` (default: its longest sequence); an error if the frame has no
    row at that length."""
    require_columns(anatomy, ["seq_tokens", "part", "latency_ms", "share"], "prefill_at")
    at = float(anatomy["seq_tokens"].max()) if seq_tokens is None else float(seq_tokens)
    rows = anatomy[anatomy["seq_tokens"] == at].set_index("part")
    if rows.empty:
        raise ValueError(f"prefill_at: no row at seq_tokens={at:g} (the anatomy covers "
                         f"{anatomy['seq_tokens'].min():g}-{anatomy['seq_tokens'].max():g} "
                         "tokens)")
    return {"seq_tokens": at, "latency_ms": float(rows["latency_ms"].sum()),
            "attention_share": float(rows.at["attention", "share"])}


def b1_quote(anatomies: Mapping[str, pd.DataFrame], study_label: str) -> pd.DataFrame:
    """B1's numbers per model (label -> `roofline.prefill_anatomy` frame): prefill latency
    and attention share at the longest sequence; for `study_label`, the configuration the
    study's B1 describes (study B's model and GPU), also the latency at the study's point
    (`study_b1_point`) next to the study's value, with the difference in % (NaN when the
    anatomy lacks the study's length; other models are not compared). Columns: `model,
    seq_tokens, latency_ms, attention_share, latency_at_study_ms, study_ms, rel_diff_pct`."""
    if study_label not in anatomies:
        raise ValueError(f"parameter 'study_label': {study_label!r} is not one of "
                         f"{list(anatomies)}")
    study_tokens, study_ms = study_b1_point()
    rows = []
    for label, anatomy in anatomies.items():
        row = {"model": label, **prefill_at(anatomy), "latency_at_study_ms": math.nan,
               "study_ms": study_ms if label == study_label else math.nan,
               "rel_diff_pct": math.nan}
        if label == study_label and (anatomy["seq_tokens"] == study_tokens).any():
            at_study = prefill_at(anatomy, study_tokens)["latency_ms"]
            row.update(latency_at_study_ms=at_study,
                       rel_diff_pct=(at_study - study_ms) / study_ms * 100)
        rows.append(row)
    return pd.DataFrame(rows)
