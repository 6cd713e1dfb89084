"""The non-matmul ops of a transformer on the CPU, over plain float32 numpy arrays (no model knowledge)."""
import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x [..., d] normalised over its last axis, times weight [d]."""
    ms = np.mean(np.square(x), axis=-1, keepdims=True, dtype=np.float32)
    return x * (1.0 / np.sqrt(ms + eps)) * weight


def rope_inv_freq(rope_dim: int, base: float, freq_factors: np.ndarray | None = None) -> np.ndarray:
    """The rotation speed of each pair of dims: [rope_dim // 2] float64."""
    inv = base ** (-np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)
    return inv / freq_factors if freq_factors is not None else inv


def rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray, style: str) -> np.ndarray:
    """Rotate x [n, heads, head_dim] by position. style "normal": pairs (2i, 2i+1); "neox": (i, i + half).

    Only the first 2 * len(inv_freq) dims of each head rotate; the rest pass through.
    """
    half = len(inv_freq)
    angles = positions[:, None].astype(np.float64) * inv_freq[None, :]  # [n, half]
    cos = np.cos(angles).astype(np.float32)[:, None, :]  # [n, 1, half]
    sin = np.sin(angles).astype(np.float32)[:, None, :]
    out = x.copy()
    if style == "normal":
        x0, x1 = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
        out[..., 0:2 * half:2] = x0 * cos - x1 * sin
        out[..., 1:2 * half:2] = x0 * sin + x1 * cos
    else:
        x0, x1 = x[..., :half], x[..., half:2 * half]
        out[..., :half] = x0 * cos - x1 * sin
        out[..., half:2 * half] = x0 * sin + x1 * cos
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, pos0: int, window: int, scale: float) -> np.ndarray:
    """Causal grouped-query attention of n new queries against the cache.

    q [n, n_heads, hd] at positions pos0..pos0+n-1; k [n_kv, T, hd] and v [n_kv, T, vd] hold positions 0..T-1
    with T = pos0 + n. window > 0: a query at p sees only keys j with p - j < window. Returns [n, n_heads * vd].
    """
    n, n_heads, hd = q.shape
    n_kv, T, vd = v.shape
    group = n_heads // n_kv
    start = max(0, pos0 + 1 - window) if window > 0 else 0  # keys no query of this batch can see
    k, v = k[:, start:T], v[:, start:T]
    qg = q.reshape(n, n_kv, group, hd).transpose(1, 2, 0, 3).reshape(n_kv, group * n, hd)
    scores = (qg @ k.transpose(0, 2, 1)) * scale  # [n_kv, group * n, T - start]
    qpos = pos0 + np.arange(n)[:, None]
    kpos = start + np.arange(T - start)[None, :]
    masked = kpos > qpos
    if window > 0:
        masked |= qpos - kpos >= window
    scores = scores.reshape(n_kv, group, n, T - start)
    scores[:, :, masked] = -np.inf
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    out = scores.reshape(n_kv, group * n, T - start) @ v  # [n_kv, group * n, vd]
    return out.reshape(n_kv, group, n, vd).transpose(2, 0, 1, 3).reshape(n, n_heads * vd)


def silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-x) = inf for x << 0 gives the right limit, 0
        return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.float32(np.sqrt(2.0 / np.pi)) * (x + np.float32(0.044715) * x * x * x)))


def glu(gate: np.ndarray, up: np.ndarray, activation: str) -> np.ndarray:
    """activation(gate) * up, both [n, n_ff]."""
    return (silu(gate) if activation == "silu" else gelu_tanh(gate)) * up
