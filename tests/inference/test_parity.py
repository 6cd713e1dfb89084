"""Teacher-forced logits against llama.cpp on the same file: 6 prompts x 64 positions per model."""
import numpy as np

from tests.inference.parity import assert_parity, oracle_logits, parity
from tests.inference.synthetic import write_synthetic


def _check(engine, path):
    cases = oracle_logits(path)
    ours = [engine.logits(ids) for ids, _ in cases]
    assert all(o.shape == (64, engine.config.n_vocab) and o.dtype == np.float32 for o in ours)
    m = parity(ours, [ref for _, ref in cases])
    print(path.name, m)
    assert_parity(m)


def test_smollm2_matches_llama_cpp(smollm2_engine, smollm2):
    _check(smollm2_engine, smollm2)


def test_gemma3_matches_llama_cpp(gemma3_engine, gemma3):
    _check(gemma3_engine, gemma3)


def test_qwen2_and_qwen3_synthetic_match_llama_cpp(tmp_path, smollm2):
    from inference import load
    for arch in ("qwen2", "qwen3"):
        path = tmp_path / f"{arch}.gguf"
        write_synthetic(path, arch, vocab_from=smollm2)
        engine = load(path, device="cpu", ctx=64)
        assert engine.config.arch == arch
        _check(engine, path)
