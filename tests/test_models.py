import json

import pytest
from pydantic import ValidationError

from kvrepro import model_spec as models


@pytest.mark.parametrize("name, expected", [
    ("MiniMax-M2.7-FP8", 126_976),      # 2 x 62 x 8 x 128 x 1 (study A)
    ("Qwen3-14B-BF16", 163_840),        # 2 x 40 x 8 x 128 x 2 (study B)
    ("Llama-3.1-8B-BF16", 131_072),     # 2 x 32 x 8 x 128 x 2
    ("Llama-3.1-70B-BF16", 327_680),    # 2 x 80 x 8 x 128 x 2
    ("DeepSeek-V3-BF16KV", 70_272),     # 61 x (512 + 64) x 2, MLA latent
])
def test_kv_bytes_per_token(name: str, expected: int) -> None:
    assert models.kv_bytes_per_token(name) == expected


def test_every_catalog_entry_loads() -> None:
    catalog = models.catalog()
    assert len(catalog) >= 5
    for spec in catalog.values():
        assert spec.kv_bytes_per_token > 0
        assert spec.params_active_b <= spec.params_total_b


def test_unknown_model_names_parameter() -> None:
    with pytest.raises(ValueError, match=r"unknown model 'GPT-9'.*parameter 'model'"):
        models.get_model("GPT-9")


def test_misspelled_field_is_an_error() -> None:
    fields = models.get_model("Qwen3-14B-BF16").model_dump()
    fields["num_layer"] = fields.pop("num_layers")
    with pytest.raises(ValidationError, match="num_layer"):
        models.ModelSpec(**fields)


def _write(tmp_path, cfg: dict) -> object:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg, indent=2))
    return path


QWEN3_14B_CONFIG = {"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 40,
                    "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
                    "hidden_size": 5120, "intermediate_size": 17408, "vocab_size": 151936,
                    "torch_dtype": "bfloat16"}


def test_from_hf_config_matches_catalog(tmp_path) -> None:
    spec = models.from_hf_config(_write(tmp_path, QWEN3_14B_CONFIG))
    assert spec.kv_bytes_per_token == models.kv_bytes_per_token("Qwen3-14B-BF16")
    assert 13 < spec.params_total_b < 16   # estimated from the layer shapes (14.8 B published)
    fp8 = models.from_hf_config(tmp_path, kv_dtype="fp8")
    assert fp8.kv_bytes_per_token == 163_840 // 2


def test_from_hf_config_mla(tmp_path) -> None:
    cfg = {"num_hidden_layers": 61, "num_attention_heads": 128, "hidden_size": 7168,
           "kv_lora_rank": 512, "qk_rope_head_dim": 64, "torch_dtype": "bfloat16"}
    assert models.from_hf_config(_write(tmp_path, cfg)).kv_bytes_per_token == 70_272


def test_malformed_config_names_file_and_line(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{\n  "num_hidden_layers": 40,\n  "hidden_size": ,\n}')
    with pytest.raises(ValueError, match=r"config\.json: malformed JSON at line 3"):
        models.from_hf_config(path)


def test_config_missing_key_is_named(tmp_path) -> None:
    cfg = dict(QWEN3_14B_CONFIG)
    del cfg["num_hidden_layers"]
    with pytest.raises(ValueError, match="'num_hidden_layers'"):
        models.from_hf_config(_write(tmp_path, cfg))


def test_config_unknown_dtype(tmp_path) -> None:
    with pytest.raises(ValueError, match="kv_dtype"):
        models.from_hf_config(_write(tmp_path, QWEN3_14B_CONFIG), kv_dtype="fp5")
