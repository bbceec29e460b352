"""The API server's work on a prompt sent as text, measured: what a long text prompt adds to TTFT.

Why: study A's client sends each turn's whole conversation as text, tens of thousands of
tokens, which vLLM's API server must render, tokenize and check before the engine sees it; the
twin's `front_end_latency_s` is a constant fitted on prompts sent as token ids, so that work is
missing from every simulated TTFT. Two measurements of this machine cover it:

* `text_vs_ids_probe`: on a deployed tier, each prompt is sent as token ids twice (the second
  a prefix-cache hit, so the engine does almost nothing), then as text (words the tiny model's
  word-level tokenizer maps back to the same ids), also a hit. The slope of text minus ids TTFT
  over prompt tokens is the API server's per-token cost of a text prompt with that tokenizer
  (JSON of a long string, tokenizing, detokenizing checks).
* `bpe_tokens_per_s`: a real model's tokenizer is byte-level BPE, dearer per token than the
  tiny model's word lookup; a BPE of `vocab_size` trained here on this machine's Python sources
  is timed on long strings (one thread, as the API server tokenizes one request at a time).

`per_token_s` combines them: the API server's text overhead plus BPE tokenization, per prompt
token, which `TwinRates.front_end_per_token_s` adds to simulated TTFT.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from kvrepro.engines.live.probe import cached_tokens, complete_once, random_prompts, send

PROBE_LENGTHS = (512, 1024, 2048, 4096, 7000)


def text_of(prompt: list[int]) -> str:
    """The tiny model's text for token ids (its vocabulary is the words t<id>)."""
    return " ".join(f"t{i}" for i in prompt)


def send_text(base_url: str, model: str, text: str, timeout_s: float = 120.0
              ) -> tuple[float, int, int]:
    """(seconds until the 1-token answer is back, prompt tokens, cached prompt tokens)."""
    took_s, usage = complete_once(base_url, model, text, timeout_s)
    return took_s, int(usage["prompt_tokens"]), cached_tokens(usage)


def text_vs_ids_probe(base_url: str, model: str, lengths: tuple[int, ...] = PROBE_LENGTHS,
                      rounds: int = 5, seed: int = 0) -> pd.DataFrame:
    """Per prompt length and round: hit TTFT sent as ids and as text (see the module doc).

    Columns `prompt_tokens, round, ids_s, text_s, text_prompt_tokens, text_cached_tokens`;
    a text prompt that does not map to the same ids (prompt tokens differ) is an error."""
    rows = []
    for n in lengths:
        for k, prompt in enumerate(random_prompts(rounds, n, seed + n)):
            send(base_url, model, prompt)  # cold: computes and caches it
            ids_s, _ = send(base_url, model, prompt)
            text_s, tokens, cached = send_text(base_url, model, text_of(prompt))
            if tokens != n:
                raise ValueError(f"text prompt of {n} ids came back as {tokens} tokens: the "
                                 f"server's tokenizer is not the tiny model's word level")
            rows.append({"prompt_tokens": n, "round": k, "ids_s": ids_s, "text_s": text_s,
                         "text_prompt_tokens": tokens, "text_cached_tokens": cached})
    return pd.DataFrame(rows)


def text_overhead_per_token_s(probe: pd.DataFrame) -> tuple[float, float]:
    """(intercept s, slope s per token) of median text - ids TTFT over prompt length."""
    med = probe.assign(extra_s=probe.text_s - probe.ids_s).groupby("prompt_tokens")[
        "extra_s"].median()
    slope, intercept = np.polyfit(med.index.to_numpy(float), med.to_numpy(float), 1)
    return float(intercept), float(slope)


def _corpus(max_bytes: int) -> str:
    """Text to train a BPE on: this interpreter's standard-library sources."""
    root, parts, size = Path(sys.prefix) / "lib", [], 0
    for path in sorted(root.glob("python3*/*.py")):
        text = path.read_text(errors="ignore")
        parts.append(text)
        size += len(text)
        if size >= max_bytes:
            break
    if not parts:  # a venv's prefix: fall back to the base interpreter's
        root = Path(sys.base_prefix) / "lib"
        parts = [p.read_text(errors="ignore") for p in sorted(root.glob("python3*/*.py"))[:400]]
    return "".join(parts)[:max_bytes]


def bpe_tokens_per_s(vocab_size: int = 65_536, prompt_tokens: int = 50_000,
                     repeats: int = 5, corpus_bytes: int = 20_000_000) -> dict[str, float]:
    """Tokens per second of a byte-level BPE (`tokenizers`) on one thread, on prompts of
    about `prompt_tokens` (median of `repeats`)."""
    import os

    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    text = _corpus(corpus_bytes)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False)
    lines = text.splitlines()
    bpe.train_from_iterator(lines, trainer=trainer)
    chars_per_token = len(text[:1_000_000]) / len(bpe.encode(text[:1_000_000]).ids)
    prompt = text[:int(prompt_tokens * chars_per_token)]
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        n = len(bpe.encode(prompt).ids)
        times.append(time.perf_counter() - started)
    return {"vocab_size": float(bpe.get_vocab_size()), "prompt_tokens": float(n),
            "seconds_median": float(np.median(times)),
            "tokens_per_s": float(n / np.median(times)), "chars_per_token": chars_per_token}


def per_token_s(text_slope_s: float, bpe_rate_tokens_s: float) -> float:
    """The API server's cost per prompt token of a text prompt with a BPE tokenizer."""
    return text_slope_s + 1.0 / bpe_rate_tokens_s


def measure(out_dir: str | Path, server_spec: str | Path = "data/servers/cpu_tiny.yaml",
            tier: str = "small-kv", port: int = 8447) -> dict[str, float]:
    """Deploy `tier`, run both measurements, write `probe.csv` and `front_end.json` to
    `out_dir` (which must be new or empty) and return the summary."""
    from kvrepro.engines.live.server import VllmServer
    from kvrepro.engines.live.tiers import live_tier
    from kvrepro.tier_spec import load_server, override_server

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty: measurements are never mixed")
    (out / "server").mkdir(parents=True, exist_ok=True)
    config = live_tier(override_server(load_server(server_spec), {"live.port": port}), tier)
    with VllmServer(config, out / "server") as server:
        server.wait_healthy()
        probe = text_vs_ids_probe(server.base_url, config.served_model_name or config.model)
    probe.to_csv(out / "probe.csv", index=False)
    intercept_s, slope_s = text_overhead_per_token_s(probe)
    bpe = bpe_tokens_per_s()
    summary = {"text_intercept_s": intercept_s, "text_slope_s_per_token": slope_s,
               "bpe_tokens_per_s": bpe["tokens_per_s"], "bpe_vocab_size": bpe["vocab_size"],
               "bpe_prompt_tokens": bpe["prompt_tokens"],
               "front_end_per_token_s": per_token_s(slope_s, bpe["tokens_per_s"])}
    (out / "front_end.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv: list[str] | None = None) -> None:
    """`python -m kvrepro.engines.live.front_end OUT_DIR`: measure and print."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m kvrepro.engines.live.front_end OUT_DIR")
    for key, value in measure(args[0]).items():
        print(f"{key}: {value:.6g}")


__all__ = ["PROBE_LENGTHS", "bpe_tokens_per_s", "per_token_s", "send_text", "text_of",
           "measure", "text_overhead_per_token_s", "text_vs_ids_probe"]


if __name__ == "__main__":
    main()
