"""Decode attention alone, on the GPU machine: microseconds a call of kernels/cuda/ops.attention_decode (its two
passes: the splits, the combine; 50 calls a CUDA graph) over an fp16 KV cache filled to DEPTH, the bandwidth that
is of the keys' and values' bytes it reads, and the largest error against a float64 softmax(q k^T) v.

    PYTHONPATH=. python3 tests/device_attention.py N_HEAD N_HEAD_KV HEAD_DIM DEPTH [WINDOW [ROWS [SPLITS [N_TOK]]]]

ROWS: the cache's rows (default DEPTH; fewer: a ring, position j at row j % ROWS, as a sliding window's cache).
SPLITS: the blocks a kv head's keys are split over (default, or 0: decode_scratch's choice).
N_TOK: queries at the cache's last N_TOK positions (a verify step's), causal; more than one: attention_prefill of the
same queries is timed too, the kernel a verify step took before.
"""
import sys

import cupy as cp
import numpy as np

from kernels.cuda import ops


def reference(q, k, v, positions, rows: int, window: int, scale: float):
    """float64 softmax(q k^T) v of q [n_tok, n_head, hd] at positions over the (ring) caches k, v [n_kv, rows, hd]."""
    group = q.shape[1] // k.shape[0]
    out = cp.empty(q.shape, dtype=cp.float64)
    for t, p in enumerate(positions):
        keys = np.arange(max(0, p - window + 1) if window else 0, p + 1)
        k64, v64 = (cp.repeat(a[:, keys % rows], group, axis=0).astype(cp.float64) for a in (k, v))
        s64 = cp.einsum("hd,hjd->hj", q[t].astype(cp.float64), k64) * scale
        w64 = cp.exp(s64 - s64.max(axis=1, keepdims=True))
        out[t] = cp.einsum("hj,hjd->hd", w64 / w64.sum(axis=1, keepdims=True), v64)
    return out


def timed(stream, call) -> list[float]:
    """Microseconds a call, 5 times over a graph of 50 calls (the GPU's time, not the host's launching)."""
    with stream:
        stream.begin_capture()
        for _ in range(50):
            call()
        graph = stream.end_capture()
    times = []
    for _ in range(5):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        graph.launch(stream)
        stop.record(stream)
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 50 * 1e3)
    return times


def main(n_head: int, n_head_kv: int, head_dim: int, depth: int, window: int = 0, rows: int = 0,
         splits: int = 0, n_tok: int = 1) -> None:
    rows = rows or depth
    rng = np.random.default_rng(0)
    k = cp.asarray(rng.standard_normal((n_head_kv, rows, head_dim), dtype=np.float32) * 1.5).astype(cp.float16)
    v = cp.asarray(rng.standard_normal((n_head_kv, rows, head_dim), dtype=np.float32)).astype(cp.float16)
    q = cp.asarray(rng.standard_normal((n_tok, n_head, head_dim), dtype=np.float32))
    pos = cp.asarray([depth - n_tok], dtype=cp.int32)
    scale = head_dim ** -0.5
    ref = reference(q, k, v, range(depth - n_tok, depth), rows, window, scale)
    scratch = ops.decode_scratch(n_head, n_head_kv, head_dim, n_tok=n_tok)
    if splits:
        scratch = cp.empty((n_tok * n_head, splits, head_dim + 4), dtype=cp.float32)
    out = cp.empty(q.shape, dtype=cp.float32)

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        ops.attention_decode(q, k, v, out, pos, scratch, scale, window)
        err = float(cp.abs(out - ref).max())
    times = timed(stream, lambda: ops.attention_decode(q, k, v, out, pos, scratch, scale, window))
    first = max(0, depth - n_tok - window + 1) if window else 0
    read = 2 * n_head_kv * (depth - first) * head_dim * 2
    print(f"heads {n_head}/{n_head_kv} hd {head_dim} depth {depth} window {window} rows {rows} tokens {n_tok} splits "
          f"{scratch.shape[1]}: {' '.join(f'{t:.1f}' for t in times)} us, {read / min(times) / 1e3:.0f} GB/s, "
          f"max |err| {err:.2e}")
    if n_tok > 1:
        with stream:
            ops.attention_prefill(q, k, v, out, pos, scale, window)
            err = float(cp.abs(out - ref).max())
        times = timed(stream, lambda: ops.attention_prefill(q, k, v, out, pos, scale, window))
        print(f"  attention_prefill of the same queries: {' '.join(f'{t:.1f}' for t in times)} us, "
              f"max |err| {err:.2e}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
