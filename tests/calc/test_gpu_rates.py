"""A server's twin rates derived from its stated hardware (kvrepro.calc.gpu_rates): the GPU
catalog times the shared constants, the rule study A's server and the external cases share."""

from __future__ import annotations

import copy

import pytest
import yaml
from pydantic import ValidationError

from kvrepro._paths import data_file
from kvrepro.calc.gpu_rates import derived_rates, derived_server, load_constants
from kvrepro.calc.roofline import get_gpu
from kvrepro.engines.sim import sim_profile
from kvrepro.tier_spec import ServerSpec, load_server

STUDY_A = data_file("servers", "study_a.yaml")


def _raw() -> dict:
    return yaml.safe_load(STUDY_A.read_text())


def test_study_a_gets_the_catalogs_rates_times_the_shared_constants() -> None:
    spec, constants = load_server(STUDY_A), load_constants()
    gpu = get_gpu("RTX-PRO-6000")
    rates = derived_rates(spec, constants)
    assert rates["twin.fp16_tflops"] == 4 * gpu.bf16_dense_tflops
    assert rates["twin.mem_bw_tb_s"] == pytest.approx(4 * gpu.mem_bw_tb_s)
    assert rates["twin.mfu"] == constants.value("prefill_mfu.Hopper")  # the declared stand-in
    assert rates["twin.tp_token_s"] > 0  # TP4 over PCIe: the all-reduces cost per token
    dma = 4 * gpu.host_link_gb_s * 1e9 * constants.value("dma_one_way_efficiency")
    assert rates["tiers.dram.stores.0.read_bw_bytes_s"] == pytest.approx(dma)
    assert rates["tiers.flash.stores.0.write_bw_bytes_s"] == pytest.approx(dma)
    assert rates["tiers.flash.stores.1.chunk_read_latency_s"] == constants.value(
        "fs_read_latency_s")  # one read in flight (LMCache 0.5.0)
    assert "tiers.flash.stores.1.read_bw_bytes_s" not in rates  # stated: fio 114 GB/s
    profile = sim_profile(spec)
    assert profile.server.mfu == rates["twin.mfu"]
    assert profile.tiers["dram"].stores[0].read_bw_bytes_s == pytest.approx(dma)


def test_a_changed_constant_moves_the_derived_rates() -> None:
    """The guard of the derivation: break a constant and the twin it gives changes."""
    constants = load_constants()
    moved = copy.deepcopy(constants)
    moved.constants["prefill_mfu.Hopper"].value *= 1.3
    moved.constants["fs_read_latency_s"].value *= 1.3
    spec = load_server(STUDY_A)
    before, after = derived_server(spec, constants), derived_server(spec, moved)
    assert after.twin.mfu == pytest.approx(1.3 * before.twin.mfu)
    assert (after.tiers["flash"].stores[1].chunk_read_latency_s
            == pytest.approx(1.3 * before.tiers["flash"].stores[1].chunk_read_latency_s))


def test_without_a_measured_architecture_the_stand_in_must_be_declared() -> None:
    raw = _raw()
    del raw["hardware"]["constants_arch"]
    with pytest.raises(ValueError, match="no prefill_mfu for GPU architecture 'Blackwell'"):
        derived_server(ServerSpec.model_validate(raw))
    raw = _raw()
    raw["hardware"]["constants_arch_why"] = " "
    with pytest.raises(ValidationError, match="constants_arch_why"):
        ServerSpec.model_validate(raw)


def test_a_server_gives_typed_rates_or_hardware_not_both() -> None:
    raw = _raw()
    raw["twin"] = {"fp16_tflops": 2000, "mem_bw_tb_s": 6.4}
    with pytest.raises(ValidationError, match="either twin"):
        ServerSpec.model_validate(raw)
    del raw["hardware"]
    with pytest.raises(ValidationError, match=r"tiers\.dram\.stores\.0\.read_bw_bytes_s"):
        ServerSpec.model_validate(raw)


def test_only_a_dram_stores_rate_is_derived() -> None:
    raw = _raw()
    raw["tiers"]["flash"]["stores"][1]["read_bw_bytes_s"] = None
    with pytest.raises(ValueError, match=r"tiers\.flash\.stores\.1\.read_bw_bytes_s: only a "
                                         r"host-memory store"):
        derived_server(ServerSpec.model_validate(raw))
