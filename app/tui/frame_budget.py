"""How often a streaming reply may be drawn: at most FRAME_SECONDS apart, and only while the UI thread keeps to
its share of a core.

Each frame of a growing reply costs the UI thread Markdown parsing, layout and drawing: ~30-35 ms for prose on the
2-core machine (textual lays the screen out twice, for the grown reply and then for the sizes it changed, and redraws
the conversation), 50 ms and more for a long Markdown list. Whatever the UI thread runs is taken from the engine (its
two numba threads want both cores, and its Python steps the GIL), so the reply is drawn again only once the UI
thread has spent at most UI_SHARE of the time since the last frame: prose about every 0.7 s, a long list less
often (BENCHMARKS.md: a share of 0.1 kept the chat at 80-94% of run's speed, 0.05 at 89-95%). But never more than
FRAME_MAX_GAP apart: one costly frame (a fresh install's first Markdown render, ~0.2 s) would otherwise hold the
next one back for seconds, a reply frozen after its first word. At 0.5 s that gap, not the share, paced prose, and
the UI thread took ~9% of a core (BENCHMARKS.md, 2026-11-26, issue 21).
"""
import time

FRAME_SECONDS = 1 / 20  # the most frames a second: new text reaches the screen at most this often
UI_SHARE = 0.05         # of one core: the UI thread's CPU time over the wall time since the last frame
FRAME_MAX_GAP = 1.0     # seconds: a frame at least this often, whatever the share


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
