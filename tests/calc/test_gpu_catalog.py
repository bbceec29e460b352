"""The GPU catalog (data/hardware/gpus.csv): datasheet rates with their source."""

from __future__ import annotations

import pytest

from kvrepro.calc.roofline import gpu_presets

ARCHITECTURES = {"Ampere", "Hopper", "Blackwell"}


@pytest.mark.parametrize("name", sorted(gpu_presets()))
def test_every_gpu_has_dense_rates_an_architecture_and_a_source(name: str) -> None:
    gpu = gpu_presets()[name]
    assert gpu.arch in ARCHITECTURES
    assert gpu.source.strip()
    assert gpu.bf16_dense_tflops > 0
    # NVIDIA prints FP16/BF16 with 2:4 sparsity: the catalog's dense rate is half of it
    assert gpu.fp16_tflops == pytest.approx(2 * gpu.bf16_dense_tflops, rel=0.002)
    if gpu.fp8_dense_tflops:  # Hopper and Blackwell: FP8 at twice BF16
        assert gpu.fp8_dense_tflops == pytest.approx(2 * gpu.bf16_dense_tflops, rel=0.002)
    assert gpu.pcie_gen in (0, 4, 5)
    assert gpu.host_link_gb_s == {4: 32, 5: 64}.get(gpu.pcie_gen, gpu.host_link_gb_s)


def test_the_cases_gpus_are_in_the_catalog() -> None:
    for name in ("H100-SXM", "H100-PCIe", "H200", "H20", "H800", "A100-SXM",
                 "RTX-PRO-6000"):
        assert name in gpu_presets()
