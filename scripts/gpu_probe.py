"""Measure one GPU the way the twin models it: prefill by prompt length, decode step by batch
and context, pinned host<->device copy rates by block size, and the GEMM / HBM peaks.

Runs on a machine with PyTorch and a CUDA GPU, nothing downloaded: the model is
Llama-3.1-8B-shaped (its config.json numbers, below), random BF16 weights, written here in
plain PyTorch (RMSNorm, RoPE, GQA attention through `scaled_dot_product_attention`, SwiGLU MLP)
so that the work per token is the real model's whatever the transformers version. Decode steps
are timed eager and as a replayed CUDA graph (vLLM captures decode batches in graphs).

    python scripts/gpu_probe.py --out results.json [--budget-s 420]

Every section writes the file again (atomically), so a run cut short keeps what it measured.
`kvrepro predict` reads the result through data/external/measured_h200.yaml.
"""

# ruff: noqa: B023, B905 - each closure is called within the loop iteration that defines it

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time

import torch
import torch.nn.functional as F

LLAMA_31_8B = {  # meta-llama/Llama-3.1-8B config.json
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 128256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
}
MB = 1 << 20


class Budget:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def save(path: str, results: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1)
    os.replace(tmp, path)


def cuda_time_s(fn, repeat: int, warmup: int = 2) -> list[float]:
    """Wall times of `fn` measured with CUDA events, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    return times


def median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else 0.5 * (s[len(s) // 2 - 1] + s[len(s) // 2])


# ------------------------------------------------------------------ the model

class Model:
    """Llama-shaped decoder, random BF16 weights, one fused QKV and gate-up matmul per layer
    (as vLLM runs it)."""

    def __init__(self, cfg: dict, device: str = "cuda"):
        self.cfg = cfg
        h, i = cfg["hidden_size"], cfg["intermediate_size"]
        nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.nh, self.nkv, self.hd = nh, nkv, hd
        dt = torch.bfloat16

        def w(*shape):
            return (torch.randn(*shape, device=device, dtype=dt) * 0.02)
        self.embed = w(cfg["vocab_size"], h)
        self.layers = [{"qkv": w((nh + 2 * nkv) * hd, h), "o": w(h, nh * hd),
                        "gate_up": w(2 * i, h), "down": w(h, i),
                        "n1": torch.ones(h, device=device, dtype=dt),
                        "n2": torch.ones(h, device=device, dtype=dt)}
                       for _ in range(cfg["num_hidden_layers"])]
        self.norm = torch.ones(h, device=device, dtype=dt)
        self.lm_head = w(cfg["vocab_size"], h)
        inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, device=device).float() / hd))
        self.inv_freq = inv
        self.gqa_native = True

    def param_bytes(self) -> int:
        n = self.embed.numel() + self.lm_head.numel() + self.norm.numel()
        n += sum(t.numel() for layer in self.layers for t in layer.values())
        return 2 * n

    def rope(self, x, pos):
        freqs = torch.outer(pos.float(), self.inv_freq)[:, None, :]  # (T, 1, hd/2)
        cos, sin = freqs.cos().to(x.dtype), freqs.sin().to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

    def rms(self, x, w):
        if hasattr(F, "rms_norm"):
            return F.rms_norm(x, (x.shape[-1],), w, self.cfg["rms_norm_eps"])
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.cfg["rms_norm_eps"])).to(x.dtype) * w

    def attend(self, q, k, v, causal: bool):
        if self.gqa_native:
            try:
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
            except TypeError:
                self.gqa_native = False
        rep = self.nh // self.nkv
        return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1),
                                              v.repeat_interleave(rep, 1), is_causal=causal)

    def layer(self, x, L, pos, kv=None):
        """x: (B, T, h). kv None: prefill (causal over T); else (k_cache, v_cache) of shape
        (B, nkv, C, hd) that the T=1 query attends to (its last slot takes the new token)."""
        B, T, _ = x.shape
        y = self.rms(x, L["n1"]) @ L["qkv"].t()
        q, k, v = y.split([self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], -1)
        q = self.rope(q.view(B, T, self.nh, self.hd), pos).transpose(1, 2)
        k = self.rope(k.view(B, T, self.nkv, self.hd), pos).transpose(1, 2)
        v = v.view(B, T, self.nkv, self.hd).transpose(1, 2)
        if kv is None:
            a = self.attend(q, k, v, causal=True)
        else:
            kc, vc = kv
            kc[:, :, -1:].copy_(k)
            vc[:, :, -1:].copy_(v)
            a = self.attend(q, kc, vc, causal=False)
        x = x + a.transpose(1, 2).reshape(B, T, -1) @ L["o"].t()
        gu = self.rms(x, L["n2"]) @ L["gate_up"].t()
        g, u = gu.chunk(2, -1)
        return x + (F.silu(g) * u) @ L["down"].t()

    def forward(self, ids, pos, kvs=None):
        x = self.embed[ids]
        for j, L in enumerate(self.layers):
            x = self.layer(x, L, pos, None if kvs is None else kvs[j])
        return self.rms(x[:, -1:], self.norm) @ self.lm_head.t()


# ------------------------------------------------------------------ sections

def env_info() -> dict:
    p = torch.cuda.get_device_properties(0)
    info = {"gpu": p.name, "gpu_mem_bytes": p.total_memory, "sm_count": p.multi_processor_count,
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "cpu_count": os.cpu_count()}
    try:
        import transformers
        info["transformers"] = transformers.__version__
    except Exception as e:  # noqa: BLE001 - recorded, not needed
        info["transformers"] = f"unavailable: {e}"
    for key, cmd in {"nvidia_smi": ["nvidia-smi", "--query-gpu=name,pcie.link.gen.current,"
                                    "pcie.link.gen.max,pcie.link.width.current,clocks.max.sm,"
                                    "clocks.max.mem,power.limit,driver_version",
                                    "--format=csv"],
                     "cpu_model": ["bash", "-c", "lscpu | grep -E 'Model name|Socket|NUMA node\\('"]
                     }.items():
        try:
            info[key] = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout
        except Exception as e:  # noqa: BLE001
            info[key] = f"failed: {e}"
    return info


def peaks() -> dict:
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    t = median(cuda_time_s(lambda: a @ b, 10, 3))
    out = {"gemm_bf16_8192_tflops": 2 * n ** 3 / t / 1e12}
    try:
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()
        one = torch.tensor(1.0, device="cuda")
        t8 = median(cuda_time_s(lambda: torch._scaled_mm(a8, b8, one, one,
                                                         out_dtype=torch.bfloat16), 10, 3))
        out["gemm_fp8_8192_tflops"] = 2 * n ** 3 / t8 / 1e12
    except Exception as e:  # noqa: BLE001
        out["gemm_fp8_error"] = str(e)[:200]
    src = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    tc = median(cuda_time_s(lambda: dst.copy_(src), 10, 2))
    out["hbm_copy_tb_s"] = 2 * src.numel() / tc / 1e12  # read + write
    a = b = src = dst = None  # free the GPU memory before the next section
    torch.cuda.empty_cache()
    return out


def prefill(model: Model, budget: Budget) -> list[dict]:
    rows = []
    for n in (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536):
        if budget.left() < 60:
            break
        ids = torch.randint(0, model.cfg["vocab_size"], (1, n), device="cuda")
        pos = torch.arange(n, device="cuda")
        with torch.inference_mode():
            times = cuda_time_s(lambda: model.forward(ids, pos), 5 if n <= 8192 else 3, 1)
        rows.append({"prompt_tokens": n, "prefill_s": median(times), "runs_s": times})
        torch.cuda.empty_cache()
    return rows


def decode(model: Model, budget: Budget) -> list[dict]:
    rows = []
    cfg = model.cfg
    per_token = 2 * cfg["num_hidden_layers"] * model.nkv * model.hd * 2
    for batch in (1, 8, 32, 64, 128, 256):
        for ctx in (1024, 4096, 16384, 65536):
            if batch * ctx * per_token > 60e9 or budget.left() < 45:
                continue
            kvs = [(torch.randn(batch, model.nkv, ctx, model.hd, device="cuda",
                                dtype=torch.bfloat16),
                    torch.randn(batch, model.nkv, ctx, model.hd, device="cuda",
                                dtype=torch.bfloat16)) for _ in range(cfg["num_hidden_layers"])]
            ids = torch.randint(0, cfg["vocab_size"], (batch, 1), device="cuda")
            pos = torch.tensor([ctx - 1], device="cuda")
            row = {"batch": batch, "context_tokens": ctx}
            with torch.inference_mode():
                row["eager_step_s"] = median(cuda_time_s(lambda: model.forward(ids, pos, kvs), 10))
                try:
                    s = torch.cuda.Stream()
                    s.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(s):
                        for _ in range(2):
                            model.forward(ids, pos, kvs)
                    torch.cuda.current_stream().wait_stream(s)
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        model.forward(ids, pos, kvs)
                    row["graph_step_s"] = median(cuda_time_s(g.replay, 20, 3))
                    del g
                except Exception as e:  # noqa: BLE001
                    row["graph_error"] = str(e)[:200]
            rows.append(row)
            kvs = None  # free the cache before the next shape
            torch.cuda.empty_cache()
    return rows


def copies(budget: Budget) -> list[dict]:
    """Host<->device rates of pinned memory, one cudaMemcpyAsync per block (as vLLM's
    offloading connector issues them), 1 GiB moved per point; and both ways at once."""
    rows = []
    total = 1 << 30
    host = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(total, dtype=torch.uint8, device="cuda")
    host2 = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    dev2 = torch.empty(total, dtype=torch.uint8, device="cuda")
    for block_mb in (0.5, 1, 2, 4, 8, 16):
        if budget.left() < 20:
            break
        size = int(block_mb * MB)
        n = total // size
        hv = [host[i * size:(i + 1) * size] for i in range(n)]
        dv = [dev[i * size:(i + 1) * size] for i in range(n)]
        hv2 = [host2[i * size:(i + 1) * size] for i in range(n)]
        dv2 = [dev2[i * size:(i + 1) * size] for i in range(n)]

        def h2d():
            for d, h in zip(dv, hv):
                d.copy_(h, non_blocking=True)

        def d2h():
            for d, h in zip(dv, hv):
                h.copy_(d, non_blocking=True)
        s2 = torch.cuda.Stream()

        def both():
            s2.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s2):
                for d, h in zip(dv2, hv2):
                    h.copy_(d, non_blocking=True)
            h2d()
            torch.cuda.current_stream().wait_stream(s2)
        row = {"block_bytes": size}
        for name, fn, moved in (("h2d", h2d, total), ("d2h", d2h, total),
                                ("both", both, 2 * total)):
            row[f"{name}_gb_s"] = moved / median(cuda_time_s(fn, 5)) / 1e9
            if name == "both":
                continue
            try:  # the same copies replayed from a CUDA graph: no Python per block
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    fn()
                row[f"{name}_graph_gb_s"] = moved / median(cuda_time_s(g.replay, 5)) / 1e9
                del g
            except Exception as e:  # noqa: BLE001
                row[f"{name}_graph_error"] = str(e)[:200]
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=420)
    args = ap.parse_args()
    budget = Budget(args.budget_s)
    results: dict = {"config": LLAMA_31_8B, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                     time.gmtime())}
    results["env"] = env_info()
    save(args.out, results)
    torch.manual_seed(0)
    for name, fn in (("peaks", peaks), ("copies", lambda: copies(budget))):
        t0 = time.monotonic()
        try:
            results[name] = fn()
        except Exception as e:  # noqa: BLE001 - keep what the other sections measure
            results[f"{name}_error"] = repr(e)[:400]
        results[f"{name}_wall_s"] = time.monotonic() - t0
        save(args.out, results)
    model = Model(LLAMA_31_8B)
    results["model_param_bytes"] = model.param_bytes()
    results["gqa_native"] = model.gqa_native
    for name, fn in (("prefill", prefill), ("decode", decode)):
        t0 = time.monotonic()
        try:
            results[name] = fn(model, budget)
        except Exception as e:  # noqa: BLE001
            results[f"{name}_error"] = repr(e)[:400]
        results[f"{name}_wall_s"] = time.monotonic() - t0
        results["gqa_native"] = model.gqa_native
        save(args.out, results)
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    save(args.out, results)
    print(json.dumps({k: v for k, v in results.items() if k not in ("prefill", "decode")},
                     indent=1))
    for r in results.get("prefill", []):
        print("prefill", r["prompt_tokens"], round(r["prefill_s"] * 1e3, 2), "ms")
    for r in results.get("decode", []):
        print("decode", r)


if __name__ == "__main__":
    main()
