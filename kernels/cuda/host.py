"""A file's pages pinned in place for the GPU: weights that stay in host memory (experts on the host) are copied
up for a prompt chunk straight from the model file's mmap, with no staging copy by the cores first.

cudaHostRegister pins the pages the mmap already holds (the page cache's, no second copy in RAM) and tells the
driver it may DMA from them; a read-only mapping needs cudaHostRegisterReadOnly. Where the driver refuses (an
old driver, a platform without read-only registration), pin_in_place returns None and callers stage as before.
"""
import bisect
import mmap
import weakref

import cupy as cp
import numpy as np

REGISTER_READ_ONLY = 8  # cudaHostRegisterReadOnly


class PinnedPages:
    """Disjoint page ranges [start, end) of host memory, registered with the driver until this is collected."""

    def __init__(self, ranges: list[tuple[int, int]], owners: list[np.ndarray]):
        self.starts = [s for s, _ in ranges]
        self.ends = [e for _, e in ranges]
        self._owners = owners  # the arrays whose pages these are: their mmap stays open while registered
        # not at exit: the driver lets go of a process's pages then, and CuPy may be gone before this runs
        weakref.finalize(self, _unregister, list(self.starts)).atexit = False

    def holds(self, a: np.ndarray) -> bool:
        """a's bytes lie in one registered range."""
        first, nbytes = a.ctypes.data, a.nbytes
        i = bisect.bisect_right(self.starts, first) - 1
        return i >= 0 and first + nbytes <= self.ends[i]

    @property
    def nbytes(self) -> int:
        return sum(e - s for s, e in zip(self.starts, self.ends))


def page_ranges(arrays: list[np.ndarray]) -> list[tuple[int, int]]:
    """The arrays' bytes rounded out to whole pages, overlapping or touching ranges merged, in address order."""
    page = mmap.PAGESIZE
    spans = sorted((a.ctypes.data // page * page, -(-(a.ctypes.data + a.nbytes) // page) * page)
                   for a in arrays if a.nbytes)
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def pin_in_place(arrays: list[np.ndarray]) -> PinnedPages | None:
    """Register the pages under arrays (C-contiguous views of a read-only mmap) with the driver; None if it
    refuses any range (those done are released)."""
    done = []
    try:
        for start, end in page_ranges(arrays):
            cp.cuda.runtime.hostRegister(start, end - start, REGISTER_READ_ONLY)
            done.append((start, end))
    except cp.cuda.runtime.CUDARuntimeError:
        _unregister([s for s, _ in done])
        return None
    return PinnedPages(done, list(arrays))


def copy_up(dst: cp.ndarray, src: np.ndarray, stream: cp.cuda.Stream) -> None:
    """dst[:] = src (same bytes) on stream, from pinned pages: asynchronous (a graph node when captured), src must
    stay mapped until it is done."""
    _check_pair("copy_up", dst, src)
    cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.ctypes.data, src.nbytes, cp.cuda.runtime.memcpyHostToDevice,
                                stream.ptr)


def copy_down(dst: np.ndarray, src: cp.ndarray, stream: cp.cuda.Stream) -> None:
    """dst[:] = src (same bytes) on stream, into pinned host memory: asynchronous (a graph node when captured),
    dst is read once the stream has done it."""
    _check_pair("copy_down", dst, src)
    cp.cuda.runtime.memcpyAsync(dst.ctypes.data, src.data.ptr, src.nbytes, cp.cuda.runtime.memcpyDeviceToHost,
                                stream.ptr)


def _check_pair(name: str, dst, src) -> None:
    if dst.nbytes != src.nbytes or not (dst.flags.c_contiguous and src.flags.c_contiguous):
        raise ValueError(f"{name}: two C-contiguous arrays of one size, got {src.nbytes} and {dst.nbytes} bytes")


def _unregister(starts: list[int]) -> None:
    for start in starts:
        cp.cuda.runtime.hostUnregister(start)
