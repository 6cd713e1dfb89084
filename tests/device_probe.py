"""The GPU machine's host, for the split engine's design: DRAM read GB/s from numba threads, our matmuls over 16
layers' matrices, pinned host-to-device copies, a GPU kernel reading pinned host memory (zero-copy, UVA), and
the CPU's matmuls while the GPU reads host memory.

    python3 tests/device_probe.py FILE.gguf      # a llama3-8b-shaped file (synth_gguf.py --preset llama3-8b)
"""
import sys
import time

import cupy as cp
import numba as nb
import numpy as np

from inference.weights import load_weights
from kernels.cpu.quant import quantized_matmul, quantized_matmuls
from models.config import config_from_metadata
from models.gguf import open_gguf


@nb.njit(parallel=True, fastmath=True)
def _read(a, n_chunks):  # sums a in n_chunks chunks, one a thread at a time: DRAM-bound for large a
    out = np.empty(n_chunks, np.float32)
    for c in nb.prange(n_chunks):
        out[c] = a[c * a.size // n_chunks:(c + 1) * a.size // n_chunks].sum()
    return out.sum()


def best_seconds(f, runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times)


def layer_matmuls(layers, cfg):
    """One decode token's matmuls of layers, grouped as forward() calls them."""
    x = np.random.default_rng(0).standard_normal((1, cfg.n_embd), np.float32)
    x_ff = np.random.default_rng(1).standard_normal((1, cfg.n_ff), np.float32)
    for layer in layers:
        quantized_matmuls([m.data for m in layer.qkv], [m.qtype for m in layer.qkv], x)
        quantized_matmul(layer.attn_output.data, layer.attn_output.qtype, x)
        quantized_matmuls([m.data for m in layer.gate_up], [m.qtype for m in layer.gate_up], x)
        quantized_matmul(layer.ffn_down.data, layer.ffn_down.qtype, x_ff)


ZERO_COPY_READ = cp.RawKernel(r'''extern "C" __global__ void read(const uint4* __restrict__ p, long n, unsigned* out) {
  unsigned s = 0;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
    uint4 v = p[i]; s += v.x ^ v.y ^ v.z ^ v.w; }
  if (s == 12345) out[0] = s; }''', "read")


def main(path: str) -> None:
    a = np.ones(1 << 29, np.float32)  # 2 GiB
    for threads in (16, 8, 1):
        nb.set_num_threads(min(threads, nb.config.NUMBA_NUM_THREADS))
        print(f"DRAM read, {threads} threads: {a.nbytes / best_seconds(lambda: _read(a, 64)) / 1e9:.1f} GB/s")
    nb.set_num_threads(nb.config.NUMBA_NUM_THREADS)
    del a
    gguf = open_gguf(path)
    cfg = config_from_metadata(gguf.metadata)
    layers = load_weights(gguf, cfg).layers[:16]
    nbytes = sum(m.data.nbytes for layer in layers
                 for m in (*layer.qkv, layer.attn_output, *layer.gate_up, layer.ffn_down))
    layer_matmuls(layers, cfg)
    cpu_alone = nbytes / best_seconds(lambda: layer_matmuls(layers, cfg), 4) / 1e9
    print(f"CPU matmuls of 16 layers ({nbytes / 1e9:.2f} GB): {cpu_alone:.1f} GB/s")

    n = 1 << 30
    pinned = cp.cuda.alloc_pinned_memory(n)
    np.frombuffer(pinned, np.uint8, n)[:] = 1
    device = cp.empty(n, cp.uint8)
    host = np.frombuffer(pinned, np.uint8, n)
    stream = cp.cuda.Stream(non_blocking=True)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    with stream:
        device.set(host, stream=stream)
        start.record(stream)
        for _ in range(5):
            device.set(host, stream=stream)
        end.record(stream)
    end.synchronize()
    print(f"pinned host-to-device copy: {5 * n / cp.cuda.get_elapsed_time(start, end) / 1e6:.1f} GB/s")
    # under UVA the pinned host pointer is valid in kernels: the GPU reads host memory over PCIe
    memory = cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(pinned.ptr, n, pinned), 0)
    zero_copy = cp.ndarray((n // 16, 4), cp.uint32, memory)
    out = cp.zeros(1, cp.uint32)
    launch = lambda: ZERO_COPY_READ((132 * 16,), (256,), (zero_copy, np.int64(n // 16), out))  # noqa: E731
    with stream:
        launch()
        start.record(stream)
        for _ in range(3):
            launch()
        end.record(stream)
    end.synchronize()
    print(f"GPU zero-copy read of pinned host memory: {3 * n / cp.cuda.get_elapsed_time(start, end) / 1e6:.1f} GB/s")
    with stream:  # both at once: the GPU reads host memory throughout the CPU's two passes
        start.record(stream)
        for _ in range(40):
            launch()
        end.record(stream)
    t = time.perf_counter()
    layer_matmuls(layers, cfg)
    layer_matmuls(layers, cfg)
    cpu_both = 2 * nbytes / (time.perf_counter() - t) / 1e9
    gpu_busy = not end.done
    end.synchronize()
    print(f"at once: CPU matmuls {cpu_both:.1f} GB/s (GPU busy throughout: {gpu_busy}), GPU zero-copy "
          f"{40 * n / cp.cuda.get_elapsed_time(start, end) / 1e6:.1f} GB/s")


if __name__ == "__main__":
    main(sys.argv[1])
