"""The Gated DeltaNet mixer's two ops in float64 numpy, written straight from llama.cpp's definition
(src/models/qwen35.cpp build_layer_attn_linear, ggml-cpu ops.cpp gated_delta_net): the oracle the CPU and GPU
kernels are held to. Token by token, no chunking, no fusion.

Layouts (the kernels use the same):
  conv state  [K - 1, C]      the last K - 1 inputs of each channel, oldest first
  delta state [Hv, S, S]      state[h, j, i] = S_h[i][j] (i: key index, j: value index), as llama.cpp stores it
  qkv         [n, C]          C = 2 * Hk * S + Hv * S: q heads, k heads, v heads
"""
import numpy as np


def conv_silu(x, state, w):
    """Causal depthwise conv of x [n, C] over the last K inputs of each channel (w [C, K]; tap K - 1 is the
    current token), then SiLU. Returns (y [n, C], new state [K - 1, C])."""
    x, state, w = (np.asarray(a, np.float64) for a in (x, state, w))
    K = w.shape[1]
    xin = np.concatenate([state, x])  # [K - 1 + n, C]
    n = len(x)
    y = np.stack([(xin[t:t + K] * w.T).sum(0) for t in range(n)])
    return y / (1 + np.exp(-y)), xin[-(K - 1):]


def delta_rule(y, alpha, beta, dt_bias, a, state, n_k_heads, eps):
    """The gated delta rule on the conv's output y [n, C] for Hv value heads of size S (state [Hv, S, S]):
    q, k L2-normed per head (x / sqrt(sum x^2 + eps)), decay g = softplus(alpha + dt_bias) * a (a = -exp(A_log)),
    beta = sigmoid(beta); value head h reads key head h % n_k_heads. Returns (o [n, Hv, S], new state)."""
    y, alpha, beta, dt_bias, a = (np.asarray(t, np.float64) for t in (y, alpha, beta, dt_bias, a))
    M = np.array(state, np.float64)  # [Hv, S(j), S(i)]
    Hv, S, _ = M.shape
    n = len(y)
    q = y[:, :n_k_heads * S].reshape(n, n_k_heads, S)
    k = y[:, n_k_heads * S:2 * n_k_heads * S].reshape(n, n_k_heads, S)
    v = y[:, 2 * n_k_heads * S:].reshape(n, Hv, S)
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + eps)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + eps)
    x = alpha + dt_bias
    g = np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))) * a  # softplus as ggml's (x > 20: x)
    b = 1 / (1 + np.exp(-beta))
    o = np.empty((n, Hv, S))
    for t in range(n):
        for h in range(Hv):
            kh = h % n_k_heads
            M[h] *= np.exp(g[t, h])
            d = b[t, h] * (v[t, h] - M[h] @ k[t, kh])  # (S^T k)[j] = sum_i S[i][j] k[i] = (M k)[j]
            M[h] += np.outer(d, k[t, kh])
            o[t, h] = M[h] @ q[t, kh] / np.sqrt(S)
    return o, M


def delta_rule_chunked(y, alpha, beta, dt_bias, a, state, n_k_heads, eps, chunk=64):
    """delta_rule in chunks of `chunk` tokens, the WY form (llama.cpp's build_delta_net_chunking; the algorithm of
    the GPU's prompt kernel, kernels/cuda/deltanet.cu), every head at once. Within a chunk, with G the cumulative sum of
    g, D[t, s] = exp(G_t - G_s) for s <= t, Kb = diag(b) K, S0 the state at the chunk's start (S_h, not stored
    transposed):
      T = (I + strict_lower(Kb K^T * D))^-1      (the chunk's writes, each seen by the later ones)
      U = T diag(b) V,  W = T diag(e^G) Kb,  V' = U - W S0
      O = diag(e^G) Q S0 + ((Q K^T) * D) V'      (lower triangle with its diagonal; Q scaled by 1/sqrt(S))
      S = e^(G_last) S0 + (diag(e^(G_last - G)) K)^T V'
    Every exponent is <= 0: nothing overflows however strong the decay. Returns (o [n, Hv, S], new state)."""
    y, alpha, beta, dt_bias, a = (np.asarray(t, np.float64) for t in (y, alpha, beta, dt_bias, a))
    n = len(y)
    Hv, S = state.shape[0], state.shape[1]
    heads = np.arange(Hv) % n_k_heads
    q = y[:, :n_k_heads * S].reshape(n, n_k_heads, S)[:, heads].transpose(1, 0, 2)  # [Hv, n, S]
    k = y[:, n_k_heads * S:2 * n_k_heads * S].reshape(n, n_k_heads, S)[:, heads].transpose(1, 0, 2)
    v = y[:, 2 * n_k_heads * S:].reshape(n, Hv, S).transpose(1, 0, 2)
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + eps) / np.sqrt(S)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + eps)
    x = alpha + dt_bias
    g = (np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))) * a).T  # [Hv, n]
    b = (1 / (1 + np.exp(-beta))).T  # [Hv, n]
    S0 = np.array(state, np.float64).transpose(0, 2, 1)  # [Hv, S(i), S(j)]
    o = np.empty((Hv, n, S))
    for c0 in range(0, n, chunk):
        c1 = min(n, c0 + chunk)
        m = c1 - c0
        qc, kc, vc = q[:, c0:c1], k[:, c0:c1], v[:, c0:c1]
        G = np.cumsum(g[:, c0:c1], axis=1)  # [Hv, m]
        lower = np.tril(np.ones((m, m), bool))
        D = np.where(lower, np.exp(np.where(lower, G[:, :, None] - G[:, None, :], 0)), 0)
        kb = kc * b[:, c0:c1, None]
        A = np.tril((kb @ kc.transpose(0, 2, 1)) * D, -1)
        eG = np.exp(G)[:, :, None]
        UW = np.linalg.solve(A + np.eye(m), np.concatenate([vc * b[:, c0:c1, None], kb * eG], 2))
        Vp = UW[:, :, :S] - UW[:, :, S:] @ S0
        o[:, c0:c1] = (qc * eG) @ S0 + ((qc @ kc.transpose(0, 2, 1)) * D) @ Vp
        last = G[:, -1:]
        S0 = np.exp(last)[:, :, None] * S0 + (kc * np.exp(last - G)[:, :, None]).transpose(0, 2, 1) @ Vp
    return o.transpose(1, 0, 2), S0.transpose(0, 2, 1)


def gated_norm(o, z, weight, eps):
    """rms_norm over each head of o [n, Hv, S] times weight [S], times silu(z) (z [n, Hv * S]): [n, Hv * S]."""
    o = np.asarray(o, np.float64)
    n, Hv, S = o.shape
    z = np.asarray(z, np.float64).reshape(n, Hv, S)
    normed = o / np.sqrt((o * o).mean(-1, keepdims=True) + eps) * weight
    return (normed * z / (1 + np.exp(-z))).reshape(n, Hv * S)
