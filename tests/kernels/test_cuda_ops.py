"""The CUDA op kernels (kernels/cuda/ops.py) against numpy float64 references. Needs a GPU.

Fresh random inputs every run, real shapes, outputs poisoned with NaN first so an unwritten element fails.
Bounds: embed is bit-exact with models/dequant.py; add and bias add are exact float32; the rest are float32
arithmetic against float64, checked by ||out - ref|| / ||ref|| under a bound stated at each test (an indexing
or race bug gives errors of order 1). Attention's kernels: test_cuda_attention.py.
"""
import math

import numpy as np
import pytest

from kernels.bench.cuda import random_weight_bytes
from models.dequant import dequantize
from models.ggml_types import TYPES_BY_NAME

pytestmark = pytest.mark.gpu

EMBED_TYPES = ["Q8_0", "Q4_K", "Q6_K", "F16", "F32", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K",
               "MXFP4", "IQ4_NL", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"]


@pytest.fixture(scope="module")
def cuda():
    import cupy as cp

    import kernels.cuda.ops as ops

    return cp, ops


@pytest.fixture
def rng():
    return np.random.default_rng(np.random.SeedSequence().generate_state(1)[0])  # fresh every run


def rel_err(out, ref) -> float:
    out = np.asarray(out, dtype=np.float64)
    assert np.isfinite(out).all(), f"{(~np.isfinite(out)).sum()} outputs not written or not finite"
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def nan_like(cp, shape, dtype=None):
    return cp.full(shape, cp.nan, dtype=dtype or cp.float32)


def device_pos(cp, p):
    return cp.array([p], dtype=cp.int32)


# ---- embed ----

@pytest.mark.parametrize("name", EMBED_TYPES)
def test_embed_is_bit_exact_with_dequant(cuda, rng, name):
    cp, ops = cuda
    from kernels.cuda.quant import to_device

    qtype = TYPES_BY_NAME[name]
    n_rows, n_cols = 1000, 2048
    raw = random_weight_bytes(qtype, n_rows, n_cols, seed=int(rng.integers(1 << 31)))
    table = to_device(raw, qtype)
    ref = dequantize(raw, qtype, (n_cols, n_rows))  # [n_rows, n_cols]
    ids = rng.integers(0, n_rows, 9).astype(np.int32)
    ids[0], ids[1] = 0, n_rows - 1
    for scale in (1.0, math.sqrt(640)):  # gemma scales by sqrt(n_embd)
        out = nan_like(cp, (len(ids), n_cols))
        ops.embed(table, cp.asarray(ids), out, scale)
        np.testing.assert_array_equal(cp.asnumpy(out), ref[ids] * np.float32(scale))
    one = nan_like(cp, (1, n_cols))  # decode: the id comes from the device token buffer
    ops.embed(table, cp.asarray(ids[2:3]), one)
    np.testing.assert_array_equal(cp.asnumpy(one)[0], ref[ids[2]])


def test_embed_bad_id_gives_nan(cuda):
    cp, ops = cuda
    from kernels.cuda.quant import to_device

    qtype = TYPES_BY_NAME["Q8_0"]
    table = to_device(random_weight_bytes(qtype, 10, 64), qtype)
    out = cp.zeros((2, 64), dtype=cp.float32)
    ops.embed(table, cp.array([10, -1], dtype=cp.int32), out)
    assert cp.isnan(out).all()


# ---- rms_norm ----

def ref_rms_norm(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


@pytest.mark.parametrize("shape", [(4096,), (7, 8192), (3, 640), (5, 32, 128), (1, 4, 256)],
                         ids=lambda s: "x".join(map(str, s)))
def test_rms_norm(cuda, rng, shape):
    """Float32 sums of squares over up to 8192 values, rsqrtf (2 ulp): bound 2e-6."""
    cp, ops = cuda
    d = shape[-1]
    x = rng.standard_normal(shape).astype(np.float32) * 3
    w = rng.standard_normal(d).astype(np.float32)
    out = nan_like(cp, shape)
    ops.rms_norm(cp.asarray(x), cp.asarray(w), out, 1e-6)
    assert rel_err(cp.asnumpy(out), ref_rms_norm(x, w, 1e-6)) < 2e-6
    x_dev = cp.asarray(x)  # in place, as the per-head q/k norms run
    ops.rms_norm(x_dev, cp.asarray(w), x_dev, 1e-6)
    assert rel_err(cp.asnumpy(x_dev), ref_rms_norm(x, w, 1e-6)) < 2e-6


@pytest.mark.parametrize("d", [4096, 2048, 640])
def test_rms_norm_with_residual(cuda, rng, d):
    cp, ops = cuda
    x = rng.standard_normal((3, d)).astype(np.float32)
    r = rng.standard_normal((3, d)).astype(np.float32)
    w = rng.standard_normal(d).astype(np.float32)
    x_dev, out = cp.asarray(x), nan_like(cp, (3, d))
    ops.rms_norm(x_dev, cp.asarray(w), out, 1e-5, residual=cp.asarray(r))
    np.testing.assert_array_equal(cp.asnumpy(x_dev), x + r)  # the residual stream, written back
    assert rel_err(cp.asnumpy(out), ref_rms_norm(x + r, w, 1e-5)) < 2e-6


def q8_1_of(cp, values):
    """A Q8Vector of values (device float32 [n]) from cuda_quant.quantize_q8_1, itself checked against numpy."""
    from kernels.cuda.quant import Q8Vector, quantize_q8_1

    xq = Q8Vector.empty(values.size)
    quantize_q8_1(values.reshape(-1), xq)
    return xq


def poisoned_q8_1(cp, n):
    from kernels.cuda.quant import Q8Vector

    return Q8Vector(cp.full(n, -128, dtype=cp.int8), cp.full((n // 32, 2), cp.nan, dtype=cp.float32))


def assert_same_q8_1(cp, xq, ref):
    """A fused kernel's q8_1 copy equals quantize_q8_1 of its float output, bit for bit."""
    np.testing.assert_array_equal(cp.asnumpy(xq.qs), cp.asnumpy(ref.qs))
    np.testing.assert_array_equal(cp.asnumpy(xq.ds), cp.asnumpy(ref.ds))


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("d", [4096, 2048, 640, 64, 5120, 8192, 16384])
def test_rms_norm_q8_1(cuda, rng, d, rows):
    """Rows normalized (float32, its own summation order) and, in the same launch, quantized: a decode step's one
    row, a verify step's few."""
    cp, ops = cuda
    x = rng.standard_normal((rows, d)).astype(np.float32) * 3
    w = rng.standard_normal(d).astype(np.float32)
    out, xq = nan_like(cp, (rows, d)), poisoned_q8_1(cp, rows * d)
    ops.rms_norm(cp.asarray(x), cp.asarray(w), out, 1e-5, xq=xq)
    assert rel_err(cp.asnumpy(out), ref_rms_norm(x, w, 1e-5)) < 2e-6
    assert_same_q8_1(cp, xq, q8_1_of(cp, out))


# ---- rope ----

def ref_rope(x, positions, inv_freq, neox):
    x = x.astype(np.float64).copy()
    half = len(inv_freq)
    ang = positions[:, None, None].astype(np.float64) * inv_freq[None, None, :]  # [n, 1, half]
    cos, sin = np.cos(ang), np.sin(ang)
    if neox:
        i0, i1 = np.arange(half), np.arange(half) + half
    else:
        i0, i1 = np.arange(0, 2 * half, 2), np.arange(1, 2 * half, 2)
    x0, x1 = x[..., i0].copy(), x[..., i1].copy()
    x[..., i0] = x0 * cos - x1 * sin
    x[..., i1] = x0 * sin + x1 * cos
    return x


@pytest.mark.parametrize("neox", [False, True], ids=["normal", "neox"])
@pytest.mark.parametrize("head_dim, rope_dim, n_head, n_head_kv", [(128, 128, 32, 8), (64, 64, 9, 3), (256, 256, 4, 1),
                                                                   (128, 64, 16, 2)])
@pytest.mark.parametrize("n_tok, p0", [(1, 0), (1, 4321), (7, 100000)])
def test_rope(cuda, rng, neox, head_dim, rope_dim, n_head, n_head_kv, n_tok, p0):
    """Angles in float64, rotation in float32: bound 1e-6; dims past rope_dim untouched."""
    cp, ops = cuda
    inv_freq = 1e6 ** (-np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)
    q = rng.standard_normal((n_tok, n_head, head_dim)).astype(np.float32)
    k = rng.standard_normal((n_tok, n_head_kv, head_dim)).astype(np.float32)
    q_dev, k_dev = cp.asarray(q), cp.asarray(k)
    ops.rope(q_dev, k_dev, ops.rope_inv_freq(rope_dim, 1e6), device_pos(cp, p0), neox)
    positions = p0 + np.arange(n_tok)
    for got, x in ((cp.asnumpy(q_dev), q), (cp.asnumpy(k_dev), k)):
        assert rel_err(got, ref_rope(x, positions, inv_freq, neox)) < 1e-6
        np.testing.assert_array_equal(got[..., rope_dim:], x[..., rope_dim:])


def test_rope_without_k(cuda, rng):
    cp, ops = cuda
    inv_freq = 1e4 ** (-np.arange(0, 64, 2, dtype=np.float64) / 64)
    q = rng.standard_normal((2, 4, 64)).astype(np.float32)
    q_dev = cp.asarray(q)
    ops.rope(q_dev, None, cp.asarray(inv_freq), device_pos(cp, 9), True)
    assert rel_err(cp.asnumpy(q_dev), ref_rope(q, 9 + np.arange(2), inv_freq, True)) < 1e-6


# ---- kv_write ----

@pytest.mark.parametrize("n_tok, p0", [(1, 37), (9, 100), (5, 254), (7, 1020)])
def test_kv_write(cuda, rng, n_tok, p0):
    """fp16 round-to-nearest, exactly numpy's astype(float16); other rows untouched; position p at row p % max_ctx
    (past the cache's rows: a ring's, wrapping to its start)."""
    cp, ops = cuda
    n_head_kv, max_ctx, head_dim = 8, 256, 128
    k = rng.standard_normal((n_tok, n_head_kv, head_dim)).astype(np.float32)
    v = rng.standard_normal((n_tok, n_head_kv, head_dim)).astype(np.float32)
    k_cache = cp.full((n_head_kv, max_ctx, head_dim), -7.0, dtype=cp.float16)
    v_cache = cp.full((n_head_kv, max_ctx, head_dim), -7.0, dtype=cp.float16)
    ops.kv_write(cp.asarray(k), cp.asarray(v), k_cache, v_cache, device_pos(cp, p0))
    rows = (p0 + np.arange(n_tok)) % max_ctx
    for cache, x in ((cp.asnumpy(k_cache), k), (cp.asnumpy(v_cache), v)):
        np.testing.assert_array_equal(cache[:, rows], x.transpose(1, 0, 2).astype(np.float16))
        assert (np.delete(cache, rows, axis=1) == -7.0).all()


@pytest.mark.parametrize("neox", [False, True], ids=["normal", "neox"])
@pytest.mark.parametrize("head_dim, rope_dim", [(128, 128), (128, 64), (256, 256), (64, 32)])
@pytest.mark.parametrize("n_tok, p0", [(1, 77), (9, 200), (4, 254)])
def test_rope_kv_write_equals_rope_then_kv_write(cuda, rng, neox, head_dim, rope_dim, n_tok, p0):
    """The fused op gives bit-identical q, k and caches to the two ops it replaces (same roundings)."""
    cp, ops = cuda
    n_head, n_head_kv, max_ctx = 16, 4, 256
    inv_freq = ops.rope_inv_freq(rope_dim, 1e4)
    q, k, v = (rng.standard_normal((n_tok, n, head_dim)).astype(np.float32) for n in (n_head, n_head_kv, n_head_kv))
    pos = device_pos(cp, p0)
    results = []
    for fused in (False, True):
        q_dev, k_dev, v_dev = cp.asarray(q), cp.asarray(k), cp.asarray(v)
        k_cache = cp.full((n_head_kv, max_ctx, head_dim), -7.0, dtype=cp.float16)
        v_cache = cp.full((n_head_kv, max_ctx, head_dim), -7.0, dtype=cp.float16)
        if fused:
            ops.rope_kv_write(q_dev, k_dev, v_dev, inv_freq, pos, neox, k_cache, v_cache)
        else:
            ops.rope(q_dev, k_dev, inv_freq, pos, neox)
            ops.kv_write(k_dev, v_dev, k_cache, v_cache, pos)
        results.append([cp.asnumpy(a) for a in (q_dev, k_dev, k_cache, v_cache)])
    for separate, fused in zip(*results):
        np.testing.assert_array_equal(fused, separate)
    assert rel_err(results[1][0], ref_rope(q, p0 + np.arange(n_tok), cp.asnumpy(inv_freq), neox)) < 1e-6


@pytest.mark.parametrize("head_dim, rope_dim", [(128, 128), (128, 64), (256, 256), (64, 32)])
@pytest.mark.parametrize("n_tok, p0", [(1, 77), (9, 200)])
def test_rope_kv_write_with_head_norms_equals_the_norms_first(cuda, rng, head_dim, rope_dim, n_tok, p0):
    """q and k normalized per head inside the launch (qwen3's q/k norms) against rms_norm's launches first, then
    the same op without them: the sums of squares add in another order, so equal to float32 rounding."""
    cp, ops = cuda
    n_head, n_head_kv, max_ctx, eps = 16, 4, 256, 1e-6
    inv_freq = ops.rope_inv_freq(rope_dim, 1e6)
    q, k, v = (rng.standard_normal((n_tok, n, head_dim)).astype(np.float32) * 3 for n in (n_head, n_head_kv, n_head_kv))
    norms = [cp.asarray(rng.random(head_dim).astype(np.float32) + 0.5) for _ in range(2)]
    pos = device_pos(cp, p0)
    results = []
    for fused in (False, True):
        q_dev, k_dev, v_dev = cp.asarray(q), cp.asarray(k), cp.asarray(v)
        caches = [cp.full((n_head_kv, max_ctx, head_dim), -7.0, dtype=cp.float16) for _ in range(2)]
        if fused:
            ops.rope_kv_write(q_dev, k_dev, v_dev, inv_freq, pos, True, *caches, head_norms=norms, eps=eps)
        else:
            for x, w in ((q_dev, norms[0]), (k_dev, norms[1])):
                ops.rms_norm(x, w, x, eps)
            ops.rope_kv_write(q_dev, k_dev, v_dev, inv_freq, pos, True, *caches)
        results.append([cp.asnumpy(a) for a in (q_dev, k_dev, *caches)])
    for separate, fused in zip(*results):  # fp16 caches: a float32 difference may flip one rounding
        rtol = 2e-3 if fused.dtype == np.float16 else 1e-5
        np.testing.assert_allclose(fused.astype(np.float32), separate.astype(np.float32), rtol=rtol, atol=1e-5)
    assert np.abs(results[1][0] - q).max() > 0.1  # normalized and rotated, not left as they were


@pytest.mark.parametrize("head_dim", [64, 256, 512])
@pytest.mark.parametrize("n_tok, p0", [(1, 77), (20, 200)])
def test_rope_kv_write_of_gemma4_v_from_k_and_q_alone(cuda, rng, head_dim, n_tok, p0):
    """gemma4's cases: v is k's array itself (no attn_v: v is k's projection before k's norm and rope) and normed per
    head with v_norm's weight, against v copied and normed by rms_norm first; and q alone (the KV-shared layers),
    against rms_norm then rope. q and k to float32 rounding, the caches to fp16's; the v cache must be v's norm, not
    the rotated k (what reading v after k's write would store): checked against that too."""
    cp, ops = cuda
    n_head, n_head_kv, max_ctx, eps, rope_dim = 8, 2, 256, 1e-6, head_dim // 4
    inv_freq = ops.rope_inv_freq(rope_dim, 1e6)
    q, k = (rng.standard_normal((n_tok, n, head_dim)).astype(np.float32) * 3 for n in (n_head, n_head_kv))
    norms = [cp.asarray(rng.random(head_dim).astype(np.float32) + 0.5) for _ in range(2)] + [cp.ones(head_dim, cp.float32)]
    pos = device_pos(cp, p0)
    q_dev, k_dev = cp.asarray(q), cp.asarray(k)
    caches = [cp.full((n_head_kv, max_ctx, head_dim), -7.0, dtype=cp.float16) for _ in range(2)]
    ops.rope_kv_write(q_dev, k_dev, k_dev, inv_freq, pos, True, *caches, head_norms=norms, eps=eps)
    q_ref, k_ref, v_ref = cp.asarray(q), cp.asarray(k), cp.asarray(k)
    ops.rms_norm(v_ref, norms[2], v_ref, eps)
    ref_caches = [cp.full((n_head_kv, max_ctx, head_dim), -7.0, dtype=cp.float16) for _ in range(2)]
    ops.rope_kv_write(q_ref, k_ref, v_ref, inv_freq, pos, True, *ref_caches, head_norms=norms[:2], eps=eps)
    for got, want in zip((q_dev, k_dev, *caches), (q_ref, k_ref, *ref_caches)):
        rtol = 2e-3 if want.dtype == cp.float16 else 1e-5  # fp16: a float32 difference may flip one rounding
        np.testing.assert_allclose(cp.asnumpy(got).astype(np.float32), cp.asnumpy(want).astype(np.float32), rtol=rtol,
                                   atol=1e-5)
    assert np.abs(cp.asnumpy(caches[1]).astype(np.float32) - cp.asnumpy(caches[0]).astype(np.float32)).max() > 0.1
    # q alone: no k, no caches
    q_alone, q_two = cp.asarray(q), cp.asarray(q)
    ops.rope_kv_write(q_alone, None, None, inv_freq, pos, True, None, None, head_norms=(norms[0], None, norms[2]),
                      eps=eps)
    ops.rms_norm(q_two, norms[0], q_two, eps)
    ops.rope(q_two, None, inv_freq, pos, True)
    np.testing.assert_allclose(cp.asnumpy(q_alone), cp.asnumpy(q_two), rtol=1e-5, atol=1e-5)
    assert np.abs(cp.asnumpy(q_alone) - q).max() > 0.1


@pytest.mark.parametrize("n_tok, p0", [(1, 4321), (9, 100), (40, 3000)])
def test_rope_kv_write_with_yarn_matches_cpu(cuda, rng, n_tok, p0):
    """gpt-oss's rope: YaRN's speeds (kernels/cpu/ops.yarn_inv_freq, its synthetic file's base and factor) and cos,
    sin times mscale, against the CPU's rope_kv_store from the same speeds: q to float32 rounding, k and v in the
    caches to fp16's; without mscale the q would be far off (the check can fail)."""
    from kernels.cpu import ops as cpu_ops
    cp, ops = cuda
    n_head, n_head_kv, head_dim, max_ctx, mscale = 8, 2, 64, 4400, 1 + 0.1 * math.log(32)
    inv_freq = cpu_ops.yarn_inv_freq(head_dim, 150000.0, 1 / 32, 4096)
    q, k, v = (rng.standard_normal((n_tok, n, head_dim)).astype(np.float32) for n in (n_head, n_head_kv, n_head_kv))
    q_dev, k_dev, v_dev = cp.asarray(q), cp.asarray(k), cp.asarray(v)
    caches = [cp.zeros((n_head_kv, max_ctx, head_dim), cp.float16) for _ in range(2)]
    ops.rope_kv_write(q_dev, k_dev, v_dev, cp.asarray(inv_freq), device_pos(cp, p0), True, *caches, mscale=mscale)
    cos, sin = (a * np.float32(mscale) for a in cpu_ops.rope_cos_sin(p0 + np.arange(n_tok), inv_freq))
    want = [np.zeros((n_head_kv, max_ctx, head_dim), np.float32) for _ in range(2)]
    want_q = cpu_ops.rope_kv_store(q, k, v, cos, sin, "neox", *want, p0)
    assert rel_err(cp.asnumpy(q_dev), want_q) < 1e-6
    for got, ref in zip(caches, want):
        np.testing.assert_allclose(cp.asnumpy(got).astype(np.float32), ref.astype(np.float16).astype(np.float32),
                                   rtol=2e-3, atol=1e-5)
    assert rel_err(cp.asnumpy(q_dev) / mscale, want_q) > 0.1


# ---- elementwise ----

@pytest.mark.parametrize("activation", ["silu", "gelu", "swiglu_oai"])
@pytest.mark.parametrize("shape", [(14336,), (5, 2048)], ids=lambda s: "x".join(map(str, s)))
def test_glu(cuda, rng, activation, shape):
    """expf / tanhf in float32 against float64 (gelu cancels in 1 + tanh for negative gate): bound 1e-5.
    swiglu_oai (gpt-oss) against kernels/cpu/ops.glu, its gate and up spread past the clamps at +-7."""
    from kernels.cpu.ops import glu as cpu_glu
    cp, ops = cuda
    gate = (rng.standard_normal(shape) * 4).astype(np.float32)
    up = (rng.standard_normal(shape) * (4 if activation == "swiglu_oai" else 1)).astype(np.float32)
    out = nan_like(cp, shape)
    ops.glu(cp.asarray(gate), cp.asarray(up), out, activation)
    g = gate.astype(np.float64)
    if activation == "swiglu_oai":
        ref = cpu_glu(gate, up, activation).astype(np.float64)
    else:
        act = g / (1 + np.exp(-g)) if activation == "silu" else \
            0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
        ref = act * up
    assert rel_err(cp.asnumpy(out), ref) < 1e-5
    out_q, xq = nan_like(cp, shape), poisoned_q8_1(cp, gate.size)
    ops.glu(cp.asarray(gate), cp.asarray(up), out_q, activation, xq=xq)
    np.testing.assert_array_equal(cp.asnumpy(out_q), cp.asnumpy(out))
    assert_same_q8_1(cp, xq, q8_1_of(cp, out))


def test_add_bias_softcap(cuda, rng):
    cp, ops = cuda
    a = rng.standard_normal((3, 4096)).astype(np.float32)
    b = rng.standard_normal((3, 4096)).astype(np.float32)
    out = nan_like(cp, (3, 4096))
    ops.add(cp.asarray(a), cp.asarray(b), out)
    np.testing.assert_array_equal(cp.asnumpy(out), a + b)
    bias = rng.standard_normal(4096).astype(np.float32)
    x, out = cp.asarray(a), nan_like(cp, (3, 4096))
    ops.add_bias(x, cp.asarray(bias), out)  # into out, x left as it was
    np.testing.assert_array_equal(cp.asnumpy(out), a + bias)
    np.testing.assert_array_equal(cp.asnumpy(x), a)
    ops.add_bias(x, cp.asarray(bias))  # in place
    np.testing.assert_array_equal(cp.asnumpy(x), a + bias)
    out = nan_like(cp, (3, 4096))
    ops.scale(cp.asarray(a), 0.7, out)  # gemma4's per-layer inputs and layer output scale
    np.testing.assert_array_equal(cp.asnumpy(out), a * np.float32(0.7))
    logits = (rng.standard_normal(262144) * 40).astype(np.float32)
    x = cp.asarray(logits)
    ops.softcap(x, 30.0)
    assert rel_err(cp.asnumpy(x), 30 * np.tanh(logits.astype(np.float64) / 30)) < 1e-6


# ---- choosing the next token ----

def sampler_buffers(cp, ops, p, n_hist=64, history=None):
    token = cp.full(1, -1, dtype=cp.int32)
    hist = cp.asarray(history if history is not None else np.full(n_hist, -1), dtype=cp.int32)
    return token, hist, device_pos(cp, p)


@pytest.mark.parametrize("n_vocab", [262144, 151936, 128256, 32000, 100])
def test_argmax_is_exact(cuda, rng, n_vocab):
    cp, ops = cuda
    logits = rng.standard_normal(n_vocab).astype(np.float32)
    best = int(rng.integers(n_vocab))
    logits[best] = 10.0
    logits[rng.integers(best, n_vocab)] = 10.0  # a tie: the smaller id wins, like np.argmax
    token, hist, pos = sampler_buffers(cp, ops, 70)
    ops.argmax(cp.asarray(logits), ops.argmax_scratch(), token, hist, pos)
    assert int(token[0]) == np.argmax(logits) == best
    assert int(pos[0]) == 71 and int(hist[71 % 64]) == best


@pytest.mark.parametrize("n_vocab", [248320, 128256, 100])
def test_argmax_rows_is_exact(cuda, rng, n_vocab):
    """A verify step's argmax of each row (speculative decoding's plain greedy), ties to the smaller id."""
    cp, ops = cuda
    logits = rng.standard_normal((5, n_vocab)).astype(np.float32)
    best = rng.integers(n_vocab, size=5)
    logits[np.arange(5), best] = 10.0
    logits[0, rng.integers(best[0], n_vocab)] = 10.0  # a tie: the smaller id wins, like np.argmax
    out = cp.full(5, -1, dtype=cp.int32)
    ops.argmax_rows(cp.asarray(logits), out)
    np.testing.assert_array_equal(cp.asnumpy(out), np.argmax(logits, axis=1))
    np.testing.assert_array_equal(cp.asnumpy(out), best)


def ref_candidates(logits, history, p, *, temperature, top_k, top_p, min_p, repeat_penalty, seed=None):
    """The sampler chain in float64: (token ids, probabilities) that the draw picks from (seed unused)."""
    x = logits.astype(np.float64).copy()
    recent = [history[(p - a) % len(history)] for a in range(min(len(history), p + 1))]
    for t in set(recent):
        x[t] = x[t] / repeat_penalty if x[t] > 0 else x[t] * repeat_penalty
    k = 64 if top_k <= 0 or top_k > 64 else top_k
    ids = np.lexsort((np.arange(len(x)), -x))[:k]  # largest first, smaller id on ties
    if temperature <= 0:
        return ids[:1], np.ones(1)
    w = np.exp(x[ids] - x[ids[0]])
    if top_p < 1:
        ids = ids[:min(int(np.searchsorted(np.cumsum(w / w.sum()), top_p)) + 1, len(ids))]
    w = np.exp(x[ids] - x[ids[0]])
    if min_p > 0:
        ids = ids[:max(1, int(np.count_nonzero(w >= min_p)))]
    w = np.exp((x[ids] - x[ids[0]]) / temperature)
    return ids, w / w.sum()


def set_params(cp, ops, **params):
    fparams, iparams = ops.sampling_params()
    ops.set_sampling_params(fparams, iparams, **params)
    return fparams, iparams


GREEDYISH = dict(temperature=0.8, top_k=1, top_p=0.95, min_p=0.05, repeat_penalty=1.0, seed=1)


@pytest.mark.parametrize("n_vocab", [262144, 151936, 32000])
def test_top_k_1_and_temperature_0_equal_argmax(cuda, rng, n_vocab):
    cp, ops = cuda
    logits = cp.asarray(rng.standard_normal(n_vocab).astype(np.float32) * 3)
    expected = int(cp.argmax(logits))
    for params in (GREEDYISH, dict(GREEDYISH, top_k=40, temperature=0.0)):
        token, hist, pos = sampler_buffers(cp, ops, 5)
        ops.sample(logits, ops.sample_scratch(n_vocab), *set_params(cp, ops, **params), token, hist, pos)
        assert int(token[0]) == expected and int(pos[0]) == 6 and int(hist[6]) == expected


@pytest.mark.parametrize("case", ["applied", "once_per_token", "negative"])
def test_repetition_penalty(cuda, rng, case):
    """Greedy after a penalty of 2: a history token A against a fresh token C. applied: A 5 -> 2.5 loses to
    C 3; once_per_token: A twice in the history still 2.5, beats C 2; negative: A -1 -> -2 loses to C -1.5."""
    cp, ops = cuda
    n_vocab, p = 151936, 130
    a, c = rng.choice(n_vocab, 2, replace=False)
    if case == "negative":
        logits = (rng.standard_normal(n_vocab) * 0.1 - 10).astype(np.float32)
    else:
        logits = (rng.standard_normal(n_vocab) * 0.3).astype(np.float32)
    logits[a], logits[c], winner = {"applied": (5.0, 3.0, c), "once_per_token": (5.0, 2.0, a),
                                    "negative": (-1.0, -1.5, c)}[case]
    history = rng.integers(0, n_vocab, 64).astype(np.int32)
    history[history == c] = a
    history[p % 64] = history[(p - 5) % 64] = a
    params = dict(GREEDYISH, repeat_penalty=2.0)
    assert ref_candidates(logits, history, p, **params)[0][0] == winner
    token, hist, pos = sampler_buffers(cp, ops, p, history=history)
    ops.sample(cp.asarray(logits), ops.sample_scratch(n_vocab), *set_params(cp, ops, **params), token, hist, pos)
    assert int(token[0]) == winner


def draw(cp, ops, logits, params, p, n, history=None):
    """n tokens drawn at positions p, p+1, ... with the history reset before each draw."""
    n_vocab = logits.size
    scratch = ops.sample_scratch(n_vocab)
    fparams, iparams = set_params(cp, ops, **params)
    token, hist, pos = sampler_buffers(cp, ops, p, history=history)
    hist0 = hist.copy()
    tokens = cp.empty(n, dtype=cp.int32)
    for i in range(n):
        hist[...] = hist0
        ops.sample(logits, scratch, fparams, iparams, token, hist, pos)
        tokens[i:i + 1] = token
    assert int(pos[0]) == p + n
    return cp.asnumpy(tokens)


def test_rng_is_repeatable_for_a_seed(cuda, rng):
    cp, ops = cuda
    logits = cp.asarray(rng.standard_normal(32000).astype(np.float32))
    params = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, seed=1234)
    a = draw(cp, ops, logits, params, 10, 50)
    b = draw(cp, ops, logits, params, 10, 50)
    c = draw(cp, ops, logits, dict(params, seed=99), 10, 50)
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()
    assert len(set(a.tolist())) > 10  # 64 near-equal candidates: the draws spread


@pytest.mark.parametrize("params", [
    dict(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.0, seed=7),
    dict(temperature=1.3, top_k=0, top_p=0.8, min_p=0.0, repeat_penalty=1.0, seed=8),
    dict(temperature=1.0, top_k=20, top_p=1.0, min_p=0.1, repeat_penalty=1.3, seed=9),
], ids=["default", "top_p", "min_p_penalty"])
def test_sample_frequencies_match_reference(cuda, rng, params):
    """4000 draws: never a token outside the reference's candidates, and a chi-square statistic within
    6 standard deviations of its mean (a wrong filter or temperature moves it by hundreds)."""
    cp, ops = cuda
    n_vocab, n, p = 5000, 4000, 100
    logits = (rng.standard_normal(n_vocab) * 2).astype(np.float32)
    history = rng.integers(0, n_vocab, 64).astype(np.int32)
    history[:8] = np.argsort(-logits)[:8]  # the penalty hits likely tokens
    ids, probs = ref_candidates(logits, history, p + 63, **params)  # the first draw's history window
    tokens = draw(cp, ops, cp.asarray(logits), params, p + 63, n, history)
    assert set(tokens.tolist()) <= set(ids.tolist())
    counts = np.array([(tokens == t).sum() for t in ids])
    expected = probs * n
    keep = expected >= 5
    chi2 = ((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum() + \
        (counts[~keep].sum() - expected[~keep].sum()) ** 2 / max(expected[~keep].sum(), 1)
    dof = keep.sum()
    assert chi2 < dof + 6 * math.sqrt(2 * dof) + 10, f"chi2 {chi2:.1f} with {dof} bins"


def test_masked_logits_sample_only_allowed_tokens(cuda, rng):
    """mask_logits leaves the allowed tokens' logits as they are and the others -inf; after it, argmax picks the
    best allowed token and sample() draws only allowed ones, even where fewer than its 64 candidates are allowed
    (the rest of its candidates are -inf) and with the repetition penalty on."""
    cp, ops = cuda
    n_vocab = 40000  # not a multiple of 32: the last word's high bits name no token
    logits = rng.standard_normal(n_vocab).astype(np.float32) * 3
    allowed = np.zeros(n_vocab, bool)
    allowed[rng.choice(n_vocab, 7, replace=False)] = True
    words = np.packbits(np.pad(allowed, (0, -n_vocab % 32)), bitorder="little").view(np.uint32)
    masked = cp.asarray(logits)
    ops.mask_logits(masked, cp.asarray(words))
    out = cp.asnumpy(masked)
    assert np.array_equal(out[allowed], logits[allowed]) and np.all(out[~allowed] == -np.inf)
    token, hist, pos = sampler_buffers(cp, ops, 70)
    ops.argmax(masked, ops.argmax_scratch(), token, hist, pos)
    assert int(token[0]) == np.flatnonzero(allowed)[np.argmax(logits[allowed])]
    params = dict(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.3, seed=7)
    tokens = draw(cp, ops, masked, params, 100, 400, rng.choice(np.flatnonzero(allowed), 64).astype(np.int32))
    assert set(tokens.tolist()) <= set(np.flatnonzero(allowed).tolist()) and len(set(tokens.tolist())) > 1


# ---- one decode step captured as a graph ----

def test_decode_chain_captures_and_replays(cuda, rng):
    """embed -> rms_norm -> rope -> kv_write -> attention -> add -> sampler, captured once: 3 replays give
    the same tokens and outputs as 3 eager steps, and advance pos by 3."""
    cp, ops = cuda
    from kernels.cuda.quant import to_device

    n_vocab, n_embd, n_head, n_head_kv, head_dim, max_ctx, p0 = 512, 256, 4, 2, 64, 64, 5
    qtype = TYPES_BY_NAME["Q8_0"]
    table = to_device(random_weight_bytes(qtype, n_vocab, n_embd, seed=int(rng.integers(1 << 31))), qtype)
    w1, w2 = (cp.asarray(rng.standard_normal(n_embd).astype(np.float32)) for _ in range(2))
    inv_freq = cp.asarray(1e4 ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    k0 = (rng.standard_normal((n_head_kv, max_ctx, head_dim))).astype(np.float16)
    v0 = (rng.standard_normal((n_head_kv, max_ctx, head_dim))).astype(np.float16)
    x, h, h2, att, logits = (cp.empty(n, dtype=cp.float32) for n in (n_embd, n_embd, n_embd, n_embd, n_embd))
    k_cache, v_cache = ops.kv_cache(n_head_kv, max_ctx, head_dim)
    scratch = ops.decode_scratch(n_head, n_head_kv, head_dim)
    cand = ops.sample_scratch(n_embd)
    fparams, iparams = set_params(cp, ops, temperature=0.9, top_k=10, top_p=0.95, min_p=0.0,
                                  repeat_penalty=1.1, seed=3)
    token, hist, pos = sampler_buffers(cp, ops, p0)
    stream = cp.cuda.Stream(non_blocking=True)

    def reset():
        k_cache.set(k0, stream=stream)
        v_cache.set(v0, stream=stream)
        token.set(np.array([7], dtype=np.int32), stream=stream)
        hist.set(np.arange(64, dtype=np.int32), stream=stream)
        pos.set(np.array([p0], dtype=np.int32), stream=stream)

    def step():
        ops.embed(table, token, x.reshape(1, n_embd), 16.0, stream)
        ops.rms_norm(x, w1, h, 1e-6, stream=stream)
        ops.rms_norm(x, w2, h2, 1e-6, stream=stream)
        q, k, v = h.reshape(1, n_head, head_dim), h2[:128].reshape(1, n_head_kv, head_dim), \
            x[:128].reshape(1, n_head_kv, head_dim)
        ops.rope(q, k, inv_freq, pos, True, stream)
        ops.kv_write(k, v, k_cache, v_cache, pos, stream)
        ops.attention_decode(q[0], k_cache, v_cache, att.reshape(n_head, head_dim), pos, scratch, 0.125,
                             stream=stream)
        ops.add(att, x, logits, stream)
        ops.sample(logits, cand, fparams, iparams, token, hist, pos, stream)

    def run(launch):
        reset()
        tokens, outs = [], []
        for _ in range(3):
            launch()
            stream.synchronize()
            tokens.append(int(token[0]))
            outs.append(cp.asnumpy(logits))
        return tokens, outs, cp.asnumpy(k_cache), int(pos[0])

    with stream:
        eager = run(step)
        stream.begin_capture()
        step()
        graph = stream.end_capture()
        replayed = run(lambda: graph.launch(stream))
    assert eager[0] == replayed[0]
    for a, b in zip(eager[1], replayed[1]):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(eager[2], replayed[2])
    assert eager[3] == replayed[3] == p0 + 3
    assert np.isfinite(eager[1]).all()


def test_bad_inputs_raise(cuda):
    cp, ops = cuda
    x = cp.zeros((2, 64), dtype=cp.float32)
    with pytest.raises(ValueError, match="out must be"):
        ops.rms_norm(x, cp.ones(64, dtype=cp.float32), cp.zeros((2, 63), dtype=cp.float32), 1e-6)
    with pytest.raises(ValueError, match="pos must be"):
        ops.rope(x.reshape(2, 1, 64), None, cp.ones(32), cp.zeros(1, dtype=cp.int64), False)
    k_cache, v_cache = ops.kv_cache(2, 16, 96)
    with pytest.raises(ValueError, match="head_dim 96"):
        ops.attention_prefill(cp.zeros((1, 4, 96), dtype=cp.float32), k_cache, v_cache,
                              cp.zeros((1, 4, 96), dtype=cp.float32), cp.zeros(1, dtype=cp.int32), 0.1)
    q, scratch = cp.zeros((3, 4, 64), dtype=cp.float32), ops.decode_scratch(4, 2, 64, n_tok=2)
    k_cache, v_cache = ops.kv_cache(2, 16, 64)
    with pytest.raises(ValueError, match="scratch must have rows for 3 tokens"):
        ops.attention_decode(q, k_cache, v_cache, cp.zeros_like(q), cp.zeros(1, dtype=cp.int32), scratch, 0.1)
    with pytest.raises(ValueError, match="out must be"):
        ops.attention_decode(q[:2], k_cache, v_cache, q[0], cp.zeros(1, dtype=cp.int32), scratch, 0.1)
    with pytest.raises(ValueError, match="vocabularies up to"):
        ops.sample_scratch(300000)
    with pytest.raises(ValueError, match="activation"):
        ops.glu(x, x, x, "relu")
    with pytest.raises(ValueError, match="xq.qs"):
        ops.rms_norm(x, cp.ones(64, dtype=cp.float32), x, 1e-6, xq=poisoned_q8_1(cp, 64))  # 128 values
    with pytest.raises(ValueError, match="no residual"):
        ops.rms_norm(x, cp.ones(64, dtype=cp.float32), x, 1e-6, residual=x, xq=poisoned_q8_1(cp, 128))
    with pytest.raises(ValueError, match="xq.qs"):
        ops.glu(x, x, x, "silu", xq=poisoned_q8_1(cp, 64))  # 128 values
