"""Roofline cost of prefill and decode: the one timing model of kvrepro.

Prefill is compute bound: FLOPs over the GPU's rate times a utilisation. Decode (one new
token per request) is memory bound: the weights and the cached KV are read once per step; of
a MoE's routed experts, those the step's tokens touch (`decode_weight_bytes`).
Figure B4 (prefill TTFT by GPU) and the simulator's step time both call these functions.

FLOPs of `new_tokens` query tokens attending to `cached_tokens` earlier ones plus themselves
(causal), per layer with attention width d = heads x head_dim:
  linear (projections + MLP) = 2 x active parameters x new tokens (summed over layers);
  attention = QK^T + AV = 4 x new x (cached + new / 2) x d.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from kvrepro._checks import non_negative, positive
from kvrepro._paths import data_file
from kvrepro.model_spec import ModelSpec


class GpuSpec(BaseModel):
    """Rates of one GPU that the roofline needs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    fp16_tflops: float = Field(gt=0, description="peak FP16 rate, TFLOP/s")
    host_link_gb_s: float = Field(gt=0, description="host <-> GPU link, GB/s")
    pcie_gen: int = Field(0, ge=0, description="the host link's PCIe generation (0: not PCIe "
                                               "or not given)")
    mem_bw_tb_s: float = Field(gt=0, description="GPU memory bandwidth, TB/s")
    mem_gb: float = Field(gt=0, description="GPU memory, GB")
    arch: str = Field("", description="architecture (Ampere, Hopper, Blackwell): the twin's "
                                      "efficiencies are per architecture")
    bf16_dense_tflops: float = Field(0.0, ge=0, description="dense BF16 tensor rate, TFLOP/s")
    fp8_dense_tflops: float = Field(0.0, ge=0, description="dense FP8 tensor rate, TFLOP/s "
                                                           "(0: no FP8 tensor cores)")
    nvlink_gb_s: float = Field(0.0, ge=0, description="NVLink per GPU, bidirectional, GB/s "
                                                      "(0: none)")
    source: str = ""


@lru_cache(maxsize=1)
def gpu_presets() -> dict[str, GpuSpec]:
    """Load the shipped GPU presets (`data/hardware/gpus.csv`)."""
    df = pd.read_csv(data_file("hardware", "gpus.csv"), comment="#")
    return {row["name"]: GpuSpec(**row) for row in df.to_dict("records")}


def get_gpu(name: str) -> GpuSpec:
    """Return a GPU preset by name; the error lists the known names."""
    presets = gpu_presets()
    if name not in presets:
        raise ValueError(f"unknown GPU {name!r} (parameter 'gpu'); known: {sorted(presets)}")
    return presets[name]


def prefill_flops(model: ModelSpec, new_tokens: int, cached_tokens: int = 0) -> dict[str, float]:
    """FLOPs to prefill `new_tokens` after `cached_tokens`, split into linear and attention."""
    linear, attention = _prefill_flops_parts(model, new_tokens, cached_tokens)
    return {"linear": linear, "attention": attention, "total": linear + attention}


def _prefill_flops_parts(model: ModelSpec, new_tokens: int,
                         cached_tokens: int) -> tuple[float, float]:
    """(linear, attention) FLOPs of a prefill (`prefill_flops`, without building its dict:
    the simulator calls this for every prefill chunk)."""
    if not (type(new_tokens) is int and type(cached_tokens) is int  # noqa: E721 - fast path
            and new_tokens >= 0 and cached_tokens >= 0):
        non_negative(new_tokens=new_tokens, cached_tokens=cached_tokens)
    width = model.num_attention_heads * model.head_dim
    linear = 2.0 * model.params_active_b * 1e9 * new_tokens
    attention = 4.0 * model.num_layers * width * new_tokens * (cached_tokens + new_tokens / 2)
    return linear, attention


def prefill_compute_s(linear: Any, attention: Any, fp16_tflops: float, mfu: float,
                      attention_tflops: float | None = None) -> Any:
    """Seconds of `linear` and `attention` prefill FLOPs (floats or arrays): both at
    fp16_tflops x mfu, or the attention FLOPs at `attention_tflops` where it is given. Why
    two rates: on a CPU the attention kernel and the matmuls (oneDNN) run at rates of their
    own, and one rate fitted on short prompts, whose FLOPs are mostly matmuls, makes long
    ones, whose FLOPs are mostly attention, too slow (`calibration.fit.fit_prefill_split`)."""
    if attention_tflops is None:
        return (linear + attention) / (fp16_tflops * 1e12 * mfu)
    return linear / (fp16_tflops * 1e12 * mfu) + attention / (attention_tflops * 1e12)


def prefill_time_s(model: ModelSpec, gpu: GpuSpec, new_tokens: int, cached_tokens: int = 0,
                   mfu: float = 0.5, attention_tflops: float | None = None) -> float:
    """Seconds of GPU compute to prefill `new_tokens` (compute bound; `prefill_compute_s`)."""
    if not (type(mfu) is float and 0.0 < mfu <= 1.0):  # noqa: E721 - the common case, fast
        positive(mfu=mfu)
        if mfu > 1:
            raise ValueError(f"parameter 'mfu' must be <= 1, got {mfu}")
    linear, attention = _prefill_flops_parts(model, new_tokens, cached_tokens)
    return prefill_compute_s(linear, attention, gpu.fp16_tflops, mfu, attention_tflops)


def expected_experts_touched(num_experts: int, experts_per_token: int, tokens: int) -> float:
    """Expected distinct experts of one MoE layer that `tokens` tokens are routed to.

    Assumes uniform, independent routing: each token picks `experts_per_token` (k) distinct
    experts of `num_experts` (E) uniformly, so an expert is missed by one token with
    probability 1 - k/E and by all b tokens with (1 - k/E)^b: E x (1 - (1 - k/E)^b), k at
    b = 1 and E as b grows. Real routers are skewed (popular experts), which touches fewer;
    the uniform case is the upper bound a batch's weight traffic is modelled with.
    """
    positive(num_experts=num_experts, experts_per_token=experts_per_token)
    non_negative(tokens=tokens)
    if experts_per_token > num_experts:
        raise ValueError(f"parameter 'experts_per_token' ({experts_per_token}) exceeds "
                         f"'num_experts' ({num_experts})")
    return num_experts * (1.0 - (1.0 - experts_per_token / num_experts) ** tokens)


def decode_weight_bytes(model: ModelSpec, batch_tokens: int = 1) -> float:
    """Bytes of weights one step reads for a batch of `batch_tokens` tokens.

    Dense models read all their weights. A MoE reads its dense part (attention, embeddings,
    shared experts, dense layers) once and each routed expert the batch touches once
    (`expected_experts_touched`). The split follows from the catalog's counts alone: with E
    routed experts, k per token and P parameters in all of which A are active per token,
    one expert (over all MoE layers) has (P - A) / (E - k) parameters and the dense part
    A - k x that. One token reads the active weights; a large batch nearly all of them.
    """
    positive(batch_tokens=batch_tokens)
    if model.num_experts is None:
        return model.active_weight_bytes
    routed, k = model.num_experts, model.experts_per_token
    expert_bytes = ((model.params_total_b - model.params_active_b) * 1e9
                    * model.weight_bytes_per_param / (routed - k))
    dense_bytes = model.active_weight_bytes - k * expert_bytes
    return dense_bytes + expected_experts_touched(routed, k, batch_tokens) * expert_bytes


def decode_step_s(model: ModelSpec, gpu: GpuSpec, context_tokens: int, batch: int = 1,
                  batch_tokens: int | None = None) -> float:
    """Seconds for one decode step of `batch` requests of `context_tokens` each: the
    weights the step's tokens touch (`decode_weight_bytes`; `batch_tokens`, default one per
    request) read once, and every request's KV."""
    non_negative(context_tokens=context_tokens)
    positive(batch=batch)
    kv_bytes = batch * context_tokens * model.kv_bytes_per_token
    weight_bytes = decode_weight_bytes(model, batch if batch_tokens is None else batch_tokens)
    return (weight_bytes + kv_bytes) / (gpu.mem_bw_tb_s * 1e12)


def kv_load_time_s(model: ModelSpec, gpu: GpuSpec, tokens: int) -> float:
    """Seconds to move `tokens` of KV from host memory to the GPU over the host link."""
    non_negative(tokens=tokens)
    return tokens * model.kv_bytes_per_token / (gpu.host_link_gb_s * 1e9)


def ttft_without_cache_s(model: ModelSpec, gpu: GpuSpec, prompt_tokens: int,
                         mfu: float = 0.5) -> float:
    """TTFT when the whole prompt is recomputed: prefill FLOPs / (FP16 rate x utilisation)."""
    return prefill_time_s(model, gpu, prompt_tokens, 0, mfu)


def ttft_with_cache_s(model: ModelSpec, gpu: GpuSpec, prompt_tokens: int) -> float:
    """TTFT when the prompt's KV is in host memory: load it over the link, decode one step."""
    return kv_load_time_s(model, gpu, prompt_tokens) + decode_step_s(model, gpu, prompt_tokens)


def prefill_ttft_by_gpu(model: ModelSpec, gpus: list[str], prompt_tokens: list[int],
                        mfu: float = 0.5) -> pd.DataFrame:
    """Tidy TTFT with and without a prompt cache for each GPU and prompt length (figure B4)."""
    rows = []
    for name in gpus:
        gpu = get_gpu(name)
        for tokens in prompt_tokens:
            rows.append({"gpu": name, "prompt_tokens": tokens, "cache": "without cache",
                         "ttft_s": ttft_without_cache_s(model, gpu, tokens, mfu)})
            rows.append({"gpu": name, "prompt_tokens": tokens, "cache": "with cache",
                         "ttft_s": ttft_with_cache_s(model, gpu, tokens)})
    return pd.DataFrame(rows)


ANATOMY_PARTS = ("feed-forward", "attention")


def prefill_anatomy(model: ModelSpec, gpu: GpuSpec, seq_tokens: list[int],
                    mfu: float = 0.5) -> pd.DataFrame:
    """Prefill latency of a fresh prompt vs its length, split into feed-forward and attention.

    Figure B1: why prompt caching pays more the longer the prompt. The split is
    `prefill_time_s` (the function the simulator's step time calls) divided in proportion to
    `prefill_flops`'s linear part (projections + MLP, linear in length; "feed-forward") and
    attention part (QK^T + AV, quadratic; "attention" / KV compute), so the two parts of a
    length add up to `prefill_time_s` for it. Tidy: `seq_tokens, part, latency_ms, share`.
    """
    if not seq_tokens:
        raise ValueError("parameter 'seq_tokens' is empty")
    rows = []
    for tokens in seq_tokens:
        total_ms = prefill_time_s(model, gpu, tokens, 0, mfu) * 1e3
        flops = prefill_flops(model, tokens)
        share = flops["attention"] / flops["total"] if flops["total"] else 0.0
        feed_forward_ms = total_ms * (1 - share)
        rows.append({"seq_tokens": tokens, "part": "feed-forward",
                     "latency_ms": feed_forward_ms, "share": 1 - share})
        rows.append({"seq_tokens": tokens, "part": "attention",
                     "latency_ms": total_ms - feed_forward_ms, "share": share})
    return pd.DataFrame(rows)
