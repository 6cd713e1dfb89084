"""Decode attention alone, on the GPU machine: microseconds a call of attention.cu's two decode passes (split,
combine) over a full fp16 KV cache, and the bandwidth that is of the cache's bytes, for the ring depths and
split counts given, with the largest error against a float64 softmax(q k^T) v.

    PYTHONPATH=. python3 tests/device_attention.py N_HEAD N_HEAD_KV HEAD_DIM DEPTH STAGES:SPLITS [...]

STAGES: key tiles a warp's ring holds (2, 3 or 4; 4 does not fit at HEAD_DIM 256).
"""
import math
import sys

import cupy as cp
import numpy as np

from kernels.cuda.module import KERNEL_DIR

STAGES = (2, 3, 4)


def module(head_dim: int) -> cp.RawModule:
    """attention.cu with its decode kernel instantiated at every STAGES."""
    code = (KERNEL_DIR / "attention.cu").read_text()
    code += "".join(f"\nATTN_DECODE(bench_decode_{s}, {head_dim}, {s})" for s in STAGES)
    return cp.RawModule(code=code, options=("-std=c++17", f"-I{KERNEL_DIR}"), backend="nvrtc")


def main(n_head: int, n_head_kv: int, head_dim: int, depth: int, variants: list[str]) -> None:
    mod = module(head_dim)
    rng = np.random.default_rng(0)
    k = cp.asarray(rng.standard_normal((n_head_kv, depth, head_dim), dtype=np.float32)).astype(cp.float16)
    v = cp.asarray(rng.standard_normal((n_head_kv, depth, head_dim), dtype=np.float32)).astype(cp.float16)
    q = cp.asarray(rng.standard_normal((n_head, head_dim), dtype=np.float32))
    pos = cp.asarray([depth - 1], dtype=cp.int32)
    scale = np.float32(head_dim ** -0.5)
    cache_bytes = 2 * k.nbytes
    group = n_head // n_head_kv
    k64, v64 = cp.repeat(k, group, axis=0).astype(cp.float64), cp.repeat(v, group, axis=0).astype(cp.float64)
    s64 = cp.einsum("hd,hjd->hj", q.astype(cp.float64), k64) * float(scale)
    w64 = cp.exp(s64 - s64.max(axis=1, keepdims=True))
    reference = cp.einsum("hj,hjd->hd", w64 / w64.sum(axis=1, keepdims=True), v64)
    for variant in variants:
        stages, n_splits = (int(x) for x in variant.split(":"))
        part = cp.empty((n_head, n_splits, head_dim + 4), dtype=cp.float32)
        out = cp.empty((n_head, head_dim), dtype=cp.float32)
        split, combine = mod.get_function(f"bench_decode_{stages}"), mod.get_function("attn_decode_combine")
        smem = 2 * (2 * 16 * (head_dim + 8) * (1 + 4 * stages))  # attention.cu: DmShape<HD, STAGES>::BYTES
        split.max_dynamic_shared_size_bytes = smem
        grid = (n_head_kv, n_splits, math.ceil(group / 16))

        def call():
            split(grid, (128,), (q, k, v, part, pos, np.int32(n_head), np.int32(n_head_kv), np.int32(depth),
                                 np.int32(0), scale, np.int32(n_splits)), shared_mem=smem)
            combine((n_head,), (512,), (part, out, pos, np.int32(head_dim), np.int32(0), np.int32(n_splits),
                                        np.int32(depth), out, out, np.int32(0), np.uint64(0)))
        call()
        err = float(cp.abs(out - reference).max())
        times = []
        for _ in range(5):
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            for _ in range(50):
                call()
            stop.record()
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop) / 50 * 1e3)
        best = min(times)
        print(f"heads {n_head}/{n_head_kv} hd {head_dim} depth {depth} stages {stages} splits {n_splits} grid {grid}: "
              f"{' '.join(f'{t:.1f}' for t in times)} us, {cache_bytes / best / 1e3:.0f} GB/s, "
              f"max |err| {err:.2e}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:5]), sys.argv[5:])
