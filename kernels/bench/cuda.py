"""Benchmark the CUDA matvec kernels: achieved GB/s of weight reads per type and shape vs the H100 roofline.

Run on the device machine: python3 -m kernels.bench.cuda [TYPE ...]. Each timing replays a CUDA graph of
many matvecs over enough weight copies to exceed the 50 MB L2, so the numbers are from HBM, not cache.
Shapes are rows x cols (out features x in features) of llama3-8b and llama-1b decode matmuls.
"""
import json
import math
import os
import sys

import numpy as np

from kernels.cuda.layout import ELEMS_PER_ITEM, repack
from models.ggml_types import TYPES_BY_NAME, GGMLType

ROOFLINE_GBS = 3000.0  # H100 80GB HBM3, device-to-device copy measured in this workplace
SHAPES = [
    (4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (128256, 4096),  # llama3-8b q/o, k/v, up, down, output
    (2048, 2048), (512, 2048), (8192, 2048), (2048, 8192), (128256, 2048),  # llama-1b
    (6144, 4096), (28672, 4096),  # llama3-8b q+k+v and gate+up as one matrix each
]
TYPES = ["Q4_K", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q5_K", "Q3_K", "Q2_K", "F16", "BF16", "F32",
         "MXFP4", "IQ4_NL", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"]

# byte offsets of the fp16 scale fields inside one block, as in the file
HALF_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "MXFP4": [],  # an e8m0 byte, set below
    **dict.fromkeys(["IQ4_NL", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S"], [0]),
    "IQ1_M": [],  # the top nibbles of its 4 scale words, set below
}


def random_weight_bytes(qtype: GGMLType, n_rows: int, n_cols: int, xp=np, seed: int = 0):
    """Random valid blocks as in a file: uint8 [n_rows, row_bytes]; xp is numpy or cupy."""
    rs = xp.random.RandomState(seed)
    row_bytes = qtype.nbytes(n_cols)
    if qtype.name == "F32":
        return rs.standard_normal((n_rows, n_cols)).astype(np.float32).view(np.uint8)
    if qtype.name == "F16":
        return rs.standard_normal((n_rows, n_cols)).astype(np.float16).view(np.uint8)
    if qtype.name == "BF16":
        f = rs.standard_normal((n_rows, n_cols)).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    raw = rs.randint(0, 256, size=(n_rows, row_bytes), dtype=np.uint8)
    if qtype.name == "MXFP4":  # e8m0 scales 2^-9 .. 2^-6 (its 17-byte blocks have no fp16 field)
        raw.reshape(n_rows, -1, qtype.block_bytes)[:, :, 0] = rs.randint(119, 123, size=(n_rows, row_bytes // 17))
        return raw
    halves = raw.view(np.uint16).reshape(n_rows, -1, qtype.block_bytes // 2)
    for off in HALF_FIELDS[qtype.name]:
        scale = (rs.standard_normal(halves.shape[:2]) * 0.01).astype(np.float16)
        halves[:, :, off // 2] = scale.view(np.uint16)
    if qtype.name == "IQ1_M":  # d's 16 bits as the top nibbles of the scale words 24 .. 27 (u16)
        d = (rs.standard_normal(halves.shape[:2]) * 0.01).astype(np.float16).view(np.uint16)
        words = halves[:, :, 24:28]
        for k in range(4):
            words[:, :, k] = (words[:, :, k] & 0x0FFF) | (((d >> (4 * k)) & 0xF) << 12)
    return raw


# One decode token's matvecs, as ((type, rows, cols), share of layers) per layer. q4_k_m keeps attn_v and
# ffn_down in Q6_K in about half of the layers (llama.cpp's use_more_bits), Q4_K in the rest.
DECODE_MATVECS = [
    ("llama3-8b q4_k_m", [(("Q4_K", 4096, 4096), 2), (("Q4_K", 1024, 4096), 1.5), (("Q6_K", 1024, 4096), 0.5),
                          (("Q4_K", 14336, 4096), 2), (("Q4_K", 4096, 14336), 0.5), (("Q6_K", 4096, 14336), 0.5)], 32),
    ("llama3-8b q8_0", [(("Q8_0", 4096, 4096), 2), (("Q8_0", 1024, 4096), 2), (("Q8_0", 14336, 4096), 2),
                        (("Q8_0", 4096, 14336), 1)], 32),
    ("llama-1b q4_k_m", [(("Q4_K", 2048, 2048), 2), (("Q4_K", 512, 2048), 1.5), (("Q6_K", 512, 2048), 0.5),
                         (("Q4_K", 8192, 2048), 2), (("Q4_K", 2048, 8192), 0.5), (("Q6_K", 2048, 8192), 0.5)], 16),
]
OUTPUT = {"llama3-8b q4_k_m": ("Q6_K", 128256, 4096), "llama3-8b q8_0": ("Q8_0", 128256, 4096),
          "llama-1b q4_k_m": ("Q6_K", 128256, 2048)}


def time_graph(cp, step, n_launch: int, replays: int = 5) -> float:
    """Median seconds of one step(i, stream) from replays of a graph holding n_launch of them."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        step(0, stream)  # compile outside capture
        stream.synchronize()
        stream.begin_capture()
        for i in range(n_launch):
            step(i, stream)
        graph = stream.end_capture()
        graph.launch(stream)
        times = []
        for _ in range(replays):
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            graph.launch(stream)
            stop.record(stream)
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3 / n_launch)
    return float(np.median(times))


def time_matvecs(cp, cq, weights, x, out, tpr, replays=5):
    """Median seconds of one matvec, from replays of a graph that cycles over `weights`."""
    def step(i, stream):
        cq.matvec(weights[i % len(weights)], x, out, stream=stream, threads_per_row=tpr)
    return time_graph(cp, step, max(len(weights), 32), replays)


def copy_bandwidth(cp) -> float:
    """GB/s of a 1 GiB device-to-device copy, bytes read plus written."""
    a = cp.ones(1 << 28, dtype=cp.float32)
    b = cp.empty_like(a)
    b[...] = a
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(10):
        b[...] = a
    stop.record()
    stop.synchronize()
    return 2 * a.nbytes * 10 / (cp.cuda.get_elapsed_time(start, stop) / 1e3) / 1e9


def bench_one(cp, cq, qtype: GGMLType, n_rows: int, n_cols: int) -> dict:
    """GB/s of one type and shape at each threads_per_row."""
    raw = random_weight_bytes(qtype, n_rows, n_cols, xp=cp, seed=1)
    nbytes = raw.size
    data = repack(raw, qtype)
    del raw
    n_copies = max(1, min(64, math.ceil(200e6 / nbytes)))  # 200 MB of weights: 4x the L2
    weights = [cq.DeviceWeight(data if i == 0 else data.copy(), qtype, n_rows, n_cols) for i in range(n_copies)]
    x = cp.random.standard_normal(n_cols, dtype=cp.float32)
    if weights[0].takes_q8:
        xq = cq.Q8Vector.empty(n_cols)
        cq.quantize_q8_1(x, xq)
        x = xq
    out = cp.empty(n_rows, dtype=cp.float32)
    gbs = {tpr: nbytes / time_matvecs(cp, cq, weights, x, out, tpr) / 1e9 for tpr in (32, 64, 128)}
    return dict(type=qtype.name, rows=n_rows, cols=n_cols, bytes=nbytes, gbs=gbs,
                default_tpr=cq.default_threads_per_row(n_rows, n_cols // ELEMS_PER_ITEM[qtype.name]))


def print_decode_estimates(results: list[dict]) -> None:
    seconds = {(r["type"], r["rows"], r["cols"]): r["bytes"] / (r["gbs"][r["default_tpr"]] * 1e9) for r in results}
    for model, per_layer, n_layers in DECODE_MATVECS:
        keys = [key for key, _ in per_layer] + [OUTPUT[model]]
        if not all(k in seconds for k in keys):
            continue  # a type it needs was not benchmarked
        t = n_layers * sum(share * seconds[key] for key, share in per_layer) + seconds[OUTPUT[model]]
        print(f"{model}: matvecs {t * 1e3:.3f} ms a token -> at most {1 / t:.0f} tok/s from matvecs alone")


def main(types: list[str]) -> None:
    import cupy as cp

    import kernels.cuda.quant as cq

    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, "
          f"copy {copy_bandwidth(cp):.0f} GB/s (read+write)", flush=True)
    results = []
    for name in types:
        for n_rows, n_cols in SHAPES:
            r = bench_one(cp, cq, TYPES_BY_NAME[name], n_rows, n_cols)
            results.append(r)
            print(f"{name:5s} {n_rows:6d}x{n_cols:<6d} " + " ".join(f"tpr{t}:{g:6.0f}" for t, g in r["gbs"].items())
                  + f"  default tpr{r['default_tpr']}", flush=True)
            cp.get_default_memory_pool().free_all_blocks()
    x = cp.random.standard_normal(14336, dtype=cp.float32)
    print(f"quantize_q8_1 of 14336 values: {time_quantize(cp, cq, x, cq.Q8Vector.empty(14336)) * 1e6:.2f} us")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_cuda.json"), "w") as f:
            json.dump(results, f, indent=1)
    print(f"\nGB/s at the default threads_per_row (roofline {ROOFLINE_GBS:.0f}); shapes rows x cols")
    print("shape        " + "".join(f"{name:>6}" for name in types))
    for n_rows, n_cols in SHAPES:
        row = {r["type"]: r["gbs"][r["default_tpr"]] for r in results if (r["rows"], r["cols"]) == (n_rows, n_cols)}
        print(f"{n_rows}x{n_cols}".ljust(13) + "".join(f"{row[name]:6.0f}" for name in types))
    print_decode_estimates(results)


def time_quantize(cp, cq, x, xq, n_launch=64):
    """Seconds of one quantize_q8_1, from a graph replay."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        cq.quantize_q8_1(x, xq, stream=stream)
        stream.synchronize()
        stream.begin_capture()
        for _ in range(n_launch):
            cq.quantize_q8_1(x, xq, stream=stream)
        graph = stream.end_capture()
        graph.launch(stream)
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        graph.launch(stream)
        stop.record(stream)
        stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) / 1e3 / n_launch


if __name__ == "__main__":
    main(sys.argv[1:] or TYPES)
