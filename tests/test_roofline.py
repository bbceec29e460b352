import pytest

from kvrepro.calc import roofline
from kvrepro.calc.models import get_model


def test_prefill_flops_hand_case() -> None:
    qwen = get_model("Qwen3-14B-BF16")
    flops = roofline.prefill_flops(qwen, 1000)
    assert flops["linear"] == pytest.approx(2 * 14.8e9 * 1000)
    # 4 x 40 layers x 5120 width x 1000 x 500 (causal mean context)
    assert flops["attention"] == pytest.approx(4 * 40 * 5120 * 1000 * 500)
    # with 1000 cached tokens every new token also attends to the cached ones
    cached = roofline.prefill_flops(qwen, 1000, cached_tokens=1000)
    assert cached["attention"] == pytest.approx(3 * flops["attention"])


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
