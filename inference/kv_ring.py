"""Sliding-window layers' KV caches as rings: a layer that attends to its last `window` positions keeps only those
(and what a prompt chunk and a taken-back reply need), not the whole context, as llama.cpp's SWA cache does.

Position p lies at row p % rows (kernels/cuda's attention and kernels/cpu/attention.py index caches so), so a cache
as long as the context is the ring that never wraps. A ring of window + chunk + RING_SLACK rows holds, when a chunk
of up to `chunk` tokens is written, the window before each of its tokens; after a reply, the last RING_SLACK or so
positions can be taken back (a regenerated reply, a verify step's rejected drafts) and the prompt still goes on
from there (can_resume: the rows before it must still hold the window before it).
"""
import numpy as np

from models.config import ModelConfig

RING_SLACK = 1024


def cache_rows(cfg: ModelConfig, n_ctx: int, layer: int, chunk: int) -> int:
    """Rows of an attention layer's KV cache with prompt chunks of up to chunk tokens: the context, or for a
    sliding-window layer the ring's where that is fewer."""
    window = cfg.layer_window(layer)
    return min(n_ctx, window + chunk + RING_SLACK) if window else n_ctx


def ring_positions(rows: dict[int, int], n_ctx: int, window: int) -> "RingPositions | None":
    """The bookkeeping of a backend's rings, its caches' rows by layer given (cache_rows'), or None where every
    cache holds the whole context."""
    ring = min(rows.values(), default=n_ctx)
    return RingPositions(ring, window) if ring < n_ctx else None


class RingPositions:
    """The position each row of a backend's rings holds (its sliding layers' rings are all as long: one window),
    kept as the forwards write them, to tell whether a prompt can go on after its first keep cached tokens."""

    def __init__(self, rows: int, window: int):
        self.rows, self.window = rows, window
        self.held = np.full(rows, -1)

    def wrote(self, pos: int, n: int) -> None:
        """A forward wrote positions pos .. pos + n - 1."""
        if n == 1:
            self.held[pos % self.rows] = pos
        else:
            written = np.arange(pos, pos + n)
            self.held[written % self.rows] = written

    def can_resume(self, keep: int) -> bool:
        """The rings still hold the window before position keep (later tokens overwrite it)."""
        need = np.arange(max(0, keep - self.window + 1), keep)
        return bool((self.held[need % self.rows] == need).all())
