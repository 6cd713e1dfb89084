"""Where a split engine's decode time goes, on the GPU machine: per-token wall time (mean and percentiles) and
the CPU backend's per-op time of decode steps only (the prompt's are left out).

    python3 tests/device_profile.py FILE.gguf GPU_LAYERS [ROUNDS]

Each round processes a fresh 512-token prompt and times 128 generated tokens. add_matmul includes its matmul.
"""
import collections
import sys
import time

import numpy as np

from inference import load
from inference.backend_cpu import CPUBackend

OPS = ("embed", "rms_norm", "matmul", "matmuls", "rope_kv_write", "attention", "glu", "add_matmul")


def timed_ops(times: dict, counts: collections.Counter) -> None:
    """Wrap CPUBackend's ops to add their wall time and calls to times and counts."""
    for name in OPS:
        op = getattr(CPUBackend, name)

        def wrapper(self, *args, op=op, name=name, **kw):
            t = time.perf_counter()
            result = op(self, *args, **kw)
            times[name] += time.perf_counter() - t
            counts[name] += 1
            return result
        setattr(CPUBackend, name, wrapper)


def main(path: str, gpu_layers: int, rounds: int = 2) -> None:
    times, counts = collections.defaultdict(float), collections.Counter()
    timed_ops(times, counts)
    engine = load(path, device="cuda", gpu_layers=gpu_layers, ctx=2048)
    print(engine.placement.summary().splitlines()[0])
    list(engine.generate(list(range(100, 612)), max_tokens=8, temperature=0))  # compile, capture the graph
    for r in range(rounds):
        engine._cached = []
        stamps = []
        for i, _ in enumerate(engine.generate(list(range(1000 + r, 1512 + r)), max_tokens=129, temperature=0)):
            stamps.append(time.perf_counter())
            if i == 0:  # the prompt is done: time decode steps only
                times.clear()
                counts.clear()
        dt = np.diff(stamps) * 1e3
        print(f"round {r}: {len(dt)} steps, ms a token: mean {dt.mean():.2f} p10 {np.percentile(dt, 10):.2f} "
              f"p50 {np.median(dt):.2f} p90 {np.percentile(dt, 90):.2f} max {dt.max():.2f} "
              f"({1e3 / dt.mean():.2f} tok/s)")
        for name, seconds in sorted(times.items(), key=lambda item: -item[1]):
            print(f"  {name:14} {seconds / len(dt) * 1e3:8.3f} ms  {counts[name] / len(dt):.0f} calls")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), *(int(a) for a in sys.argv[3:4]))
