"""Benchmark the Gated DeltaNet kernels (kernels/cuda/deltanet.py) at the real models' shapes: time per call
from CUDA graph replays (kernels/bench/cuda.time_graph).

Run on the device machine: python3 -m kernels.bench.deltanet. The decode step (one token) cycles over 32
layers' states (64-96 MiB, past the 50 MB L2, as a decode step's GDN layers are) and reports GB/s of state read
and written (Hv * S * S * 4 bytes each way); prompts report tokens/s, chunked against token by token.
"""
import cupy as cp
import numpy as np

import kernels.cuda.deltanet as dn
from kernels.bench import cuda as bench_cuda

# name: (Hk, Hv, S)
SHAPES = {"qwen3.5-35b-a3b": (16, 32, 128), "qwen3.5-27b": (16, 48, 128)}
LAYERS = 32
EPS = 1e-6


def time_graph(step, n_launch: int, replays: int = 5) -> float:
    return bench_cuda.time_graph(cp, step, n_launch, replays)


def layer_inputs(n, Hk, Hv, S):
    C = (2 * Hk + Hv) * S
    r = lambda *s: cp.random.standard_normal(s, dtype=cp.float32)  # noqa: E731
    return dict(y=r(n, C), alpha=r(n, Hv), beta=r(n, Hv), dt_bias=r(Hv), a=-cp.exp(r(Hv)), z=r(n, Hv * S),
                norm_w=r(S), out=cp.empty((n, Hv * S), dtype=cp.float32))


def bench(rows):
    for name, (Hk, Hv, S) in SHAPES.items():
        C = (2 * Hk + Hv) * S
        states = [0.1 * cp.random.standard_normal((Hv, S, S), dtype=cp.float32) for _ in range(LAYERS)]
        conv_w = cp.random.standard_normal((C, 4), dtype=cp.float32)
        conv_state = cp.zeros((3, C), dtype=cp.float32)
        state_bytes = Hv * S * S * 4
        for n in (1, 32, 64, 512, 8192):
            x = layer_inputs(n, Hk, Hv, S)
            conv_out = cp.empty((n, C), dtype=cp.float32)

            def rule(i, stream, chunked):
                dn.delta_rule(x["y"], x["alpha"], x["beta"], x["dt_bias"], x["a"], x["z"], x["norm_w"],
                              states[i % LAYERS], x["out"], Hk, EPS, stream, chunked=chunked)

            launches = 64 if n == 1 else 1
            t_conv = time_graph(lambda i, s: dn.conv_silu(x["y"], conv_state, conv_w, conv_out, s), launches)
            t_tok = time_graph(lambda i, s: rule(i, s, False), launches)
            if n == 1:
                rows.append((f"{name} conv_silu n 1", t_conv, f"{2 * C * 4 * 4 / t_conv / 1e9:.0f} GB/s", ""))
                rows.append((f"{name} delta_rule decode", t_tok, f"{2 * state_bytes / t_tok / 1e9:.0f} GB/s state",
                             ""))
                continue
            t_chunk = time_graph(lambda i, s: rule(i, s, True), 1)
            rows.append((f"{name} conv_silu n {n}", t_conv, f"{n / t_conv:.3g} tok/s", ""))
            rows.append((f"{name} delta_rule tokens n {n}", t_tok, f"{n / t_tok:.3g} tok/s", ""))
            rows.append((f"{name} delta_rule chunks n {n}", t_chunk, f"{n / t_chunk:.3g} tok/s",
                         f"{t_tok / t_chunk:.1f}x token by token"))


def main():
    print(cp.cuda.runtime.getDeviceProperties(0)["name"].decode())
    rows = []
    bench(rows)
    for name, t, rate, note in rows:
        print(f"{name:45s} {t * 1e6:10.1f} us  {rate:>18s}  {note}")


if __name__ == "__main__":
    main()
