"""The download bar, on stderr: `name  35% ▕███     ▏ 586 MB/1.7 GB  4.6 MB/s  3m56s` (Ollama's), redrawn in place
on a terminal; where stderr is not a terminal (logs, pipes), one line when a file starts and one when it ends."""
import sys
import time

from models.hub_files import human_bytes

BAR_WIDTH = 25
REDRAW_EVERY_S = 0.1


class DownloadBar:
    """A progress callback for models/ (name, bytes done, bytes total)."""

    def __init__(self, stream=None, tty: bool | None = None, clock=time.monotonic):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.clock = clock
        self.name = None
        self.start_done = self.start_time = self.last_draw = 0

    def __call__(self, name: str, done: int, total: int) -> None:
        now = self.clock()
        if name != self.name:
            self.name, self.start_done, self.start_time, self.last_draw = name, done, now, 0.0
            if not self.tty:
                resumed = f", resuming at {human_bytes(done)}" if done else ""
                self.stream.write(f"pulling {name} ({human_bytes(total)}{resumed})\n")
        finished = done >= total
        if self.tty and (finished or now - self.last_draw >= REDRAW_EVERY_S):
            self.last_draw = now
            self.stream.write("\r" + self.line(done, total, now) + "\x1b[K" + ("\n" if finished else ""))
        elif finished and not self.tty:
            elapsed = now - self.start_time
            self.stream.write(f"pulled {name} ({human_bytes(total)} in {elapsed:.1f}s, "
                              f"{human_bytes(self.speed(done, now))}/s)\n")
        if finished:
            self.name = None
        self.stream.flush()

    def speed(self, done: int, now: float) -> float:
        """Bytes a second over this run (bytes resumed from an earlier run do not count)."""
        elapsed = now - self.start_time
        return (done - self.start_done) / elapsed if elapsed > 0 else 0.0

    def line(self, done: int, total: int, now: float) -> str:
        fraction = done / total if total else 1.0
        filled = int(fraction * BAR_WIDTH)
        speed = self.speed(done, now)
        eta = _duration((total - done) / speed) if speed > 0 and done < total else ""
        return (f"{self.name}  {fraction:4.0%} ▕{'█' * filled}{' ' * (BAR_WIDTH - filled)}▏ "
                f"{human_bytes(done)}/{human_bytes(total)}  {human_bytes(speed)}/s  {eta}").rstrip()


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60}s"
    return f"{seconds}s"
