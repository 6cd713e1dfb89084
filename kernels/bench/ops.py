"""Benchmark the op kernels of kernels/cuda/ops.py on the device: time per call from CUDA graph replays.

Run on the device machine: python3 -m kernels.bench.ops. Decode attention cycles over enough layer caches
to exceed the 50 MB L2 at long contexts and reports GB/s of KV read against the 3.0 TB/s HBM roofline;
prefill attention reports TFLOP/s (4 * n_tok^2 / 2 * n_head * head_dim flops, causal); the small ops report
microseconds (a graph node costs ~1-2 us however little it does).
"""
import cupy as cp
import numpy as np

import kernels.cuda.ops as ops
from kernels.bench import cuda as bench_cuda
from kernels.bench.cuda import random_weight_bytes
from kernels.cuda.quant import Q8Vector, quantize_q8_1, to_device
from models.ggml_types import TYPES_BY_NAME

ROOFLINE_GBS = 3000.0
# (n_head, n_head_kv, head_dim) of the attention benches: llama3-8b's; Gemma 4 31B's global layers (heads of 512: the
# kernels make the output in slices, each reading the keys again, from L2 if the slices run together)
ATTENTION_SHAPES = [(32, 8, 128), (32, 4, 512)]


def time_graph(step, n_launch: int, replays: int = 7) -> float:
    return bench_cuda.time_graph(cp, step, n_launch, replays)


def bench_decode_attention(rows, n_head: int, n_head_kv: int, head_dim: int):
    max_ctx = 16384
    layers = [ops.kv_cache(n_head_kv, max_ctx, head_dim) for _ in range(8)]  # 8 x 64 MiB (8 kv heads of 128, 4 of 512)
    for k, v in layers:
        k[...] = cp.random.standard_normal(k.shape, dtype=cp.float32).astype(cp.float16)
        v[...] = cp.random.standard_normal(v.shape, dtype=cp.float32).astype(cp.float16)
    q = cp.random.standard_normal((n_head, head_dim), dtype=cp.float32)
    out = cp.empty((n_head, head_dim), dtype=cp.float32)
    scratch = ops.decode_scratch(n_head, n_head_kv, head_dim)
    for n_ctx in (1, 37, 512, 4096, 16384):
        pos = cp.array([n_ctx - 1], dtype=cp.int32)

        def step(i, stream):
            k, v = layers[i % len(layers)]
            ops.attention_decode(q, k, v, out, pos, scratch, 0.088, stream=stream)

        t = time_graph(step, 32)
        gbs = 2 * n_head_kv * n_ctx * head_dim * 2 / t / 1e9
        rows.append((f"attention_decode {n_head}h/{n_head_kv}kv/{head_dim} ctx {n_ctx} ({scratch.shape[1]} splits)", t,
                     f"{gbs:.0f} GB/s KV", f"{gbs / ROOFLINE_GBS:.0%} of roofline"))


def bench_prefill_attention(rows, n_head: int, n_head_kv: int, head_dim: int):
    for n_tok in (512, 2048):
        k, v = ops.kv_cache(n_head_kv, n_tok, head_dim)
        k[...] = cp.random.standard_normal(k.shape, dtype=cp.float32).astype(cp.float16)
        v[...] = cp.random.standard_normal(v.shape, dtype=cp.float32).astype(cp.float16)
        q = cp.random.standard_normal((n_tok, n_head, head_dim), dtype=cp.float32)
        out = cp.empty_like(q)
        pos = cp.zeros(1, dtype=cp.int32)
        t = time_graph(lambda i, s: ops.attention_prefill(q, k, v, out, pos, 0.088, stream=s), 4, 3)
        flops = 4 * n_tok * n_tok / 2 * n_head * head_dim
        rows.append((f"attention_prefill {n_head}h/{n_head_kv}kv/{head_dim} n {n_tok}", t, f"{flops / t / 1e12:.2f} TFLOP/s",
                     ""))


def bench_small_ops(rows):
    d, n_ff, n_vocab = 4096, 14336, 128256
    x, r, y = (cp.random.standard_normal(d, dtype=cp.float32) for _ in range(3))
    w = cp.ones(d, dtype=cp.float32)
    gate, up, act = (cp.random.standard_normal(n_ff, dtype=cp.float32) for _ in range(3))
    q = cp.random.standard_normal((1, 32, 128), dtype=cp.float32)
    k = cp.random.standard_normal((1, 8, 128), dtype=cp.float32)
    inv_freq = cp.asarray(5e5 ** (-np.arange(0, 128, 2, dtype=np.float64) / 128))
    k_cache, v_cache = ops.kv_cache(8, 4096, 128)
    pos = cp.array([100], dtype=cp.int32)
    qtype = TYPES_BY_NAME["Q6_K"]
    table = to_device(random_weight_bytes(qtype, 4096, d), qtype)
    ids = cp.array([17], dtype=cp.int32)
    emb = cp.empty((1, d), dtype=cp.float32)
    logits = cp.random.standard_normal(n_vocab, dtype=cp.float32)
    token, hist = cp.zeros(1, dtype=cp.int32), cp.zeros(64, dtype=cp.int32)
    fparams, iparams = ops.sampling_params()
    ops.set_sampling_params(fparams, iparams, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05,
                            repeat_penalty=1.1, seed=1)
    cand, amax = ops.sample_scratch(n_vocab), ops.argmax_scratch()
    x_q8, act_q8 = Q8Vector.empty(d), Q8Vector.empty(n_ff)
    cases = {
        "embed Q6_K 4096": lambda i, s: ops.embed(table, ids, emb, 1.0, s),
        "rms_norm 4096 + residual": lambda i, s: ops.rms_norm(x, w, y, 1e-5, residual=r, stream=s),
        "rms_norm 4096 + q8_1 copy": lambda i, s: ops.rms_norm(x[None], w, y[None], 1e-5, xq=x_q8, stream=s),
        "quantize_q8_1 4096": lambda i, s: quantize_q8_1(y, x_q8, s),
        "rope 32+8 heads x 128": lambda i, s: ops.rope(q, k, inv_freq, pos, False, s),
        "kv_write 8 x 128": lambda i, s: ops.kv_write(k, k, k_cache, v_cache, pos, s),
        "rope_kv_write 32+8 heads x 128": lambda i, s: ops.rope_kv_write(q, k, k, inv_freq, pos, False, k_cache,
                                                                         v_cache, s),
        "glu silu 14336": lambda i, s: ops.glu(gate, up, act, "silu", stream=s),
        "glu silu 14336 + q8_1 copy": lambda i, s: ops.glu(gate, up, act, "silu", xq=act_q8, stream=s),
        "add 4096": lambda i, s: ops.add(x, r, y, s),
        # the samplers advance pos: harmless here, pos only keys the RNG and the history ring
        "argmax 128256 (2 kernels)": lambda i, s: ops.argmax(logits, amax, token, hist, pos, s),
        "sample 128256 (1 kernel)": lambda i, s: ops.sample(logits, cand, fparams, iparams, token, hist, pos, s),
    }
    for name, step in cases.items():
        rows.append((name, time_graph(step, 64), "", ""))


def main():
    print(cp.cuda.runtime.getDeviceProperties(0)["name"].decode())
    rows = []
    bench_small_ops(rows)
    for shape in ATTENTION_SHAPES:
        bench_decode_attention(rows, *shape)
        bench_prefill_attention(rows, *shape)
    print(f"{'op':58s} {'us':>9s}")
    for name, t, a, b in rows:
        print(f"{name:58s} {t * 1e6:9.2f}  {a} {b}")


if __name__ == "__main__":
    main()
