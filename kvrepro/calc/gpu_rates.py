"""A GPU server's twin rates from what is stated about it: the GPU catalog, the model, the
tensor-parallel size, and the twin's one set of shared constants.

Why here, below the engines: a server spec may give its hardware (`ServerSpec.hardware`)
instead of typed twin rates, and the simulator then derives them (`derived_server`), so a
study's server (study A) and an external case (`kvrepro.studies.external`) get their rates
by the same rule and no file carries an efficiency of its own.

The constants (`data/external/constants.yaml`) are fitted or measured by
`kvrepro.studies.external.constants.fit_constants` and frozen; this module only reads them.

* Tensor parallelism: a TP group of n GPUs has n times one GPU's dense BF16 rate and HBM
  bandwidth, and every step pays two all-reduces per layer (after attention and after the
  MLP, Megatron-style, as vLLM runs it): a latency each (`allreduce_latency_s`, in the step
  overhead) and the step's tokens' hidden states over the GPUs' link (`tp_token_s`: a ring
  all-reduce moves 2 (n-1)/n of the data each way, at NVLink's per-direction rate x
  `allreduce_link_efficiency`; PCIe when the GPU has none).
* Step overhead: `graph_step_overhead_s` with CUDA graphs; with --enforce-eager,
  `eager_layer_overhead_s` x layers on top (the launches a graph replay saves).
* Host memory: pinned DMA at the host link x `dma_one_way_efficiency` per GPU (each GPU of a
  TP group moves its own shard: n links).
* A disk store's chunk read: `fs_read_latency_s` per chunk-file read, of which the disk
  path keeps `HardwareSpec.disk_reads_in_flight` in flight.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kvrepro._checks import load_yaml_model
from kvrepro._paths import data_file
from kvrepro.calc.roofline import GpuSpec, get_gpu
from kvrepro.model_spec import ModelSpec
from kvrepro.tier_spec import ServerSpec, TwinSpec, set_dotted

Kind = Literal["measured", "fitted", "datasheet", "estimate"]
BYTES_PER_ACTIVATION = 2
"""BF16 hidden states in the all-reduces."""


class Constant(BaseModel):
    """One constant with where it comes from."""

    model_config = ConfigDict(extra="forbid")

    value: float
    unit: str
    kind: Kind
    source: str
    fit_case: str | None = Field(None, description="the case whose numbers set it (then "
                                                   "labelled fitted there)")


class Constants(BaseModel):
    """The frozen file: constant name -> Constant. Per-architecture names end in `.<arch>`."""

    model_config = ConfigDict(extra="forbid")

    constants: dict[str, Constant]

    def value(self, name: str) -> float:
        if name not in self.constants:
            raise KeyError(f"twin constant {name!r} is not in data/external/constants.yaml "
                           f"(known: {sorted(self.constants)})")
        return self.constants[name].value

    def arch_value(self, name: str, arch: str) -> float:
        """A per-architecture constant; an architecture without one cannot be predicted."""
        key = f"{name}.{arch}"
        if key not in self.constants:
            raise ValueError(f"no {name} for GPU architecture {arch!r}: no case measured or "
                             f"fitted it (data/external/constants.yaml)")
        return self.constants[key].value

    def fit_cases(self) -> set[str]:
        return {c.fit_case for c in self.constants.values() if c.fit_case}


CONSTANTS_FILE = "constants.yaml"


def constants_path() -> Path:
    return data_file("external", CONSTANTS_FILE)


def load_constants(path: str | Path | None = None) -> Constants:
    return load_yaml_model(path or constants_path(), Constants, "twin constants")


def group_rates(gpu: GpuSpec, model: ModelSpec, tp: int, cuda_graphs: bool,
                constants: Constants, arch: str | None = None) -> dict[str, Any]:
    """The twin rates of a TP group of `tp` x `gpu` serving `model` (the `twin` block's
    rate fields); `arch` names whose per-architecture constants apply (default: the GPU's)."""
    arch = arch or gpu.arch
    overhead_s = constants.value("graph_step_overhead_s")
    if not cuda_graphs:
        overhead_s += constants.value("eager_layer_overhead_s") * model.num_layers
    tp_token_s = 0.0
    if tp > 1:
        overhead_s += 2 * model.num_layers * constants.value("allreduce_latency_s")
        link_b_s = ((gpu.nvlink_gb_s / 2 if gpu.nvlink_gb_s else gpu.host_link_gb_s) * 1e9
                    * constants.value("allreduce_link_efficiency"))
        moved_bytes = 2 * (tp - 1) / tp * model.hidden_size * BYTES_PER_ACTIVATION
        tp_token_s = 2 * model.num_layers * moved_bytes / link_b_s
    return {"fp16_tflops": tp * gpu.bf16_dense_tflops, "mem_bw_tb_s": tp * gpu.mem_bw_tb_s,
            "mfu": constants.arch_value("prefill_mfu", arch),
            "decode_efficiency": constants.arch_value("decode_efficiency", arch),
            "step_overhead_s": overhead_s, "tp_token_s": tp_token_s, "step_combine": "max"}


def host_dma_bytes_s(gpu: GpuSpec, tp: int, constants: Constants) -> float:
    """Pinned host->GPU copies of a TP group: each GPU its shard over its own link."""
    return tp * gpu.host_link_gb_s * 1e9 * constants.value("dma_one_way_efficiency")


def derived_rates(spec: ServerSpec, constants: Constants | None = None) -> dict[str, Any]:
    """What `derived_server` fills in, by dotted path of the spec (a table shows them)."""
    hardware = spec.hardware
    if hardware is None:
        return {}
    constants = constants or load_constants()
    gpu, tp = get_gpu(hardware.gpu), spec.live.tensor_parallel_size
    rates = group_rates(gpu, spec.model_spec(), tp, hardware.cuda_graphs, constants,
                        hardware.constants_arch)
    out: dict[str, Any] = {f"twin.{k}": v for k, v in rates.items()}
    dma_b_s = host_dma_bytes_s(gpu, tp, constants)
    for tier_name, tier in spec.tiers.items():
        for i, store in enumerate(tier.stores):
            where = f"tiers.{tier_name}.stores.{i}"
            for field in ("read_bw_bytes_s", "write_bw_bytes_s"):
                if getattr(store, field) is None:
                    if not store.host_memory:
                        raise ValueError(f"{where}.{field}: only a host-memory store's rate "
                                         f"is derived (the host DMA); a {store.kind} store "
                                         f"states its own")
                    out[f"{where}.{field}"] = dma_b_s
            if store.chunk_read_latency_s is None:
                out[f"{where}.chunk_read_latency_s"] = (constants.value("fs_read_latency_s")
                                                        / hardware.disk_reads_in_flight)
    return out


def derived_server(spec: ServerSpec, constants: Constants | None = None) -> ServerSpec:
    """`spec` with its twin rates and its stores' open rates derived from its `hardware`
    (unchanged when it types its own twin)."""
    if spec.hardware is None:
        return spec
    values = derived_rates(spec, constants)
    twin = TwinSpec(**{k.split(".", 1)[1]: v for k, v in values.items()
                       if k.startswith("twin.")})
    raw = spec.model_dump()
    raw["twin"], raw["hardware"] = twin.model_dump(), None  # the rates it became
    for path, value in values.items():
        if not path.startswith("twin."):
            set_dotted(raw, path, value)
    return ServerSpec.model_validate(raw)
