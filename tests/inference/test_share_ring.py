"""The VRAM ring of the GPU's share (inference/share_ring.py), on the CPU: places, waits, and the schedule run
against a model of two CUDA streams in random orders, checking that every call reads its own rows."""
import random
from collections import deque

import numpy as np
import pytest

from inference.share_ring import ALIGN, RingSchedule, copy_waits, ring_offsets


def test_places_are_packed_aligned_and_wrap():
    assert ring_offsets([256, 300, 256], 1024) == [0, 256, 768]
    assert ring_offsets([512, 512, 256, 512], 1024) == [0, 512, 0, 256]  # a token starts again at 0 too
    with pytest.raises(ValueError, match="do not fit"):
        ring_offsets([256, 2048], 1024)


def test_a_copy_waits_for_the_last_call_reading_its_bytes():
    sizes = [512, 512, 256, 512]
    offsets = ring_offsets(sizes, 1024)
    assert offsets == [0, 512, 0, 256]
    # call 0's place [0, 512) was last read by call 3 of the token before (1 back), call 1's [512, 1024) by call 3
    # (2 back), call 2's [0, 256) by call 0, call 3's [256, 768) by call 1
    assert copy_waits(sizes, offsets) == [1, 2, 2, 2]
    assert copy_waits([256, 256], [0, 256]) == [2, 2]  # a place of its own: its own last turn


class Streams:
    """Two CUDA streams as queues of what the host gave them, run in any order CUDA allows: in order within a
    stream, a wait until the last record of its event queued before it has run. The ring holds, for each
    ALIGN bytes, the number of the copy that wrote them."""

    def __init__(self, ring_bytes: int, rng: random.Random):
        self.queues = {"copy": deque(), "compute": deque()}
        self.last_record = {}  # event -> the mark of its record queued last
        self.recorded = set()  # the marks of records run
        self.ring = np.full(ring_bytes // ALIGN, -1)
        self.rng = rng

    def put(self, stream: str, op: tuple) -> tuple:
        self.queues[stream].append(op)
        return op

    def record(self, stream: str, event) -> None:
        self.last_record[event] = self.put(stream, ("record", object()))[1]

    def wait(self, stream: str, event) -> None:
        self.put(stream, ("wait", self.last_record.get(event)))

    def write(self, place: slice, tag: int) -> None:
        self.put("copy", ("write", place, tag))

    def read(self, place: slice, tag: int) -> None:
        self.put("compute", ("read", place, tag))

    def _ready(self, op) -> bool:
        return op[0] != "wait" or op[1] is None or op[1] in self.recorded

    def step(self) -> bool:
        ready = [q for q in self.queues.values() if q and self._ready(q[0])]
        if not ready:
            assert not any(self.queues.values()), "the streams wait on each other"
            return False
        op = self.rng.choice(ready).popleft()
        if op[0] == "write":
            self.ring[op[1]] = op[2]
        elif op[0] == "read":
            assert (self.ring[op[1]] == op[2]).all(), f"a call read {self.ring[op[1]]}, not its copy {op[2]}"
        elif op[0] == "record":
            self.recorded.add(op[1])
        return True

    def sync(self, *streams: str) -> None:
        while any(self.queues[s] for s in streams):
            assert self.step()

    def wander(self) -> None:
        """The GPU gets on with some of its work while the host goes on."""
        for _ in range(self.rng.randrange(4)):
            self.step()


def drive(schedule: RingSchedule, sizes: list[int], calls: list[int], streams: Streams) -> None:
    """What GpuShare.matmuls does for each call, against the model: copies queued, the launch (reading its
    place in the ring), copies ahead, then the host waits for the stream."""
    latest = {}  # call -> the number of its copy queued last: what its next launch must read
    copies = 0

    def queue(due):
        nonlocal copies
        for call, after in due:
            if after is not None:
                streams.wait("copy", ("done", after))
            streams.write(place(call), copies)
            streams.record("copy", ("copied", call))
            latest[call] = copies
            copies += 1

    def place(call):
        first = schedule.offsets[call] // ALIGN
        return slice(first, first + -(-sizes[call] // ALIGN))

    for call in calls:
        if not schedule.in_order(call):
            streams.sync("copy", "compute")
            schedule.restart(call)
        queue(schedule.copies_due())
        streams.wait("compute", ("copied", call))
        streams.read(place(call), latest[call])
        streams.record("compute", ("done", call))
        schedule.launched()
        queue(schedule.copies_due())
        streams.wander()
        streams.sync("compute")


def random_case(rng: random.Random):
    n = rng.randint(1, 10)
    sizes = [ALIGN * rng.randint(1, 6) for _ in range(n)]
    ring = ALIGN * rng.randint(max(sizes) // ALIGN, sum(sizes) // ALIGN + 2)
    calls = []
    for _ in range(rng.randint(1, 6)):  # tokens, some cut short, some starting mid-way (a restart)
        first = rng.choice([0, 0, 0, rng.randrange(n)])
        calls += list(range(first, rng.choice([n, n, rng.randint(first, n)])))
    return sizes, min(ring, sum(sizes) + 2 * ALIGN), calls


def test_every_call_reads_its_own_rows_in_any_order_the_streams_run():
    rng = random.Random(0)
    for _ in range(400):
        sizes, ring, calls = random_case(rng)
        drive(RingSchedule(sizes, ring), sizes, calls, Streams(ring, rng))


def test_the_copies_run_ahead_across_tokens():
    """With room for every call, all copies of the next token are queued once this one's calls launch; with a
    ring of two calls' room, each call's copy is queued one call ahead."""
    sizes = [ALIGN] * 4
    roomy = RingSchedule(sizes, 4 * ALIGN)
    assert [c for c, _ in roomy.copies_due()] == [0, 1, 2, 3]  # before the first launch
    roomy.launched()
    assert [c for c, _ in roomy.copies_due()] == [0]  # call 0 of the next token, its place now free
    tight = RingSchedule(sizes, 2 * ALIGN)
    assert tight.copies_due() == [(0, None), (1, None)]
    tight.launched()
    assert tight.copies_due() == [(2, 0)]  # into call 0's place, after its kernels


def test_the_model_catches_a_copy_that_does_not_wait():
    """A schedule whose copies wait only for their own call's last turn overwrites rows still to be read."""
    rng, caught = random.Random(1), 0
    for _ in range(200):
        sizes, ring, calls = random_case(rng)
        schedule = RingSchedule(sizes, ring)
        schedule.waits = [schedule.n] * schedule.n
        try:
            drive(schedule, sizes, calls, Streams(ring, rng))
        except AssertionError:
            caught += 1
    assert caught > 10
