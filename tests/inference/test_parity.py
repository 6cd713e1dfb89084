"""Teacher-forced logits against llama.cpp on the same file: 6 prompts x 64 positions per model.

The comparison can fail: on the random qwen3 file, layer 1's attention dropped (its output zeroed) fails it
(test_parity_fails_with_a_layers_attention_dropped), and the synthetic files' logits depend on the input (two
prompts' last logits correlate < 0.5), so agreeing on them is not agreeing on a constant."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from tests.inference.parity import assert_parity, oracle, oracle_logits, parity
from tests.inference.synthetic import LLAMA_K_SHAPES, Q4_K_M_LAYERS, write_synthetic


def _check(engine, path):
    cases = oracle_logits(path)
    ours = [engine.logits(ids) for ids, _ in cases]
    assert all(o.shape == (64, engine.config.n_vocab) and o.dtype == np.float32 for o in ours)
    m = parity(ours, [ref for _, ref in cases])
    print(path.name, m)
    assert_parity(m)
    return m


def test_smollm2_matches_llama_cpp(smollm2_engine, smollm2):
    _check(smollm2_engine, smollm2)


def test_gemma3_matches_llama_cpp(gemma3_engine, gemma3):
    _check(gemma3_engine, gemma3)


def _synthetic(tmp_path, arch, smollm2):
    from inference import load
    path = tmp_path / f"{arch}.gguf"
    write_synthetic(path, arch, vocab_from=smollm2)
    engine = load(path, device="cpu", ctx=64)
    assert engine.config.arch == arch
    return engine, path


def test_qwen2_and_qwen3_synthetic_match_llama_cpp(tmp_path, smollm2):
    for arch in ("qwen2", "qwen3"):
        engine, path = _synthetic(tmp_path, arch, smollm2)
        _check(engine, path)
        first, second = (engine.logits(ids)[-1] for ids, _ in oracle_logits(path)[:2])
        assert np.corrcoef(first, second)[0, 1] < 0.5, f"{arch}: the logits barely depend on the input"


def test_q4_k_m_llama_synthetic_matches_llama_cpp(synth_llama_k):
    """The GPU tests' Q4_K / Q6_K file (random K-quant blocks, its own SentencePiece vocabulary: the prompts are
    mostly byte tokens). With smollm2's vocabulary the same weights give one decided mismatch (a lead of 0.6):
    llama.cpp rounds activations to 8 bits per 256 (Q8_K), which the random layers amplify."""
    from inference import load
    _check(load(synth_llama_k, device="cpu", ctx=64), synth_llama_k)


@pytest.mark.parametrize("qtype", [T.IQ4_XS, T.IQ3_XXS, T.IQ2_XXS], ids=lambda t: t.name)
def test_iq_llama_synthetic_matches_llama_cpp(tmp_path, qtype):
    """Every layer matrix of one IQ type (random blocks): our int8 dots (x rounded to 8 bits per 256, as llama.cpp's
    Q8_K) against llama.cpp's; the logits depend on the input. Mean correlation when written: IQ4_XS 0.99907 with
    float32 x; int8 x: IQ4_XS 0.99963, IQ3_XXS 0.99963, IQ2_XXS 0.99959."""
    from inference import load
    path = tmp_path / f"llama_{qtype.name}.gguf"
    write_synthetic(path, "llama", shapes=LLAMA_K_SHAPES, types=dict.fromkeys(Q4_K_M_LAYERS, qtype))
    engine = load(path, device="cpu", ctx=64)
    assert _check(engine, path)["corr_mean"] >= 0.999  # issue 34's bar, above assert_parity's
    first, second = (engine.logits(ids)[-1] for ids, _ in oracle_logits(path)[:2])
    assert np.corrcoef(first, second)[0, 1] < 0.5, "the logits barely depend on the input"


def test_parity_fails_with_a_layers_attention_dropped(tmp_path, smollm2, monkeypatch):
    """A planted fault the comparison above must catch: layer 1's attention output zeroed on the qwen3 file."""
    import inference.backend_cpu as backend_cpu
    engine, path = _synthetic(tmp_path, "qwen3", smollm2)
    attention = backend_cpu.CPUBackend.attention

    def dropped(self, layer, q, window, scale, sinks=None):
        out = attention(self, layer, q, window, scale, sinks)
        return out * 0 if layer == 1 else out

    monkeypatch.setattr(backend_cpu.CPUBackend, "attention", dropped)
    cases = oracle_logits(path)
    m = parity([engine.logits(ids) for ids, _ in cases], [ref for _, ref in cases])
    print("qwen3, layer 1's attention dropped", m)
    with pytest.raises(AssertionError):
        assert_parity(m)


def test_gemma3_past_its_sliding_window_matches_llama_cpp(gemma3_engine, gemma3):
    """600 tokens: the last 64 positions see more than the 512-token window of gemma3's local layers."""
    from tests.inference.parity import PROMPTS
    llm = oracle(gemma3, logits_all=True, n_ctx=640, n_batch=640, n_threads=2)
    ids = llm.tokenize(" ".join(PROMPTS * 2).encode(), add_bos=True)[:600]
    assert len(ids) == 600
    llm.eval(ids)
    theirs = np.array(llm.scores[536:600], np.float32)
    llm.close()
    ours = gemma3_engine.logits(ids)[536:]
    m = parity([ours], [theirs])
    print("gemma3 past the window", m)
    assert_parity(m)
