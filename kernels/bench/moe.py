"""Benchmark a mixture-of-experts layer's expert matmuls (kernels/cuda/moe.py) at a model's shapes: Qwen3-30B-A3B's
(128 experts, 8 a token, gate and up [768, 2048], down [2048, 768], Q4_K, down Q6_K as in half of q4_k_m's layers)
or Gemma 4 26B-A4B's (128 experts, 8 a token, gate and up [704, 2816], down [2816, 704]: Q5_0 or Q8_0 in q4_k_m, as
704 columns are no multiple of Q4_K's 256). For each token count: the grouped path (sort, gate+up+glu, down:
kernels/cuda/moe_mm.cu) and the per-pair path (the decode kernels), microseconds a layer with the routing spread
uniformly; the grouped path's TFLOP/s counts the pairs' useful products only. Weights are 340 MB (Qwen3) or 310 MB
(Gemma 4) a layer, 6-7x the L2, so they come from HBM.

Run on the device machine: python3 -m kernels.bench.moe [--shape gemma4-26b-a4b] [--down TYPE] [TOKENS ...]
"""
import argparse

import numpy as np

from kernels.bench.cuda import random_weight_bytes
from kernels.bench.prefill import time_loop
from kernels.cuda.layout import repack
from models.ggml_types import TYPES_BY_NAME

# name: (n_expert, k, n_ff, n_embd, layers, down's type, activation)
SHAPES = {"qwen3moe-30b-a3b": (128, 8, 768, 2048, 48, "Q6_K", "silu"),
          "gemma4-26b-a4b": (128, 8, 704, 2816, 30, "Q8_0", "gelu")}
N_TOKENS = [1, 4, 8, 16, 32, 64, 512, 2048]


def stack(cp, cq, moe, name, n_expert, n_rows, n_cols, seed):
    qtype = TYPES_BY_NAME[name]
    raw = random_weight_bytes(qtype, n_expert * n_rows, n_cols, xp=cp, seed=seed)
    return moe.DeviceExperts(cq.DeviceWeight(repack(raw, qtype), qtype, n_expert * n_rows, n_cols), n_expert)


def main(shape: str, down_type: str | None, n_tokens: list[int]) -> None:
    import cupy as cp

    import kernels.cuda.moe as moe
    import kernels.cuda.quant as cq

    n_expert, k, n_ff, n_embd, n_layers, default_down, act = SHAPES[shape]
    down_type = down_type or default_down
    gate, up = (stack(cp, cq, moe, "Q4_K", n_expert, n_ff, n_embd, seed) for seed in (1, 2))
    down = stack(cp, cq, moe, down_type, n_expert, n_embd, n_ff, 3)
    print(f"{shape}: gate, up Q4_K [{n_ff}, {n_embd}], down {down_type} [{n_embd}, {n_ff}], {n_expert} experts, k {k}")
    print(f"| tokens | grouped us | sort | gate+up+glu | down | TFLOP/s | per-pair us | {n_layers} layers grouped ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in n_tokens:
        rng = np.random.default_rng(n)
        ids = cp.asarray(np.stack([rng.permutation(n_expert)[:k] for _ in range(n)]).astype(np.int32))
        weights = cp.full((n, k), 1.0 / k, cp.float32)
        h = cp.random.standard_normal((n, n_embd), dtype=cp.float32)
        h16 = h.astype(cp.float16)
        act16 = cp.empty((n * k, n_ff), cp.float16)
        y = cp.empty((n * k, n_embd), cp.float32)
        pairs = moe.sort_pairs(ids, n_expert)

        def sort(_):
            moe.sort_pairs(ids, n_expert)

        def gate_up(_):
            moe.gate_up_glu_grouped(gate, up, h16, k, pairs, act16, act)

        def down_mm(_):
            moe.matmul_grouped(down, act16, 1, pairs, y)

        def grouped(i):
            sort(i), gate_up(i), down_mm(i)

        hq = cq.Q8Vector.empty(h.size)
        act32 = cp.empty((n * k, n_ff), cp.float32)
        act_q = cq.Q8Vector.empty(act32.size)
        out = cp.empty((n, n_embd), cp.float32)

        def per_pair(_):
            cq.quantize_q8_1(h.reshape(-1), hq)
            moe.gate_up_glu(gate, up, ids, hq, act32, act_q, act)
            moe.down(down, ids, weights, act_q, out, out)

        t = {name: time_loop(cp, f, 10) * 1e6 for name, f in
             (("grouped", grouped), ("sort", sort), ("gate_up", gate_up), ("down", down_mm), ("per_pair", per_pair))}
        flop = 2 * n * k * 3 * n_ff * n_embd
        print(f"| {n} | {t['grouped']:.1f} | {t['sort']:.1f} | {t['gate_up']:.1f} | {t['down']:.1f} | "
              f"{flop / t['grouped'] / 1e6:.1f} | {t['per_pair']:.1f} | {n_layers * t['grouped'] / 1e3:.2f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=SHAPES, default="qwen3moe-30b-a3b")
    parser.add_argument("--down", help="down's type (default: the shape's)")
    parser.add_argument("tokens", type=int, nargs="*", default=N_TOKENS)
    args = parser.parse_args()
    main(args.shape, args.down, args.tokens)
