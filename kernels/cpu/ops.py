"""The non-matmul ops of a transformer on the CPU, over float32 numpy arrays (no model knowledge).

Small fused numba loops: during generation each op works on a few hundred numbers, where numpy's
per-call overhead (a dozen temporaries per op) would cost more than the arithmetic. Attention has a module of its
own (attention.py).
"""
import math

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

import kernels.cpu.types  # noqa: F401  (numba's cache saves serialized: kernels/cpu/cache.py)

_jit = nb.njit(cache=True, nogil=True)
# From this many values (a prompt's rows) GLU runs on all cores; below (decode), on one: a parallel region of scalar
# math.exp right after a matmul's cost more than the work (llama-1b's 8192 values on 2 cores 116-160 us, numpy's
# SIMD exp 30-66 us, median), and numpy's five passes and temporaries cost more than one numba loop on a decode
# step's few thousand values (SmolLM2's 1536 on the AVX2 2-core VM: 21 -> 12 us).
GLU_PARALLEL_SIZE = 1 << 16


@nb.njit(cache=True, nogil=True, fastmath=True)  # fastmath: the sum of squares vectorizes (strict order did not)
def _rms_norm(x, weight, eps, out):  # x, out [rows, d]
    for r in range(x.shape[0]):
        ss = 0.0
        for j in range(x.shape[1]):
            ss += x[r, j] * x[r, j]
        scale = np.float32(1.0 / math.sqrt(ss / x.shape[1] + eps))
        for j in range(x.shape[1]):
            out[r, j] = x[r, j] * scale * weight[j]


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x [..., d] normalised over its last axis, times weight [d]."""
    if x.ndim == 2 and x.dtype == np.float32 and x.flags.c_contiguous:  # the common case without a reshape or a copy:
        out = np.empty(x.shape, np.float32)  # each numpy call costs ~1 us on the 2-core VM, the kernel 1.3 (576 values)
        _rms_norm(x, weight, eps, out)
        return out
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(x)
    _rms_norm(x.reshape(-1, x.shape[-1]), weight, eps, out.reshape(-1, x.shape[-1]))
    return out


def rope_inv_freq(rope_dim: int, base: float, freq_factors: np.ndarray | None = None) -> np.ndarray:
    """The rotation speed of each pair of dims: [rope_dim // 2] float64."""
    inv = base ** (-np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)
    return inv / freq_factors if freq_factors is not None else inv


def yarn_inv_freq(rope_dim: int, base: float, freq_scale: float, n_ctx_orig: int, beta_fast: float = 32.0,
                  beta_slow: float = 1.0) -> np.ndarray:
    """YaRN's rotation speeds [rope_dim // 2] float64, as llama.cpp's rope (ggml rope_yarn, ext_factor 1): pair i
    turns at theta_i = base^(-2i / rope_dim) blended from freq_scale * theta_i (interpolated) to theta_i
    (extrapolated) by a ramp that is 1 below the pair that turns beta_fast times over n_ctx_orig tokens and 0
    above the one that turns beta_slow times (those pairs floored and ceiled, as ggml_rope_yarn_corr_dims). cos
    and sin are scaled apart (ModelConfig.rope_mscale)."""
    def corr_dim(beta: float) -> float:  # the pair that turns beta times over n_ctx_orig tokens
        return rope_dim * math.log(n_ctx_orig / (beta * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = max(0.0, math.floor(corr_dim(beta_fast))), min(rope_dim - 1.0, math.ceil(corr_dim(beta_slow)))
    ramp = 1 - np.clip((np.arange(rope_dim // 2) - lo) / max(0.001, hi - lo), 0, 1)
    return rope_inv_freq(rope_dim, base) * (freq_scale * (1 - ramp) + ramp)


def rope_cos_sin(positions: np.ndarray, inv_freq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin, float32 [n, len(inv_freq)], of the angles positions x inv_freq (in float64). A forward pass
    computes them once per rope base and uses them in every layer's q and k (see rope_rotate)."""
    theta = np.asarray(positions, np.float64)[:, None] * inv_freq[None, :]
    return np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)


@_jit
def _rotate_into(x, cos, sin, neox, out):  # x, out [head_dim]; cos, sin [half]
    half = cos.shape[0]
    for i in range(2 * half, x.shape[0]):
        out[i] = x[i]
    for i in range(half):
        c, s = cos[i], sin[i]
        a, b = (i, i + half) if neox else (2 * i, 2 * i + 1)
        x0, x1 = x[a], x[b]
        out[a] = x0 * c - x1 * s
        out[b] = x0 * s + x1 * c


@_jit
def _rope_rotate(x, cos, sin, neox, out):  # x, out [n, heads, head_dim]; cos, sin [n, half]
    for t in range(x.shape[0]):
        for h in range(x.shape[1]):
            _rotate_into(x[t, h], cos[t], sin[t], neox, out[t, h])


def rope_rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, style: str) -> np.ndarray:
    """Rotate x [n, heads, head_dim] by the angles of rope_cos_sin. style "normal": pairs (2i, 2i+1); "neox":
    (i, i + half). Only the first 2 * cos.shape[1] dims of each head rotate; the rest pass through."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(x)
    _rope_rotate(x, cos, sin, style == "neox", out)
    return out


@_jit
def _rope_kv_store(q, k, v, cos, sin, neox, k_cache, v_cache, pos, q_out):
    slots = k_cache.shape[1]  # a ring's (see rope_kv_store): position p in slot p % slots; else p < slots
    for t in range(q.shape[0]):
        for h in range(q.shape[1]):
            _rotate_into(q[t, h], cos[t], sin[t], neox, q_out[t, h])
        for h in range(k.shape[1]):
            _rotate_into(k[t, h], cos[t], sin[t], neox, k_cache[h, (pos + t) % slots])
            for d in range(v.shape[2]):  # a loop: a slice assignment compiles numba's shape-mismatch message (~4 s)
                v_cache[h, (pos + t) % slots, d] = v[t, h, d]


def rope_kv_store(q: np.ndarray, k: np.ndarray, v: np.ndarray, cos: np.ndarray, sin: np.ndarray, style: str,
                  k_cache: np.ndarray, v_cache: np.ndarray, pos: int, ring: bool = False) -> np.ndarray:
    """q and k [n, heads, head_dim] rotated as rope_rotate does (_rotate_into: the same floats), k into
    k_cache [n_kv, n_ctx, head_dim] at positions pos..pos+n-1 and v [n, n_kv, vd] into v_cache, in one call;
    returns the rotated q. A decode step's rope of q, of k and the two cache writes were four calls and three
    copies. ring: the caches are rings of a sliding window (position p in slot p % their length, which must hold
    the n new positions), where a cache of the whole context must hold position pos + n - 1."""
    (n, _, d), (n_k, h_k, d_k), (n_v, h_v, d_v) = q.shape, k.shape, v.shape
    (h_kc, t_kc, d_kc), (h_vc, t_vc, d_vc), (n_c, half) = k_cache.shape, v_cache.shape, cos.shape
    end = n if ring else pos + n
    if not (n == n_k == n_v == n_c and h_k == h_kc and d == d_k == d_kc and h_v == h_vc and d_v == d_vc
            and 0 <= pos and end <= t_kc and t_kc == t_vc and sin.shape == cos.shape and 2 * half <= d):
        raise ValueError(f"rope_kv_store: q {q.shape}, k {k.shape}, v {v.shape} at {pos} do not fit the caches "
                         f"{k_cache.shape}, {v_cache.shape} or cos {cos.shape}")
    q_out = np.empty(q.shape, np.float32)
    _rope_kv_store(np.ascontiguousarray(q, np.float32), np.ascontiguousarray(k, np.float32),
                   np.ascontiguousarray(v, np.float32), cos, sin, style == "neox", k_cache, v_cache, pos, q_out)
    return q_out


def rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray, style: str) -> np.ndarray:
    """Rotate x [n, heads, head_dim] by position (see rope_rotate)."""
    return rope_rotate(x, *rope_cos_sin(positions, inv_freq), style)


@intrinsic
def _f32_of_bits(typingctx, bits):
    """The float32 whose IEEE bits are the int32 bits."""
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


@nb.njit(inline="always")
def exp_f32(x):
    """e^x in float32 to ~1e-7 relative (x clamped to [-87.3, 88.3]) by arithmetic alone, so loops of it vectorize:
    Cephes' expf, the form of ggml's SIMD exp (ggml_v_expf) that llama.cpp's softmax and silu use. numba's math.exp
    is a libm call a value (no SVML in pip's llvmlite): a prompt's silu of 128 x 2816 values took 464 us on 2 cores,
    this 34. Inlined (numba IR), it takes its caller's flags: callers that must agree bit for bit share them."""
    x = min(max(x, np.float32(-87.3)), np.float32(88.3))
    n = np.floor(x * np.float32(1.44269504) + np.float32(0.5))  # x = n ln 2 + r, |r| <= ln 2 / 2
    r = x - n * np.float32(0.693359375) + n * np.float32(2.12194440e-4)
    p = np.float32(1.9875691500e-4) * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    return (p * r * r + r + np.float32(1.0)) * _f32_of_bits((np.int32(n) + np.int32(127)) << np.int32(23))


# gelu (tanh form) by linear interpolation in a table over [-10, 10]: math.tanh does not vectorize, and cost
# Gemma 3's prompt a fifth of its time; the table's error (~1e-8, plus float32 rounding of the position,
# ~1e-6) is below llama.cpp's, which looks gelu up at x rounded to float16. Outside: gelu(x) = x above 10
# and 0 below -10, to float32 precision.
GELU_LO, GELU_HI, GELU_STEPS = -10.0, 10.0, 1 << 16


def _gelu_table() -> np.ndarray:
    x = np.linspace(GELU_LO, GELU_HI, GELU_STEPS + 1)
    return (0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))).astype(np.float32)


GELU_TABLE = _gelu_table()


@nb.njit(inline="always")
def _silu_glu(g, u):
    return (g / (np.float32(1.0) + exp_f32(-g)) if g > np.float32(-80.0) else np.float32(0.0)) * u


# error_model "numpy" here and in _glu_serial: numba's default checks each division for a zero, a branch that kept
# silu's loop from vectorizing (a token's 2816 values 14 us; deltanet.py's conv measured it: 3.2 ms -> 0.2 for 786k)
@nb.njit(cache=True, nogil=True, error_model="numpy")
def _glu_one(g, u, gelu, table):
    if gelu:
        t = min(max((g - np.float32(GELU_LO)) * np.float32(GELU_STEPS / (GELU_HI - GELU_LO)), np.float32(0.0)),
                np.float32(GELU_STEPS))
        i = min(int(t), GELU_STEPS - 1)
        y = table[i] + (t - np.float32(i)) * (table[i + 1] - table[i])
        return (g if g >= np.float32(GELU_HI) else y) * u
    return _silu_glu(g, u)


# Compiled here, under its own flags: left to its first caller, a fastmath parallel one (matvec's glu kernels, or
# test_cpu_regions' fresh copy of one) compiled it with fastmath, numba cached that, and every caller after it
# took that variant (gemma3's logits moved by up to 1 and test_parity failed in a fresh checkout).
_glu_one.compile("float32(float32, float32, boolean, float32[::1])")


# silu's loops inline _silu_glu, so they vectorize; without fastmath, as _glu_one, whose values they must equal
# (a decode step's fused GLU calls _glu_one)
@nb.njit(cache=True, nogil=True, parallel=True)
def _glu_parallel(gate, up, gelu, table, out):
    if gelu:
        for j in nb.prange(gate.shape[0]):
            out[j] = _glu_one(gate[j], up[j], gelu, table)
    else:
        for j in nb.prange(gate.shape[0]):
            out[j] = _silu_glu(gate[j], up[j])


@nb.njit(cache=True, nogil=True, error_model="numpy")
def _glu_serial(gate, up, gelu, table, out):
    if gelu:
        for j in range(gate.shape[0]):
            out[j] = _glu_one(gate[j], up[j], gelu, table)
    else:
        for j in range(gate.shape[0]):
            out[j] = _silu_glu(gate[j], up[j])


# gpt-oss's GLU (llama.cpp's ggml_swiglu_oai with the alpha and limit its openai-moe graph passes)
SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT = np.float32(1.702), np.float32(7.0)
# an activation's code in kernels that take any of the three (matvec.expert_ffn_int8)
ACTIVATIONS = {"silu": 0, "gelu": 1, "swiglu_oai": 2}


@nb.njit(cache=True, nogil=True)
def _glu_act(g, u, act, table):
    """glu's value of one gate g and up u for the activation code act (ACTIVATIONS): swiglu_oai as its numpy
    form computes it, to float32 rounding; silu and gelu _glu_one's."""
    if act == 2:
        g = min(g, SWIGLU_OAI_LIMIT)
        u = min(max(u, -SWIGLU_OAI_LIMIT), SWIGLU_OAI_LIMIT)
        return g / (np.float32(1.0) + np.float32(math.exp(SWIGLU_OAI_ALPHA * -g))) * (u + np.float32(1.0))
    return _glu_one(g, u, act == 1, table)


def swiglu_oai(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """g * sigmoid(alpha g) * (u + 1) with g = min(gate, limit), u = up clamped to [-limit, limit], float32 as
    ggml computes it (g / (1 + exp(-alpha g)), times u + 1)."""
    g = np.minimum(np.asarray(gate, np.float32), SWIGLU_OAI_LIMIT)
    u = np.clip(np.asarray(up, np.float32), -SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT)
    return g / (np.float32(1.0) + np.exp(SWIGLU_OAI_ALPHA * -g)) * (u + np.float32(1.0))


def glu(gate: np.ndarray, up: np.ndarray, activation: str) -> np.ndarray:
    """activation(gate) * up, both [n, n_ff]; activation "silu", "gelu" (tanh approximation) or "swiglu_oai"."""
    if activation == "swiglu_oai":
        return swiglu_oai(gate, up)
    gate, up = np.ascontiguousarray(gate, np.float32), np.ascontiguousarray(up, np.float32)
    out = np.empty_like(gate)
    glu_fn = _glu_serial if gate.size < GLU_PARALLEL_SIZE else _glu_parallel
    glu_fn(gate.reshape(-1), up.reshape(-1), activation == "gelu", GELU_TABLE, out.reshape(-1))
    return out


def route(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """A mixture of experts' routing, as llama.cpp's (softmax gating, weights renormalized): logits [n, n_expert]
    -> (ids int32 [n, k], weights float32 [n, k]), per token the k most probable experts, most probable first,
    and their probabilities divided by their sum. Ties go to the lower id, as the GPU kernel's. That is a softmax
    over the k chosen logits: gpt-oss's routing (llama.cpp's SOFTMAX_WEIGHT gating) too."""
    logits = np.asarray(logits, np.float32)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    ids = np.argsort(-p, axis=1, kind="stable")[:, :k].astype(np.int32)
    w = np.take_along_axis(p, ids, axis=1)
    return ids, (w / w.sum(axis=1, keepdims=True)).astype(np.float32)


@nb.njit(cache=True, nogil=True, parallel=True)
def _parallel_copy(src, dst, n_chunks):
    n = src.size
    for c in nb.prange(n_chunks):
        dst[c * n // n_chunks:(c + 1) * n // n_chunks] = src[c * n // n_chunks:(c + 1) * n // n_chunks]


def parallel_copy(src: np.ndarray, dst: np.ndarray) -> None:
    """dst[:] = src for 1-D uint8 arrays, by all cores: one core copies from a file's cached pages at a fraction
    of the memory's rate (a weight on its way to pinned memory and the GPU)."""
    if src.shape != dst.shape or src.dtype != np.uint8 or dst.dtype != np.uint8:
        raise ValueError(f"parallel_copy: two uint8 arrays of one shape, got {src.dtype} {src.shape}, {dst.dtype} {dst.shape}")
    _parallel_copy(src, dst, max(1, min(256, src.size >> 20)))  # chunks of >= 1 MiB
