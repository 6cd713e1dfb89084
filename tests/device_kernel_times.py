"""Where an all-GPU decode step's time goes, on the GPU machine: the step's wall time through the captured graph,
and each kernel's time in the same step run eagerly, read by Nsight Compute.

    python3 tests/device_kernel_times.py FILE.gguf step [DEPTH]     # ms a token through the graph (200 steps)
    ncu --nvtx --nvtx-include "step/" --metrics gpu__time_duration.sum --csv \
        python3 tests/device_kernel_times.py FILE.gguf kernels [DEPTH] > ncu.csv
    python3 tests/device_kernel_times.py ncu.csv table       # per kernel: launches, total us, share
    python3 tests/device_kernel_times.py FILE.gguf prefill   # ms of a 512-token prompt, and of its parts
    python3 tests/device_kernel_times.py FILE.gguf doubled [DEPTH]  # what each kernel costs inside the graph
    python3 tests/device_kernel_times.py FILE.gguf prompt_kernels [N]  # per kernel, one N-token prompt (512)
    python3 tests/device_kernel_times.py FILE.gguf prompt_host [N]  # the host's functions over one such prompt
    python3 tests/device_kernel_times.py FILE.gguf verify [N]  # verify steps of 1..8 tokens; per kernel at N (4)
    python3 tests/device_kernel_times.py FILE.gguf draft [K]  # the MTP drafter's propose of 1..K drafts (3)

A kernel runs as long in the graph as eagerly; the step's time less the kernels' sum is what launching and the
gaps between nodes cost.
"""
import collections
import csv
import sys
import time

import numpy as np


def _prompt(depth: int) -> list[int]:
    """The tokens before the measured steps: 64, or DEPTH (the cache's fill, as bench's -d)."""
    return [100 + i % 1000 for i in range(depth)]


def _step_times(decode, depth: int) -> list[float]:
    """ms a step of three runs of 200 decode steps from position depth (a recurrent model: from where its
    state is), each waited for."""
    times, pos = [], decode.be.state_pos if decode.be.conv_state else depth
    for _ in range(3):
        decode.wait()
        t = time.perf_counter()
        for _ in range(200):
            decode(True, 0, pos)
            pos += 1
        decode.wait()
        times.append((time.perf_counter() - t) / 200 * 1e3)
    return times


def step_ms(path: str, depth: int = 64) -> None:
    import cupy as cp

    from inference import load
    engine = load(path, device="cuda", ctx=depth + 1024)
    list(engine.generate(_prompt(depth), max_tokens=8, temperature=0))  # compile, capture the graph
    times = _step_times(engine._decode, depth)
    print(f"graph step: {' '.join(f'{t:.3f}' for t in times)} ms ({cp.cuda.runtime.getDeviceProperties(0)['name'].decode()})")


def kernels(path: str, depth: int = 64) -> None:
    import cupy as cp

    from inference import load
    engine = load(path, device="cuda", ctx=depth + 1024, cuda_graph=False)
    list(engine.generate(_prompt(depth), max_tokens=8, temperature=0))
    engine._decode.wait()
    cp.cuda.nvtx.RangePush("step")
    engine._decode(True, 0, depth + 8)
    engine._decode.wait()
    cp.cuda.nvtx.RangePop()


def prefill(path: str) -> None:
    """A 512-token prompt's wall time and the host's part of it (3 runs after a warm-up), then the same with the
    device synchronized around each timed part: the MoE op and the grouped path's pieces (their sum runs slower
    than the whole)."""
    import cupy as cp

    import inference.backend_cuda as backend_cuda
    import inference.backend_cuda_moe as backend_cuda_moe
    from inference import load
    from kernels.cuda import moe as cuda_moe
    engine = load(path, device="cuda", ctx=1024)

    def run(seed):
        engine._cached = []
        ids = np.random.default_rng(seed).integers(3, engine.config.n_vocab, 512).tolist()
        engine._be.stream.synchronize()
        t = time.perf_counter()
        engine._prefill(ids, all_logits=False)
        host = time.perf_counter() - t  # the host's part: about the whole when launches, not the GPU, set the pace
        engine._be.stream.synchronize()
        return (time.perf_counter() - t) * 1e3, host * 1e3

    run(0)
    print("512-token prompt (ms, whole / host's part):", " ".join("%.1f / %.1f" % run(s) for s in (1, 2, 3)))
    times = collections.defaultdict(float)

    def timed(owner, name):
        f = getattr(owner, name)

        def wrapper(*a, **kw):
            cp.cuda.get_current_stream().synchronize()
            engine._be.stream.synchronize()
            t = time.perf_counter()
            out = f(*a, **kw)
            engine._be.stream.synchronize()
            times[name] += (time.perf_counter() - t) * 1e3
            return out
        setattr(owner, name, wrapper)

    for owner, name in ((backend_cuda.CUDABackend, "add_moe"), (backend_cuda_moe, "experts_grouped"),
                        (cuda_moe, "sort_pairs"), (cuda_moe, "gate_up_glu_grouped"), (cuda_moe, "matmul_grouped")):
        timed(owner, name)
    whole, _ = run(4)
    print(f"synchronized: {whole:.1f} ms; " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()))


def doubled(path: str, depth: int = 64) -> None:
    """Each kernel's cost inside the captured step, where launches overlap (Nsight Compute runs them one at a
    time): the graph step with every launch of that kernel made twice, less the step as it is, per launch.
    The doubled launches compute the same again (the norms, matvecs, attention) or add their output twice to
    the residual (a wrong but finite step: only its time is read)."""
    from inference import load
    from kernels.cuda import module as cuda_module
    engine = load(path, device="cuda", ctx=depth + 1024)
    list(engine.generate(_prompt(depth), max_tokens=8, temperature=0))
    decode, launch = engine._decode, cuda_module.Kernel.__call__
    seen, twice = collections.Counter(), set()

    def launch_counted(self, grid, block, args, shared_mem=0):
        seen[self.raw.name] += 1
        launch(self, grid, block, args, shared_mem)
        if self.raw.name in twice:
            launch(self, grid, block, args, shared_mem)
    cuda_module.Kernel.__call__ = launch_counted

    def step_us() -> float:
        decode.graphs.clear()
        seen.clear()
        decode(True, 0, depth)  # an eager step, then the capture
        return float(np.median(_step_times(decode, depth))) * 1e3

    base = step_us()
    launches = {name: n // 2 for name, n in seen.items()}  # the eager step's and the capture's
    print(f"graph step {base:.1f} us at depth {depth}; per kernel: launches a step, us a launch in the graph")
    for name, n in sorted(launches.items(), key=lambda kv: -kv[1]):
        twice = {name}
        print(f"{name:<40} {n:>4} {(step_us() - base) / n:7.2f}")
    twice = set()
    print(f"graph step again {step_us():.1f} us")


def prompt_kernels(path: str, n: int = 512) -> None:
    """Each kernel's launches and time over one n-token prompt (after a warm-up one), read by torch's profiler:
    CUPTI sees every kernel of the process, CuPy's included. The kernels' sum against the prompt's wall time
    says how much of it the GPU is idle (launches, the host, copies)."""
    from inference import load
    engine = load(path, device="cuda", ctx=n + 64)

    def run(seed):
        engine._cached = []
        ids = np.random.default_rng(seed).integers(3, engine.config.n_vocab, n).tolist()
        engine._be.stream.synchronize()
        t = time.perf_counter()
        engine._prefill(ids, all_logits=False)
        engine._be.stream.synchronize()
        return (time.perf_counter() - t) * 1e3

    run(0)
    print(f"{n}-token prompt, ms:", " ".join("%.1f" % run(s) for s in (1, 2)))
    walls = []
    rows = _profiled(lambda: walls.append(run(3)))
    s = sum(ms for _, _, ms in rows)
    print(f"profiled prompt {walls[0]:.1f} ms; {sum(c for _, c, _ in rows)} kernels and copies, {s:.1f} ms on the GPU")
    for name, count, ms in rows[:40]:
        print(f"{name:<60} {count:>6} {ms:>8.2f} ms {ms / s:6.1%} {ms / count * 1e3:8.1f} us each")


def prompt_host(path: str, n: int = 512) -> None:
    """Where the host's time goes in one n-token prompt (cProfile, after a warm-up one), and the prompt's wall
    time against the time its forward takes to return (launches queued, the GPU not waited for)."""
    import cProfile
    import pstats

    from inference import load
    from inference.forward import forward
    engine = load(path, device="cuda", ctx=n + 64)
    be = engine._be

    def run(seed, profile=None):
        engine._cached = []
        be.set_input(np.random.default_rng(seed).integers(3, engine.config.n_vocab, n).astype(np.int32), 0)
        be.stream.synchronize()
        t = time.perf_counter()
        if profile:
            profile.enable()
        forward(engine._segments, engine.config, engine._weights)
        if profile:
            profile.disable()
        host = time.perf_counter() - t
        be.stream.synchronize()
        return (time.perf_counter() - t) * 1e3, host * 1e3

    run(0)
    print(f"{n}-token forward (ms, whole / host's part):", " ".join("%.1f / %.1f" % run(s) for s in (1, 2, 3)))
    profile = cProfile.Profile()
    print("profiled: %.1f / %.1f" % run(4, profile))
    pstats.Stats(profile).sort_stats("tottime").print_stats(35)

    def checkpoint(seed):  # a checkpoint after a prompt, waited for (ms)
        engine._cached = [seed] * n
        be.stream.synchronize()
        t = time.perf_counter()
        engine._checkpoint()
        host = time.perf_counter() - t
        be.stream.synchronize()
        return (time.perf_counter() - t) * 1e3, host * 1e3

    print("checkpoints, new memory (ms, whole / host's part):",
          " ".join("%.1f / %.1f" % checkpoint(s) for s in range(5)))
    engine._checkpoints = []
    print("checkpoints, memory freed before:", " ".join("%.1f / %.1f" % checkpoint(s) for s in range(5, 10)))


def _profiled(run) -> list[tuple[str, int, float]]:
    """(kernel, launches, ms) of everything run() puts on the GPU, read by torch's profiler (CUPTI sees CuPy's
    kernels too), the largest first."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
    torch.cuda.synchronize()
    total, count = collections.defaultdict(float), collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name.split("(")[0][:60]
            total[name] += e.time_range.elapsed_us() / 1e3
            count[name] += 1
    return sorted(((name, count[name], ms) for name, ms in total.items()), key=lambda r: -r[2])


def verify(path: str, n_profiled: int = 4, depth: int = 300) -> None:
    """Speculative decoding's verify step against a plain decode step after a depth-token context: the captured
    step of n = 1..8 tokens on the GPU alone (50 launches waited for once, each rewound), the same through
    engine._verify (the logits to the host, as a sampled reply takes them; each row's argmax, as a plain greedy one
    does), then each kernel of one eager step of n_profiled tokens beside one eager decode step."""
    from inference import load
    from inference.cuda_graph import VerifyStep
    from inference.speculative import PromptLookup, Speculation
    engine = load(path, device="cuda", ctx=depth + 1024)
    ids = _prompt(depth)
    list(engine.generate(ids, max_tokens=8, temperature=0))  # compile, capture the decode graph
    decode, be = engine._decode, engine._be
    plain = _step_times(decode, depth + 8)
    print(f"plain graph step: {' '.join(f'{t:.3f}' for t in plain)} ms")
    engine.reset()
    list(engine.generate(ids, max_tokens=1, temperature=0))
    engine.speculation = Speculation("ngram", PromptLookup(), 7)
    pos = depth

    def launches(n: int, times: int, host: bool, argmax: bool = False) -> float:
        nonlocal pos
        be.stream.synchronize()
        t = time.perf_counter()
        for _ in range(times):
            if host:
                engine._verify(ids[:n], pos, argmax)
            else:
                engine._captured_verify(n)(ids[:n], pos)
            engine._rewind_states(pos + 1)
            pos += 1
        be.stream.synchronize()
        return (time.perf_counter() - t) / times * 1e3

    for n in range(1, 9):
        launches(n, 2, False)  # the capture
        gpu = [launches(n, 50, False) for _ in range(2)]
        host = [launches(n, 20, True) for _ in range(2)]
        argmax = [launches(n, 20, True, True) for _ in range(2)]
        print(f"verify {n}: graph {' '.join(f'{t:.3f}' for t in gpu)} ms ({min(gpu) / min(plain):.2f}x a step), "
              f"with the logits to the host {' '.join(f'{t:.3f}' for t in host)} ms, "
              f"with each row's argmax (plain greedy) {' '.join(f'{t:.3f}' for t in argmax)} ms")
    eager = VerifyStep(be, engine.config, engine._weights, 8, use_graph=False)

    def eager_verify():
        nonlocal pos
        eager(ids[:n_profiled], pos)
        engine._rewind_states(pos + 1)
        pos += 1
    eager_verify()  # compiles what the profiled one needs
    report(f"eager verify step of {n_profiled} tokens", _profiled(lambda: (eager_verify(), be.stream.synchronize())))
    engine.speculation = None
    engine.reset()
    decode.use_graph = False
    list(engine.generate(ids, max_tokens=2, temperature=0))
    step_pos = be.state_pos if be.conv_state else depth + 2

    def eager_decode():
        nonlocal step_pos
        decode(True, 0, step_pos)
        step_pos += 1
    eager_decode()
    report("eager decode step", _profiled(lambda: (eager_decode(), be.stream.synchronize())))


def draft(path: str, k_max: int = 3, depth: int = 300) -> None:
    """The MTP drafter's cost (a file with the block: synth_gguf.py --mtp): ms of a greedy propose of k = 1..k_max
    drafts after a depth-token context and a 32-token reply, the same history each time, after a catch-up of one
    token (a round that kept no draft) and of k + 1 (one that kept all), 20 waited for once, three runs."""
    from inference import load
    from inference.sampling import SamplingParams
    engine = load(path, device="cuda", ctx=depth + 1024, spec="mtp", spec_k=k_max)
    list(engine.generate(_prompt(depth), max_tokens=32, temperature=0))
    drafter, history = engine.speculation.drafter, list(engine._cached[:-1])
    params, rng = SamplingParams(temperature=0), np.random.default_rng(0)
    for k in range(1, k_max + 1):
        for n in (1, k + 1):
            entered = history[:len(history) - n]  # the block's entries hold up to the catch-up's n tokens
            drafter.entered = entered
            drafter.propose(history, k, params, rng)  # compiles, captures
            times = []
            for _ in range(3):
                drafter.be.stream.synchronize()
                t = time.perf_counter()
                for _ in range(20):
                    drafter.entered = entered
                    tokens = drafter.propose(history, k, params, rng).tokens
                drafter.be.stream.synchronize()
                times.append((time.perf_counter() - t) / 20 * 1e3)
            print(f"propose {k} after {n}: {' '.join(f'{t:.3f}' for t in times)} ms, drafts {tokens}")


def report(title: str, rows: list[tuple[str, int, float]]) -> None:
    print(f"{title}: {sum(r[2] for r in rows):.3f} ms on the GPU")
    for kernel, count, ms in rows[:25]:
        print(f"  {kernel:<60} {count:>5} {ms * 1e3:>9.1f} us {ms / count * 1e3:8.2f} us each")


def table(csv_path: str) -> None:
    rows = [r for r in csv.reader(open(csv_path)) if len(r) > 10]
    head = rows[0]
    name_at, value_at = head.index("Kernel Name"), head.index("Metric Value")
    unit_at = head.index("Metric Unit")
    total, count = collections.defaultdict(float), collections.Counter()
    for r in rows[1:]:
        scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}[r[unit_at]]
        name = r[name_at].split("(")[0]
        total[name] += float(r[value_at].replace(",", "")) * scale
        count[name] += 1
    s = sum(total.values())
    print(f"{sum(count.values())} kernels, {s:.1f} us in all")
    for name, us in sorted(total.items(), key=lambda kv: -kv[1]):
        print(f"{name:<40} {count[name]:>5} {us:>9.1f} us {us / s:6.1%} {us / count[name]:7.2f} us each")


if __name__ == "__main__":
    {"step": step_ms, "kernels": kernels, "doubled": doubled, "table": table, "prefill": prefill,
     "prompt_kernels": prompt_kernels, "prompt_host": prompt_host, "verify": verify, "draft": draft}[sys.argv[2]](
        sys.argv[1], *map(int, sys.argv[3:]))
