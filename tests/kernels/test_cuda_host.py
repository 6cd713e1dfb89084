"""A file's pages pinned in place (kernels/cuda/host.py): registered with the driver, copied up byte for byte, and
released when the object goes. Needs a GPU."""
import gc

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

PAGE = 4096


@pytest.fixture()
def mapped(tmp_path):
    """A read-only mmap of 64 pages of random bytes, as the GGUF reader maps a model."""
    path = tmp_path / "weights.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 64 * PAGE, dtype=np.uint8).tobytes())
    return np.memmap(path, np.uint8, mode="r")


def test_ranges_are_whole_pages_merged(mapped):
    from kernels.cuda.host import page_ranges
    base = mapped.ctypes.data
    assert base % PAGE == 0
    # two arrays on one page and the next, one far off: two ranges
    ranges = page_ranges([mapped[10:20], mapped[PAGE + 5:PAGE + 9], mapped[40 * PAGE + 1:41 * PAGE + 1]])
    assert ranges == [(base, base + 2 * PAGE), (base + 40 * PAGE, base + 42 * PAGE)]


def test_pinned_pages_copy_up_and_are_released(mapped):
    import cupy as cp

    from kernels.cuda.host import copy_up, pin_in_place
    pinned = pin_in_place([mapped[PAGE:3 * PAGE], mapped[10 * PAGE + 7:20 * PAGE]])
    assert pinned is not None and pinned.nbytes == 12 * PAGE
    assert pinned.holds(mapped[PAGE + 1:3 * PAGE]) and pinned.holds(mapped[11 * PAGE:12 * PAGE])
    assert not pinned.holds(mapped[2 * PAGE:4 * PAGE]) and not pinned.holds(mapped[30 * PAGE:31 * PAGE])
    src = mapped[10 * PAGE + 7:20 * PAGE]
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:  # zeroed on the copy's stream: a non-blocking stream does not wait for the default one's memset
        dst = cp.zeros(src.size, cp.uint8)
    copy_up(dst, src, stream)
    stream.synchronize()
    assert np.array_equal(dst.get(), src)
    with pytest.raises(cp.cuda.runtime.CUDARuntimeError):  # registered: the driver refuses a second time
        cp.cuda.runtime.hostRegister(mapped.ctypes.data + PAGE, PAGE, 8)
    del pinned
    gc.collect()
    again = pin_in_place([mapped[PAGE:3 * PAGE]])  # released with the object: it registers again
    assert again is not None
