"""How a token's host experts reach the GPU and the cores, alone and at once, on the GPU machine (issue 17): the
file's experts in pinned pages (all on the host, --cpu-moe), random choices of 8 of 128 in each of the 48 layers.

    python3 tests/device_host_reads.py FILE.gguf [--steps]   # --steps: only the captured step's profile

Rows, each the best and median of 5 passes over the layers (ms a token, and GB/s of the chosen experts' bytes):
- cores N: backend_cpu.moe_experts on N of a token's experts, layer after layer (what the cores run now);
- in place N: the GPU's decode kernels on N experts read over PCIe from the pinned pages (what the GPU runs now);
- dma N: the N experts' bytes copied into VRAM by the copy engine (one memcpyAsync a matrix), and the host's time
  issuing them;
- both: the cores on 8 - N while the GPU reads N in place or by copies, each layer's GPU work issued just before
  the cores start on it, as a step does; the GPU's own time from events.
Then the captured decode step's pieces: per token, the host's wait for each layer's hand-over, the host's work
after it (of it, moe_experts) and the graph launches.
"""
import statistics
import sys
import time

import cupy as cp
import numpy as np

import inference.host_experts as host_experts
from inference import load
from kernels.cuda import moe as cuda_moe
from kernels.bench.cpu import DRAM_BYTES, _sum, best_median
from kernels.cuda.quant import DeviceWeight, Q8Vector

K = 8


def row(name: str, nbytes: int, best: float, median: float, extra: str = "") -> None:
    print(f"| {name} | {best * 1e3:.2f} / {median * 1e3:.2f} | {nbytes / best / 1e9:.1f} | {extra} |", flush=True)


def main(path: str, steps_only: bool) -> None:
    t = time.perf_counter()
    engine = load(path, device="cuda", ctx=2048, cpu_moe="all")
    be = engine._be
    he = be.host_experts
    print(f"loaded in {time.perf_counter() - t:.1f} s; {he.describe()}")
    cfg = engine.config
    ffns = [engine._weights.layers[i].experts for i in he.layers]
    shares = [he.in_place[id(f)] for f in ffns]
    rng = np.random.default_rng(0)
    ids = [np.sort(rng.permutation(cfg.n_expert)[:K]).astype(np.int32)[None] for _ in ffns]
    weights = np.full((1, K), 1 / K, np.float32)
    h = rng.standard_normal((1, cfg.n_embd)).astype(np.float32)
    expert_bytes = [sum(m.data[0].nbytes for m in (f.gate, f.up, f.down)) for f in ffns]
    print(f"{len(ffns)} host layers, {statistics.mean(expert_bytes) / 1e6:.2f} MB an expert")
    if steps_only:
        for slots in (0, he.gpu_slots, 3, 0, he.gpu_slots, 3):
            step_profile(engine, slots)
        return
    print("| what | ms a token, best / median | GB/s (best) | |\n|---|---:|---:|---|")

    def chosen_bytes(n):
        return sum(b * n for b in expert_bytes)

    def cores(n, layer=None):
        for i in ([layer] if layer is not None else range(len(ffns))):
            host_experts.moe_experts(ffns[i], h, ids[i][:, :n], weights[:, :n], cfg.activation)

    side = cp.cuda.Stream(non_blocking=True)
    ids_dev = [cp.asarray(i) for i in ids]
    w_dev = cp.asarray(weights)
    hq = Q8Vector.empty(cfg.n_embd)
    x = cp.zeros((1, cfg.n_embd), cp.float32)
    out = cp.empty_like(x)
    n_ff = shares[0][0].n_rows
    act = cp.empty((K, n_ff), cp.float32)
    act_q = Q8Vector.empty(act.size)

    def in_place(n, layer):
        s = shares[layer]
        cuda_moe.gate_up_glu(s[0], s[1], ids_dev[layer][:, K - n:], hq, act[:n], _q8_view(act_q, n * n_ff),
                             cfg.activation, stream=side)
        cuda_moe.down(s[2], ids_dev[layer][:, K - n:], w_dev[:, K - n:], _q8_view(act_q, n * n_ff), out, x,
                      stream=side)

    # VRAM staging: K slots of each stack in the file's layout
    staging = [cp.empty((K,) + m.data.shape[1:], cp.uint8) for m in (ffns[0].gate, ffns[0].up, ffns[0].down)]
    slot_ids = cp.arange(K, dtype=cp.int32)[None]

    def dma(n, layer):
        f = ffns[layer]
        for m, dst in zip((f.gate, f.up, f.down), staging):
            for j in range(n):
                src = m.data[ids[layer][0, K - n + j]]
                cp.cuda.runtime.memcpyAsync(dst[j].data.ptr, src.ctypes.data, src.nbytes,
                                            cp.cuda.runtime.memcpyHostToDevice, side.ptr)

    def staged_kernels(n, layer):
        f = ffns[layer]
        s = [cuda_moe.DeviceExperts(DeviceWeight(st.reshape(-1), m.qtype, K * m.data.shape[1], sh.n_cols), K,
                                    in_host=True)
             for st, m, sh in zip(staging, (f.gate, f.up, f.down), shares[layer])]
        cuda_moe.gate_up_glu(s[0], s[1], slot_ids[:, :n], hq, act[:n], _q8_view(act_q, n * n_ff), cfg.activation,
                             stream=side)
        cuda_moe.down(s[2], slot_ids[:, :n], w_dev[:, :n], _q8_view(act_q, n * n_ff), out, x, stream=side)

    def gpu_alone(fn, n):
        def go():
            for i in range(len(ffns)):
                fn(n, i)
            side.synchronize()
        return go

    for n in (4, 5, 6, 8):
        row(f"cores {n}", chosen_bytes(n), *best_median(lambda: cores(n)))
    cores_breakdown(ffns, ids, h, cfg.activation, chosen_bytes(K))
    for n in (2, 3, 4, 5):
        row(f"in place {n}", chosen_bytes(n), *best_median(gpu_alone(in_place, n)))
    for n in (2, 3, 4, 5):
        t_issue = []

        def dma_timed(n, i):
            t = time.perf_counter()
            dma(n, i)
            t_issue.append(time.perf_counter() - t)
        row(f"dma {n}", chosen_bytes(n), *best_median(gpu_alone(dma_timed, n)),
            f"issue {statistics.median(t_issue) * 1e6:.1f} us a layer")
        row(f"dma {n} + kernels", chosen_bytes(n),
            *best_median(gpu_alone(lambda n, i: (dma(n, i), staged_kernels(n, i)), n)))

    for how, fn in (("in place", in_place), ("dma", lambda n, i: (dma(n, i), staged_kernels(n, i)))):
        for n in (3, 4, 5):
            gpu_ms = []

            def both():
                start, end = cp.cuda.Event(), cp.cuda.Event()
                start.record(side)
                for i in range(len(ffns)):
                    fn(n, i)
                    cores(K - n, i)
                    side.synchronize()
                end.record(side)
                end.synchronize()
                gpu_ms.append(cp.cuda.get_elapsed_time(start, end))
            row(f"cores {K - n} + {how} {n}", chosen_bytes(K), *best_median(both),
                f"GPU busy to the last layer {statistics.median(gpu_ms):.2f} ms")

    for slots in (0, 3, 0, 3, 2, 4, he.gpu_slots):
        step_profile(engine, slots)


def cores_breakdown(ffns, ids, h, activation, nbytes) -> None:
    """A token's 8 experts on the cores: the gate/up call (no GLU), the down call and the rest, apart (the engine runs
    them in one call, OneTokenExperts.ffn); with fewer threads and more row chunks; next to the cores' plain DRAM
    read rate (kernels.bench.cpu's parallel sum)."""
    import numba as nb

    import kernels.cpu.ops as cpu_ops
    import kernels.cpu.quant as cpu_quant

    a = np.ones(DRAM_BYTES // 4, np.float32)
    _sum(a)
    row(f"cores' DRAM read (parallel sum, {DRAM_BYTES >> 30} GiB a pass)", a.nbytes, *best_median(lambda: _sum(a)))
    acts = [cpu_ops.glu(*cpu_quant.expert_matvecs((f.gate.data, f.up.data), (f.gate.qtype, f.up.qtype), i[0], h),
                        activation) for f, i in zip(ffns, ids)]

    def gate_up():
        for f, i in zip(ffns, ids):
            cpu_quant.expert_matvecs((f.gate.data, f.up.data), (f.gate.qtype, f.up.qtype), i[0], h)

    def downs():
        for f, i, a in zip(ffns, ids, acts):
            cpu_quant.expert_matvecs((f.down.data,), (f.down.qtype,), i[0], a, own_rows=True)
    gu_bytes = sum(f.gate.data[0].nbytes + f.up.data[0].nbytes for f in ffns) * K
    row("cores 8: gate/up calls only", gu_bytes, *best_median(gate_up))
    row("cores 8: down calls only", nbytes - gu_bytes, *best_median(downs))
    threads = nb.get_num_threads()
    for n in (8, 12):
        nb.set_num_threads(n)
        row(f"cores 8 on {n} threads", nbytes, *best_median(lambda: [host_experts.moe_experts(
            f, h, i, np.full((1, K), 1 / K, np.float32), activation) for f, i in zip(ffns, ids)]))
    nb.set_num_threads(threads)
    chunks = cpu_quant.MATVEC_CHUNKS
    for c in (32, 128, 256):
        cpu_quant.MATVEC_CHUNKS = c
        row(f"cores 8, {c} row chunks a call", nbytes, *best_median(lambda: [host_experts.moe_experts(
            f, h, i, np.full((1, K), 1 / K, np.float32), activation) for f, i in zip(ffns, ids)]))
    cpu_quant.MATVEC_CHUNKS = chunks


def _q8_view(q: Q8Vector, n: int) -> Q8Vector:
    return Q8Vector(q.qs[:n], q.ds[:n // 32])


def step_profile(engine, slots: int) -> None:
    """The captured step's pieces, replayed as DecodeStep does, with the host's time split; the GPU running slots
    of a token's experts (captured anew)."""
    engine._be.host_experts.gpu_slots = slots
    engine._decode.graphs.clear()
    engine._cached = []
    list(engine.generate(list(range(100, 612)), max_tokens=4, temperature=0))  # captured
    step, be = engine._decode, engine._be
    pieces = step.graphs[(True, False)]
    spent = {"wait": 0.0, "host work": 0.0, "launch": 0.0}
    inner, wait = host_experts.moe_experts, be.host_experts._wait_handed
    work = [0.0]

    def timed(*a, **kw):
        t = time.perf_counter()
        r = inner(*a, **kw)
        work[0] += time.perf_counter() - t
        return r

    def timed_wait():  # a host piece's wait for its layer's hand-over
        t = time.perf_counter()
        wait()
        spent["wait"] += time.perf_counter() - t
    host_experts.moe_experts = timed
    be.host_experts._wait_handed = timed_wait
    n_steps = 64
    t0 = time.perf_counter()
    for _ in range(n_steps):
        for piece in pieces:
            t = time.perf_counter()
            if callable(piece):
                piece()
                spent["host work"] += time.perf_counter() - t
            else:
                piece.launch(be.stream)
                spent["launch"] += time.perf_counter() - t
    be.stream.synchronize()
    total = time.perf_counter() - t0
    spent["host work"] -= spent["wait"]
    host_experts.moe_experts = inner
    del be.host_experts._wait_handed
    print(f"captured step, GPU slots {slots}, {n_steps} steps, {len(pieces)} pieces: "
          f"{total / n_steps * 1e3:.2f} ms a token; " +
          ", ".join(f"{k} {v / n_steps * 1e3:.2f}" for k, v in spent.items()) +
          f" (of the work, moe_experts {work[0] / n_steps * 1e3:.2f}) ms a token")


if __name__ == "__main__":
    main(sys.argv[1], "--steps" in sys.argv[2:])
