"""Where each call's GPU rows sit in the VRAM ring of gpu_share.py, and which earlier call its copy waits for.

Decode makes the CPU layers' matmuls calls in the same order every token. The copy engine copies the rows the
GPU multiplies for a call from pinned host memory into a ring buffer in VRAM, ahead of the call, while the GPU
and the cores work on earlier ones. Each call has a fixed place in the ring (its captured graph reads fixed
addresses); a copy may overwrite bytes only once the last call that read them is done.
"""
ALIGN = 256  # bytes: each call's place starts where a CUDA allocation would


def aligned(nbytes: int) -> int:
    """nbytes rounded up to a multiple of ALIGN."""
    return -(-nbytes // ALIGN) * ALIGN


def ring_offsets(sizes: list[int], ring_bytes: int) -> list[int]:
    """Each call's offset in the ring: packed in call order, back to 0 when a call does not fit before the end
    (every token starts again at 0)."""
    offsets, at = [], 0
    for size in sizes:
        if size > ring_bytes:
            raise ValueError(f"a call's {size} bytes do not fit the {ring_bytes}-byte ring")
        if at + size > ring_bytes:
            at = 0
        offsets.append(at)
        at += aligned(size)
    return offsets


def copy_waits(sizes: list[int], offsets: list[int]) -> list[int]:
    """For each call j, how many calls back (1 to n, counting around the token; n is j's own last turn) the
    last call is that reads bytes j's copy overwrites: the copy waits until that call's kernels are done (and so
    every call before it, as all run on one stream)."""
    n = len(sizes)

    def overlap(i: int, j: int) -> bool:
        return offsets[i] < offsets[j] + sizes[j] and offsets[j] < offsets[i] + sizes[i]

    return [next(d for d in range(1, n + 1) if overlap((j - d) % n, j)) for j in range(n)]


class RingSchedule:
    """When GpuShare queues each copy, apart from CUDA (tests/inference/test_share_ring.py runs it against a model
    of two streams). Numbers count calls across tokens: number k is call k % n. A copy queues once the call it
    waits for has launched, and at most a token ahead, so that the last record of each event is the one a wait
    means; a copy whose wait falls before `since` needs none (both streams were idle then)."""

    def __init__(self, sizes: list[int], ring_bytes: int):
        self.n = len(sizes)
        self.offsets = ring_offsets(sizes, ring_bytes)
        self.waits = copy_waits(sizes, self.offsets)
        self.next = self.copied = self.since = 0  # the numbers of the next launch and the next copy

    def in_order(self, call: int) -> bool:
        """Whether call is the one due next; if not (the first call, or a step cut short), wait until both
        streams are idle and call restart."""
        return call == self.next % self.n

    def restart(self, call: int) -> None:
        self.next = self.copied = self.since = self.next + (call - self.next) % self.n

    def copies_due(self) -> list[tuple[int, int | None]]:
        """The copies to queue now, in order: (call, the call whose kernels it waits for, or None). Before a
        launch they include the launching call's own."""
        due = []
        while self.copied < self.next + self.n and self.copied - self.waits[self.copied % self.n] < self.next:
            after = self.copied - self.waits[self.copied % self.n]
            due.append((self.copied % self.n, after % self.n if after >= self.since else None))
            self.copied += 1
        return due

    def launched(self) -> None:
        self.next += 1
