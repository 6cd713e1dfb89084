"""How the CPU's two thread pools wait between jobs: numba's parallel regions (its omp layer, libgomp) and numpy's
OpenBLAS. Both read the environment once, when they load, so this runs before either does (the CLI's first line,
inference's, and matvec's for the kernels alone); setdefault keeps a user's own settings.

- libgomp: its default spins ~300k rounds after each region; on a busy machine a spinning thread held the core
  the next region's other thread needed, and 2-thread matvecs ran 15x slower than one (sessions 2-3), hence
  OMP_WAIT_POLICY=PASSIVE. But passive threads sleep at once and are woken through the kernel for every region:
  ~45-90 us a region on the 2-core CPU machine, ~6 regions a layer a decode token. GOMP_SPINCOUNT=10000 (~0.1-0.5
  ms) lets them spin across the gaps between a token's regions (~2 us a region) and still sleep soon after;
  100k decoded as fast but held the cores long enough to slow prompts' BLAS calls.
- OpenBLAS: its threads spin 2^28 cycles after each call, holding the cores that numba's threads need next;
  2^4 lets them sleep at once.
Measured there (interleaved runs, BENCHMARKS.md): SmolLM2 decode 52-53 -> 94-99 tok/s and prompt 332 -> 417-428;
llama-1b q4_k_m decode 34-38 -> 29-33 ms a token (median).
"""
import os


def configure_thread_waits() -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
