"""How the CPU's two thread pools wait between jobs: numba's parallel regions (its omp layer, libgomp) and numpy's
OpenBLAS. Both read the environment once, when they load, so this runs before either does (the CLI's first line,
and inference's); setdefault keeps a user's own settings.

- libgomp: on the 2-core CPU machine a parallel region cost ~45 us, its threads woken through the kernel each
  time (libgomp documents a spin of only 100 rounds when it counts more threads than CPUs), against ~2 us with
  GOMP_SPINCOUNT set; a decode token makes ~6 regions a layer. 10k spins (~0.1-0.5 ms) bridge the gaps between
  a token's regions; 100k decoded as fast but held the cores long enough to slow prompts' BLAS calls.
- OpenBLAS: its threads spin 2^28 cycles after each call, holding the cores that numba's threads need next;
  2^4 lets them sleep at once.
Measured there (interleaved runs, BENCHMARKS.md): SmolLM2 decode 52-53 -> 94-99 tok/s and prompt 332 -> 417-428;
llama-1b q4_k_m decode 34-38 -> 29-33 ms a token (median). Idle, the threads still sleep.
"""
import os


def configure_thread_waits() -> None:
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
