"""Comparisons the GPU tests share: random prompts, logits against a reference, greedy decode steps."""
import numpy as np

from inference.sampling import SamplingParams


def random_prompt(engine, n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(3, engine.config.n_vocab, n).tolist()


def assert_close_logits(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
    """Rows of logits [n, n_vocab]: mean correlation >= 0.999, and the same top-1 wherever ref's best leads
    its second by more than 0.5."""
    corr = np.array([np.corrcoef(a, b)[0, 1] for a, b in zip(ours.astype(np.float64), ref.astype(np.float64))])
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 0.5
    same = ours.argmax(1) == ref.argmax(1)
    err = np.abs(ours - ref).max()
    print(f"{what}: mean corr {corr.mean():.6f} (min {corr.min():.6f}), max |err| {err:.4f}, "
          f"top-1 {same.mean():.3f} ({clear.sum()} clear rows, {same[clear].mean() if clear.any() else 1:.3f})")
    assert corr.mean() >= 0.999, f"{what}: mean correlation {corr.mean()}"
    assert same[clear].all(), f"{what}: top-1 differs at rows {np.flatnonzero(clear & ~same)}"


def greedy_steps(engine, ids: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """n greedy tokens after ids on the device, and the logits [n - 1, n_vocab] of each decode step."""
    engine._cached = []
    decode = engine._decode
    tokens = decode.tokens(engine._prefill(ids, all_logits=False), SamplingParams(temperature=0), None, ids)
    out, logits = [], []
    for _ in range(n):
        out.append(next(tokens))
        logits.append(engine._be.to_host(decode.logits)[0])  # of the step on that token, launched before it came
    engine._cached = []
    return out, np.array(logits[:-1])


def assert_graph_replay_equals_eager(graph, eager) -> None:
    """Engines of one model with and without the CUDA graph: the same 40 greedy tokens and bit-equal logits."""
    ids = random_prompt(graph, 12)
    g_tokens, g_logits = greedy_steps(graph, ids, 40)
    e_tokens, e_logits = greedy_steps(eager, ids, 40)
    assert graph._decode.graphs and not eager._decode.graphs
    assert g_tokens == e_tokens
    assert np.array_equal(g_logits, e_logits)
