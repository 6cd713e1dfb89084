"""gpt-oss on the CPU: config, info, the GPU refusing its MXFP4 experts, and teacher-forced logits against llama.cpp over prompts
shorter and longer than its 128-token window.

The file is random (tests/inference/synthetic.py, OSS_*): 2 layers (layer 0 local, layer 1 global), biases
everywhere, sinks that take a real share of each softmax, MXFP4 experts and F32 layer matrices, so llama.cpp
computes the rest in float32 as we do. Its experts' x goes in 8-bit blocks on both sides (cpu_mxfp4), and its
KV cache is asked for in F32: its default F16 cache rounds K and V, noise a random network amplifies into flipped
expert choices (with it the long prompt kept min corr 0.99 but one decided miss; F32: min 0.9998, none).
"""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from app.cli import main
from models.config import BadConfigValueError, config_from_metadata
from models.gguf import open_gguf
from tests.inference.parity import PROMPTS, oracle_logits, parity
from tests.inference.synthetic import (EXPERTS, F16_LAYERS, OSS_WINDOW, OSS_YARN_FACTOR, OSS_YARN_ORIG_CTX,
                                       write_synthetic)

F32_LAYERS = dict.fromkeys(F16_LAYERS, T.F32)
LLAMA_F32_CACHE = dict(type_k=0, type_v=0)  # ggml type 0: F32
LONG = 320  # positions of the long prompt: more than twice the window


@pytest.fixture(scope="module")
def oss_file(tmp_path_factory, smollm2):
    path = tmp_path_factory.mktemp("gpt-oss") / "gpt-oss-f32.gguf"
    write_synthetic(path, "gpt-oss", vocab_from=smollm2, types=F32_LAYERS)
    return path


@pytest.fixture(scope="module")
def engine(oss_file):
    from inference import load
    return load(oss_file, device="cpu", ctx=512)


def test_config_reads_the_window_sinks_and_yarn(oss_file):
    meta = open_gguf(oss_file).metadata
    cfg = config_from_metadata(meta)
    assert (cfg.arch, cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp) == ("gpt-oss", *EXPERTS, 128)
    assert [cfg.layer_window(i) for i in range(cfg.n_layers)] == [OSS_WINDOW, 0]  # even layers local
    assert cfg.attn_sinks and cfg.qkv_bias
    assert cfg.activation == "swiglu_oai" and cfg.rope_style == "neox"
    assert cfg.rope_yarn_orig_ctx == OSS_YARN_ORIG_CTX and cfg.rope_scale == 1 / OSS_YARN_FACTOR
    assert [cfg.layer_rope_scale(i) for i in range(2)] == [1 / OSS_YARN_FACTOR] * 2  # YaRN on every layer
    assert cfg.rope_mscale == pytest.approx(1 + 0.1 * np.log(OSS_YARN_FACTOR))
    cfg4 = config_from_metadata(dict(meta) | {"gpt-oss.block_count": 4, "gpt-oss.attention.sliding_window_pattern": 4})
    assert [cfg4.is_local(i) for i in range(4)] == [True, True, True, False]
    with pytest.raises(BadConfigValueError, match="sliding_window_pattern"):
        config_from_metadata(dict(meta) | {"gpt-oss.attention.sliding_window_pattern": [True, False]})


def test_info_lists_mxfp4(oss_file, capsys):
    assert main(["info", str(oss_file)]) == 0
    out = capsys.readouterr().out
    assert "gpt-oss" in out and "MXFP4" in out, out


def test_logits_match_llama_cpp(engine, oss_file):
    """Three prompts of 64 tokens and one of LONG (the window ends inside it twice over): mean corr >= 0.999, min
    >= 0.99, no top-1 miss where llama.cpp leads by more than 0.5."""
    theirs = oracle_logits(oss_file, **LLAMA_F32_CACHE)
    theirs += oracle_logits(oss_file, [" ".join(PROMPTS)], LONG, **LLAMA_F32_CACHE)
    ours = [engine.logits(ids) for ids, _ in theirs]
    m = parity(ours, [t for _, t in theirs])
    assert m["corr_mean"] >= 0.999 and m["corr_min"] >= 0.99 and m["decided_mismatches"] == 0, m
    long = parity([ours[-1][2 * OSS_WINDOW:]], [theirs[-1][1][2 * OSS_WINDOW:]])  # twice the window on alone
    assert long["corr_min"] >= 0.99 and long["decided_mismatches"] == 0, long
    # the comparison can fail: the logits depend on the input
    assert np.corrcoef(ours[0][-1], ours[1][-1])[0, 1] < 0.9
