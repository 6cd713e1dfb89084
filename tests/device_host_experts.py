"""Where the time of a model with all experts on the host goes, on the GPU machine: a 512-token prompt's time and
the part of it spent uploading expert stacks (CUDABackend._upload), then the decode steps' time and the part of
it in the host's expert work (backend_cpu.moe_experts).

    python3 tests/device_host_experts.py FILE.gguf [SLOTS ...]

Each of two rounds processes a fresh 512-token prompt and times 64 generated tokens (BENCHMARKS.md, session 10);
once for each SLOTS given, the GPU running that many of a token's chosen experts from the pinned pages
(host_experts.HOST_EXPERTS_GPU_SLOTS; default: the count load measures).
"""
import collections
import gc
import sys
import time

import numpy as np

import inference.backend_cuda as backend_cuda
import inference.host_experts as host_experts
from inference import load


TIMES, COUNTS = collections.defaultdict(float), collections.Counter()


def timed(owner, name: str) -> None:
    """Wrap owner.name (a function or a method) to add its wall time and calls to TIMES[name] and COUNTS[name]."""
    fn = getattr(owner, name)

    def wrapper(*args, **kw):
        t = time.perf_counter()
        result = fn(*args, **kw)
        TIMES[name] += time.perf_counter() - t
        COUNTS[name] += 1
        return result
    setattr(owner, name, wrapper)


def main(path: str, slots: int | None) -> None:
    host_experts.HOST_EXPERTS_GPU_SLOTS = slots
    engine = load(path, device="cuda", ctx=2048, cpu_moe="all")
    print(f"{engine.placement.summary().splitlines()[0]}; the GPU runs {engine._be.host_experts.gpu_slots} of a "
          f"token's experts itself ({'measured at load' if slots is None else 'as asked'})")
    list(engine.generate(list(range(100, 612)), max_tokens=8, temperature=0))  # compile, capture
    for r in range(2):
        engine._cached = []
        TIMES.clear()
        COUNTS.clear()
        stamps = [time.perf_counter()]
        for i, _ in enumerate(engine.generate(list(range(1000 + r, 1512 + r)), max_tokens=65, temperature=0)):
            stamps.append(time.perf_counter())
            if i == 0:
                print(f"prompt 512: {stamps[1] - stamps[0]:.3f} s; _upload {TIMES['_upload']:.3f} s in "
                      f"{COUNTS['_upload']} calls; moe_experts {TIMES['moe_experts']:.3f} s")
                TIMES.clear()
                COUNTS.clear()
        dt = np.diff(stamps[1:]) * 1e3
        print(f"decode: {dt.mean():.2f} ms a token (p10 {np.percentile(dt, 10):.2f} p90 {np.percentile(dt, 90):.2f}), "
              f"{1e3 / dt.mean():.1f} tok/s; moe_experts {TIMES['moe_experts'] / len(dt) * 1e3:.2f} ms a token in "
              f"{COUNTS['moe_experts'] / len(dt):.0f} calls")


if __name__ == "__main__":
    timed(host_experts, "moe_experts")
    timed(backend_cuda.CUDABackend, "_upload")
    for n in sys.argv[2:] or [None]:
        main(sys.argv[1], n and int(n))
        gc.collect()  # the last engine's VRAM and pinned pages go before the next loads
