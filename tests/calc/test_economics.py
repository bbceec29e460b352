"""Cost model (A9) on hand-computed cases, the prices file's checks, and B1's roofline split."""

from __future__ import annotations

import math

import nbformat
import numpy as np
import pandas as pd
import pytest

from kvrepro.calc import economics as ec
from kvrepro.calc import roofline
from kvrepro.engines.sim import steptime
from kvrepro.engines.sim.config import ServerProfile
from kvrepro.model_spec import get_model
from kvrepro.plots import economics_figures as efigs
from kvrepro.reproduce import reproduce
from kvrepro.studies import economics_quotes as eq
from kvrepro.tier_spec import TierSpec, shipped_server
from tests.conftest import NOTEBOOKS

HEADER = "price_set,item,usd,unit,date,source\n"
GOOD_ROWS = {
    "dram": "s,dram,10,per_gb,2026-01-01,quote A\n",
    "flash": "s,flash,100,per_tb,2026-01-01,quote B\n",
    "gpu": "s,gpu,10000,each,2026-01-01,quote C\n",
    "server": "s,server,20000,each,2026-01-01,estimate\n",
    "electricity": "s,electricity,0.1,per_kwh,2026-01-01,estimate\n",
}


def _prices_file(tmp_path, **replace: str):
    rows = {**GOOD_ROWS, **replace}
    path = tmp_path / "prices.csv"
    path.write_text("# comment line\n# another\n" + HEADER + "".join(rows.values()))
    return path


def _hand_prices() -> ec.PriceSet:
    items = list(ec.PRICE_UNITS)
    return ec.PriceSet(name="hand", dram_usd_per_gb=10, flash_usd_per_tb=100, gpu_usd_each=10_000,
                       server_usd_each=20_000, electricity_usd_per_kwh=0.1,
                       dates=dict.fromkeys(items, "2026-01-01"), sources=dict.fromkeys(items, "t"))


# One year of amortisation = 8,760 h, so $/h are easy to write down.
HAND_BILL = ec.ServerBill(gpus=2, base_dram_gb=100, max_dram_gb=1100, amortisation_years=1,
                          gpu_watts=500, server_watts=1000, dram_watts_per_gb=0.1,
                          drive_watts=20)


# ---------------------------------------------------------------- prices file


def test_shipped_prices_are_dated_and_sourced() -> None:
    for name in ("early-2026", "mid-2025"):
        prices = ec.load_prices(name)
        table = ec.price_table(prices)
        assert list(table.item) == [i for i in ec.PRICE_UNITS if i not in ec.OPTIONAL_PRICES]
        assert (table.usd > 0).all() and table.source.str.len().gt(10).all()
        assert table.date.str.match(r"\d{4}-\d{2}-\d{2}$").all()
    assert ec.load_prices().name == ec.DEFAULT_PRICE_SET


def test_load_prices_from_own_file(tmp_path) -> None:
    prices = ec.load_prices("s", _prices_file(tmp_path))
    assert prices.dram_usd_per_gb == 10 and prices.flash_usd_per_tb == 100
    assert prices.sources["server"] == "estimate"


@pytest.mark.parametrize(("row", "message"), [
    ("s,dram,,per_gb,2026-01-01,quote A\n", "column 'usd' has no price"),
    ("s,dram,-3,per_gb,2026-01-01,quote A\n", "column 'usd' must be a price > 0, got -3"),
    ("s,dram,0,per_gb,2026-01-01,quote A\n", "must be a price > 0"),
    ("s,dram,ten,per_gb,2026-01-01,quote A\n", "not a number: 'ten'"),
    ("s,dram,10,per_tb,2026-01-01,quote A\n", "column 'unit' must be 'per_gb'"),
    ("s,dram,10,per_gb,Jan 2026,quote A\n", "column 'date' must be an ISO date"),
    ("s,dram,10,per_gb,2026-01-01,\n", "column 'source' is empty"),
])
def test_bad_price_row_names_file_line_and_item(tmp_path, row: str, message: str) -> None:
    path = _prices_file(tmp_path, dram=row)
    with pytest.raises(ValueError) as err:
        ec.load_prices("s", path)
    text = str(err.value)
    # two comment lines and the header come first: dram is line 4
    assert str(path) in text and "line 4" in text and "item 'dram'" in text and message in text


def test_bad_rows_elsewhere_in_the_file_are_found(tmp_path) -> None:
    path = _prices_file(tmp_path)
    path.write_text(path.read_text() + "other,flash,-1,per_tb,2026-01-01,x\n")
    with pytest.raises(ValueError, match=r"line 9 \(price set 'other', item 'flash'\)"):
        ec.load_prices("s", path)


def test_price_set_errors(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"no price set 'nope'.*known: \['s'\]"):
        ec.load_prices("nope", _prices_file(tmp_path))
    with pytest.raises(ValueError, match=r"lacks item\(s\) \['gpu'\]"):
        ec.load_prices("s", _prices_file(tmp_path, gpu=""))
    with pytest.raises(ValueError, match="item 'dram' appears twice"):
        ec.load_prices("s", _prices_file(tmp_path, gpu=GOOD_ROWS["dram"]))
    with pytest.raises(FileNotFoundError, match="prices_file"):
        ec.load_prices("s", tmp_path / "missing.csv")


def test_overrides(tmp_path) -> None:
    prices = ec.load_prices("s", _prices_file(tmp_path),
                            overrides={"dram_usd_per_gb": 4.5, "flash_usd_per_tb": None})
    assert prices.dram_usd_per_gb == 4.5 and prices.flash_usd_per_tb == 100
    assert prices.dates["dram"] == "override"
    assert prices.sources["dram"] == "parameter dram_usd_per_gb"
    with pytest.raises(ValueError, match="parameter 'flash_usd_per_tb'"):
        ec.load_prices("s", _prices_file(tmp_path), overrides={"flash_usd_per_tb": -1})
    with pytest.raises(ValueError, match="unknown price override 'dram_usd'"):
        ec.load_prices("s", _prices_file(tmp_path), overrides={"dram_usd": 1})


# ---------------------------------------------------------------- hardware and costs


def test_raid_capacity() -> None:
    flash = eq.study_a_tiers()["flash"]
    assert flash.usable_tb == pytest.approx(51.2)
    assert ec.drives_for(1.7, 12.8, "RAID10") == 4          # RAID10 needs 4 drives at least
    assert ec.drives_for(30, 12.8, "RAID10") == 6           # 3 data drives, mirrored
    assert ec.drives_for(30, 12.8, "RAID5") == 4
    assert ec.drives_for(0.5, 12.8, "RAID0") == 1
    with pytest.raises(ValueError, match="RAID1 holds one drive"):
        ec.drives_for(20, 12.8, "RAID1")
    with pytest.raises(ValueError):
        ec.TierHardware(name="x", drives=3, raid_level="RAID10")   # odd count


def test_cost_per_hour_hand_case() -> None:
    tiers = {"baseline": ec.TierHardware(name="baseline"),
             "dram": ec.TierHardware(name="dram", dram_bytes=500e9),
             "flash": ec.TierHardware(name="flash", dram_bytes=50e9, drives=4, drive_tb=10)}
    costs = ec.cost_table(tiers, HAND_BILL, _hand_prices()).set_index("tier")
    # server: 20,000 + 2 x 10,000 + 100 GB x $10 = $41,000; 1,000 + 2 x 500 + 10 = 2,010 W
    base_h = 41_000 / 8760 + 2.010 * 0.1
    assert costs.at["baseline", "server_usd_per_h"] == pytest.approx(base_h)
    assert costs.at["baseline", "tier_usd_per_h"] == 0
    # DRAM tier: 500 GB x $10 = $5,000 and 50 W
    assert costs.at["dram", "tier_capex_usd"] == 5_000
    assert costs.at["dram", "tier_usd_per_h"] == pytest.approx(5_000 / 8760 + 0.050 * 0.1)
    # flash tier: 4 x 10 TB x $100 + 50 GB x $10 = $4,500; 4 x 20 W + 5 W
    assert costs.at["flash", "tier_capex_usd"] == 4_500
    assert costs.at["flash", "server_usd_per_h"] == pytest.approx(
        45_500 / 8760 + (2.010 + 0.085) * 0.1)
    assert costs.at["flash", "tier_flash_usable_tb"] == 20


def _binned(rates: dict[str, list[float]], bin_s: float = 300.0) -> pd.DataFrame:
    rows = [{"tier": tier, "bin_start_s": i * bin_s, "bin_end_s": (i + 1) * bin_s,
             "total_tok_s": rate}
            for tier, values in rates.items() for i, rate in enumerate(values)]
    return pd.DataFrame(rows)


def test_tokens_per_dollar_hand_case() -> None:
    from kvrepro import analysis

    tiers = {"baseline": ec.TierHardware(name="baseline"),
             "dram": ec.TierHardware(name="dram", dram_bytes=500e9),
             "flash": ec.TierHardware(name="flash", dram_bytes=50e9, drives=4, drive_tb=10)}
    costs = ec.cost_table(tiers, HAND_BILL, _hand_prices())
    binned = _binned({"baseline": [10_000] * 6, "dram": [20_000, 30_000, 30_000, 15_000,
                                                          15_000, 15_000],
                      "flash": [20_000, 25_000, 25_000, 25_000, 25_000, 25_000]})
    out = ec.tokens_per_dollar(binned, costs)
    base_h = 41_000 / 8760 + 2.010 * 0.1
    first = out[(out.tier == "baseline")].iloc[0]
    assert first.tok_per_usd_server == pytest.approx(10_000 * 3600 / base_h)
    assert math.isnan(first.tok_per_usd_tier)                       # no tier bought
    dram_h = costs.set_index("tier").at["dram", "tier_usd_per_h"]
    assert out[out.tier == "dram"].tok_per_usd_tier.iloc[0] == pytest.approx(20_000 * 3600 / dram_h)
    # flash (the cheaper build here) is ahead alone in bin 0, but only the stretch from bin 3
    # lasts the 10-minute hold
    assert analysis.crossover_time_s(out, "flash", "dram", "tok_per_usd_server") == 900.0
    with pytest.raises(ValueError, match=r"no hardware for tier\(s\) \['native'\]"):
        ec.tokens_per_dollar(_binned({"native": [1.0]}), costs)


def test_served_rates_use_the_never_full_tier() -> None:
    binned = _binned({"baseline": [5, 9, 9], "dram": [9, 30, 12], "flash": [9, 25, 27]})
    assert eq.served_rates(binned) == {"baseline": 9.0, "dram": 27.0, "flash": 27.0}


# ---------------------------------------------------------------- vs TTL


def test_break_even_hand_cases() -> None:
    prices = _hand_prices()
    free = HAND_BILL.model_copy(update={"dram_watts_per_gb": 0.0, "drive_watts": 0.0})
    raid0 = ec.Retention(kv_bytes_per_token=1e5, kv_cache_bytes=1e9, staging_gb=0, drive_tb=10,
                         raid_level="RAID0")
    # one 10 TB drive at $100/TB = $1,000 = 100 GB of DRAM at $10/GB
    assert ec.break_even_kv_bytes(raid0, free, prices) == pytest.approx(100e9)
    raid10 = raid0.model_copy(update={"raid_level": "RAID10", "staging_gb": 64})
    # four drives ($4,000) + 64 GB staging ($640) = 464 GB of DRAM
    assert ec.break_even_kv_bytes(raid10, free, prices) == pytest.approx(464e9)
    # flash so dear that DRAM stays cheaper until the server's slots are full (1,000 GB)
    dear = prices.model_copy(update={"flash_usd_per_tb": 1_000})
    assert ec.break_even_kv_bytes(raid10, free, dear) == pytest.approx(1000e9)


def test_tokens_per_dollar_vs_ttl_and_crossover() -> None:
    prices = _hand_prices()
    retention = ec.Retention(kv_rate_tok_s=1000, kv_bytes_per_token=1e5, kv_cache_bytes=12e9,
                             staging_gb=64, drive_tb=10, raid_level="RAID10")
    ttls = np.arange(60, 12_001, 60)                 # 1,000 tok/s x 1e5 B = 0.1 GB per second
    table = ec.tokens_per_dollar_vs_ttl(ttls, {"baseline": 1.0, "dram": 2.0, "flash": 2.0},
                                        retention, HAND_BILL, prices)
    at = table.set_index(["tier", "ttl_s"])
    assert at.at[("baseline", 120.0), "fits"] and not at.at[("baseline", 180.0), "fits"]
    assert not at.at[("dram", 10_020.0), "fits"]     # 1,002 GB > 1,100 - 100 GB of slots
    assert math.isnan(at.at[("dram", 10_020.0), "tok_per_usd_server"])
    assert at.at[("flash", 60.0), "drives"] == 4
    crossover = ec.crossover_ttl_s(table)
    break_even = ec.break_even_kv_bytes(retention, HAND_BILL, prices) / (1000 * 1e5)
    assert break_even <= crossover < break_even + 60  # same answer, to the grid step
    fast_dram = ec.tokens_per_dollar_vs_ttl(ttls, {"dram": 4.0, "flash": 2.0}, retention,
                                            HAND_BILL, prices)
    assert ec.crossover_ttl_s(fast_dram) == 10_020.0  # only where DRAM no longer fits


def test_crossover_ttl_hand_frame() -> None:
    frame = pd.DataFrame({"tier": ["dram", "flash"] * 4, "ttl_s": [1, 1, 2, 2, 3, 3, 4, 4],
                          "tok_per_usd_server": [5, 4, 3, 4, 5, 4, np.nan, 4]})
    assert ec.crossover_ttl_s(frame) == 4.0           # behind again at 3, DRAM gone at 4
    assert math.isnan(ec.crossover_ttl_s(frame.iloc[:6].assign(tok_per_usd_server=[5, 4] * 3)))


# ---------------------------------------------------------------- B1


def test_prefill_anatomy_hand_case() -> None:
    qwen, h100 = get_model("Qwen3-14B-BF16"), roofline.get_gpu("H100")
    table = roofline.prefill_anatomy(qwen, h100, [0, 15_000], mfu=0.5)
    at = table.set_index(["seq_tokens", "part"])
    # attention / total = layers x width x L / (params + layers x width x L)
    width = 40 * 5120
    share = width * 15_000 / (14.8e9 + width * 15_000)
    assert at.at[(15_000, "attention"), "share"] == pytest.approx(share)
    assert share == pytest.approx(0.17189, abs=1e-5)
    total_ms = (2 * 14.8e9 * 15_000 + 2 * width * 15_000**2) / (1513e12 * 0.5) * 1e3
    assert at.loc[15_000].latency_ms.sum() == pytest.approx(total_ms)
    assert total_ms == pytest.approx(708.74, abs=0.01)
    assert at.loc[0].latency_ms.sum() == 0


def test_prefill_anatomy_is_the_simulators_roofline(monkeypatch) -> None:
    server = ServerProfile(model="MiniMax-M2.7-FP8", fp16_tflops=2000, mem_bw_tb_s=6.4, mfu=0.25,
                           kv_cache_bytes=80e9)
    # the simulator's step time calls roofline.prefill_time_s itself, not a copy
    assert steptime.prefill_time_s is roofline.prefill_time_s
    lengths = [512, 4096, 15_000]
    table = roofline.prefill_anatomy(server.model_spec(), server.gpu_spec(), lengths, server.mfu)
    timer = steptime.StepTimer(server)
    for tokens in lengths:
        parts = table[table.seq_tokens == tokens].latency_ms.sum() / 1e3
        assert parts == pytest.approx(timer.compute_s([(tokens, 0)]), rel=1e-12)
    calls = []
    real = roofline.prefill_time_s
    monkeypatch.setattr(roofline, "prefill_time_s",
                        lambda *args, **kw: calls.append(args) or real(*args, **kw))
    roofline.prefill_anatomy(server.model_spec(), server.gpu_spec(), lengths, server.mfu)
    assert len(calls) == len(lengths)


def test_prefill_anatomy_rejects_empty() -> None:
    with pytest.raises(ValueError, match="seq_tokens"):
        roofline.prefill_anatomy(get_model("Qwen3-14B-BF16"), roofline.get_gpu("H100"), [])


def test_b1_study_point_comes_from_the_reference_file() -> None:
    import csv

    from kvrepro._paths import data_file

    with open(data_file("reference", "reference_numbers.csv"), newline="") as handle:
        rows = {row["id"]: row for row in csv.DictReader(handle)}
    assert eq.study_b1_point() == (float(rows["B1.seq_tokens"]["value"]),
                                   float(rows["B1.prefill_ms"]["value"]))
    assert rows["B1.prefill_ms"]["unit"] == "ms" and rows["B1.seq_tokens"]["unit"] == "tokens"


def test_b1_quote_hand_case() -> None:
    qwen, h100 = get_model("Qwen3-14B-BF16"), roofline.get_gpu("H100")
    anatomy = roofline.prefill_anatomy(qwen, h100, [0, 5_000, 15_000], mfu=0.5)
    short = roofline.prefill_anatomy(qwen, h100, [0, 5_000], mfu=0.5)
    quote = eq.b1_quote({"qwen": anatomy, "short": short}, study_label="qwen").set_index("model")
    # hand values of test_prefill_anatomy_hand_case at 15,000 tokens
    assert quote.at["qwen", "seq_tokens"] == 15_000
    assert quote.at["qwen", "latency_ms"] == pytest.approx(708.74, abs=0.01)
    assert quote.at["qwen", "attention_share"] == pytest.approx(0.17189, abs=1e-5)
    study_tokens, study_ms = eq.study_b1_point()
    assert study_tokens == 15_000
    assert quote.at["qwen", "rel_diff_pct"] == pytest.approx((708.74 - study_ms) / study_ms * 100,
                                                           abs=0.01)
    # 5,000 tokens: 2 x 14.8e9 x 5e3 + 2 x 204,800 x 5e3^2 FLOPs at 756.5 TFLOPS
    assert quote.at["short", "latency_ms"] == pytest.approx(
        (2 * 14.8e9 * 5e3 + 2 * 204_800 * 5e3**2) / 756.5e12 * 1e3)
    assert math.isnan(quote.at["short", "study_ms"])  # only the study's configuration
    assert eq.prefill_at(anatomy, 5_000)["latency_ms"] == quote.at["short", "latency_ms"]
    with pytest.raises(ValueError, match="seq_tokens=7000"):
        eq.prefill_at(anatomy, 7_000)
    with pytest.raises(ValueError, match="study_label"):
        eq.b1_quote({"qwen": anatomy}, study_label="other")


def test_a9_quote_hand_case() -> None:
    free = HAND_BILL.model_copy(update={"dram_watts_per_gb": 0.0, "drive_watts": 0.0})
    prices = _hand_prices()
    tiers = {"baseline": ec.TierHardware(name="baseline"),
             "dram": ec.TierHardware(name="dram", dram_bytes=500e9)}
    costs = ec.cost_table(tiers, free, prices)
    per_dollar = ec.tokens_per_dollar(_binned({"baseline": [10_000] * 6,
                                               "dram": [20_000, 30_000, 30_000, 15_000,
                                                        14_000, 16_000]}), costs)
    late = eq.late_per_dollar(per_dollar)
    # late window: the last third of 1,800 s, bins centred at 1,350 and 1,650 s
    base_h = 41_000 / 8760 + 2.0 * 0.1                       # 2,000 W (no DRAM watts)
    dram_h = 46_000 / 8760 + 2.0 * 0.1
    assert late.at["dram", "total_tok_s"] == 15_000
    assert late.at["dram", "tok_per_usd_server"] == pytest.approx(15_000 * 3600 / dram_h)
    raid0 = ec.Retention(kv_rate_tok_s=1000, kv_bytes_per_token=1e5, kv_cache_bytes=1e9,
                         staging_gb=0, drive_tb=10, raid_level="RAID0")
    # one 10 TB drive at $100/TB = 100 GB of DRAM at $10/GB; 100 GB / (1,000 x 1e5 B/s)
    assert ec.break_even_ttl_s(raid0, free, prices) == pytest.approx(1000.0)
    quote = eq.a9_quote(costs, late, {"server": 900.0, "tier": math.nan}, 1800.0, raid0, free,
                        prices)
    assert list(quote.columns) == list(eq.QUOTE_COLUMNS)
    rows = quote.set_index(["quantity", "tier"]).value
    assert rows[("server cost", "baseline")] == pytest.approx(base_h)
    assert rows[("server cost", "dram")] == pytest.approx(dram_h)
    assert rows[("tokens per $ late in the run (whole server)", "baseline")] == pytest.approx(
        10_000 * 3600 / base_h / 1e6)
    assert rows[("flash overtakes DRAM per $ (whole server) at", "")] == 15.0
    assert math.isnan(rows[("flash overtakes DRAM per $ (cache tier alone) at", "")])
    assert rows[("break-even retained KV (flash tier costs no more than DRAM)", "")] == \
        pytest.approx(0.1)
    assert rows[("break-even TTL at 1,000 tok/s x 100,000 B/token", "")] == pytest.approx(1000 / 60)
    assert rows[("flash ahead per $ (whole server) for TTLs from", "")] == 30.0
    with pytest.raises(ValueError, match="crossover_s"):
        eq.a9_quote(costs, late, {"server": 1.0}, 1.0, raid0, free, prices)


# ---------------------------------------------------------------- figures and notebook


def test_figures_draw_and_check_columns() -> None:
    anatomy = roofline.prefill_anatomy(get_model("Qwen3-14B-BF16"), roofline.get_gpu("H100"),
                                       [0, 5000, 15_000])
    assert efigs.b1_prefill_anatomy(anatomy, "t", study_point=(15_000, 600)).axes
    with pytest.raises(ValueError, match="figure B1"):
        efigs.b1_prefill_anatomy(anatomy.drop(columns="part"))
    with pytest.raises(ValueError, match="figure A9"):
        efigs.a9_tokens_per_dollar(_binned({"dram": [1.0]}))


def test_a9_figures_read_at_report_size() -> None:
    """One legend below both panels (the cross-over a legend entry, not text over the lines),
    no text over text, and a tier's line that stops is marked and named."""
    from kvrepro.plots.legibility import text_problems

    prices = _hand_prices()
    retention = ec.Retention(kv_rate_tok_s=1000, kv_bytes_per_token=1e5, kv_cache_bytes=12e9,
                             staging_gb=64, drive_tb=10, raid_level="RAID10")
    table = ec.tokens_per_dollar_vs_ttl(np.arange(60, 12_001, 60),
                                        {"baseline": 1.0, "dram": 2.0, "flash": 2.0},
                                        retention, HAND_BILL, prices)
    fig = efigs.a9_tokens_per_dollar_vs_ttl(table, ec.crossover_ttl_s(table), "prices s")
    assert [t.get_text() for t in fig.legends[0].get_texts()][:3] == ["baseline", "dram",
                                                                       "flash"]
    assert fig.legends[0].get_texts()[3].get_text().startswith("flash ahead from TTL")
    notes = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert notes == ["DRAM slots full", "VRAM full"]
    assert fig.get_figwidth() <= 9 and not text_problems(fig)
    binned = _binned({"baseline": [1.0] * 4, "dram": [3.0, 3.0, 1.0, 1.0],
                      "flash": [2.0] * 4})
    tiers = {"baseline": ec.TierHardware(name="baseline"),
             "dram": ec.TierHardware(name="dram", dram_bytes=500e9),
             "flash": ec.TierHardware(name="flash", dram_bytes=50e9, drives=4, drive_tb=10)}
    per_dollar = ec.tokens_per_dollar(binned, ec.cost_table(tiers, HAND_BILL, prices))
    fig = efigs.a9_tokens_per_dollar(per_dollar, 600.0)
    assert fig.legends[0].get_texts()[-1].get_text() == "flash ahead (whole server) from 10 min"
    assert not [t for ax in fig.axes for t in ax.texts] and not text_problems(fig)


def test_economics_notebook(tmp_path) -> None:
    params = {"duration_s": 1800.0, "max_ttl_s": 7200.0, "ttl_step_s": 300.0}
    result = reproduce(NOTEBOOKS, tmp_path / "fig", tmp_path / "runs", ["10_economics"], params)
    assert not result.failures, result.failures
    assert result.headlines.empty   # A9 has no numbers; B1's point is compared, not saved
    figures = {p.name for p in (tmp_path / "fig").iterdir()}
    for name in ("A9-tokens-per-dollar", "A9-tokens-per-dollar-vs-ttl", "B1-prefill-anatomy",
                 "B1-prefill-anatomy-minimax"):
        assert f"{name}.png" in figures and f"{name}.svg" in figures
    executed = nbformat.read(result.run_dir / "10_economics_prefill.ipynb", as_version=4)
    text = "".join(o.get("text", "") for o in executed.cells[-1].outputs)
    assert "Qwen3-14B-BF16 on H100: 708.7 ms at 15000 tokens" in text
    assert "B1 study B's model: attention share at 15000 tokens 17.2 %" in text
    assert "B1 study A's model: attention share at 15000 tokens 36.4 %" in text
    assert "break-even: 1.703 TB retained" in text


# ---------------------------------------------------------------- stores' bills, shared fs


def _shared_fs_tier() -> TierSpec:
    return TierSpec.model_validate({"name": "shared", "stores": [
        {"name": "dram", "kind": "dram", "capacity_bytes": 64e9, "read_bw_bytes_s": 1e9,
         "write_bw_bytes_s": 1e9},
        {"name": "share", "kind": "shared_fs", "capacity_bytes": 400e12,
         "read_bw_bytes_s": 1e9, "write_bw_bytes_s": 1e9, "servers_sharing": 8}]})


def test_tier_hardware_sums_the_stores_bills() -> None:
    """DRAM of every store that takes some, the drive array of the store that has one, the
    server's share of a shared filesystem: no kind is named, each store bills itself."""
    flash = ec.tier_hardware(shipped_server("study_a").tier("flash"))
    assert flash.dram_bytes == 64e9 and flash.dram_gb == 64  # the staging buffer is DRAM
    assert (flash.drives, flash.shared_fs_bytes) == (8, 0.0)
    shared = ec.tier_hardware(_shared_fs_tier())
    assert shared.dram_bytes == 64e9 and shared.drives == 0
    assert shared.shared_fs_bytes == 50e12 and shared.shared_fs_tb == 50  # 400 TB / 8


def test_shared_fs_capacity_is_priced_per_tb() -> None:
    prices = _hand_prices()
    assert prices.shared_fs_usd_per_tb == ec.SHARED_FS_USD_PER_TB  # the documented estimate
    assert "estimate" in ec.PriceSet.model_fields["shared_fs_usd_per_tb"].description
    shared = ec.tier_hardware(_shared_fs_tier())
    assert ec.tier_capex_usd(shared, prices) == pytest.approx(
        64 * 10 + 50 * ec.SHARED_FS_USD_PER_TB)
    assert ec.tier_watts(shared, HAND_BILL) == pytest.approx(64 * 0.1)  # DRAM's only
    table = ec.cost_table({"shared": shared}, HAND_BILL, prices)
    assert table.tier_shared_fs_tb.tolist() == [50]
    # without a shared filesystem the table keeps its columns
    plain = ec.cost_table({"dram": ec.TierHardware(name="dram", dram_bytes=1e9)}, HAND_BILL,
                          prices)
    assert "tier_shared_fs_tb" not in plain


def test_shared_fs_price_is_optional_in_a_prices_file(tmp_path) -> None:
    prices = ec.load_prices("s", _prices_file(tmp_path))
    assert prices.shared_fs_usd_per_tb == ec.SHARED_FS_USD_PER_TB
    assert "shared_fs" not in list(ec.price_table(prices).item)
    given = ec.load_prices("s", _prices_file(
        tmp_path, shared_fs="s,shared_fs,700,per_tb,2026-01-01,quote D\n"))
    assert given.shared_fs_usd_per_tb == 700
    assert ec.price_table(given).set_index("item").at["shared_fs", "source"] == "quote D"
    over = ec.load_prices("s", _prices_file(tmp_path), {"shared_fs_usd_per_tb": 900})
    assert over.shared_fs_usd_per_tb == 900 and over.dates["shared_fs"] == "override"


def test_sized_tiers_are_a_registry_by_kind() -> None:
    assert ec.TIER_KINDS == tuple(ec.SIZED_TIERS) == ("baseline", "dram", "flash")
    retention = ec.Retention(kv_bytes_per_token=1e5, kv_cache_bytes=1e9, staging_gb=64,
                             drive_tb=10, raid_level="RAID10")
    dram = ec.sized_tier("dram", 500e9, retention, HAND_BILL)
    assert dram.dram_bytes == 500e9 and dram.drives == 0
    flash = ec.sized_tier("flash", 15e12, retention, HAND_BILL)
    assert flash.dram_gb == 64 and flash.drives == 4
    with pytest.raises(ValueError, match=r"unknown tier kind 'nvme'.*baseline"):
        ec.sized_tier("nvme", 1e9, retention, HAND_BILL)
