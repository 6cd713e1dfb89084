"""The Gated DeltaNet mixer's ops on the CPU (numba, numpy BLAS for prompts), float32.

A DeltaNet layer (qwen35's recurrent layers) mixes tokens through two states it carries from token to token:
  conv state  [K - 1, C]   the last K - 1 inputs of each of the C channels (a causal depthwise conv of K taps)
  delta state [Hv, S, S]   per value head h the matrix S_h, stored transposed: state[h, j, i] = S_h[i][j]
                           (i: key index, j: value index), as llama.cpp stores it
tests/kernels/deltanet_reference.py defines the ops in float64; these kernels are held to it.

conv_silu: y = silu(conv(x)) (its taps transposed, conv_taps). delta_rule: per token, q and k of each key head L2-normed, decay
g = softplus(alpha + dt_bias) * a, write strength b = sigmoid(beta), and for value head h (which reads key head
h % Hk): S_h = exp(g) S_h; S_h += k (b (v - S_h^T k))^T; o = S_h^T q / sqrt(S); then the gated norm
rms_norm(o) * norm_w * silu(z). Tokens run as a numba loop, heads in parallel, each state read twice a token,
prompts too: on the 2-core VM the loop ran 0.8B-like shapes (16 heads of 128) faster at every length than the
chunked form in numpy BLAS (the GPU prompt kernel's algorithm, now tests/kernels/deltanet_reference.py's
delta_rule_chunked): 128 tokens a layer 40-45 ms against 70-268 ms, 512 tokens 123-166 against 345-685 (2026-11-27).
"""
import math

import numba as nb
import numpy as np

import kernels.cpu.types  # noqa: F401  (numba's cache saves serialized: kernels/cpu/cache.py)
from kernels.cpu.ops import exp_f32

# numba's cache keys these kernels on this file alone: kernels/cpu/cache.py says how edits to the modules they
# inline reach them (INLINED, INLINED_DIGEST, checked by tests/kernels/test_cpu_cache.py)
INLINED = ("types", "ops")
INLINED_DIGEST = "1d71873eabac9fbf"


# error_model "numpy": numba's default ("python") checks every division for a zero, a branch that keeps a loop from
# vectorizing (silu of 786k values: 3.2 ms, 0.13 ms without the check)
@nb.njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
def _conv_silu(x, state, taps, y):  # x, y [n, C]; state [K - 1, C]; taps [K, C]
    """A token's channels a tap at a time: rows of taps and inputs, so each loop vectorizes over the channels (a
    channel at a time, with a branch a tap and libm's exp a value, took 5.3 ms for 128 tokens of 6144 channels)."""
    n, C = x.shape
    K = taps.shape[0]
    for t in range(n):
        yt, xt, now = y[t], x[t], taps[K - 1]
        for c in range(C):
            yt[c] = xt[c] * now[c]
        for j in range(K - 1):  # input t - (K - 1) + j: from the state while it is before x
            src = t - (K - 1) + j
            row = x[src] if src >= 0 else state[src + K - 1]
            tap = taps[j]
            for c in range(C):
                yt[c] += row[c] * tap[c]
        for c in range(C):
            yt[c] = yt[c] / (np.float32(1.0) + exp_f32(-yt[c]))
    # the new state: the last K - 1 inputs, the old state's rows where x has fewer
    for j in range(K - 1):
        src = n - (K - 1) + j
        if src >= 0:
            state[j, :] = x[src]
        else:
            state[j, :] = state[j + n, :]  # rows move up by n: row j + n is read before it is written


def conv_silu(x: np.ndarray, state: np.ndarray, taps: np.ndarray) -> np.ndarray:
    """silu of the causal depthwise conv of x [n, C] with taps [K, C] (ssm_conv1d's [C, K] transposed, conv_taps;
    the last for the current token) over the state [K - 1, C] (the inputs before x, oldest first) and x; the state
    moves on to x's end, in place."""
    n, C = x.shape
    if state.shape != (taps.shape[0] - 1, C) or taps.shape[1] != C or state.dtype != np.float32:
        raise ValueError(f"conv_silu: x {x.shape}, state {state.dtype} {state.shape}, taps {taps.shape} do not fit")
    y = np.empty((n, C), np.float32)
    _conv_silu(np.ascontiguousarray(x, np.float32), state, np.ascontiguousarray(taps, np.float32), y)
    return y


def conv_taps(w: np.ndarray) -> np.ndarray:
    """conv_silu's taps [K, C] of ssm_conv1d's w [C, K]: a copy (98 KB for 6144 channels), made once a layer."""
    return np.ascontiguousarray(w.T, np.float32)


@nb.njit(cache=True, nogil=True, fastmath=True)
def _l2_normed(x, eps, out):  # x, out [S]
    ss = 0.0
    for i in range(x.shape[0]):
        ss += x[i] * x[i]
    r = 1.0 / math.sqrt(ss + eps)
    for i in range(x.shape[0]):
        out[i] = x[i] * r


@nb.njit(cache=True, nogil=True, fastmath=True)
def _gates(alpha, beta, dt_bias, a):
    """(decay factor exp(g), write strength b) of one token and head."""
    x = alpha + dt_bias
    sp = x if x > 20.0 else math.log1p(math.exp(x))  # softplus as ggml's
    return math.exp(sp * a), 1.0 / (1.0 + math.exp(-beta))


@nb.njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
def _gated_norm(o, z, weight, eps, out):  # o, z, out [S]: rms_norm(o) * weight * silu(z)
    ss = 0.0
    for j in range(o.shape[0]):
        ss += o[j] * o[j]
    r = np.float32(1.0 / math.sqrt(ss / o.shape[0] + eps))
    for j in range(o.shape[0]):
        out[j] = o[j] * r * weight[j] * (z[j] / (np.float32(1.0) + exp_f32(-z[j])))


@nb.njit(cache=True, nogil=True, fastmath=True, parallel=True, error_model="numpy")
def _delta_rule_tokens(y, alpha, beta, dt_bias, a, z, norm_w, state, n_k, eps, out, snapshots):
    """Token by token: y [n, C], alpha, beta [n, Hv], z, out [n, Hv * S], state [Hv, S, S]; snapshots [m, Hv, S, S]
    the state after each of the first m <= n tokens (m = 0: none). Heads in parallel."""
    n = y.shape[0]
    Hv, S = state.shape[0], state.shape[1]
    scale = 1.0 / math.sqrt(S)
    for h in nb.prange(Hv):
        kh = h % n_k  # the converter tiles value heads over key heads (llama.cpp: iq1 = iv1 % neq1)
        q = np.empty(S, np.float32)
        k = np.empty(S, np.float32)
        d = np.empty(S, np.float32)
        o = np.empty(S, np.float32)
        M = state[h]
        for t in range(n):
            _l2_normed(y[t, kh * S:(kh + 1) * S], eps, q)
            _l2_normed(y[t, (n_k + kh) * S:(n_k + kh + 1) * S], eps, k)
            v = y[t, (2 * n_k + h) * S:(2 * n_k + h + 1) * S]
            decay, b = _gates(alpha[t, h], beta[t, h], dt_bias[h], a[h])
            for j in range(S):  # decay the state and read it with k: d = b (v - S^T k)
                acc = 0.0
                for i in range(S):
                    M[j, i] *= decay
                    acc += M[j, i] * k[i]
                d[j] = b * (v[j] - acc)
            for j in range(S):  # write k d^T and read the new state with q
                acc = 0.0
                for i in range(S):
                    M[j, i] += d[j] * k[i]
                    acc += M[j, i] * q[i]
                o[j] = acc * scale
            _gated_norm(o, z[t, h * S:(h + 1) * S], norm_w, eps, out[t, h * S:(h + 1) * S])
            if t < snapshots.shape[0]:
                snapshots[t, h] = M


def delta_rule(y: np.ndarray, alpha: np.ndarray, beta: np.ndarray, dt_bias: np.ndarray, a: np.ndarray,
               z: np.ndarray, norm_w: np.ndarray, state: np.ndarray, n_k_heads: int, eps: float,
               snapshots: np.ndarray | None = None) -> np.ndarray:
    """The delta rule and the gated norm (module doc) of the conv's output y [n, C] (C = (2 Hk + Hv) S: q, k,
    v heads), alpha, beta [n, Hv] (the projections), dt_bias, a [Hv], z [n, Hv * S], norm_w [S], over the
    state [Hv, S, S] (moved on in place): out [n, Hv * S]. snapshots: float32 [m, Hv, S, S] that takes the state
    after each of the first m <= n tokens (a verify step's, for a rewind)."""
    n, C = y.shape
    Hv, S = state.shape[0], state.shape[2]
    if snapshots is None:
        snapshots = np.empty((0, Hv, S, S), np.float32)
    elif (snapshots.shape[0] > n or snapshots.shape[1:] != (Hv, S, S) or snapshots.dtype != np.float32
          or not snapshots.flags.c_contiguous):
        raise ValueError(f"delta_rule: snapshots {snapshots.dtype} {snapshots.shape} for {n} tokens of {Hv} heads")
    if (state.shape != (Hv, S, S) or state.dtype != np.float32 or not state.flags.c_contiguous
            or C != (2 * n_k_heads + Hv) * S or Hv % n_k_heads or alpha.shape != (n, Hv) or beta.shape != (n, Hv)
            or z.shape != (n, Hv * S) or norm_w.shape != (S,) or dt_bias.shape != (Hv,) or a.shape != (Hv,)):
        raise ValueError(f"delta_rule: y {y.shape}, alpha {alpha.shape}, beta {beta.shape}, z {z.shape}, state "
                         f"{state.dtype} {state.shape}, {n_k_heads} key heads do not fit")
    f32 = lambda t: np.ascontiguousarray(t, np.float32)  # noqa: E731
    y, alpha, beta, z = f32(y), f32(alpha), f32(beta), f32(z)
    out = np.empty((n, Hv * S), np.float32)
    _delta_rule_tokens(y, alpha, beta, f32(dt_bias), f32(a), z, f32(norm_w), state, n_k_heads, eps, out, snapshots)
    return out
