"""Model architectures and their KV-cache footprint.

KV bytes per token is the one number every sizing question starts from: capacity per TTL,
write traffic per token, load time per cached prefix. It follows from the architecture alone:

* MHA / GQA: 2 (K and V) x layers x KV heads x head dim x bytes per element;
* MLA (DeepSeek-style latent cache): layers x (kv_lora_rank + qk_rope_head_dim) x bytes,
  because one compressed latent plus the rotary key part is cached instead of K and V.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kvrepro._paths import data_file

DTYPE_BYTES: dict[str, int] = {
    "float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "bfloat16": 2, "bf16": 2,
    "float8": 1, "fp8": 1, "float8_e4m3fn": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1,
}


class ModelSpec(BaseModel):
    """Architecture numbers of one model, as far as KV size and prefill cost need them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    attention: Literal["gqa", "mla"] = Field(description="gqa also covers MHA")
    num_layers: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0, description="KV heads (== attention heads for MHA)")
    head_dim: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    kv_dtype_bytes: float = Field(gt=0, description="bytes per cached element")
    kv_lora_rank: int | None = Field(default=None, gt=0, description="MLA latent width")
    qk_rope_head_dim: int | None = Field(default=None, ge=0, description="MLA rotary key width")
    params_total_b: float = Field(gt=0, description="total parameters, billions")
    params_active_b: float = Field(gt=0, description="parameters active per token, billions")
    weight_bytes_per_param: float = Field(gt=0)
    num_experts: int | None = Field(default=None, gt=1, description="MoE: routed experts per "
                                    "MoE layer (None: dense)")
    experts_per_token: int | None = Field(default=None, gt=0, description="MoE: routed experts "
                                          "each token uses (top-k)")
    source: str = ""

    @model_validator(mode="after")
    def _mla_needs_latent(self) -> ModelSpec:
        if self.attention == "mla" and self.kv_lora_rank is None:
            raise ValueError(f"model {self.name!r}: attention 'mla' needs kv_lora_rank")
        return self

    @model_validator(mode="after")
    def _experts_consistent(self) -> ModelSpec:
        """Routed experts need both counts, fewer active than routed, and more parameters in
        all than active: the roofline splits the weights into dense and per-expert parts from
        params_total_b and params_active_b (`kvrepro.calc.roofline.decode_weight_bytes`)."""
        if (self.num_experts is None) != (self.experts_per_token is None):
            raise ValueError(f"model {self.name!r}: give both num_experts and experts_per_token "
                             f"or neither, got {self.num_experts} and {self.experts_per_token}")
        if self.num_experts is not None and not self.experts_per_token < self.num_experts:
            raise ValueError(f"model {self.name!r}: experts_per_token ({self.experts_per_token})"
                             f" must be below num_experts ({self.num_experts})")
        if self.num_experts is not None and not self.params_active_b < self.params_total_b:
            raise ValueError(f"model {self.name!r}: a MoE needs params_active_b "
                             f"({self.params_active_b}) below params_total_b "
                             f"({self.params_total_b})")
        return self

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache one token occupies across all layers."""
        if self.attention == "mla":
            width = self.kv_lora_rank + (self.qk_rope_head_dim or 0)
            return round(self.num_layers * width * self.kv_dtype_bytes)
        return round(2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes)

    @property
    def weight_bytes(self) -> float:
        """Bytes of all weights (what must fit in GPU memory)."""
        return self.params_total_b * 1e9 * self.weight_bytes_per_param

    @property
    def active_weight_bytes(self) -> float:
        """Bytes of weights read per decode step (active experts only for MoE)."""
        return self.params_active_b * 1e9 * self.weight_bytes_per_param


@lru_cache(maxsize=1)
def catalog() -> dict[str, ModelSpec]:
    """Load the shipped model catalog (`data/models/catalog.yaml`)."""
    path = data_file("models", "catalog.yaml")
    raw = yaml.safe_load(path.read_text())
    out = {}
    for name, fields in raw.items():
        try:
            out[name] = ModelSpec(name=name, **fields)
        except ValidationError as err:
            raise ValueError(f"{path}: entry {name!r} is invalid:\n{err}") from err
    return out


def get_model(name: str) -> ModelSpec:
    """Return a catalog model by name; the error lists the names that exist."""
    models = catalog()
    if name not in models:
        raise ValueError(f"unknown model {name!r} (parameter 'model'); known: {sorted(models)}")
    return models[name]


def kv_bytes_per_token(model: str | ModelSpec) -> int:
    """KV bytes per token of a catalog model name or a ModelSpec."""
    spec = get_model(model) if isinstance(model, str) else model
    return spec.kv_bytes_per_token


def _hf_require(cfg: dict, key: str, path: Path | str) -> int:
    if key not in cfg:
        raise ValueError(f"{path}: config.json has no {key!r}, needed for the KV size")
    value = cfg[key]
    if not isinstance(value, int) or value <= 0:
        raise ValueError(f"{path}: {key!r} must be a positive integer, got {value!r}")
    return value


def _hf_dtype_bytes(cfg: dict, kv_dtype: str | None, path: Path | str) -> int:
    dtype = kv_dtype or cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    if str(dtype).lower() not in DTYPE_BYTES:
        raise ValueError(f"{path}: unknown dtype {dtype!r} (parameter 'kv_dtype'); "
                         f"known: {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[str(dtype).lower()]


def _read_json(path: Path) -> dict:
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: malformed JSON at line {err.lineno}, column {err.colno}: "
                         f"{err.msg}") from err
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: expected a JSON object at the top level")
    return cfg.get("text_config", cfg) if "num_hidden_layers" not in cfg else cfg


def from_hf_config(path: str | Path, kv_dtype: str | None = None,
                   params_b: float | None = None, name: str | None = None) -> ModelSpec:
    """Build a ModelSpec from a local Hugging Face `config.json` (file or model folder).

    `kv_dtype` overrides the cache precision (e.g. "fp8" when vLLM runs with an FP8 KV cache);
    `params_b` sets the parameter count, which config.json does not state (defaults to a
    count from the layer shapes: `from_hf_dict`).
    """
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json at {path}")
    return from_hf_dict(_read_json(path), name or path.parent.name, kv_dtype, params_b,
                        source=str(path))


def _hf_params_b(cfg: dict, source: str) -> tuple[float, float]:
    """(total, active) parameters in billions counted from the layer shapes: attention, MLP
    (or routed experts: all of them in total, `num_experts_per_tok` of them active), and the
    embeddings and output layer. Norms and routers are left out (well under 0.1 %)."""
    layers = _hf_require(cfg, "num_hidden_layers", source)
    heads, hidden = cfg["num_attention_heads"], cfg["hidden_size"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    embeddings = cfg.get("vocab_size", 0) * hidden * (1 if cfg.get("tie_word_embeddings")
                                                      else 2)
    experts = cfg.get("num_experts") or cfg.get("num_local_experts")
    if experts:
        per_expert = 3 * hidden * cfg.get("moe_intermediate_size",
                                          cfg.get("intermediate_size", 4 * hidden))
        k = _hf_require(cfg, "num_experts_per_tok", source)
        total = layers * (attention + experts * per_expert) + embeddings
        active = layers * (attention + k * per_expert) + embeddings
        return total / 1e9, active / 1e9
    dense = layers * (attention + 3 * hidden * cfg.get("intermediate_size", 4 * hidden))
    return (dense + embeddings) / 1e9, (dense + embeddings) / 1e9


def from_hf_dict(cfg: dict, name: str, kv_dtype: str | None = None,
                 params_b: float | None = None, source: str = "config.json") -> ModelSpec:
    """A ModelSpec from the fields of a Hugging Face `config.json` already read (a case file
    may give them inline). A MoE (`num_experts` or `num_local_experts`, with
    `num_experts_per_tok`) gets its routed experts and its active count; `params_b` sets the
    total (and a dense model's active) count instead of the shape count."""
    layers = _hf_require(cfg, "num_hidden_layers", source)
    heads = _hf_require(cfg, "num_attention_heads", source)
    hidden = _hf_require(cfg, "hidden_size", source)
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    dtype_bytes = _hf_dtype_bytes(cfg, kv_dtype, source)
    weight_bytes = _hf_dtype_bytes(cfg, None, source)
    total_b, active_b = _hf_params_b(cfg, source)
    experts = cfg.get("num_experts") or cfg.get("num_local_experts")
    if params_b is not None:
        total_b, active_b = params_b, (active_b if experts else params_b)
    mla = "kv_lora_rank" in cfg and cfg["kv_lora_rank"]
    return ModelSpec(
        name=name, attention="mla" if mla else "gqa",
        num_layers=layers, num_attention_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        hidden_size=hidden, kv_dtype_bytes=dtype_bytes,
        kv_lora_rank=cfg.get("kv_lora_rank") if mla else None,
        qk_rope_head_dim=cfg.get("qk_rope_head_dim") if mla else None,
        params_total_b=total_b, params_active_b=active_b, weight_bytes_per_param=weight_bytes,
        num_experts=experts or None,
        experts_per_token=cfg.get("num_experts_per_tok") if experts else None,
        source=source)
