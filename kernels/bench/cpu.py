"""Speed of the CPU kernels at real model shapes: GB/s of weight bytes read per second.

    python -m kernels.bench.cpu                  # matvec (1 token) and prompt (128 tokens), every type
    python -m kernels.bench.cpu Q8_0 Q4_K        # only these types
    python -m kernels.bench.cpu --model F.gguf   # every matrix of a real model: kernel time per token
    python -m kernels.bench.cpu --llama3-8b Q4_K # matvec only, at llama3-8b's shapes (the hybrid decode case)
    python -m kernels.bench.cpu --layer          # one decode token's matmuls of a q4_k_m layer: 7 calls vs 4
    python -m kernels.bench.cpu --dram           # from DRAM: llama3-8b's matvecs and one token's 8 experts at
                                                 # Qwen3-30B-A3B's shapes, next to the cores' DRAM read rate
    python -m kernels.bench.cpu --experts        # one decode token's 8 chosen experts at Qwen3-30B-A3B's shapes
                                                 # (cpu_quant.OneTokenExperts.ffn, what moe_experts runs)

Weights are random valid blocks (speed does not depend on values, as long as the scales are normal
floats: subnormal ones make BLAS crawl). Times are the best of several runs, since the machine may be
shared: the best run is the one least disturbed by others. On a busy machine a parallel kernel still
waits for its slowest thread to get a core: NUMBA_NUM_THREADS=1 then gives the steadier per-core figure.
"""
import sys
import time

import numba as nb
import numpy as np

from kernels.cpu.claim import claim, counters
from kernels.cpu.matvec import N_WORKERS, prefetch_at
from kernels.cpu.quant import OneTokenExperts, quantized_matmul, quantized_matmuls
from kernels.cpu.repack import LAYOUTS, repack
from models.ggml_types import TYPES_BY_NAME

# (type, n_cols, n_rows) as in SmolLM2-135M Q4_1 and Gemma-3-270M Q4_K_M
SHAPES = [
    ("Q4_1", 576, 1536), ("Q4_1", 1536, 576), ("Q8_0", 576, 49152),
    ("Q5_0", 640, 2048), ("Q4_K", 2048, 640), ("Q6_K", 2048, 640), ("Q8_0", 640, 262144),
    ("Q4_0", 2048, 2048), ("Q5_1", 2048, 2048), ("Q2_K", 2048, 2048), ("Q3_K", 2048, 2048),
    ("Q5_K", 2048, 2048), ("F16", 2048, 2048), ("BF16", 2048, 2048), ("F32", 2048, 2048),
    ("MXFP4", 2880, 2880), ("IQ4_NL", 2048, 2048), ("IQ4_XS", 2048, 2048),  # gpt-oss's expert; the 4-bit tables
    ("IQ3_XXS", 2048, 2048), ("IQ2_XXS", 2048, 2048),  # the grid types
]
# llama3-8b q4_k_m / q8_0: attn_q (attn_k, attn_v are 4096 x 1024; q4_k_m has Q6_K attn_v in some layers),
# ffn_gate + ffn_up as one matrix, ffn_down
LLAMA3_8B_SHAPES = [
    ("Q4_K", 4096, 4096), ("Q4_K", 4096, 28672), ("Q4_K", 14336, 4096), ("Q6_K", 14336, 4096), ("Q6_K", 4096, 1024),
    ("Q8_0", 4096, 4096), ("Q8_0", 4096, 28672), ("Q8_0", 14336, 4096),
]
# one q4_k_m layer's matrices as forward() groups them, (type, n_cols, n_rows): [q, k, v], [o], [gate, up], [down]
LAYERS = {
    "llama-1b": [[("Q4_K", 2048, 2048), ("Q4_K", 2048, 512), ("Q6_K", 2048, 512)], [("Q4_K", 2048, 2048)],
                 [("Q4_K", 2048, 8192), ("Q4_K", 2048, 8192)], [("Q6_K", 8192, 2048)]],
    "llama3-8b": [[("Q4_K", 4096, 4096), ("Q4_K", 4096, 1024), ("Q6_K", 4096, 1024)], [("Q4_K", 4096, 4096)],
                  [("Q4_K", 4096, 14336), ("Q4_K", 4096, 14336)], [("Q6_K", 14336, 4096)]],
}
# copies of a weight read in turn, or experts' stacks of which a call reads 8 chosen at random: 1 GiB, ~3x the
# device host's L3 (300 MiB), still left a third of the reads to it (Q8_0 read 1.7x the DRAM sum's rate, session 15)
DRAM_BYTES = 4 << 30
PROMPT_TOKENS = 128

# where each block type keeps its f16 scales (random bytes there could be inf, nan or subnormal)
F16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q2_K": [80, 82],
              "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "MXFP4": [],
              **dict.fromkeys(["IQ4_NL", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S"], [0]),
              "IQ1_M": []}  # its f16 d is the top nibbles of its 4 scale words, set below


def random_weight(name: str, n_rows: int, n_cols: int, seed: int = 0) -> np.ndarray:
    """Random valid bytes of a [n_rows, n_cols] weight: uint8 [n_rows, row_bytes], read-only like a mmap."""
    rng = np.random.default_rng(seed)
    qt = TYPES_BY_NAME[name]
    if name == "F32":
        w = rng.standard_normal((n_rows, n_cols), np.float32).view(np.uint8)
    elif name == "F16":
        w = rng.standard_normal((n_rows, n_cols)).astype(np.float16).view(np.uint8)
    elif name == "BF16":
        w = (rng.standard_normal((n_rows, n_cols), np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    else:
        n_blocks = n_rows * n_cols // qt.block_elems
        blocks = rng.integers(0, 256, (n_blocks, qt.block_bytes), dtype=np.uint8)
        for off in F16_FIELDS[name]:
            scale = rng.uniform(-0.05, 0.05, n_blocks).astype(np.float16)
            blocks[:, off:off + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
        if name == "MXFP4":  # its e8m0 scale byte: 2^-8 .. 2^-5 (values up to 12 times that)
            blocks[:, 0] = rng.integers(120, 124, n_blocks)
        if name == "IQ1_M":
            d = rng.uniform(-0.05, 0.05, n_blocks).astype(np.float16).view(np.uint16)[:, None]
            words = blocks[:, 48:56].copy().view("<u2")
            words[:] = (words & 0x0FFF) | (((d >> np.array([0, 4, 8, 12], np.uint16)) & 0xF) << 12)
            blocks[:, 48:56] = words.view(np.uint8)
        w = blocks.reshape(n_rows, -1)
    w = np.ascontiguousarray(w)
    w.flags.writeable = False
    return w


def best_seconds(fn, min_total: float = 0.5, min_runs: int = 5) -> float:
    fn()  # compile / warm caches
    times = []
    start = time.perf_counter()
    while len(times) < min_runs or time.perf_counter() - start < min_total:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench(name: str, n_cols: int, n_rows: int, prompt: bool = True) -> tuple[float, float]:
    """(matvec GB/s, prompt tokens/s, nan without prompt) of one weight shape; Q4_0, Q4_1, Q5_0 and Q5_1 repacked
    eight rows at a time, as the CPU engine holds its layers' matrices of those types."""
    qt = TYPES_BY_NAME[name]
    rng = np.random.default_rng(0)
    w = random_weight(name, n_rows, n_cols)
    if qt.id in LAYOUTS:
        w = repack(w, qt.id)
    x1 = rng.standard_normal((1, n_cols), np.float32)
    out1 = np.empty((1, n_rows), np.float32)
    t1 = best_seconds(lambda: quantized_matmul(w, qt, x1, out=out1))
    tps = float("nan")
    if prompt:
        xp = rng.standard_normal((PROMPT_TOKENS, n_cols), np.float32)
        tps = PROMPT_TOKENS / best_seconds(lambda: quantized_matmul(w, qt, xp), min_runs=2)
    return (w.data if qt.id in LAYOUTS else w).nbytes / t1 / 1e9, tps


def main(types: list[str], shapes: list[tuple[str, int, int]], prompt: bool) -> None:
    print(f"{nb.get_num_threads()} threads; matvec = 1 token, prompt = {PROMPT_TOKENS} tokens")
    print(f"{'type':6} {'n_cols x n_rows':>16} {'MB':>7} {'matvec GB/s':>12} {'matvec ms':>10} {'prompt GFLOP/s':>15}")
    for name, n_cols, n_rows in shapes:
        if types and name not in types:
            continue
        gbs, tps = bench(name, n_cols, n_rows, prompt)
        mb = TYPES_BY_NAME[name].nbytes(n_cols) * n_rows / 1e6
        gflops = 2 * n_cols * n_rows * tps / 1e9
        print(f"{name:6} {f'{n_cols} x {n_rows}':>16} {mb:7.1f} {gbs:12.2f} {mb / gbs:10.3f} {gflops:15.1f}",
              flush=True)


@nb.njit(parallel=True, fastmath=True)
def _sum(a):
    """The sum of a (float32 [n], n a multiple of 128), its chunks claimed by the threads as the matvecs' are: the
    plain half of bench_dram's DRAM read."""
    n_chunks, n_runs = 16 * N_WORKERS, a.size // 128
    sums = np.zeros(N_WORKERS, np.float32)
    counter = counters(1)
    for w in nb.prange(N_WORKERS):
        c = claim(counter)
        while c < n_chunks:
            s = np.float32(0)
            for i in range(c * n_runs // n_chunks * 128, (c + 1) * n_runs // n_chunks * 128):
                s += a[i]
            sums[w] += s
            c = claim(counter)
    return sums.sum()


@nb.njit(parallel=True, fastmath=True)
def _sum_prefetched(a):
    """_sum with each cache line prefetched 2 KiB ahead, as the matvecs prefetch their rows: the other half of
    bench_dram's DRAM read (slower on the 2-core VM, where the loop no longer vectorizes as well)."""
    n_chunks, n_runs = 16 * N_WORKERS, a.size // 128
    sums = np.zeros(N_WORKERS, np.float32)
    counter = counters(1)
    for w in nb.prange(N_WORKERS):
        acc = np.zeros(16, np.float32)
        c = claim(counter)
        while c < n_chunks:
            for run in range(c * n_runs // n_chunks, (c + 1) * n_runs // n_chunks):  # 512 bytes: 8 lines
                for line in range(8):
                    o = 128 * run + 16 * line
                    prefetch_at(a, o + 512)
                    for j in range(16):
                        acc[j] += a[o + j]
            c = claim(counter)
        sums[w] = acc.sum()
    return sums.sum()


def best_median(fn, passes: int = 5) -> tuple[float, float]:
    """(best, median) seconds of passes of fn."""
    times = []
    for _ in range(passes):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), float(np.median(times))


def _rate(nbytes: int, fn) -> tuple[float, float]:
    """(best, median) GB/s of fn, which reads nbytes: a warm-up call, then best_median's passes."""
    fn()
    best, median = best_median(fn)
    return nbytes / best / 1e9, nbytes / median / 1e9


def _dram_reads() -> dict[str, tuple[float, float]]:
    """(best, median) GB/s of _sum and _sum_prefetched over DRAM_BYTES."""
    a = np.ones(DRAM_BYTES // 4, np.float32)
    return {"plain": _rate(a.nbytes, lambda: _sum(a)), "prefetched": _rate(a.nbytes, lambda: _sum_prefetched(a))}


def bench_dram() -> None:
    """GB/s from DRAM of llama3-8b's matvecs and of a Qwen3-30B-A3B token's 8 experts (OneTokenExperts.ffn, as the
    engine runs them: gate and up with the GLU, then the downs' weighted sum), weights rotated over copies, or layers'
    stacks, adding up to DRAM_BYTES, so that none is still in the caches when its turn comes, the experts chosen at
    random; next to the DRAM read rate of all threads (the faster of _sum and _sum_prefetched over DRAM_BYTES).
    Best and median of 5 passes; the share of DRAM is the medians'."""
    sums = _dram_reads()
    dram = max(sums.values(), key=lambda rate: rate[1])
    print(f"{nb.get_num_threads()} threads; DRAM read, the faster of two parallel sums of {DRAM_BYTES >> 20} MiB: "
          + ", ".join(f"{name} best {b:.1f} median {m:.1f} GB/s" for name, (b, m) in sums.items()))
    print(f"{'type':6} {'what':34} {'MB a call':>9} {'best GB/s':>9} {'median':>7} {'of DRAM':>8}")
    rng = np.random.default_rng(0)

    def row(name, what, mb, rate):
        print(f"{name:6} {what:34} {mb:9.1f} {rate[0]:9.1f} {rate[1]:7.1f} {rate[1] / dram[1]:8.0%}", flush=True)

    for name, n_cols, n_rows in LLAMA3_8B_SHAPES:
        qt = TYPES_BY_NAME[name]
        w = random_weight(name, n_rows, n_cols)
        copies = [w.copy() for _ in range(max(2, DRAM_BYTES // w.nbytes))]
        for c in copies:
            c.flags.writeable = False
        x = rng.standard_normal((1, n_cols), np.float32)
        out = np.empty((1, n_rows), np.float32)

        def one_pass():
            for c in copies:
                quantized_matmul(c, qt, x, out=out)
        row(name, f"llama3-8b {n_cols} x {n_rows}", w.nbytes / 1e6, _rate(w.nbytes * len(copies), one_pass))
    n_expert, k, n_embd, n_ff = 128, 8, 2048, 768
    for gate_up, down in (("Q4_K", "Q4_K"), ("Q4_K", "Q6_K"), ("Q8_0", "Q8_0")):
        layer_bytes = n_expert * (2 * TYPES_BY_NAME[gate_up].nbytes(n_embd) * n_ff + TYPES_BY_NAME[down].nbytes(n_ff)
                                  * n_embd)
        layers = [OneTokenExperts(tuple(random_weight(t, n_expert * rows, cols, seed).reshape(n_expert, rows, -1)
                                        for t, rows, cols, seed in ((gate_up, n_ff, n_embd, 3 * n + 1),
                                                                    (gate_up, n_ff, n_embd, 3 * n + 2),
                                                                    (down, n_embd, n_ff, 3 * n + 3))),
                                  tuple(TYPES_BY_NAME[t] for t in (gate_up, gate_up, down)))
                  for n in range(max(2, DRAM_BYTES // layer_bytes))]
        h, out = rng.standard_normal((1, n_embd), np.float32), np.empty((1, n_embd), np.float32)
        weights = np.full(k, 1 / k, np.float32)
        # fresh choices every call of every pass (_rate makes 6), so what the L3 keeps of a pass is rarely chosen again
        ids = iter([[rng.choice(n_expert, k, replace=False).astype(np.int32) for _ in layers] for _ in range(6)])

        def one_pass():
            for experts, chosen in zip(layers, next(ids)):
                experts.ffn(h, chosen, weights, "silu", out)
        call_bytes = layer_bytes * k // n_expert
        row(gate_up, f"8 of 128 experts, down {down}", call_bytes / 1e6, _rate(call_bytes * len(layers), one_pass))


def bench_model(path: str) -> None:
    """Kernel time of one token (matvec) and of a 128-token prompt through every matrix of a model.

    The embedding table counts once as the output head when the model has no output.weight (tied)."""
    from models.gguf import open_gguf

    m = open_gguf(path)
    mats = [t for t in m.tensors.values() if len(t.shape) == 2 and t.name != "token_embd.weight"]
    head = "output.weight" if "output.weight" in m.tensors else "token_embd.weight"
    mats += [m.tensors[head]] if head == "token_embd.weight" else []
    gen_s, prompt_s, nbytes = 0.0, 0.0, 0
    rng = np.random.default_rng(0)
    for t in mats:
        n_cols, n_rows = t.shape
        w = m.tensor_bytes(t.name).reshape(n_rows, -1)
        x1 = rng.standard_normal((1, n_cols), np.float32)
        gen_s += best_seconds(lambda: quantized_matmul(w, t.type, x1), min_total=0.05)
        nbytes += w.nbytes
        if t.name == head:  # a prompt needs the logits of its last token only
            prompt_s += best_seconds(lambda: quantized_matmul(w, t.type, x1), min_total=0.05)
        else:
            xp = rng.standard_normal((PROMPT_TOKENS, n_cols), np.float32)
            prompt_s += best_seconds(lambda: quantized_matmul(w, t.type, xp), min_total=0.05, min_runs=2)
    print(f"{path}: {len(mats)} matrices, {nbytes / 1e6:.0f} MB read per token ({nb.get_num_threads()} threads)")
    print(f"  generation: {gen_s * 1e3:.1f} ms of matvec per token = {1 / gen_s:.0f} tok/s ceiling, "
          f"{nbytes / gen_s / 1e9:.1f} GB/s")
    print(f"  prompt of {PROMPT_TOKENS}: {prompt_s * 1e3:.0f} ms of matmul = {PROMPT_TOKENS / prompt_s:.0f} tok/s ceiling")
    m.close()


def bench_layer(name: str) -> None:
    """One token through one layer's matmuls: one quantized_matmul a matrix (7 calls), then one
    quantized_matmuls a group of matrices sharing x (4 calls, as CPUBackend makes them), alternated."""
    rng = np.random.default_rng(0)
    groups = [[(random_weight(t, n_rows, n_cols, seed=k), TYPES_BY_NAME[t]) for k, (t, n_cols, n_rows) in enumerate(g)]
              for g in LAYERS[name]]
    xs = [rng.standard_normal((1, g[0][1]), np.float32) for g in LAYERS[name]]
    mb = sum(w.nbytes for g in groups for w, _ in g) / 1e6

    def one_each():
        for g, x in zip(groups, xs):
            for w, qt in g:
                quantized_matmul(w, qt, x)

    def grouped():
        for g, x in zip(groups, xs):
            quantized_matmuls([w for w, _ in g], [qt for _, qt in g], x)

    best = {"7 calls": [], "4 calls": []}
    for _ in range(3):
        best["7 calls"].append(best_seconds(one_each))
        best["4 calls"].append(best_seconds(grouped))
    print(f"{name} layer, {mb:.1f} MB, {nb.get_num_threads()} threads, 1 token, best of 3 rounds:")
    for label, times in best.items():
        t = min(times)
        print(f"  {label}: {t * 1e3:.3f} ms  {mb / 1e3 / t:.1f} GB/s")


def bench_experts(n_expert: int = 16, k: int = 8) -> None:
    """One token's k chosen experts of n_expert (stacks of 16: in the caches, so the kernels' and their calls' cost,
    not DRAM's), gate and up Q4_K [768, 2048], down Q6_K [2048, 768]: microseconds a layer, best of 5 rounds."""
    gate, up, down = (random_weight(name, n_expert * rows, cols, seed).reshape(n_expert, rows, -1)
                      for name, rows, cols, seed in (("Q4_K", 768, 2048, 1), ("Q4_K", 768, 2048, 2),
                                                     ("Q6_K", 2048, 768, 3)))
    experts = OneTokenExperts((gate, up, down), tuple(TYPES_BY_NAME[n] for n in ("Q4_K", "Q4_K", "Q6_K")))
    rng = np.random.default_rng(0)
    h, out = rng.standard_normal((1, 2048), np.float32), np.empty((1, 2048), np.float32)
    ids, weights = np.arange(k, dtype=np.int32), np.full(k, 1 / k, np.float32)
    t = min(best_seconds(lambda: experts.ffn(h, ids, weights, "silu", out)) for _ in range(5))
    print(f"{k} of {n_expert} experts, gate/up Q4_K [768, 2048], down Q6_K [2048, 768], {nb.get_num_threads()} "
          f"threads: {t * 1e6:.1f} us a layer")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--model"]:
        bench_model(sys.argv[2])
    elif sys.argv[1:2] == ["--layer"]:
        for name in sys.argv[2:] or LAYERS:
            bench_layer(name)
    elif sys.argv[1:2] == ["--dram"]:
        bench_dram()
    elif sys.argv[1:2] == ["--experts"]:
        bench_experts()
    elif sys.argv[1:2] == ["--llama3-8b"]:
        main(sys.argv[2:], LLAMA3_8B_SHAPES, prompt=False)
    else:
        main(sys.argv[1:], SHAPES, prompt=True)
