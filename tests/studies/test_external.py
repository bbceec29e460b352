"""External GPU cases (kvrepro.studies.external): the case files, the frozen constants and
their refit, the fitted labels, the tier effects, the server a case makes, and the step
time's tensor-parallel term. The llm-d fleet run (about a minute) is left to notebook 14."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from kvrepro.calc.roofline import get_gpu
from kvrepro.engines.sim.config import sim_profile
from kvrepro.engines.sim.steptime import StepTimer
from kvrepro.model_spec import get_model
from kvrepro.studies.external import constants as consts
from kvrepro.studies.external import predict, server_spec
from kvrepro.studies.external.case import (
    ExternalCase,
    forbidden_keys,
    load_case,
    shipped_cases,
)

SHIPPED = {"measured_h200", "vllm_blog_llama8b_h100", "h20_qwen3coder_tiers",
           "lmcache_fs_l2_qwen3coder", "llmd_qwen3_32b", "study_b_h100"}
KINDS = {"measured", "fitted", "datasheet", "estimate"}
LLMD, H20, FS = "llmd_qwen3_32b", "h20_qwen3coder_tiers", "lmcache_fs_l2_qwen3coder"


def _case(name: str) -> ExternalCase:
    return load_case(shipped_cases()[name])


@pytest.fixture(scope="module")
def fit_case_tables(tmp_path_factory) -> dict[str, pd.DataFrame]:
    """predict_case of every case a constant names (the fit cases: a few seconds)."""
    run_dir = tmp_path_factory.mktemp("external")
    names = consts.load_constants().fit_cases() | {"measured_h200", FS}
    return {name: predict.predict_case(name, run_dir) for name in sorted(names)}


# ------------------------------------------------------------------ 1. case files load

def test_every_shipped_case_file_loads() -> None:
    cases = shipped_cases()
    assert SHIPPED <= set(cases)
    assert "constants" not in cases
    for name, path in cases.items():
        case = load_case(path)
        assert case.name == name
        assert case.setup.tier_names()


@pytest.mark.parametrize(("where", "key", "named"), [
    (("setup", "engine"), "mfu", "setup.engine.mfu"),
    ((), "decode_efficiency", "decode_efficiency"),
    # past the schema (extra is free-form), caught by forbidden_keys alone
    (("published", 0, "extra"), "fs_read_latency_s", "published.0.extra.fs_read_latency_s"),
], ids=["engine-mfu", "top-level-decode-efficiency", "published-extra-constant"])
def test_a_case_that_sets_a_twin_constant_is_refused_naming_the_key(
        tmp_path: Path, where: tuple, key: str, named: str) -> None:
    src = shipped_cases()[LLMD]
    tree = yaml.safe_load(src.read_text())
    target = tmp_path / src.name  # the same stem: the name check passes
    target.write_text(yaml.safe_dump(tree, sort_keys=False))
    assert load_case(target).name == LLMD  # the unmodified copy loads
    node = tree
    for step in where:
        node = node.setdefault(step, {}) if isinstance(node, dict) else node[step]
    node[key] = 0.7
    target.write_text(yaml.safe_dump(tree, sort_keys=False))
    with pytest.raises(ValueError, match=re.escape(named)):
        load_case(target)


# ------------------------------------------------------------------ 2. no forbidden key

@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_no_shipped_case_file_holds_a_forbidden_key(name: str) -> None:
    raw = yaml.safe_load(shipped_cases()[name].read_text())
    assert forbidden_keys(raw) == []


def test_forbidden_keys_finds_a_key_planted_deep_in_a_nested_list() -> None:
    tree = {"setup": {"tiers": {"cpu": {"stores": [
        {"kind": "dram"}, {"kind": "fs", "options": [1, {"deep": {"prefill_mfu": 0.5}}]}]}}},
        "published": [{"extra": {"graph_step_overhead_s": 0.01}}],  # a constant's name
        "note": "mfu"}  # a value, not a key
    assert forbidden_keys(tree) == ["setup.tiers.cpu.stores.1.options.1.deep.prefill_mfu",
                                    "published.0.extra.graph_step_overhead_s"]
    assert forbidden_keys({"workload": [{"decode_efficiency.Hopper": 1}]}) == [
        "workload.0.decode_efficiency.Hopper"]


# ------------------------------------------------------------------ 3. frozen = refit

def test_the_frozen_constants_equal_a_refit() -> None:
    frozen = consts.load_constants()
    refit = consts.fit_constants()
    assert refit
    for name, constant in refit.items():
        assert name in frozen.constants, name
        stored = frozen.constants[name]
        assert stored.value == pytest.approx(constant.value, rel=1e-3), name
        assert (stored.kind, stored.fit_case, stored.unit) == (
            constant.kind, constant.fit_case, constant.unit), name


def test_the_frozen_fs_path_constants_equal_their_refit() -> None:
    from kvrepro.studies.external.fs_path import FS_FIT_CASE, fit_fs_path

    refit = fit_fs_path()
    assert set(refit) == {"fs_read_latency_s", "lmcache_mp_staging_gb_s"}
    frozen = consts.load_constants()
    for name, constant in refit.items():
        assert constant.value > 0
        assert frozen.value(name) == pytest.approx(constant.value, rel=1e-3), name
        assert constant.source.startswith(FS_FIT_CASE) and constant.fit_case == FS_FIT_CASE


def test_a_refit_on_other_measurements_would_differ_from_the_frozen_file() -> None:
    """The guard of the refit test: prefills 1.3x slower give an MFU 1/1.3 of the frozen
    one, far outside the 1e-3 the test allows, so a stale file would fail it."""
    probe = copy.deepcopy(consts.probe_results())
    for row in probe["prefill"]:
        row["prefill_s"] *= 1.3
    frozen = consts.load_constants().value("prefill_mfu.Hopper")
    slow = consts.prefill_mfu(probe, get_model(consts.PROBE_MODEL), get_gpu("H200"))
    assert slow == pytest.approx(frozen / 1.3, rel=1e-3)
    refit = consts.fit_constants(probe)["prefill_mfu.Hopper"].value
    assert refit != pytest.approx(frozen, rel=1e-3)


# ------------------------------------------------------------------ 4. fit cases, kinds

def test_every_fit_case_is_shipped_and_labels_its_rows_fitted(fit_case_tables) -> None:
    frozen = consts.load_constants()
    named = {c.fit_case for c in frozen.constants.values() if c.fit_case}
    assert named == frozen.fit_cases() and named
    assert named <= set(shipped_cases())
    for case in named:
        assert (fit_case_tables[case]["label"] == "fitted").any(), case


def test_every_constant_has_an_allowed_kind_and_a_fitted_one_its_case() -> None:
    raw = yaml.safe_load(consts.constants_path().read_text())["constants"]
    assert raw
    for name, entry in raw.items():
        assert entry["kind"] in KINDS, name
        if entry["kind"] == "fitted":
            assert entry.get("fit_case"), name


# ------------------------------------------------------------------ 5. fitted labels

def test_the_fs_case_reproduces_its_fit_points_and_labels_only_them_fitted(
        fit_case_tables) -> None:
    table = fit_case_tables[FS]
    points = [p for p in _case(FS).published if p.used_in_fit]
    assert len(points) == 2
    fitted = table[table["label"] == "fitted"].sort_values("tier")
    assert len(fitted) == 2
    for row, point in zip(fitted.itertuples(), sorted(points, key=lambda p: p.tier),
                          strict=True):
        assert (row.metric, row.tier, row.point_value) == (point.metric, point.tier,
                                                           point.point)
        assert row.predicted == pytest.approx(point.value, rel=1e-3)
        assert abs(row.error_pct) < 0.1
    assert (table["label"] == "predicted").sum() == len(table) - 2


def test_the_probe_case_labels_every_row_fitted(fit_case_tables) -> None:
    table = fit_case_tables["measured_h200"]
    assert len(table) > 0
    assert (table["label"] == "fitted").all()
    assert table["predicted"].notna().all()


# ------------------------------------------------------------------ 6. tier effects

def test_tier_effects_direction_on_a_hand_made_table() -> None:
    rows = [  # case, metric, point, tier, published, predicted
        ("a", "ttft_s", "1", "miss", 1.0, 2.0),
        ("a", "ttft_s", "1", "cpu", 0.5, 0.4),       # both faster: right
        ("a", "ttft_s", "1", "gpu_hit", 0.1, 0.1),   # a view, not an offload tier
        ("a", "ttft_s", "2", "miss", 1.0, 1.0),
        ("a", "ttft_s", "2", "cpu", 0.5, 1.2),       # the twin says slower: wrong
        ("b", "throughput_tok_s", "5", "hbm_only", 100.0, 100.0),
        ("b", "throughput_tok_s", "5", "cpu", 150.0, 90.0),   # wrong
        ("b", "throughput_tok_s", "10", "hbm_only", 100.0, 200.0),
        ("b", "throughput_tok_s", "10", "cpu", 150.0, 240.0),  # right
        ("b", "e2e_p90_s", "5", "hbm_only", 20.0, 12.0),
        ("b", "e2e_p90_s", "5", "cpu", 19.0, 12.0),  # no predicted effect: not right
        ("c", "ttft_s", "1", "x", 1.0, 1.0),         # no reference tier: left out
        ("c", "ttft_s", "1", "y", 2.0, 2.0),
        ("d", "prefill_s", "1", "device", 1.0, 1.0)]
    table = pd.DataFrame(rows, columns=["case", "metric", "point", "tier", "published",
                                        "predicted"])
    effects = predict.tier_effects(table)
    got = list(zip(effects["case"], effects["point"], effects["baseline_tier"],
                   effects["offload_tier"], effects["direction_right"], strict=True))
    assert got == [("a", "1", "miss", "cpu", True), ("a", "2", "miss", "cpu", False),
                   ("b", "5", "hbm_only", "cpu", False), ("b", "10", "hbm_only", "cpu", True),
                   ("b", "5", "hbm_only", "cpu", False)]
    assert effects["published_ratio"].tolist() == pytest.approx([0.5, 0.5, 1.5, 1.5, 0.95])
    assert effects["predicted_ratio"].tolist() == pytest.approx([0.2, 1.2, 0.9, 1.2, 1.0])


# ------------------------------------------------------------------ 7. the case's server

def test_tensor_parallel_rates_and_all_reduce_cost() -> None:
    case = _case(LLMD)
    gpu = get_gpu(case.setup.gpu)
    assert case.setup.tensor_parallel_size == 2
    c = consts.load_constants()
    twin = server_spec.case_server(case, c).twin
    assert twin.fp16_tflops == pytest.approx(2 * gpu.bf16_dense_tflops)
    assert twin.mem_bw_tb_s == pytest.approx(2 * gpu.mem_bw_tb_s)
    assert twin.tp_token_s > 0
    one = case.model_copy(update={"setup": case.setup.model_copy(
        update={"tensor_parallel_size": 1})})
    solo = server_spec.case_server(one, c).twin
    assert solo.tp_token_s == 0
    assert solo.fp16_tflops == pytest.approx(gpu.bf16_dense_tflops)
    assert solo.mem_bw_tb_s == pytest.approx(gpu.mem_bw_tb_s)
    layers = case.setup.model_spec().num_layers
    assert twin.step_overhead_s - solo.step_overhead_s == pytest.approx(
        2 * layers * c.value("allreduce_latency_s"))


def test_enforce_eager_adds_the_eager_overhead_per_layer() -> None:
    case = _case(H20)
    assert not case.setup.engine.cuda_graphs
    assert case.setup.model_spec().num_layers == 48
    c = consts.load_constants()
    eager = server_spec.case_server(case, c).twin.step_overhead_s
    assert eager == pytest.approx(c.value("graph_step_overhead_s")
                                  + 48 * c.value("eager_layer_overhead_s"))
    graphs = case.model_copy(update={"setup": case.setup.model_copy(update={
        "engine": case.setup.engine.model_copy(update={"cuda_graphs": True})})})
    graph = server_spec.case_server(graphs, c).twin.step_overhead_s
    assert graph == pytest.approx(c.value("graph_step_overhead_s"))
    assert eager - graph == pytest.approx(48 * c.value("eager_layer_overhead_s"))


# ------------------------------------------------------------------ 8. StepTimer's TP term

def test_tp_token_s_adds_batch_tokens_times_it_to_every_step_time() -> None:
    profile = sim_profile(server_spec.case_server(_case(LLMD)))
    with_tp = profile.server
    tp_s = with_tp.tp_token_s
    assert tp_s > 0
    timer = StepTimer(with_tp)
    bare = StepTimer(with_tp.model_copy(update={"tp_token_s": 0.0}))
    for batch in (1, 7, 64, 300):
        step_fn, bare_fn = timer.decode_step_fn(batch), bare.decode_step_fn(batch)
        for kv in (0, 1000, 123_457):
            decode = timer.decode_step_s(kv, batch)
            assert step_fn(kv) == decode  # bit-equal: the scheduler's runs use step_fn
            assert timer.step_s([], kv, batch_tokens=batch) == decode
            assert decode - bare.decode_step_s(kv, batch) == pytest.approx(batch * tp_s)
            assert step_fn(kv) - bare_fn(kv) == pytest.approx(batch * tp_s)
            chunks = [(batch, kv)]
            assert (timer.step_s(chunks, kv + batch, batch_tokens=batch)
                    - bare.step_s(chunks, kv + batch, batch_tokens=batch)
                    ) == pytest.approx(batch * tp_s)


# ------------------------------------------------------------------ 9. a named server spec

def test_a_case_naming_a_server_spec_runs_it_with_the_shared_rates() -> None:
    from kvrepro.tier_spec import shipped_server

    case = _case("study_b_h100")
    c = consts.load_constants()
    spec = server_spec.case_server(case, c)
    study_b = shipped_server("study_b")
    assert set(spec.tiers) == set(study_b.tiers)
    assert spec.tiers["opt"] == study_b.tiers["opt"]  # the B6-fitted stores are kept
    assert spec.twin.mfu == c.arch_value("prefill_mfu", "Hopper") != study_b.twin.mfu
    assert spec.twin.fp16_tflops == get_gpu("H100-PCIe").bf16_dense_tflops


def test_tiers_and_a_server_spec_together_are_refused() -> None:
    from pydantic import ValidationError

    from kvrepro.studies.external.case import Setup

    base = _case("study_b_h100").setup.model_dump()
    with pytest.raises(ValidationError, match="either tiers or server_spec"):
        Setup.model_validate({**base, "tiers": {"x": {"connector": "none"}}})
    with pytest.raises(ValidationError, match="either tiers or server_spec"):
        Setup.model_validate({**base, "server_spec": None})


def test_reads_in_flight_come_from_the_deployment_else_the_adapter_release() -> None:
    from kvrepro.studies.external.case import StoreSetup

    case = _case(FS)
    io16 = case.setup.tiers["fs_io16"].stores[0]
    assert io16.reads_in_flight is None and io16.adapter == "fs-pr4366"
    assert server_spec.reads_in_flight(io16, case) == 16
    assert server_spec.reads_in_flight(case.setup.tiers["fs_io1"].stores[0], case) == 1
    bare = StoreSetup(kind="fs", capacity_bytes=1e9, device_read_gb_s=10.0)
    with pytest.raises(ValueError, match="reads_in_flight or an adapter"):
        server_spec.reads_in_flight(bare, case)


# ------------------------------------------------------------------ 10. a model inline

QWEN3_CODER_CONFIG = {  # Qwen/Qwen3-Coder-30B-A3B-Instruct config.json (its shape fields)
    "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 5472,
    "moe_intermediate_size": 768, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
    "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "decoder_sparse_step": 1, "mlp_only_layers": []}


def test_a_case_may_give_its_model_as_an_inline_config_json(tmp_path) -> None:
    """The H20 case with its model as config.json fields: the same KV bytes, the MoE counts
    of the model card (30.5B total, 3.3B active) within 2 %, and predictions within 2 % of the
    catalog entry's."""
    tree = yaml.safe_load(shipped_cases()[H20].read_text())
    tree["setup"]["model"] = {"hf_config": QWEN3_CODER_CONFIG}
    path = tmp_path / f"{H20}.yaml"
    path.write_text(yaml.safe_dump(tree))
    inline = load_case(path)
    spec, catalog = inline.setup.model_spec(), _case(H20).setup.model_spec()
    assert spec.kv_bytes_per_token == catalog.kv_bytes_per_token == 98_304
    assert (spec.num_experts, spec.experts_per_token) == (128, 8)
    assert spec.params_total_b == pytest.approx(30.5, rel=0.02)
    assert spec.params_active_b == pytest.approx(3.3, rel=0.02)
    ours = predict.predict_case(path, tmp_path / "inline")
    theirs = predict.predict_case(shipped_cases()[H20], tmp_path / "catalog")
    assert ours["predicted"].to_numpy() == pytest.approx(theirs["predicted"].to_numpy(),
                                                         rel=0.02)


def test_the_host_cpu_model_leaves_an_idle_gpu_servers_cases_where_they_were(tmp_path) -> None:
    """On a GPU server's 112 CPUs (a DGX H100-class host) the serving processes of one
    instance barely load them: the host-CPU model changes no prediction of these cases
    (issue [host-cpu]; the llm-d fleet of 8 replicas on one host is the one it moves)."""
    from kvrepro.calibration.fit_host import host_of
    from kvrepro.studies.external.predict import host_cpu_effect

    table = host_cpu_effect(tmp_path, host_of(112),
                            ["vllm_blog_llama8b_h100", "h20_qwen3coder_tiers"])
    assert len(table) > 10
    assert (table["host_change_pct"].abs() < 1e-9).all()
    one_cpu = host_cpu_effect(tmp_path / "one", host_of(1, speed=0.05), ["h20_qwen3coder_tiers"])
    assert one_cpu["host_change_pct"].abs().max() > 1  # the model is in the loop
