"""Benchmark the few-token matvecs of speculative decoding's verify step (kernels/cuda/quant.matvec_tokens) against
one token's matvec: us a launch for 1 to 8 tokens, and each as a multiple of the one-token matvec.

Run on the device machine: python3 -m kernels.bench.tokens [TYPE ...]. As kernels.bench.cuda: graph replays over
enough weight copies to exceed the L2. Shapes: qwen35-27b's fused gate+up, ffn_down, q+gate and its output head,
llama3-8b's gate+up, and a small k projection.
"""
import math
import sys

from kernels.bench.cuda import random_weight_bytes, time_graph
from kernels.cuda.layout import repack
from models.ggml_types import TYPES_BY_NAME

SHAPES = [(34816, 5120), (5120, 17408), (12288, 5120), (248320, 5120), (28672, 4096), (1024, 5120)]
TYPES = ["Q4_K", "Q6_K", "Q5_K", "Q8_0", "IQ4_XS", "F32"]
TOKENS = range(1, 9)


def bench_one(cp, cq, name: str, n_rows: int, n_cols: int) -> tuple[float, list[float]]:
    """us of one token's matvec, and of matvec_tokens for each count of TOKENS."""
    qtype = TYPES_BY_NAME[name]
    data = repack(random_weight_bytes(qtype, n_rows, n_cols, xp=cp, seed=1), qtype)
    n_copies = max(1, min(64, math.ceil(200e6 / data.size)))  # 200 MB of weights: 4x the L2
    weights = [cq.DeviceWeight(data if i == 0 else data.copy(), qtype, n_rows, n_cols) for i in range(n_copies)]

    def x_of(n: int):
        x = cp.random.standard_normal((n, n_cols), dtype=cp.float32)
        if not weights[0].takes_q8:
            return x
        xq = cq.Q8Vector.empty(n * n_cols)
        cq.quantize_q8_1(x.reshape(-1), xq)
        return xq

    x1 = x_of(1)
    x1 = x1 if weights[0].takes_q8 else x1.reshape(-1)
    out1 = cp.empty(n_rows, dtype=cp.float32)
    one = time_graph(cp, lambda i, s: cq.matvec(weights[i % n_copies], x1, out1, stream=s), max(n_copies, 32))
    many = []
    for n in TOKENS:
        x, out = x_of(n), cp.empty((n, n_rows), dtype=cp.float32)
        many.append(time_graph(cp, lambda i, s: cq.matvec_tokens(weights[i % n_copies], x, n, out, stream=s),
                               max(n_copies, 32)))
    return one * 1e6, [t * 1e6 for t in many]


def main(types: list[str]) -> None:
    import cupy as cp

    import kernels.cuda.quant as cq

    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}; us a launch (x one token's matvec)")
    for name in types:
        for n_rows, n_cols in SHAPES:
            one, many = bench_one(cp, cq, name, n_rows, n_cols)
            print(f"{name:6s} {n_rows:6d}x{n_cols:<6d} matvec {one:7.1f} | "
                  + " ".join(f"{n}:{t:.1f} ({t / one:.2f})" for n, t in zip(TOKENS, many)), flush=True)
            cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main(sys.argv[1:] or TYPES)
