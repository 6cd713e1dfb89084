"""Qwen3.5 / 3.6 (qwen35, qwen35moe: Gated DeltaNet layers between gated full-attention ones) on the CPU: config,
logits against llama.cpp, the recurrent state carried between calls, and checkpoints of it reused.

The files are random (tests/inference/synthetic.py), with value heads twice the key heads (so pairing value head h
with key head h // 2 instead of h % 2 changes the output) and F32 layer matrices, so llama.cpp computes in float32
as we do (see test_moe.py for why).
"""
import re

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from app.cli import main
from models.config import BadConfigValueError, config_from_metadata
from models.gguf import open_gguf
from tests.inference.parity import PROMPTS, assert_parity, oracle_logits, parity
from tests.inference.synthetic import DELTANET, F16_LAYERS, SHARED_EXPERT_FF, write_synthetic

F32_LAYERS = dict.fromkeys(F16_LAYERS, T.F32)
ARCHS = ["qwen35", "qwen35moe"]


@pytest.fixture(scope="module", params=ARCHS)
def hybrid_f32(request, tmp_path_factory, smollm2):
    path = tmp_path_factory.mktemp("hybrid") / f"{request.param}-f32.gguf"
    write_synthetic(path, request.param, vocab_from=smollm2, types=F32_LAYERS)
    return path


@pytest.fixture(scope="module")
def engine(hybrid_f32):
    from inference import load
    return load(hybrid_f32, device="cpu", ctx=512)


def test_config_reads_the_layer_kinds_and_deltanet_shape(hybrid_f32):
    meta = open_gguf(hybrid_f32).metadata
    cfg = config_from_metadata(meta)
    assert cfg.recurrent == (True, True, False, True, True, False)  # full_attention_interval 3
    assert cfg.attention_layers == [2, 5]
    assert (cfg.ssm_k_heads, cfg.ssm_v_heads, cfg.ssm_state, cfg.ssm_conv_kernel) == (
        DELTANET["k_heads"], DELTANET["v_heads"], DELTANET["state"], DELTANET["conv"])
    assert cfg.attn_output_gate and cfg.rope_dim == 16 and cfg.head_dim == 64
    assert cfg.n_ff_shexp == (SHARED_EXPERT_FF if cfg.arch == "qwen35moe" else 0)
    assert cfg.text_rope_divisors() == [1.0] * 8  # sections (3, 3, 2, 0): every pair turns with the position
    arch = cfg.arch
    with pytest.raises(BadConfigValueError, match="DeltaNet shape is inconsistent"):
        config_from_metadata(dict(meta) | {f"{arch}.ssm.inner_size": 100})
    # an explicit per-layer list wins over the interval, and the MTP block counted in block_count is not a layer
    cfg = config_from_metadata(dict(meta) | {f"{arch}.attention.recurrent_layers": [True] * 5 + [False, False],
                                             f"{arch}.block_count": 7, f"{arch}.nextn_predict_layers": 1})
    assert (cfg.n_layers, cfg.recurrent, cfg.n_nextn_layers) == (6, (True,) * 5 + (False,), 1)


def test_imrope_sections_that_leave_pairs_unturned():
    """llama.cpp gives a pair whose sector falls outside the t, h, w sections the 4th position, 0 for text."""
    from dataclasses import replace
    cfg = config_from_metadata(open_gguf_meta_stub())
    cfg = replace(cfg, rope_dim=16, rope_sections=(4, 4, 0, 0))  # sectors 2 and 5 belong to w, which has none
    assert [d == 1.0 for d in cfg.text_rope_divisors()] == [True, True, False, True, True, False, True, True]


def open_gguf_meta_stub() -> dict:
    return {"general.architecture": "llama", "llama.embedding_length": 64, "llama.feed_forward_length": 128,
            "llama.attention.head_count": 4, "llama.block_count": 1, "llama.context_length": 64,
            "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.vocab_size": 10}


def test_info_shows_the_layer_kinds(hybrid_f32, capsys):
    assert main(["info", str(hybrid_f32)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^layers +6 \(4 Gated DeltaNet, 2 attention\)$", out, re.M), out


def test_logits_match_llama_cpp(engine, hybrid_f32):
    theirs = oracle_logits(hybrid_f32)
    ours = [engine.logits(ids) for ids, _ in theirs]
    m = parity(ours, [t for _, t in theirs])
    assert m["corr_mean"] >= 0.999 and m["corr_min"] >= 0.99, m
    assert_parity(m)
    # the comparison can fail: the logits depend on the input
    a, b = ours[0][-1], ours[1][-1]
    assert np.corrcoef(a, b)[0, 1] < 0.9


def test_state_carries_on_between_calls(engine):
    """A prompt processed in pieces (a chunked prefill, then single tokens as in decoding, then a chunk again)
    gives the logits of one pass over all of it: the conv and delta states go on from where the last call left."""
    ids = engine.tokenizer.encode(PROMPTS[2])[:60]
    fresh = engine.logits(ids)
    engine._cached = []
    pieces = [engine._prefill(ids[:30], all_logits=True)]
    for j in range(30, 34):
        pieces.append(engine._prefill(ids[:j + 1], all_logits=True))
    pieces.append(engine._prefill(ids, all_logits=True))
    m = parity([np.concatenate(pieces)], [fresh])
    assert m["corr_min"] >= 0.9999 and m["decided_mismatches"] == 0, m


def test_regenerate_and_edit_resume_from_checkpoints(engine, hybrid_f32):
    """Three turns of a conversation, then: regenerating the last reply processes no prompt token and gives the
    reply a fresh engine gives; an edited last message processes only the tokens after the checkpoint at the end
    of the second reply, with the logits of a fresh run."""
    from inference import load
    tok = engine.tokenizer
    engine.logits([1])  # start from an empty context
    ids = []
    for turn in range(3):
        ids = ids + tok.encode(PROMPTS[turn])[:40]
        reply = list(_greedy(engine, ids, 6))
        prompt_end = len(ids)
        if turn < 2:
            ids = ids + reply
    second_reply_end = prompt_end - 40  # the third prompt began after the second reply
    again = list(_greedy(engine, ids, 6))
    assert engine._prefill_start == len(ids)  # nothing processed: the prompt's end is a checkpoint
    fresh = load(hybrid_f32, device="cpu", ctx=512)
    assert again == reply == list(_greedy(fresh, ids, 6))

    edited = ids[:second_reply_end] + tok.encode(PROMPTS[4])[:30]
    got = engine._prefill(edited, all_logits=True)
    assert engine._prefill_start == second_reply_end
    want = fresh.logits(edited)[second_reply_end:]
    # the same up to float rounding: the state came through other splits of the tokens (turns, single decode
    # steps), where a mixture's near-tie may route a token to another expert
    m = parity([got], [want])
    assert m["corr_min"] >= 0.999 and m["decided_mismatches"] == 0, m


def test_a_segment_restores_its_own_layers_from_a_checkpoint(engine):
    """A checkpoint holds every segment's layers (with layers on the CPU and the GPU, both): a CPU backend of the
    first layers takes its own from it and leaves the others."""
    from inference.backend_cpu import CPUBackend
    engine.logits(engine.tokenizer.encode(PROMPTS[0])[:20])
    saved = engine._segments[0][0].recurrent_state()  # every recurrent layer's
    first = CPUBackend(engine.config, engine._weights, 64, layers=range(2))
    first.restore_recurrent_state(saved)
    assert sorted(first.state_pos) == [0, 1] and first.state_pos[0] == 20
    np.testing.assert_array_equal(first.delta_state[1], saved[1][2])


def _greedy(engine, ids, n):
    out = []
    for piece in engine.generate(list(ids), max_tokens=n, temperature=0):
        if not isinstance(piece, str):
            break
    # the tokens the engine ran after the prompt, and the last one it sampled
    out = engine._cached[len(ids):]
    return out


def test_a_deltanet_shape_the_gpu_kernels_do_not_take_runs_on_the_cpu(tmp_path, smollm2, monkeypatch):
    """DeltaNet heads of 32 and a conv of 3 taps (the GPU kernels take 64 / 128 and 4): --device cuda is refused in
    one line, auto runs on the CPU and says why, and the CPU engine's logits still match llama.cpp's."""
    from tests.inference.cpu_fallback import load_refused_by_the_gpu
    path = tmp_path / "qwen35-s32.gguf"
    write_synthetic(path, "qwen35", vocab_from=smollm2, types=F32_LAYERS, deltanet=DELTANET | dict(state=32, conv=3))
    e = load_refused_by_the_gpu(path, monkeypatch, "DeltaNet heads of 32 (only 64, 128)", ctx=256)
    theirs = oracle_logits(path)
    m = parity([e.logits(ids) for ids, _ in theirs], [t for _, t in theirs])
    assert m["corr_mean"] >= 0.999 and m["corr_min"] >= 0.99, m
    assert_parity(m)
