"""Launchers of the Gated DeltaNet mixer's kernels (kernels/cuda/deltanet.cu) for qwen35 / qwen35moe.

As in cuda_ops: dtypes and shapes are checked, then the kernels only launch on the given stream (default: the
current one): nothing allocates, nothing syncs, so a decode step of them can be captured into a CUDA graph.
Layouts (tests/kernels/deltanet_reference.py): float32, row-major; qkv and y [n, C] with C = 2 * Hk * S + Hv * S
(q heads, k heads, v heads), conv state [K - 1, C], delta state [Hv, S, S] with state[h, j, i] = S_h[i][j];
value head h reads key head h % Hk.
"""
import functools

import cupy as cp
import numpy as np

from kernels.cuda.module import Kernel, kernel
from kernels.cuda.ops import NULL, _check, _stream
from kernels.cuda.shapes import DELTANET_CONV_K as CONV_K, DELTANET_HEAD_SIZES as HEAD_SIZES

CONV_TOKENS = 32  # deltanet.cu: CONV_TOKENS, tokens a thread
REC_CLUSTER = 4  # deltanet.cu: REC_CLUSTER, blocks a head token by token
REC_ROWS = 4  # deltanet.cu: REC_ROWS, state rows a warp
CHUNK = 64  # deltanet.cu: CH, tokens a chunk
CHUNK_COLS = 64  # deltanet.cu: CJ, value columns a block in chunks
CHUNK_THREADS = 256
CHUNKED_MIN_TOKENS = 40  # delta_rule's default: chunks from here (H200: even with tokens at 32, 59 us; 1.8x at 64)


def conv_silu(x: cp.ndarray, state: cp.ndarray, w: cp.ndarray, out: cp.ndarray, stream=None,
              snapshots: cp.ndarray | None = None) -> None:
    """out [n, C] = silu(causal depthwise conv of x [n, C] over the last K inputs of each channel), w [C, K] with
    tap K - 1 the current token and the conv state [K - 1, C] (oldest first) the inputs before x; the state
    becomes the last K - 1 inputs. K = 4, any n >= 1. snapshots [>= n, K - 1, C]: the state after each token as
    well (a verify step's, which rewinds to one of them)."""
    n, C = x.shape if isinstance(x, cp.ndarray) and x.ndim == 2 else (-1, -1)
    _check("x", x, cp.float32, (n, C))
    if n < 1:
        raise ValueError("conv_silu: x needs a token at least")
    _check("state", state, cp.float32, (CONV_K - 1, C))
    _check("w", w, cp.float32, (C, CONV_K))
    _check("out", out, cp.float32, (n, C))
    if snapshots is not None:
        _check_snapshots("conv_silu", snapshots, n, state.shape)
    grid = ((C + 255) // 256, (n + CONV_TOKENS - 1) // CONV_TOKENS)
    with _stream(stream):
        kernel("deltanet.cu", "conv_silu")(grid, (256,), (x, state, w, out, np.int32(n), np.int32(C),
                                                          NULL if snapshots is None else snapshots))


def _check_snapshots(op: str, snapshots: cp.ndarray, n: int, state_shape: tuple) -> None:
    """snapshots: float32 rows [>= n, *state_shape], contiguous."""
    rows = snapshots.shape[0] if isinstance(snapshots, cp.ndarray) and snapshots.ndim == len(state_shape) + 1 else 0
    if rows < n:
        raise ValueError(f"{op}: snapshots must be [>= {n}, {', '.join(map(str, state_shape))}]")
    _check("snapshots", snapshots, cp.float32, (rows, *state_shape))


def _chunk_smem(S: int) -> int:
    """deltanet.cu ChunkSmem<S>::FLOATS * 4: the chunked kernel's dynamic shared memory in bytes."""
    ldk, ldc, ldv = S + 4, CHUNK + 4, CHUNK_COLS + 8
    return 4 * (3 * CHUNK * ldk + CHUNK_COLS * ldk + 3 * CHUNK * ldc + 2 * CHUNK * ldv + 6 * CHUNK)


@functools.cache
def _chunked_kernel(S: int) -> Kernel:
    launch = kernel("deltanet.cu", f"gdn_chunked_{S}")
    launch.raw.max_dynamic_shared_size_bytes = _chunk_smem(S)
    return launch


def delta_rule(y: cp.ndarray, alpha: cp.ndarray, beta: cp.ndarray, dt_bias: cp.ndarray, a: cp.ndarray,
               z: cp.ndarray, norm_w: cp.ndarray, state: cp.ndarray, out: cp.ndarray, n_k_heads: int, eps: float,
               stream=None, chunked: bool | None = None, snapshots: cp.ndarray | None = None) -> None:
    """The gated delta rule over the conv's output y [n, C] and the gated norm after it, in one launch:
    q, k = L2-normed key heads of y (x / sqrt(sum x^2 + eps)), v its value heads; per token t and value head h,
    decay exp(softplus(alpha[t, h] + dt_bias[h]) * a[h]) (a < 0) and b = sigmoid(beta[t, h]) ([n, Hv] each);
    the state [Hv, S, S] (in/out) runs the delta rule, o = M q / sqrt(S), and
    out [n, Hv * S] = rms_norm(o per head, eps) * norm_w [S] * silu(z [n, Hv * S]).

    chunked: in chunks of 64 tokens on the tensor cores (prompts) or token by token (the decode step, the
    baseline); None picks chunks from CHUNKED_MIN_TOKENS tokens. S in HEAD_SIZES. snapshots [>= n, Hv, S, S]
    (token by token only): the state after each token as well (a verify step's, which rewinds to one of them)."""
    Hv, S = state.shape[:2] if isinstance(state, cp.ndarray) and state.ndim == 3 else (-1, -1)
    _check("state", state, cp.float32, (Hv, S, S))
    if S not in HEAD_SIZES or not 0 < n_k_heads:
        raise ValueError(f"delta_rule: head size {S} (need one of {HEAD_SIZES}), {n_k_heads} key heads")
    n = y.shape[0] if isinstance(y, cp.ndarray) and y.ndim == 2 else -1
    _check("y", y, cp.float32, (n, (2 * n_k_heads + Hv) * S))
    if n < 1:
        raise ValueError("delta_rule: y needs a token at least")
    _check("alpha", alpha, cp.float32, (n, Hv))
    _check("beta", beta, cp.float32, (n, Hv))
    _check("dt_bias", dt_bias, cp.float32, (Hv,))
    _check("a", a, cp.float32, (Hv,))
    _check("z", z, cp.float32, (n, Hv * S))
    _check("norm_w", norm_w, cp.float32, (S,))
    _check("out", out, cp.float32, (n, Hv * S))
    args = (y, alpha, beta, dt_bias, a, z, norm_w, state, out, np.int32(n), np.int32(n_k_heads), np.int32(Hv),
            np.float32(eps))
    if chunked is None:
        chunked = n >= CHUNKED_MIN_TOKENS and snapshots is None
    if snapshots is not None:
        if chunked:
            raise ValueError("delta_rule: snapshots are kept token by token, not in chunks")
        _check_snapshots("delta_rule", snapshots, n, state.shape)
    with _stream(stream):
        if chunked:
            _chunked_kernel(S)((Hv * S // CHUNK_COLS,), (CHUNK_THREADS,), args, shared_mem=_chunk_smem(S))
        else:
            threads = S // (REC_ROWS * REC_CLUSTER) * 32
            kernel("deltanet.cu", f"gdn_recurrent_{S}")((Hv * REC_CLUSTER,), (threads,),
                                                        (*args, NULL if snapshots is None else snapshots))
