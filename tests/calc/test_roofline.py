import numpy as np
import pytest

from kvrepro.calc import roofline
from kvrepro.model_spec import ModelSpec, get_model


def test_prefill_flops_hand_case() -> None:
    qwen = get_model("Qwen3-14B-BF16")
    flops = roofline.prefill_flops(qwen, 1000)
    assert flops["linear"] == pytest.approx(2 * 14.8e9 * 1000)
    # 4 x 40 layers x 5120 width x 1000 x 500 (causal mean context)
    assert flops["attention"] == pytest.approx(4 * 40 * 5120 * 1000 * 500)
    # with 1000 cached tokens every new token also attends to the cached ones
    cached = roofline.prefill_flops(qwen, 1000, cached_tokens=1000)
    assert cached["attention"] == pytest.approx(3 * flops["attention"])


def test_attention_flops_at_their_own_rate_only_where_given() -> None:
    """A GPU spec leaves `attention_tflops` unset: one rate, the same float operations as
    before it existed; set, the attention FLOPs run at it and the matmuls at fp16 x mfu."""
    qwen, h100 = get_model("Qwen3-14B-BF16"), roofline.get_gpu("H100")
    flops = roofline.prefill_flops(qwen, 4096, cached_tokens=2048)
    one = roofline.prefill_time_s(qwen, h100, 4096, 2048, 0.5)
    assert one == (flops["linear"] + flops["attention"]) / (h100.fp16_tflops * 1e12 * 0.5)
    two = roofline.prefill_time_s(qwen, h100, 4096, 2048, 0.5, attention_tflops=100.0)
    assert two == pytest.approx(flops["linear"] / (h100.fp16_tflops * 1e12 * 0.5)
                                + flops["attention"] / 100e12)


def test_ttft_with_and_without_cache_on_h100() -> None:
    qwen, h100 = get_model("Qwen3-14B-BF16"), roofline.get_gpu("H100")
    cold = roofline.ttft_without_cache_s(qwen, h100, 16384, mfu=0.5)
    expected_cold = (2 * 14.8e9 * 16384 + 2 * 40 * 5120 * 16384**2) / (1513e12 * 0.5)
    assert cold == pytest.approx(expected_cold)
    warm = roofline.ttft_with_cache_s(qwen, h100, 16384)
    kv = 16384 * 163_840
    assert warm == pytest.approx(kv / 64e9 + (14.8e9 * 2 + kv) / 2.0e12)
    assert warm < cold / 5


def test_ttft_ordering_by_gpu() -> None:
    table = roofline.prefill_ttft_by_gpu(get_model("Qwen3-14B-BF16"), ["A100", "H100", "GH200"],
                                         [32768])
    cold = table[table.cache == "without cache"].set_index("gpu").ttft_s
    warm = table[table.cache == "with cache"].set_index("gpu").ttft_s
    assert cold["A100"] > cold["H100"] > cold["GH200"]
    assert warm["A100"] > warm["H100"] > warm["GH200"]
    assert cold["A100"] / cold["H100"] == pytest.approx(1513 / 624)


def test_unknown_gpu_names_parameter() -> None:
    with pytest.raises(ValueError, match="parameter 'gpu'"):
        roofline.get_gpu("TPUv9")


def _moe(num_experts: int = 64, experts_per_token: int = 4) -> ModelSpec:
    return ModelSpec(name="test-moe", attention="gqa", num_layers=4, num_attention_heads=8,
                     num_kv_heads=2, head_dim=64, hidden_size=512, kv_dtype_bytes=2,
                     params_total_b=8.2, params_active_b=0.6, weight_bytes_per_param=2,
                     num_experts=num_experts, experts_per_token=experts_per_token)


def _monte_carlo_experts(num_experts: int, k: int, tokens: int, trials: int,
                         rng: np.random.Generator) -> np.ndarray:
    """Distinct experts one MoE layer routes `tokens` tokens to, each token to k distinct
    experts drawn uniformly (the routing the formula assumes), per trial."""
    keys = rng.random((trials, tokens, num_experts))
    chosen = np.argpartition(keys, k, axis=2)[:, :, :k].reshape(trials, -1)
    hit = np.zeros((trials, num_experts), dtype=bool)
    np.put_along_axis(hit, chosen, True, axis=1)
    return hit.sum(axis=1)


@pytest.mark.parametrize(("num_experts", "k", "tokens"),
                         [(64, 4, 1), (64, 4, 8), (64, 4, 40), (256, 8, 16), (256, 8, 100)])
def test_expected_experts_touched_matches_random_routing(num_experts: int, k: int,
                                                         tokens: int) -> None:
    rng = np.random.default_rng(20240616)
    draws = _monte_carlo_experts(num_experts, k, tokens, 400, rng)
    expected = roofline.expected_experts_touched(num_experts, k, tokens)
    standard_error = max(draws.std(ddof=1) / np.sqrt(len(draws)), 1e-9)
    assert abs(draws.mean() - expected) < 4 * standard_error + 1e-9
    if tokens == 1:
        assert expected == pytest.approx(k) and (draws == k).all()


def test_expected_experts_touched_limits_and_errors() -> None:
    assert roofline.expected_experts_touched(256, 8, 1) == pytest.approx(8)
    assert roofline.expected_experts_touched(256, 8, 10_000) == pytest.approx(256)
    assert roofline.expected_experts_touched(256, 8, 0) == 0
    values = [roofline.expected_experts_touched(256, 8, b) for b in (1, 2, 10, 100, 1000)]
    assert values == sorted(values) and values[-1] <= 256
    with pytest.raises(ValueError, match="experts_per_token"):
        roofline.expected_experts_touched(8, 9, 1)


def test_decode_reads_the_weights_the_batch_touches() -> None:
    moe, gpu = _moe(), roofline.get_gpu("H100")
    bw = gpu.mem_bw_tb_s * 1e12
    per_expert_bytes = (8.2e9 - 0.6e9) / (64 - 4) * 2
    dense_bytes = 0.6e9 * 2 - 4 * per_expert_bytes
    # one token: the active weights; a batch of b: dense once + the experts b tokens touch
    assert roofline.decode_weight_bytes(moe, 1) == pytest.approx(moe.active_weight_bytes)
    assert roofline.decode_weight_bytes(moe, 10**5) == pytest.approx(moe.weight_bytes)
    for batch in (2, 16, 64):
        touched = 64 * (1 - (1 - 4 / 64) ** batch)
        weights = dense_bytes + touched * per_expert_bytes
        kv = batch * 1000 * moe.kv_bytes_per_token
        assert roofline.decode_step_s(moe, gpu, 1000, batch=batch) == pytest.approx(
            (weights + kv) / bw)
    # a dense model reads all its weights whatever the batch
    qwen = get_model("Qwen3-14B-BF16")
    assert roofline.decode_weight_bytes(qwen, 64) == pytest.approx(qwen.weight_bytes)


def test_moe_catalog_models_declare_their_experts() -> None:
    for name in ("MiniMax-M2.7-FP8", "MiniMax-M2.7-FP8-KV-BF16", "DeepSeek-V3-BF16KV"):
        model = get_model(name)
        assert (model.num_experts, model.experts_per_token) == (256, 8), name
        assert roofline.decode_weight_bytes(model, 1) == pytest.approx(model.active_weight_bytes)
        assert roofline.decode_weight_bytes(model, 256) > 0.9 * model.weight_bytes
    assert get_model("Qwen3-14B-BF16").num_experts is None


def test_expert_fields_are_checked() -> None:
    with pytest.raises(ValueError, match="experts_per_token"):
        _moe(num_experts=4, experts_per_token=4)
    with pytest.raises(ValueError, match="num_experts"):
        ModelSpec(**{**_moe().model_dump(), "num_experts": None})
