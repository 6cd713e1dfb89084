"""Opening the 253 MB Gemma file is fast and touches only the header pages of its memory map."""
import time

from models.gguf import open_gguf

# A page fault maps the touched page plus its neighbours (fault-around, 64 KiB by default; a large
# folio can map up to a 2 MiB huge page), so "header only" means at most this much past the header.
FAULT_AROUND_SLACK = 2 << 20


def mapped_bytes(address: int) -> int:
    """Resident bytes (Rss) of the mapping that starts at address, from Linux's /proc/self/smaps."""
    current = None
    with open("/proc/self/smaps") as f:
        for line in f:
            first = line.split(maxsplit=1)[0]
            if "-" in first and not first.endswith(":"):
                current = int(first.split("-")[0], 16)
            elif first == "Rss:" and current == address:
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no mapping starts at {address:#x}")


def test_gemma_opens_fast(gemma3):
    best = float("inf")
    for _ in range(3):  # best of three: the test machine is shared
        start = time.perf_counter()
        with open_gguf(gemma3) as m:
            assert len(m.tensors) == 236
        best = min(best, time.perf_counter() - start)
    assert best < 0.5


def test_open_reads_no_tensor_data(gemma3):
    """Rss of the file's mapping counts the pages this process touched: after opening and indexing every
    tensor it covers the header only; reading the tensors (the control) makes it cover the whole file."""
    with open_gguf(gemma3) as m:
        first = min(m.tensors.values(), key=lambda t: t.offset)
        map_start = m.tensor_bytes(first.name).ctypes.data - first.offset  # a view touches no page
        header = m.files[0].data_offset
        assert header < 7_000_000 and m.file_size > 250_000_000
        assert mapped_bytes(map_start) <= header + FAULT_AROUND_SLACK
        for name in m.tensors:
            m.tensor_bytes(name).max()
        assert mapped_bytes(map_start) >= 0.95 * m.file_size
