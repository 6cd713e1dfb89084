"""Decode attention alone, on the GPU machine: microseconds a call of kernels/cuda/ops.attention_decode (its two
passes: the splits, the combine; 50 calls a CUDA graph) over an fp16 KV cache filled to DEPTH, the bandwidth that
is of the keys' and values' bytes it reads, and the largest error against a float64 softmax(q k^T) v.

    PYTHONPATH=. python3 tests/device_attention.py N_HEAD N_HEAD_KV HEAD_DIM DEPTH [WINDOW [ROWS [SPLITS]]]

ROWS: the cache's rows (default DEPTH; fewer: a ring, position j at row j % ROWS, as a sliding window's cache).
SPLITS: the blocks a kv head's keys are split over (default: decode_scratch's choice).
"""
import sys

import cupy as cp
import numpy as np

from kernels.cuda import ops


def main(n_head: int, n_head_kv: int, head_dim: int, depth: int, window: int = 0, rows: int = 0,
         splits: int = 0) -> None:
    rows = rows or depth
    rng = np.random.default_rng(0)
    k = cp.asarray(rng.standard_normal((n_head_kv, rows, head_dim), dtype=np.float32) * 1.5).astype(cp.float16)
    v = cp.asarray(rng.standard_normal((n_head_kv, rows, head_dim), dtype=np.float32)).astype(cp.float16)
    q = cp.asarray(rng.standard_normal((n_head, head_dim), dtype=np.float32))
    pos = cp.asarray([depth - 1], dtype=cp.int32)
    scale = head_dim ** -0.5
    keys = np.arange(max(0, depth - window) if window else 0, depth)
    group = n_head // n_head_kv
    k64, v64 = (cp.repeat(a[:, keys % rows], group, axis=0).astype(cp.float64) for a in (k, v))
    s64 = cp.einsum("hd,hjd->hj", q.astype(cp.float64), k64) * scale
    w64 = cp.exp(s64 - s64.max(axis=1, keepdims=True))
    reference = cp.einsum("hj,hjd->hd", w64 / w64.sum(axis=1, keepdims=True), v64)
    scratch = ops.decode_scratch(n_head, n_head_kv, head_dim)
    if splits:
        scratch = cp.empty((n_head, splits, head_dim + 4), dtype=cp.float32)
    out = cp.empty((n_head, head_dim), dtype=cp.float32)

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        ops.attention_decode(q, k, v, out, pos, scratch, scale, window)
        err = float(cp.abs(out - reference).max())
        stream.begin_capture()  # 50 calls a graph: the GPU's time, not the host's launching
        for _ in range(50):
            ops.attention_decode(q, k, v, out, pos, scratch, scale, window)
        graph = stream.end_capture()
    times = []
    for _ in range(5):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        graph.launch(stream)
        stop.record(stream)
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 50 * 1e3)
    read = 2 * n_head_kv * len(keys) * head_dim * 2
    print(f"heads {n_head}/{n_head_kv} hd {head_dim} depth {depth} window {window} rows {rows} splits "
          f"{scratch.shape[1]}: {' '.join(f'{t:.1f}' for t in times)} us, {read / min(times) / 1e3:.0f} GB/s, "
          f"max |err| {err:.2e}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
