"""The CUDA attention kernels (kernels/cuda/attention.cu through kernels/cuda/ops.py) against numpy float64 references,
as test_cuda_ops.py checks the other ops (its fixtures and helpers). Needs a GPU.

Attention reads an fp16 cache: its reference uses the same fp16 values, and test_fp16_cache_error states what fp16
costs against float32 k and v. Decode, prefill and a verify step's few tokens; over ring caches (sliding windows),
with sinks (gpt-oss), and with the keys split over blocks.
"""
import math

import numpy as np
import pytest

from tests.kernels.test_cuda_ops import (assert_same_q8_1, cuda, device_pos, nan_like,  # noqa: F401 (cuda, rng:
                                         poisoned_q8_1, q8_1_of, rel_err, rng)  # the fixtures)

pytestmark = pytest.mark.gpu

# (n_head, n_head_kv, head_dim): llama3-8b, gemma3-270m, smollm2-135m, a group of 16 (two row chunks), MHA, heads of
# 512 (gemma4's global layers: a block makes a slice of the output's dims) with a group of 8 and MHA
ATTN_SHAPES = [(32, 8, 128), (4, 1, 256), (24, 4, 256), (9, 3, 64), (64, 4, 128), (40, 2, 64), (8, 8, 64),
               (32, 4, 512), (4, 4, 512), (40, 2, 512)]


def random_cache(cp, rng, n_head_kv, max_ctx, head_dim):
    """Device caches and their float64 copies (the exact fp16 values), k scaled so scores spread."""
    k = (rng.standard_normal((n_head_kv, max_ctx, head_dim)) * 1.5).astype(np.float16)
    v = rng.standard_normal((n_head_kv, max_ctx, head_dim)).astype(np.float16)
    return cp.asarray(k), cp.asarray(v), k.astype(np.float64), v.astype(np.float64)


def ref_attention(q, k, v, positions, scale, window, sinks=None):
    """q [n, n_head, hd] float64 at positions [n]; k, v [n_kv, T, hd] -> [n, n_head, hd]. sinks [n_head]: one more
    logit in each head's softmax, of a zero value (gpt-oss; llama.cpp's soft_max with sinks)."""
    n, n_head, hd = q.shape
    group = n_head // k.shape[0]
    out = np.empty((n, n_head, hd))
    for t, p in enumerate(positions):
        lo = max(0, p - window + 1) if window > 0 else 0
        for h in range(n_head):
            s = k[h // group, lo:p + 1] @ q[t, h] * scale
            top = s.max() if sinks is None else max(s.max(), sinks[h])
            w = np.exp(s - top)
            out[t, h] = w @ v[h // group, lo:p + 1] / (w.sum() + (0.0 if sinks is None else np.exp(sinks[h] - top)))
    return out


def random_sinks(rng, n_head, n_keys):
    """Sink logits that take about half of a softmax over n_keys keys: a score here is ~N(0, 2.25) (k is scaled by
    1.5), so exp of it is ~3 on average."""
    return (np.log(3 * n_keys) + rng.standard_normal(n_head)).astype(np.float32)


@pytest.mark.parametrize("shape", ATTN_SHAPES, ids=lambda s: f"{s[0]}h{s[1]}kv{s[2]}")
@pytest.mark.parametrize("n_ctx, window", [(1, 0), (37, 0), (4096, 0), (1000, 0), (4096, 512), (37, 128)])
def test_attention_decode(cuda, rng, shape, n_ctx, window):
    """One query at position n_ctx - 1 over the cache; float32 with fast exp: bound 1e-5."""
    cp, ops = cuda
    n_head, n_head_kv, head_dim = shape
    max_ctx = 4160
    k_dev, v_dev, k, v = random_cache(cp, rng, n_head_kv, max_ctx, head_dim)
    q = rng.standard_normal((n_head, head_dim)).astype(np.float32)
    scale = 1 / math.sqrt(head_dim)
    scratch = ops.decode_scratch(n_head, n_head_kv, head_dim)
    scratch.fill(cp.nan)  # the combine must read only what this call wrote
    out = nan_like(cp, (n_head, head_dim))
    ops.attention_decode(cp.asarray(q), k_dev, v_dev, out, device_pos(cp, n_ctx - 1), scratch, scale, window)
    ref = ref_attention(q[None].astype(np.float64), k, v, [n_ctx - 1], scale, window)[0]
    assert rel_err(cp.asnumpy(out), ref) < 1e-5
    out_q, xq = nan_like(cp, (n_head, head_dim)), poisoned_q8_1(cp, n_head * head_dim)
    ops.attention_decode(cp.asarray(q), k_dev, v_dev, out_q, device_pos(cp, n_ctx - 1), scratch, scale, window,
                         xq=xq)
    np.testing.assert_array_equal(cp.asnumpy(out_q), cp.asnumpy(out))
    assert_same_q8_1(cp, xq, q8_1_of(cp, out))


def as_ring(cp, cache: np.ndarray, rows: int, end: int):
    """The device ring of `rows` rows that holds the last `rows` of positions 0..end-1 of cache [n_kv, T, hd] (float64
    copies of fp16 values): position j at row j % rows, as kv_write leaves it."""
    ring = np.full((cache.shape[0], rows, cache.shape[2]), np.nan)
    keep = np.arange(max(0, end - rows), end)
    ring[:, keep % rows] = cache[:, keep]
    return cp.asarray(ring.astype(np.float16))


@pytest.mark.parametrize("shape", [(32, 16, 256), (32, 4, 512), (8, 2, 64)], ids=lambda s: f"{s[0]}h{s[1]}kv{s[2]}")
@pytest.mark.parametrize("n_ctx, window, rows", [(3000, 1024, 1300), (700, 512, 600), (2100, 128, 200)])
def test_attention_decode_over_a_ring(cuda, rng, shape, n_ctx, window, rows):
    """A sliding window's ring cache (position j at row j % rows, the window's keys wrapping past its end; the rows
    of older positions NaN, so that reading one shows): the same output as the whole cache, bound 1e-5."""
    cp, ops = cuda
    n_head, n_head_kv, head_dim = shape
    _, _, k, v = random_cache(cp, rng, n_head_kv, n_ctx, head_dim)
    q = rng.standard_normal((n_head, head_dim)).astype(np.float32)
    scale = 1 / math.sqrt(head_dim)
    out = nan_like(cp, (n_head, head_dim))
    ops.attention_decode(cp.asarray(q), as_ring(cp, k, rows, n_ctx), as_ring(cp, v, rows, n_ctx), out,
                         device_pos(cp, n_ctx - 1), ops.decode_scratch(n_head, n_head_kv, head_dim), scale, window)
    ref = ref_attention(q[None].astype(np.float64), k, v, [n_ctx - 1], scale, window)[0]
    assert rel_err(cp.asnumpy(out), ref) < 1e-5


@pytest.mark.parametrize("shape", [(32, 16, 256), (32, 4, 512), (8, 2, 64)], ids=lambda s: f"{s[0]}h{s[1]}kv{s[2]}")
@pytest.mark.parametrize("n_tok, p0, window, rows", [(300, 1000, 512, 830), (64, 700, 128, 300)])
def test_attention_prefill_over_a_ring(cuda, rng, shape, n_tok, p0, window, rows):
    """A prompt chunk over a ring that holds the window before its first token and the chunk's own keys (rows >=
    window + n_tok): as test_attention_decode_over_a_ring, bound 1e-5."""
    cp, ops = cuda
    n_head, n_head_kv, head_dim = shape
    _, _, k, v = random_cache(cp, rng, n_head_kv, p0 + n_tok, head_dim)
    q = rng.standard_normal((n_tok, n_head, head_dim)).astype(np.float32)
    scale = 1 / math.sqrt(head_dim)
    out = nan_like(cp, (n_tok, n_head, head_dim))
    ops.attention_prefill(cp.asarray(q), as_ring(cp, k, rows, p0 + n_tok), as_ring(cp, v, rows, p0 + n_tok), out,
                          device_pos(cp, p0), scale, window)
    ref = ref_attention(q.astype(np.float64), k, v, p0 + np.arange(n_tok), scale, window)
    assert rel_err(cp.asnumpy(out), ref) < 1e-5


def test_fp16_cache_error(cuda, rng):
    """What the fp16 cache costs: decode attention over kv_write'd float32 k, v against float64 on the
    float32 values, 4096 keys, llama3-8b heads. fp16 keeps 11 bits (a value off by <= 2^-12 = 2.4e-4
    relative), so about 3e-4 is expected; bound 2e-3. The measured value is printed."""
    cp, ops = cuda
    n_head, n_head_kv, head_dim, n_ctx = 32, 8, 128, 4096
    k = (rng.standard_normal((n_ctx, n_head_kv, head_dim)) * 1.5).astype(np.float32)
    v = rng.standard_normal((n_ctx, n_head_kv, head_dim)).astype(np.float32)
    k_cache, v_cache = ops.kv_cache(n_head_kv, n_ctx, head_dim)
    ops.kv_write(cp.asarray(k), cp.asarray(v), k_cache, v_cache, device_pos(cp, 0))
    q = rng.standard_normal((n_head, head_dim)).astype(np.float32)
    out = nan_like(cp, (n_head, head_dim))
    scale = 1 / math.sqrt(head_dim)
    ops.attention_decode(cp.asarray(q), k_cache, v_cache, out, device_pos(cp, n_ctx - 1),
                         ops.decode_scratch(n_head, n_head_kv, head_dim), scale)
    ref = ref_attention(q[None].astype(np.float64), k.transpose(1, 0, 2).astype(np.float64),
                        v.transpose(1, 0, 2).astype(np.float64), [n_ctx - 1], scale, 0)[0]
    err = rel_err(cp.asnumpy(out), ref)
    print(f"fp16 cache: relative error {err:.2e} against float32 k, v")
    assert err < 2e-3


@pytest.mark.parametrize("shape", ATTN_SHAPES, ids=lambda s: f"{s[0]}h{s[1]}kv{s[2]}")
@pytest.mark.parametrize("n_tok, p0, window", [(37, 0, 0), (100, 50, 0), (64, 200, 16), (1, 9, 0)])
def test_attention_prefill(cuda, rng, shape, n_tok, p0, window):
    """n_tok queries at p0.. over keys 0..p0+n_tok-1 (causal, optional window): bound 1e-5."""
    cp, ops = cuda
    n_head, n_head_kv, head_dim = shape
    max_ctx = 512
    k_dev, v_dev, k, v = random_cache(cp, rng, n_head_kv, max_ctx, head_dim)
    q = rng.standard_normal((n_tok, n_head, head_dim)).astype(np.float32)
    scale = 1 / math.sqrt(head_dim)
    out = nan_like(cp, (n_tok, n_head, head_dim))
    ops.attention_prefill(cp.asarray(q), k_dev, v_dev, out, device_pos(cp, p0), scale, window)
    ref = ref_attention(q.astype(np.float64), k, v, p0 + np.arange(n_tok), scale, window)
    assert rel_err(cp.asnumpy(out), ref) < 1e-5


@pytest.mark.parametrize("shape", [(64, 8, 64), (24, 4, 256), (32, 8, 128)], ids=lambda s: f"{s[0]}h{s[1]}kv{s[2]}")
@pytest.mark.parametrize("n_ctx, window", [(1, 0), (200, 128), (3000, 0)])
def test_attention_decode_with_sinks(cuda, rng, shape, n_ctx, window):
    """gpt-oss's sinks (64 heads of 64 a layer, every other one a 128-key window): each head's softmax counts one
    more logit, of a zero value. Bound 1e-5; without the sinks the output is far from it (the comparison can fail)."""
    cp, ops = cuda
    n_head, n_head_kv, head_dim = shape
    k_dev, v_dev, k, v = random_cache(cp, rng, n_head_kv, 4096, head_dim)
    q = rng.standard_normal((n_head, head_dim)).astype(np.float32)
    sinks, scale = random_sinks(rng, n_head, min(n_ctx, window or n_ctx)), 1 / math.sqrt(head_dim)
    out, plain = nan_like(cp, (n_head, head_dim)), nan_like(cp, (n_head, head_dim))
    scratch = ops.decode_scratch(n_head, n_head_kv, head_dim)
    ops.attention_decode(cp.asarray(q), k_dev, v_dev, out, device_pos(cp, n_ctx - 1), scratch, scale, window,
                         sinks=cp.asarray(sinks))
    ops.attention_decode(cp.asarray(q), k_dev, v_dev, plain, device_pos(cp, n_ctx - 1), scratch, scale, window)
    ref = ref_attention(q[None].astype(np.float64), k, v, [n_ctx - 1], scale, window, sinks)[0]
    assert rel_err(cp.asnumpy(out), ref) < 1e-5
    assert rel_err(cp.asnumpy(plain), ref) > 1e-2


@pytest.mark.parametrize("shape", [(64, 8, 64), (24, 4, 256)], ids=lambda s: f"{s[0]}h{s[1]}kv{s[2]}")
@pytest.mark.parametrize("n_tok, p0, window", [(37, 0, 0), (100, 150, 128)])
def test_attention_prefill_with_sinks(cuda, rng, shape, n_tok, p0, window):
    """As test_attention_decode_with_sinks, for n_tok queries at p0..: bound 1e-5."""
    cp, ops = cuda
    n_head, n_head_kv, head_dim = shape
    k_dev, v_dev, k, v = random_cache(cp, rng, n_head_kv, 512, head_dim)
    q = rng.standard_normal((n_tok, n_head, head_dim)).astype(np.float32)
    sinks, scale = random_sinks(rng, n_head, min(p0 + n_tok, window or p0 + n_tok)), 1 / math.sqrt(head_dim)
    out, plain = nan_like(cp, (n_tok, n_head, head_dim)), nan_like(cp, (n_tok, n_head, head_dim))
    ops.attention_prefill(cp.asarray(q), k_dev, v_dev, out, device_pos(cp, p0), scale, window, sinks=cp.asarray(sinks))
    ops.attention_prefill(cp.asarray(q), k_dev, v_dev, plain, device_pos(cp, p0), scale, window)
    ref = ref_attention(q.astype(np.float64), k, v, p0 + np.arange(n_tok), scale, window, sinks)
    assert rel_err(cp.asnumpy(out), ref) < 1e-5
    assert rel_err(cp.asnumpy(plain), ref) > 1e-2


# A verify step's few tokens through attention_decode: (n_head, n_head_kv, head_dim) of ATTN_SHAPES (groups of 1, 3, 4,
# 6, 16, 20 and heads of 64-512, so 16-row chunks split a token's heads) and gpt-oss's group of 8 at 64
DECODE_TOKENS_SHAPES = ATTN_SHAPES + [(64, 8, 64)]
VERIFY_MAX = 8  # the scratch of these tests has rows for this many tokens, as a verify step's does


def decode_tokens(cp, ops, q, k_dev, v_dev, p0, scale, window, scratch=None, **kw):
    """attention_decode of q [n_tok, n_head, head_dim] (numpy) at p0.. -> out (device); scratch default: one for
    VERIFY_MAX tokens, NaN so that the combine must read only what this call wrote."""
    n_tok, n_head, head_dim = q.shape
    if scratch is None:
        scratch = ops.decode_scratch(n_head, k_dev.shape[0], head_dim, n_tok=VERIFY_MAX)
        scratch.fill(cp.nan)
    out = nan_like(cp, q.shape)
    ops.attention_decode(cp.asarray(q), k_dev, v_dev, out, device_pos(cp, p0), scratch, scale, window, **kw)
    return out


@pytest.mark.parametrize("shape", DECODE_TOKENS_SHAPES, ids=lambda s: f"{s[0]}h{s[1]}kv{s[2]}")
@pytest.mark.parametrize("n_tok", [1, 2, 4, 8])
@pytest.mark.parametrize("n_ctx, window", [(8, 0), (37, 0), (1000, 0), (4096, 0), (4096, 512), (37, 16)])
def test_attention_decode_of_tokens(cuda, rng, shape, n_tok, n_ctx, window):
    """n_tok queries at the end of a context of n_ctx keys (token t at n_ctx - n_tok + t, causal): as the reference,
    bound 1e-5; with xq, the same output and its q8_1 copy."""
    cp, ops = cuda
    n_head, n_head_kv, head_dim = shape
    k_dev, v_dev, k, v = random_cache(cp, rng, n_head_kv, 4160, head_dim)
    q = rng.standard_normal((n_tok, n_head, head_dim)).astype(np.float32)
    scale, p0 = 1 / math.sqrt(head_dim), n_ctx - n_tok
    out = decode_tokens(cp, ops, q, k_dev, v_dev, p0, scale, window)
    ref = ref_attention(q.astype(np.float64), k, v, p0 + np.arange(n_tok), scale, window)
    assert rel_err(cp.asnumpy(out), ref) < 1e-5
    xq = poisoned_q8_1(cp, q.size)
    out_q = decode_tokens(cp, ops, q, k_dev, v_dev, p0, scale, window, xq=xq)
    np.testing.assert_array_equal(cp.asnumpy(out_q), cp.asnumpy(out))
    assert_same_q8_1(cp, xq, q8_1_of(cp, out))


def splits(n_keys: int, n_splits: int) -> tuple[int, int]:
    """attention.cu's Splits over n_keys keys: (active splits, keys a split)."""
    active = min(n_splits, -(-n_keys // 32))  # MIN_SPLIT_KEYS
    return active, -(-n_keys // active)


@pytest.mark.parametrize("shape", [(32, 8, 128), (24, 4, 256), (32, 4, 512)], ids=lambda s: f"{s[0]}h{s[1]}kv{s[2]}")
@pytest.mark.parametrize("n_splits, n_ctx", [(33, 1057), (64, 2521), (64, 2524)])
def test_attention_decode_of_tokens_with_a_split_only_later_tokens_see(cuda, rng, shape, n_splits, n_ctx):
    """The last split holds fewer keys than the 8 tokens (1 or 4): the first tokens see none of it (sum p 0, max
    -inf, in the block's merge and in the combine). Bound 1e-5."""
    cp, ops = cuda
    n_head, n_head_kv, head_dim = shape
    n_tok = 8
    active, chunk = splits(n_ctx, n_splits)
    assert active == n_splits and 0 < n_ctx - (active - 1) * chunk < n_tok  # the last split's keys
    k_dev, v_dev, k, v = random_cache(cp, rng, n_head_kv, n_ctx, head_dim)
    q = rng.standard_normal((n_tok, n_head, head_dim)).astype(np.float32)
    scale, p0 = 1 / math.sqrt(head_dim), n_ctx - n_tok
    scratch = nan_like(cp, (n_tok * n_head, n_splits, head_dim + 4))
    out = decode_tokens(cp, ops, q, k_dev, v_dev, p0, scale, 0, scratch)
    ref = ref_attention(q.astype(np.float64), k, v, p0 + np.arange(n_tok), scale, 0)
    assert rel_err(cp.asnumpy(out), ref) < 1e-5


@pytest.mark.parametrize("shape", [(32, 8, 128), (24, 4, 256), (64, 8, 64), (32, 4, 512)],
                         ids=lambda s: f"{s[0]}h{s[1]}kv{s[2]}")
@pytest.mark.parametrize("n_ctx, window", [(20, 0), (3000, 0), (3000, 700), (40, 5)])
def test_attention_decode_of_tokens_masks_later_and_older_keys(cuda, rng, shape, n_ctx, window):
    """Garbage written into the keys and values after token t's position leaves tokens 0..t's outputs unchanged to
    the bit and changes token t + 1's; with a window, garbage before the last token's window leaves its output
    unchanged and changes the first token's."""
    cp, ops = cuda
    n_head, n_head_kv, head_dim = shape
    n_tok = 8
    k_dev, v_dev, _, _ = random_cache(cp, rng, n_head_kv, n_ctx, head_dim)
    q = rng.standard_normal((n_tok, n_head, head_dim)).astype(np.float32)
    scale, p0 = 1 / math.sqrt(head_dim), n_ctx - n_tok
    clean = cp.asnumpy(decode_tokens(cp, ops, q, k_dev, v_dev, p0, scale, window))

    def with_garbage(keys: slice) -> np.ndarray:
        k_bad, v_bad = k_dev.copy(), v_dev.copy()
        shape = k_bad[:, keys].shape
        k_bad[:, keys] = cp.asarray((rng.standard_normal(shape) * 30).astype(np.float16))
        v_bad[:, keys] = cp.asarray((rng.standard_normal(shape) * 30).astype(np.float16))
        return cp.asnumpy(decode_tokens(cp, ops, q, k_bad, v_bad, p0, scale, window))

    for t in range(n_tok - 1):
        out = with_garbage(slice(p0 + t + 1, n_ctx))
        np.testing.assert_array_equal(out[:t + 1], clean[:t + 1])
        assert rel_err(out[t + 1], clean[t + 1]) > 1e-2
    if window:
        first_lo, last_lo = max(0, p0 - window + 1), p0 + n_tok - window
        out = with_garbage(slice(first_lo, last_lo))
        np.testing.assert_array_equal(out[-1], clean[-1])
        assert rel_err(out[0], clean[0]) > 1e-2


@pytest.mark.parametrize("shape", [(32, 16, 256), (32, 4, 512), (8, 2, 64)], ids=lambda s: f"{s[0]}h{s[1]}kv{s[2]}")
@pytest.mark.parametrize("n_tok", [2, 8])
@pytest.mark.parametrize("n_ctx, window, rows", [(3000, 1024, 1300), (700, 512, 600), (2100, 128, 200), (300, 64, 71)])
def test_attention_decode_of_tokens_over_a_ring(cuda, rng, shape, n_tok, n_ctx, window, rows):
    """As test_attention_decode_over_a_ring for n_tok queries at the context's end: the ring holds the first one's
    window and the tokens (rows >= window + n_tok - 1; 71 rows: the least for 8), bound 1e-5."""
    cp, ops = cuda
    n_head, n_head_kv, head_dim = shape
    _, _, k, v = random_cache(cp, rng, n_head_kv, n_ctx, head_dim)
    q = rng.standard_normal((n_tok, n_head, head_dim)).astype(np.float32)
    scale, p0 = 1 / math.sqrt(head_dim), n_ctx - n_tok
    out = decode_tokens(cp, ops, q, as_ring(cp, k, rows, n_ctx), as_ring(cp, v, rows, n_ctx), p0, scale, window)
    ref = ref_attention(q.astype(np.float64), k, v, p0 + np.arange(n_tok), scale, window)
    assert rel_err(cp.asnumpy(out), ref) < 1e-5


@pytest.mark.parametrize("shape", [(64, 8, 64), (24, 4, 256), (32, 8, 128)], ids=lambda s: f"{s[0]}h{s[1]}kv{s[2]}")
@pytest.mark.parametrize("n_tok", [2, 8])
@pytest.mark.parametrize("n_ctx, window", [(8, 0), (200, 128), (3000, 0)])
def test_attention_decode_of_tokens_with_sinks(cuda, rng, shape, n_tok, n_ctx, window):
    """As test_attention_decode_with_sinks for n_tok queries at the context's end (each token's row takes its
    head's sink): bound 1e-5, and far from it without the sinks."""
    cp, ops = cuda
    n_head, n_head_kv, head_dim = shape
    k_dev, v_dev, k, v = random_cache(cp, rng, n_head_kv, 4096, head_dim)
    q = rng.standard_normal((n_tok, n_head, head_dim)).astype(np.float32)
    sinks, scale, p0 = random_sinks(rng, n_head, min(n_ctx, window or n_ctx)), 1 / math.sqrt(head_dim), n_ctx - n_tok
    out = decode_tokens(cp, ops, q, k_dev, v_dev, p0, scale, window, sinks=cp.asarray(sinks))
    plain = decode_tokens(cp, ops, q, k_dev, v_dev, p0, scale, window)
    ref = ref_attention(q.astype(np.float64), k, v, p0 + np.arange(n_tok), scale, window, sinks)
    assert rel_err(cp.asnumpy(out), ref) < 1e-5
    assert rel_err(cp.asnumpy(plain), ref) > 1e-2
