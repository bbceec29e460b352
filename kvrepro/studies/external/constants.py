"""The twin's one set of GPU-server constants, shared by every external case.

A constant is what no datasheet or source states for the case at hand: how much of a GPU's
datasheet rate prefill and decode reach, a step's fixed cost, how fast pinned host<->GPU DMA
runs compared with the link, what one read of LMCache's filesystem adapter costs. Each one
comes from a cited measurement, a datasheet, or a declared fit case (`fit_case`), and is then
frozen in `data/external/constants.yaml`. No case file may set one (`case.forbidden_keys`);
the numbers of a fit case are labelled `fitted` in every table.

`fit_constants()` is the routine that sets the fitted ones from their fit cases (the H200
probe of `scripts/gpu_probe.py`, and one point of the LMCache filesystem case); `kvrepro
predict --refit` rewrites the file from it, and a test refits and compares, so the frozen
file is never edited by hand.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np
import yaml

from kvrepro._files import replace_files
from kvrepro._paths import data_file
from kvrepro.calc.gpu_rates import Constant, constants_path, load_constants
from kvrepro.calc.roofline import GpuSpec, decode_weight_bytes, get_gpu, prefill_flops
from kvrepro.model_spec import ModelSpec, get_model

PROBE_MODEL = "Llama-3.1-8B-BF16"
"""The model `scripts/gpu_probe.py` builds (its config.json numbers)."""
PREFILL_FIT_MIN_TOKENS = 2048
"""Shorter probe prefills are bound by eager kernel launches (about 25 ms whatever the
length, measured), not by FLOPs: left out of the prefill fit."""
DECODE_FIT_MAX_BATCH = 64
"""Larger probe batches add matmul compute the memory roofline does not model."""
DMA_BLOCK_BYTES = 2 << 20
"""vLLM's offload block of Llama-3.1-8B, Qwen3-32B at TP 2 (2 MB, the vLLM blog's table): the
block size the DMA rate is read at."""


# ------------------------------------------------------------------ the fit routine

def probe_results(path: str | Path | None = None) -> dict:
    """The H200 probe's measurements (scripts/gpu_probe.py output, shipped as measured)."""
    return json.loads(Path(path or data_file("external", "measured_h200.json")).read_text())


def prefill_mfu(probe: dict, model: ModelSpec, gpu: GpuSpec) -> float:
    """Median of each probe prefill's FLOPs / (time x dense BF16 rate), long prompts only."""
    rates = [prefill_flops(model, r["prompt_tokens"])["total"]
             / (r["prefill_s"] * gpu.bf16_dense_tflops * 1e12)
             for r in probe["prefill"] if r["prompt_tokens"] >= PREFILL_FIT_MIN_TOKENS]
    return statistics.median(rates)


def decode_line(probe: dict, model: ModelSpec, gpu: GpuSpec) -> tuple[float, float]:
    """(efficiency, intercept_s) of graph decode steps: step = intercept + bytes / (bw x eff),
    bytes = weights + every request's KV, least squares over batches up to
    DECODE_FIT_MAX_BATCH."""
    rows = [r for r in probe["decode"] if r["batch"] <= DECODE_FIT_MAX_BATCH
            and "graph_step_s" in r]
    bytes_ = np.array([decode_weight_bytes(model, r["batch"])
                       + r["batch"] * r["context_tokens"] * model.kv_bytes_per_token
                       for r in rows])
    slope, intercept = np.polyfit(bytes_, [r["graph_step_s"] for r in rows], 1)
    return 1.0 / (slope * gpu.mem_bw_tb_s * 1e12), float(intercept)


def eager_layer_overhead_s(probe: dict, model: ModelSpec) -> float:
    """Median extra time per layer of an eager decode step over its CUDA-graph replay: the
    kernel launches that vLLM's --enforce-eager pays on every step."""
    return statistics.median((r["eager_step_s"] - r["graph_step_s"]) / model.num_layers
                             for r in probe["decode"] if "graph_step_s" in r)


def dma_efficiency(probe: dict, gpu: GpuSpec, direction: str) -> float:
    """Measured pinned copy rate at DMA_BLOCK_BYTES over the link's theoretical rate (one way:
    `host_link_gb_s`; both ways: twice it)."""
    row = next(r for r in probe["copies"] if r["block_bytes"] == DMA_BLOCK_BYTES)
    link = gpu.host_link_gb_s * (2 if direction == "both" else 1)
    return row[f"{direction}_gb_s"] / link


def fit_constants(probe: dict | None = None) -> dict[str, Constant]:
    """The fitted and measured constants, from their fit cases (the frozen file's source)."""
    probe = probe or probe_results()
    model, gpu = get_model(PROBE_MODEL), get_gpu("H200")
    arch = gpu.arch
    eff, intercept = decode_line(probe, model, gpu)
    how = "scripts/gpu_probe.py on one H200 (data/external/measured_h200.json): "
    out = {
        f"prefill_mfu.{arch}": Constant(
            value=prefill_mfu(probe, model, gpu), unit="fraction of dense BF16", kind="fitted",
            fit_case="measured_h200",
            source=how + f"median FLOPs / (time x {gpu.bf16_dense_tflops:g} TFLOP/s) of "
                         f"prefills >= {PREFILL_FIT_MIN_TOKENS} tokens"),
        f"decode_efficiency.{arch}": Constant(
            value=eff, unit="fraction of HBM bandwidth", kind="fitted", fit_case="measured_h200",
            source=how + "least-squares slope of CUDA-graph decode steps against weights + KV "
                         f"bytes, batches <= {DECODE_FIT_MAX_BATCH}"),
        "graph_step_overhead_s": Constant(
            value=intercept, unit="s", kind="fitted", fit_case="measured_h200",
            source=how + "intercept of the same line (launch gaps of a replayed graph, "
                         "norms, sampling head)"),
        "eager_layer_overhead_s": Constant(
            value=eager_layer_overhead_s(probe, model), unit="s per layer per step",
            kind="fitted", fit_case="measured_h200",
            source=how + "median (eager - graph) decode step / layers"),
        "dma_one_way_efficiency": Constant(
            value=dma_efficiency(probe, gpu, "h2d"), unit="fraction of host link",
            kind="measured", fit_case="measured_h200",
            source=how + "pinned host->device cudaMemcpyAsync at 2 MiB blocks / 64 GB/s "
                         "(PCIe Gen5 x16); the vLLM blog reports about 50 GB/s on an H100"),
        "dma_both_ways_efficiency": Constant(
            value=dma_efficiency(probe, gpu, "both"), unit="fraction of 2 x host link",
            kind="measured", fit_case="measured_h200",
            source=how + "both directions at once at 2 MiB blocks / 128 GB/s (the vLLM blog: "
                         "83.4 GB/s on an H100)"),
    }
    return out


def fixed_constants() -> dict[str, Constant]:
    """Constants that no fit sets: estimates and datasheet values, kept in the file as they
    are (the refit leaves them)."""
    return {name: c for name, c in load_constants().constants.items()
            if c.kind in ("estimate", "datasheet")}


def write_constants(path: str | Path | None = None,
                    extra: dict[str, Constant] | None = None) -> Path:
    """Refit and rewrite the frozen file (atomically); `extra`: constants fitted through the
    twin (`predict.refit`). The header says how it was made."""
    merged = {**fixed_constants(), **fit_constants(), **(extra or {})}
    body = {"constants": {k: _rounded(c).model_dump(exclude_none=True)
                          for k, c in sorted(merged.items())}}
    target = Path(path or constants_path())
    header = ("# The twin's shared constants for GPU servers (kvrepro.studies.external.constants)."
              "\n# Written by `kvrepro predict --refit`: the fitted and measured ones come from "
              "their fit\n# cases; estimates are kept as written. Do not edit fitted values by "
              "hand.\n")
    replace_files({target: header + yaml.safe_dump(body, sort_keys=False, width=100)})
    return target


def _rounded(c: Constant) -> Constant:
    digits = 4 - int(math.floor(math.log10(abs(c.value)))) if c.value else 0
    return c.model_copy(update={"value": round(c.value, max(digits, 0) + 0)})
