"""The tiny Llama is written locally (no download) and has the KV size the tiers assume."""

import json

from kvrepro.engines.tiny_model import TinyModelSpec, ensure_tiny_model
from kvrepro.model_spec import from_hf_config
from tests.engines.live.conftest import require_vllm


def test_tiny_model_files_and_kv_size(tmp_path) -> None:
    require_vllm()  # torch + transformers come with the live install
    spec = TinyModelSpec(vocab_size=1000, max_position_embeddings=4096)
    folder = ensure_tiny_model(spec, tmp_path)
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    assert from_hf_config(folder).kv_bytes_per_token == spec.kv_bytes_per_token == 1024
    assert json.loads((folder / "config.json").read_text())["vocab_size"] == 1000
    mtime = (folder / "model.safetensors").stat().st_mtime
    assert ensure_tiny_model(spec, tmp_path) == folder  # cached, not rewritten
    assert (folder / "model.safetensors").stat().st_mtime == mtime
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.convert_ids_to_tokens([3, 999]) == ["t3", "t999"]
