"""A model's first reply at full speed: its kernels compiled before it (Engine.warm_up), and the user told when
that takes a while (a first start compiles numba's CPU kernels once: ~30 s on a 2-core AVX-512 VM, ~70 s on an
AVX2-only one; later starts load them)."""
import threading
import time

SLOW_SECONDS = 1.0  # a warm-up longer than this is a first start: say so while it runs
NOTICE = "preparing the kernels for this machine: once, on a first start (about a minute on 2 cores)..."
# A reply's first tokens attend to few keys, which the CPU runs in a single-threaded loop (kernels/cpu/attention.py)
# that Engine.warm_up's long prompt passes by: numba compiled it during the first reply, ~20% of that reply's
# speed on 2 cores (BENCHMARKS.md, session 10). A few tokens of a short prompt compile it before; more than
# cpu_quant.MATVEC_MAX_TOKENS of them, as a chat's first prompt, for the GLU of a few tokens (cpu_ops._glu_serial).
SHORT_PROMPT = "Hi, how are you today?"


def add_no_warmup_arg(p) -> None:
    """The flag run, serve and chat share (llama.cpp's name for it)."""
    p.add_argument("--no-warmup", action="store_true",
                   help="start without the warm-up run: sooner, and the first reply pays what it skipped (on a first "
                   "start, compiling the kernels)")


def warm_up(engine, say) -> float:
    """The short prompt, then engine.warm_up() (which leaves the context empty), saying NOTICE through say(text) if
    they run past SLOW_SECONDS; the seconds they took."""
    timer = threading.Timer(SLOW_SECONDS, say, (NOTICE,))
    timer.start()
    t0 = time.perf_counter()
    try:
        for _ in engine.generate(SHORT_PROMPT, max_tokens=3, temperature=1.0, seed=0):
            pass
        engine.warm_up()
    finally:
        timer.cancel()
    return time.perf_counter() - t0
