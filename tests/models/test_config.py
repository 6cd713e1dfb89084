import math

import pytest

from models.config import MissingConfigKeyError, UnsupportedArchitectureError, config_from_metadata
from models.errors import UserError
from models.gguf import open_gguf


def test_smollm2_config(smollm2):
    cfg = config_from_metadata(open_gguf(smollm2).metadata)
    assert (cfg.arch, cfg.n_layers, cfg.n_embd, cfg.n_ff) == ("llama", 30, 576, 1536)
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.n_vocab) == (9, 3, 64, 49152)
    assert cfg.rope_style == "normal" and cfg.rope_base == 100000.0 and cfg.activation == "silu"
    assert not (cfg.qkv_bias or cfg.qk_norm or cfg.sandwich_norm) and cfg.embed_scale == 1.0
    assert [cfg.layer_window(i) for i in range(cfg.n_layers)] == [0] * 30
    assert cfg.softmax_scale == pytest.approx(1 / 8)


def test_gemma3_config(gemma3):
    cfg = config_from_metadata(open_gguf(gemma3).metadata)
    assert (cfg.arch, cfg.n_layers, cfg.n_embd, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == ("gemma3", 18, 640, 4, 1, 256)
    assert cfg.n_vocab == 262144  # no gemma3.vocab_size key: counted from the token list
    assert cfg.rope_style == "neox" and cfg.activation == "gelu" and cfg.qk_norm and cfg.sandwich_norm
    assert cfg.embed_scale == pytest.approx(math.sqrt(640))
    # five local layers with the 10k rope base, then one global layer with the file's base
    assert [cfg.layer_window(i) for i in range(12)] == [512] * 5 + [0] + [512] * 5 + [0]
    assert [cfg.layer_rope_base(i) for i in (0, 4, 5, 17)] == [10000.0, 10000.0, 1e6, 1e6]
    assert cfg.softmax_scale == pytest.approx(1 / 16)


def test_missing_key_is_named(smollm2):
    meta = dict(open_gguf(smollm2).metadata)
    del meta["llama.attention.head_count"]
    with pytest.raises(MissingConfigKeyError, match="llama.attention.head_count") as e:
        config_from_metadata(meta)
    assert isinstance(e.value, UserError) and "llama.attention.head_count" in str(e.value)


def test_unknown_architecture_is_named(smollm2):
    meta = dict(open_gguf(smollm2).metadata, **{"general.architecture": "mamba"})
    with pytest.raises(UnsupportedArchitectureError, match="'mamba' is not supported"):
        config_from_metadata(meta)
