"""The CPU attention kernels (kernels/cpu/attention.py) against a plain loop written from the definition."""
import numpy as np
import pytest

from kernels.cpu import attention as cpu_attention, ops as cpu_ops


def reference_attention(q, k, v, pos0, window, scale, sinks=None):
    """sinks [n_heads]: one more logit in each head's softmax, with no value (ggml_soft_max_add_sinks)."""
    n, n_heads, hd = q.shape
    n_kv = k.shape[0]
    out = np.zeros((n, n_heads, v.shape[2]))
    for i in range(n):
        p = pos0 + i
        for h in range(n_heads):
            kv = h // (n_heads // n_kv)
            seen = [j for j in range(p + 1) if window == 0 or p - j < window]
            s = np.array([q[i, h] @ k[kv, j] * scale for j in seen])
            m = s.max() if sinks is None else max(s.max(), sinks[h])
            w = np.exp(s - m)
            w /= w.sum() + (0 if sinks is None else np.exp(sinks[h] - m))
            out[i, h] = sum(wj * v[kv, j] for wj, j in zip(w, seen))
    return out.reshape(n, -1)


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("pos0,n,window", [(0, 7, 0), (5, 3, 0), (0, 9, 4), (6, 4, 3), (10, 1, 5), (3, 37, 0),
                                           (40, 21, 9)])
def test_attention_causal_gqa_and_window(pos0, n, window, parallel, monkeypatch):
    """Every path against the reference: up to 4 queries the decode loop, serially on a small model, on all cores on
    a big one (parallel); more queries in blocks of 16 (_attention_blocks, a last block short) or, past
    ATTENTION_BLOCKS_MAX_PAIRS, BLAS (parallel here: the whole prompt through BLAS)."""
    monkeypatch.setattr(cpu_attention, "ATTENTION_PARALLEL_WORK", 0 if parallel else 1 << 62)
    monkeypatch.setattr(cpu_attention, "ATTENTION_BLOCKS_MAX_PAIRS", 0 if parallel else 1 << 62)
    rng = np.random.default_rng(pos0 * 100 + n)
    n_heads, n_kv, hd, vd = 6, 2, 8, 5
    q = rng.standard_normal((n, n_heads, hd)).astype(np.float32)
    k = rng.standard_normal((n_kv, pos0 + n, hd)).astype(np.float32)
    v = rng.standard_normal((n_kv, pos0 + n, vd)).astype(np.float32)
    got = cpu_attention.attention(q, k, v, pos0, window, 0.3)
    np.testing.assert_allclose(got, reference_attention(q, k, v, pos0, window, 0.3), rtol=1e-4, atol=1e-5)
    # with a sink logit per head (gpt-oss): one of them above every score, so it takes most of its softmax
    sinks = rng.standard_normal(n_heads).astype(np.float32)
    sinks[1] = 8.0
    got = cpu_attention.attention(q, k, v, pos0, window, 0.3, sinks)
    np.testing.assert_allclose(got, reference_attention(q, k, v, pos0, window, 0.3, sinks), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("blas", [False, True])
@pytest.mark.parametrize("pos0,n", [(30, 1), (30, 3), (27, 9)])  # the loop kernel and a prompt's, past the ring's end
def test_attention_over_a_ring_is_attention_over_the_whole_cache(pos0, n, blas, monkeypatch):
    """A sliding window's ring (rope_kv_store's: position p in row p % rows) gives what the cache of every position
    gives, where its rows hold the window before the first query and the new positions (a prompt's queries in
    blocks, or in BLAS)."""
    monkeypatch.setattr(cpu_attention, "ATTENTION_BLOCKS_MAX_PAIRS", 0 if blas else 1 << 62)
    rng = np.random.default_rng(pos0 + n)
    n_heads, n_kv, hd, window, rows = 4, 2, 8, 6, 16
    q = rng.standard_normal((n, n_heads, hd)).astype(np.float32)
    k = rng.standard_normal((n_kv, pos0 + n, hd)).astype(np.float32)
    v = rng.standard_normal((n_kv, pos0 + n, hd)).astype(np.float32)
    ring_k, ring_v = np.full((n_kv, rows, hd), np.nan, np.float32), np.full((n_kv, rows, hd), np.nan, np.float32)
    kept = np.arange(pos0 + n - rows, pos0 + n)
    ring_k[:, kept % rows], ring_v[:, kept % rows] = k[:, kept], v[:, kept]
    want = cpu_attention.attention(q, k, v, pos0, window, 0.3)
    got = cpu_attention.attention(q, ring_k, ring_v, pos0, window, 0.3, ring=True)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # rope_kv_store writes a ring's rows: position p in row p % rows
    cos, sin = cpu_ops.rope_cos_sin(np.arange(pos0, pos0 + n), cpu_ops.rope_inv_freq(hd, 10000.0))
    new_k, new_v = (rng.standard_normal((n, n_kv, hd)).astype(np.float32) for _ in range(2))
    cpu_ops.rope_kv_store(q, new_k, new_v, cos, sin, "neox", ring_k, ring_v, pos0, ring=True)
    rows_written = np.arange(pos0, pos0 + n) % rows
    np.testing.assert_array_equal(ring_v[:, rows_written], new_v.transpose(1, 0, 2))
    want_k = cpu_ops.rope_rotate(new_k, cos, sin, "neox").transpose(1, 0, 2)
    np.testing.assert_array_equal(ring_k[:, rows_written], want_k)
