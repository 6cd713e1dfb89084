"""Benchmark the prefill matmul (kernels/cuda/prefill.py): TFLOP/s per type, shape and token count, split into
dequantize and cuBLAS time, and the matmul time of a 512-token llama3-8b prompt.

Run on the device machine: python3 -m kernels.bench.prefill. Each timing cycles over enough weight copies
(>= 200 MB of quantized bytes, 4x the L2) that weights come from HBM; median of 5 runs of a loop of calls,
so Python's launch overhead counts where the GPU work is shorter than it (small token counts).
"""
import math
import sys

import numpy as np

from kernels.bench.cuda import DECODE_MATVECS, TYPES, random_weight_bytes
from kernels.cuda.layout import repack
from models.ggml_types import TYPES_BY_NAME

N_TOKENS = [1, 2, 4, 8, 16, 32, 64, 512]
Q8_MAX_TOKENS = 64  # the q8 path is timed up to here
PROMPT = 512
MODELS = ("llama3-8b q4_k_m", "llama3-8b q8_0")
SMALL_SCRATCH = 4096 * 4096  # elements: the 14336-row weights then run as 4 tiles


def time_loop(cp, fn, n_calls, runs=5):
    """Median seconds of one call, from runs of n_calls back-to-back calls fn(i)."""
    fn(0)
    cp.cuda.get_current_stream().synchronize()
    times = []
    for _ in range(runs):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for i in range(n_calls):
            fn(i)
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3 / n_calls)
    return float(np.median(times))


def bench_shape(cp, cq, cpf, name, n_rows, n_cols, scratch, small_scratch):
    """{n_tokens: dict of seconds} for one type and shape."""
    qtype = TYPES_BY_NAME[name]
    raw = random_weight_bytes(qtype, n_rows, n_cols, xp=cp, seed=1)
    nbytes = raw.size
    data = repack(raw, qtype)
    del raw
    n_copies = max(1, min(32, math.ceil(200e6 / nbytes)))
    weights = [cq.DeviceWeight(data if i == 0 else data.copy(), qtype, n_rows, n_cols) for i in range(n_copies)]
    n_calls = max(n_copies, 8)
    result = {}
    for n in N_TOKENS:
        x = cp.random.standard_normal((n, n_cols), dtype=cp.float32)
        x16 = x.astype(cp.float16)
        out = cp.empty((n, n_rows), dtype=cp.float32)
        r = {"total": time_loop(cp, lambda i: cpf.matmul(weights[i % n_copies], x, out, scratch), n_calls),
             "f16": time_loop(cp, lambda i: cpf.matmul_f16(weights[i % n_copies], x16, out, scratch), n_calls)}
        if name != "F16":
            r["dequant"] = time_loop(cp, lambda i: cpf.dequantize_rows(weights[i % n_copies], 0, n_rows,
                                                                      scratch.w16), n_calls)
            r["gemm"] = time_loop(cp, lambda i: cpf._gemm(scratch.w16.data.ptr, n_rows, x16, out, 0), n_calls)
        if weights[0].takes_q8 and n <= Q8_MAX_TOKENS:
            xq = cq.Q8Vector.empty(-(-n // cpf.NT) * cpf.NT * n_cols)
            r["q8"] = time_loop(cp, lambda i: cpf.matmul_q8(weights[i % n_copies], xq, n, out), n_calls)
        if n == PROMPT and n_rows * n_cols > small_scratch.w16.size:
            r["f16_small_scratch"] = time_loop(
                cp, lambda i: cpf.matmul_f16(weights[i % n_copies], x16, out, small_scratch), n_calls)
        result[n] = r
    del weights, data
    cp.get_default_memory_pool().free_all_blocks()
    return result


def best(r):
    """Seconds of the faster path."""
    return min(r["f16"], r.get("q8", r["f16"]))


def main(types: list[str]) -> None:
    import cupy as cp

    import kernels.cuda.prefill as cpf
    import kernels.cuda.quant as cq

    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}", flush=True)
    llama = [(key, share) for model, per_layer, _ in DECODE_MATVECS if model in MODELS for key, share in per_layer]
    cases = sorted({key for key, _ in llama} | {(t, 4096, 4096) for t in types})
    max_cols = max(c for _, _, c in cases)
    scratch = cpf.Scratch.empty(PROMPT, max_cols, max(r * c for _, r, c in cases))
    small_scratch = cpf.Scratch.empty(PROMPT, max_cols, SMALL_SCRATCH)
    results = {}
    print("times in us; total = matmul() from float32 x (path by SMALL_BATCH); f16 = dequant + gemm path")
    print("type  rows x cols   n_tok    total TFLOP/s      f16  dequant     gemm gemm_TF/s       q8  (f16 4 tiles)")
    for name, n_rows, n_cols in cases:
        res = bench_shape(cp, cq, cpf, name, n_rows, n_cols, scratch, small_scratch)
        results[(name, n_rows, n_cols)] = res
        for n, r in res.items():
            flop = 2.0 * n * n_rows * n_cols
            line = (f"{name:5s} {n_rows:5d}x{n_cols:<6d} {n:5d} {r['total'] * 1e6:8.1f} {flop / r['total'] / 1e12:8.1f}"
                    f" {r['f16'] * 1e6:8.1f}")
            if "gemm" in r:
                line += f" {r['dequant'] * 1e6:8.1f} {r['gemm'] * 1e6:8.1f} {flop / r['gemm'] / 1e12:9.1f}"
            else:
                line += " " * 28
            if "q8" in r:
                line += f" {r['q8'] * 1e6:8.1f}"
            if "f16_small_scratch" in r:
                line += f"  ({r['f16_small_scratch'] * 1e6:.1f})"
            print(line, flush=True)
    print()
    for model, per_layer, n_layers in DECODE_MATVECS:
        if model not in MODELS:
            continue
        for n in N_TOKENS:
            t = n_layers * sum(share * results[key][n]["total"] for key, share in per_layer)
            t_best = n_layers * sum(share * best(results[key][n]) for key, share in per_layer)
            print(f"{model}: layer matmuls of {n:3d} tokens {t * 1e3:7.2f} ms -> {n / t:6.0f} tok/s "
                  f"(faster path each: {t_best * 1e3:7.2f} ms)")
        t_small = n_layers * sum(share * results[key][PROMPT].get("f16_small_scratch", results[key][PROMPT]["f16"])
                                 for key, share in per_layer)
        print(f"{model}: {PROMPT} tokens with a {SMALL_SCRATCH // 2**20}M-element scratch: {t_small * 1e3:.2f} ms")


if __name__ == "__main__":
    main(sys.argv[1:] or TYPES)
