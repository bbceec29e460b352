"""A tiny Llama model made locally, for serving on the CPU build of vLLM without any download.

Machines without a GPU cannot serve the studies' models, but everything except the GPU-only
offload connectors (prefix caching, eviction under a small KV budget, cached-token accounting,
/metrics) can be exercised for real on a 2-layer model with random weights. The package writes
config, tokenizer and weights into a cache folder; nothing is fetched from a model hub.

Sizing: 2 layers, hidden 256, 4 heads (2 KV heads, head dim 64), vocab 32,000. A 16K-token
prompt prefills in about a second on 2 cores; KV per token is 2 x 2 x 2 x 64 x 2 B = 1 KiB in
BF16, so a few MiB of KV budget hold a few thousand tokens and eviction happens at miniature
scale. Needs torch and transformers (the `live-cpu` install), imported only here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_CACHE = Path(os.environ.get("KVREPRO_CACHE", Path.home() / ".cache" / "kvrepro"))


class TinyModelSpec(BaseModel):
    """Shape of the tiny Llama; the defaults are what the tests and notebooks serve."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vocab_size: int = Field(32_000, gt=64, description="token ids 0..vocab_size-1")
    hidden_size: int = Field(256, gt=0)
    intermediate_size: int = Field(512, gt=0)
    num_hidden_layers: int = Field(2, gt=0)
    num_attention_heads: int = Field(4, gt=0)
    num_key_value_heads: int = Field(2, gt=0)
    max_position_embeddings: int = Field(65_536, gt=0)
    seed: int = Field(0, ge=0, description="seed of the random weights")

    @property
    def name(self) -> str:
        """Folder name that changes whenever the shape changes."""
        return (f"tiny-llama-v{self.vocab_size}-h{self.hidden_size}-l{self.num_hidden_layers}"
                f"-kv{self.num_key_value_heads}-p{self.max_position_embeddings}-s{self.seed}")

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes per token in BF16."""
        head_dim = self.hidden_size // self.num_attention_heads
        return 2 * self.num_hidden_layers * self.num_key_value_heads * head_dim * 2


def _write_tokenizer(folder: Path, vocab_size: int) -> None:
    """A word-level tokenizer whose vocabulary is just `t<i>`: ids are what matters here."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    vocab.update({f"t{i}": i for i in range(len(specials), vocab_size)})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>")
    fast.save_pretrained(folder)


def tiny_model_dir(spec: TinyModelSpec | None = None, cache_dir: str | Path | None = None,
                   ) -> Path:
    """Where `ensure_tiny_model` writes (or has written) the tiny model."""
    return Path(cache_dir or DEFAULT_CACHE) / (spec or TinyModelSpec()).name


def ensure_tiny_model(spec: TinyModelSpec | None = None, cache_dir: str | Path | None = None,
                      ) -> Path:
    """Return the folder of the tiny model, writing it first if it is not there yet."""
    spec = spec or TinyModelSpec()
    folder = tiny_model_dir(spec, cache_dir)
    if (folder / "kvrepro-tiny.json").is_file():
        return folder
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(spec.seed)  # torch's generator is the only one here; seeded per call
    config = LlamaConfig(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings, bos_token_id=1, eos_token_id=2,
        torch_dtype="bfloat16", tie_word_embeddings=True)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    _write_tokenizer(folder, spec.vocab_size)
    (folder / "kvrepro-tiny.json").write_text(json.dumps(spec.model_dump(), indent=2))
    return folder
