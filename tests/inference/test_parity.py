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


def test_gemma3_past_its_sliding_window_matches_llama_cpp(gemma3_engine, gemma3):
    """600 tokens: the last 64 positions see more than the 512-token window of gemma3's local layers."""
    import llama_cpp
    from tests.inference.parity import PROMPTS
    llm = llama_cpp.Llama(str(gemma3), logits_all=True, n_ctx=640, n_batch=640, n_threads=2, verbose=False)
    ids = llm.tokenize(" ".join(PROMPTS * 2).encode(), add_bos=True)[:600]
    assert len(ids) == 600
    llm.eval(ids)
    theirs = np.array(llm.scores[536:600], np.float32)
    llm.close()
    ours = gemma3_engine.logits(ids)[536:]
    m = parity([ours], [theirs])
    print("gemma3 past the window", m)
    assert_parity(m)
