"""A model's first reply at full speed: its kernels compiled before it (Engine.warm_up), and the user told when
that takes a while (a first start compiles numba's CPU kernels once: ~30 s on 2 cores; later starts load them)."""
import threading
import time

SLOW_SECONDS = 1.0  # a warm-up longer than this is a first start: say so while it runs
NOTICE = "preparing the kernels for this machine: once, on a first start (about half a minute)..."


def warm_up(engine, say) -> float:
    """engine.warm_up(), saying NOTICE through say(text) if it runs past SLOW_SECONDS; the seconds it took."""
    timer = threading.Timer(SLOW_SECONDS, say, (NOTICE,))
    timer.start()
    t0 = time.perf_counter()
    try:
        engine.warm_up()
    finally:
        timer.cancel()
    return time.perf_counter() - t0
