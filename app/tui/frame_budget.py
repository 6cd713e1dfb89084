"""How often a streaming reply may be drawn: at most FRAME_SECONDS apart, and only while the UI thread keeps to
its share of a core.

Each frame of a growing reply costs the UI thread Markdown parsing, layout and drawing: ~5-10 ms for prose on the
2-core machine, 50 ms and more for a long Markdown list, which textual rebuilds whole. Whatever the UI thread runs
is taken from the engine (its two numba threads want both cores, and its Python steps the GIL), so the reply is
drawn again only once the UI thread has spent at most UI_SHARE of the time since the last frame: prose at ~8-10
frames a second, a long list at fewer, the engine at >= 90% of its own speed (BENCHMARKS.md: a share of 0.1 kept
80-94%, 0.05 89-95%). But never more than FRAME_MAX_GAP apart: one costly frame (a fresh install's first Markdown
render, ~0.2 s) would otherwise hold the next one back for seconds, a reply frozen after its first word.
"""
import time

FRAME_SECONDS = 1 / 20  # the most frames a second: new text reaches the screen at most this often
UI_SHARE = 0.05         # of one core: the UI thread's CPU time over the wall time since the last frame
FRAME_MAX_GAP = 0.5     # seconds: a frame at least this often, whatever the share


class FrameBudget:
    """allows() is asked from the UI thread (time.thread_time is that thread's CPU time). The first frame is always
    allowed: a reply's first words show at once, whatever sending it cost."""

    def __init__(self):
        self._at: float | None = None  # wall and CPU time of the last frame; None before the first
        self._cpu = 0.0

    def allows(self) -> bool:
        """Whether to draw a frame now; when it does, the next one is counted from now."""
        now, cpu = time.monotonic(), time.thread_time()
        if self._at is not None and cpu - self._cpu > UI_SHARE * (now - self._at) and now - self._at < FRAME_MAX_GAP:
            return False
        self._at, self._cpu = now, cpu
        return True
