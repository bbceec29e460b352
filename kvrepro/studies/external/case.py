"""A case file: one public GPU measurement of KV offload, as data (data/external/<case>.yaml).

It holds what the source states and nothing the twin is tuned with: the source (repository and
path or URL, date, the quoted table), the setup as stated (model, GPU and count, TP, replicas,
engine settings, connector, store sizes, router), the workload, the published numbers (metric
as the source defines it, tier, point, value, read off a figure or not) and every assumption
where the source is silent, with why. The twin's constants live in one file for every case
(`constants`); a case file that names one is refused (`forbidden_keys`, and a test scans every
shipped file).

A user's own case is the same file with their model (a catalog name or the fields of its
config.json), GPUs, tiers and workload; `published` may be empty (then `kvrepro predict`
prints predictions only).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvrepro._checks import load_yaml_model
from kvrepro._paths import data_dir
from kvrepro.model_spec import ModelSpec, from_hf_dict, get_model


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Source(_Strict):
    """Where the published numbers come from."""

    title: str
    repository: str | None = None
    path: str | None = None
    url: str | None = None
    commit: str | None = None
    date: str = Field(description="when the source published them (YYYY-MM-DD), or why not "
                      "known")
    quote: str = Field(description="the table or sentences the numbers are copied from")


class Assumption(_Strict):
    """What the case runs where the source is silent (or contradicts itself)."""

    what: str
    value: str
    why: str


class StoreSetup(_Strict):
    """One offload store of a tier as the source states it."""

    kind: Literal["dram", "fs"] = Field(description="dram: host memory; fs: files on a "
                                        "filesystem (LMCache's fs L2 adapter)")
    capacity_bytes: float = Field(gt=0, description="per replica")
    adapter: str | None = Field(None, description="fs: LMCache's disk path and release, a key "
                                "of server_spec.LMCACHE_READS_IN_FLIGHT (how many reads it "
                                "keeps in flight, read from its source)")
    reads_in_flight: int | None = Field(None, gt=0, description="fs: reads in flight as the "
                                        "deployment set them (io_concurrency, num_workers); "
                                        "None: the adapter's default")
    device_read_gb_s: float | None = Field(None, gt=0, description="fs: the filesystem's read "
                                           "rate (a datasheet or fio measurement; say which in "
                                           "the case's assumptions)")


class TierSetup(_Strict):
    """A tier of the case: GPU only, or an offload connector with its stores."""

    connector: Literal["none", "vllm_native", "lmcache_mp"] = "none"
    stores: list[StoreSetup] = Field(default_factory=list)

    @model_validator(mode="after")
    def _stores_match(self) -> TierSetup:
        if (self.connector == "none") != (not self.stores):
            raise ValueError("a tier has stores exactly when its connector is not 'none'")
        return self


class EngineSetup(_Strict):
    """vLLM as the source ran it (defaults: the engine's own, per release)."""

    vllm_version: str
    cuda_graphs: bool = Field(True, description="False: --enforce-eager")
    block_tokens: int = Field(16, gt=0)
    kv_cache_tokens: int | None = Field(None, gt=0, description="the GPU KV pool per replica "
                                        "as stated; None: from GPU memory x "
                                        "gpu_memory_utilization - weights - activations")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    activation_reserve_gb: float = Field(4.0, ge=0, description="per GPU, used only when "
                                         "kv_cache_tokens is None")
    max_num_batched_tokens: int = Field(8192, gt=0)
    max_num_seqs: int = Field(256, gt=0)
    max_model_len: int = Field(131072, gt=0)


class HfModel(_Strict):
    """A model given by the fields of its Hugging Face `config.json`, inline."""

    hf_config: dict[str, Any] = Field(description="config.json as published (at least "
                                      "num_hidden_layers, num_attention_heads, hidden_size)")
    kv_dtype: str | None = Field(None, description="the KV cache's dtype when it is not the "
                                 "model's (vLLM --kv-cache-dtype fp8)")
    params_b: float | None = Field(None, gt=0, description="total parameters as the model "
                                   "card states them (None: counted from the shapes)")


class Setup(_Strict):
    """The serving system as stated."""

    model: str | ModelSpec | HfModel = Field(description="catalog name "
                                             "(data/models/catalog.yaml), the catalog's fields "
                                             "inline, or the model's config.json inline")
    hf_model: str = Field(description="the model's hub name as the source gives it")
    gpu: str = Field(description="GPU catalog name (data/hardware/gpus.csv)")
    tensor_parallel_size: int = Field(1, gt=0)
    replicas: int = Field(1, gt=0)
    router: Literal["none", "prefix_aware", "round_robin"] = "none"
    engine: EngineSetup
    tiers: dict[str, TierSetup] = Field(default_factory=dict)
    server_spec: str | None = Field(None, description="a server spec (shipped name or path) "
                                    "whose engine and tiers the case runs as they are, with "
                                    "the shared constants' rates for the GPU (study B's, "
                                    "whose LMCache store costs kvrepro calibrate fitted on "
                                    "B6); then `tiers` stays empty")

    @model_validator(mode="after")
    def _tiers_or_spec(self) -> Setup:
        if bool(self.tiers) == bool(self.server_spec):
            raise ValueError("give either tiers or server_spec (a spec brings its own tiers)")
        return self

    def tier_names(self) -> set[str]:
        """The tiers the case runs: its own, or its server spec's."""
        if self.server_spec is None:
            return set(self.tiers)
        from kvrepro.tier_spec import server_named
        return set(server_named(self.server_spec).tiers)

    def model_spec(self) -> ModelSpec:
        if isinstance(self.model, str):
            return get_model(self.model)
        if isinstance(self.model, HfModel):
            return from_hf_dict(self.model.hf_config, self.hf_model, self.model.kv_dtype,
                                self.model.params_b, source=f"config.json of {self.hf_model} "
                                                            "(inline in the case file)")
        return self.model


class ProbeWorkload(_Strict):
    """scripts/gpu_probe.py's measurements on one GPU (prefill, decode steps, copies)."""

    kind: Literal["probe"]
    results: str = Field(description="the probe's JSON, next to the case file")


class SingleRequestWorkload(_Strict):
    """One request at a time, per prompt length: a miss (recompute), a GPU prefix hit (the
    same prompt again) and an offload hit (the prompt's KV evicted from the GPU first)."""

    kind: Literal["single_request"]
    prompt_tokens: list[int] = Field(min_length=1)
    output_tokens: int = Field(1, gt=0)


class Stage(_Strict):
    rate_qps: float = Field(gt=0)
    duration_s: float = Field(gt=0)


class SharedPrefixWorkloadSetup(_Strict):
    """inference-perf's shared_prefix data with Poisson stages (kvrepro.workload.shared_prefix)."""

    kind: Literal["shared_prefix"]
    num_groups: int = Field(gt=0)
    num_prompts_per_group: int = Field(gt=0)
    system_prompt_len: int = Field(gt=0)
    question_len: int = Field(gt=0)
    output_len: int = Field(gt=0)
    stages: list[Stage] = Field(min_length=1)


class StudyBWorkload(_Strict):
    """Study B's B6 microbenchmark and B7 QPS sweep (kvrepro.studies.study_b), their
    published numbers read from the reference table (data/reference/reference_numbers.csv)."""

    kind: Literal["study_b"]
    b7_qps: list[float] = Field([0.1, 0.2, 0.3, 0.4, 0.5], min_length=1)


WorkloadSetup = Annotated[ProbeWorkload | SingleRequestWorkload | SharedPrefixWorkloadSetup
                          | StudyBWorkload, Field(discriminator="kind")]


class Published(_Strict):
    """One published number."""

    metric: str = Field(description="as the source defines it, unit in the name (ttft_mean_s)")
    tier: str = Field(description="a key of setup.tiers, or a view of one (gpu_hit, miss)")
    point: float = Field(description="the x of the table: QPS, prompt tokens, batch ...")
    value: float = Field(gt=0)
    read_off_figure: bool = False
    reading_error_pct: float | None = Field(None, ge=0, description="read off a figure: how "
                                            "far the reading may be off")
    used_in_fit: bool = Field(False, description="this number set a twin constant "
                                                 "(constants.yaml names the case): fitted")
    extra: dict[str, float] = Field(default_factory=dict, description="more coordinates of "
                                    "the point (batch and context of a decode step)")


class ExternalCase(_Strict):
    """A whole case file."""

    name: str
    title: str
    fit_case: bool = Field(False, description="every number of the case sets constants "
                                              "(labelled fitted)")
    source: Source
    setup: Setup
    workload: WorkloadSetup
    published: list[Published] = Field(default_factory=list)
    assumptions: list[Assumption] = Field(default_factory=list)
    reference_tier: str | None = Field(None, description="the tier the others' effects are "
                                       "measured against (None: the GPU-only tier or a miss)")
    causes: dict[str, str] = Field(default_factory=dict, description="metric or "
                                   "metric/tier -> why the twin misses there (written after "
                                   "a run; shown in the tables)")

    @model_validator(mode="after")
    def _tiers_known(self) -> ExternalCase:
        tiers = self.setup.tier_names()
        for p in self.published:
            if p.tier not in tiers | VIEW_TIERS:
                raise ValueError(f"published {p.metric} at {p.point:g}: tier {p.tier!r} is "
                                 f"not a tier of the setup ({sorted(tiers)})")
        return self

    def label(self, row: Published) -> str:
        return "fitted" if self.fit_case or row.used_in_fit else "predicted"


VIEW_TIERS = {"miss", "gpu_hit", "device"}
"""Published tiers that are views of a run rather than a tier of setup.tiers: a miss and a GPU
prefix hit of the GPU-only tier, the bare device (probe rates)."""

FORBIDDEN_KEYS = frozenset({
    "mfu", "prefill_mfu", "decode_efficiency", "step_overhead_s", "fp16_tflops",
    "mem_bw_tb_s", "read_bw_bytes_s", "write_bw_bytes_s", "chunk_read_latency_s",
    "object_latency_s", "tp_token_s", "efficiency", "dma_gb_s"})
"""Keys that set a twin constant or a rate the constants derive: never in a case file."""


def forbidden_keys(tree: Any, path: str = "", names: frozenset[str] | None = None
                   ) -> list[str]:
    """Dotted paths of every key of `tree` that would set a twin constant."""
    names = FORBIDDEN_KEYS | _constant_names() if names is None else names
    found: list[str] = []
    if isinstance(tree, dict):
        for key, value in tree.items():
            here = f"{path}.{key}" if path else str(key)
            if str(key) in names or str(key).split(".")[0] in names:
                found.append(here)
            found += forbidden_keys(value, here, names)
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            found += forbidden_keys(value, f"{path}.{i}", names)
    return found


def _constant_names() -> frozenset[str]:
    from kvrepro.calc.gpu_rates import load_constants
    return frozenset(name.split(".")[0] for name in load_constants().constants)


def cases_dir() -> Path:
    return data_dir() / "external"


def load_case(path: str | Path) -> ExternalCase:
    """Read a case file; a key that sets a twin constant is refused, naming it."""
    import yaml
    src = Path(path)
    if src.is_file():  # a constant is named as such, before the schema's "extra input"
        try:
            tree = yaml.safe_load(src.read_text())
        except (yaml.YAMLError, UnicodeDecodeError):
            tree = None  # load_yaml_model reports it with its line
        bad = forbidden_keys(tree)
        if bad:
            raise ValueError(f"{src}: {bad[0]}: a case file may not set a twin constant "
                             f"(they are shared: data/external/constants.yaml)")
    case = load_yaml_model(src, ExternalCase, "external case")
    if case.name != src.stem:
        raise ValueError(f"{src}: name {case.name!r} differs from the file name {src.stem!r}")
    return case


def shipped_cases() -> dict[str, Path]:
    """Every shipped case file by name (constants.yaml is not a case)."""
    return {p.stem: p for p in sorted(cases_dir().glob("*.yaml")) if p.stem != "constants"}


def resolve_case(name_or_path: str) -> Path:
    """A case by shipped name or by path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise FileNotFoundError(f"external case not found: {path}")
        return path
    cases = shipped_cases()
    if name_or_path not in cases:
        raise ValueError(f"unknown external case {name_or_path!r}; shipped: {sorted(cases)}")
    return cases[name_or_path]
