"""Weights of the 4-bit 32-value block types (Q4_0, Q4_1, Q5_0, Q5_1) repacked eight rows at a time (numba), as
llama.cpp's CPU "repack" buffers do: the same bytes, reordered so one 256-bit vector holds 4 quant bytes of each
of 8 rows. A matvec then dots a broadcast of 4 bytes of x with 8 rows at once (one int32 lane a row) and scales 8
rows' blocks with one vector op, where the row layout pays a nibble unpack, a horizontal sum of partial sums and
scalar scale work for every row's block; the prompt's GEMM reads its tiles from the same layout.

Layout: uint8 [n_groups, n_blocks * 8 * block_bytes]; group g holds rows 8g..8g+7 (the last group repeats the last
row up to 8), block b of a group is 8 * block_bytes bytes at 8 * block_bytes * b:
  d: 8 f16, row i's at 2i; m: 8 f16 (Q4_1, Q5_1);
  qh: 8 x 4 bytes (Q5_0, Q5_1): bit k of byte l of row i's 4 = the 5th bit of its value 4k + l;
  quants: 4 x 32 bytes, bytes 4i..4i+3 of the k-th 32 = row i's qs[4k:4k + 4]: value 4k + l in the low nibble of
  byte l, value 16 + 4k + l in the high one.
"""
from dataclasses import dataclass

import numba as nb
import numpy as np

from kernels.cpu.types import Q4_0, Q4_1, Q5_0, Q5_1, X8

# numba's cache keys these kernels on this file alone: kernels/cpu/cache.py says how edits to the modules they
# inline reach them (INLINED, INLINED_DIGEST, checked by tests/kernels/test_cpu_cache.py)
INLINED = ("types",)
INLINED_DIGEST = "330468d6e679d23c"

# type id -> (block bytes, has a minimum, has 5th bits)
LAYOUTS = {Q4_0: (18, False, False), Q4_1: (20, True, False), Q5_0: (22, False, True), Q5_1: (24, True, True)}
ROWS = 8


@dataclass(frozen=True)
class Repacked:
    """A weight [n_rows, n_cols] in the layout above: data uint8 [n_groups, 8 * row_bytes], tid the kernels' type
    id, X8 + its ggml type's id."""
    data: np.ndarray
    tid: int
    n_rows: int


@nb.njit(cache=True, nogil=True, parallel=True)
def _repack(w, block_bytes, has_min, has_qh, out):
    n_rows, n_blocks = w.shape[0], w.shape[1] // block_bytes
    for g in nb.prange(out.shape[0]):
        for b in range(n_blocks):
            o8, o = ROWS * block_bytes * b, block_bytes * b
            qh_at, q_at = 16 + 16 * has_min, 16 + 16 * has_min + 32 * has_qh  # in the repacked block
            src_qh, src_q = 2 + 2 * has_min, 2 + 2 * has_min + 4 * has_qh  # in a row's block
            for i in range(ROWS):
                r = min(ROWS * g + i, n_rows - 1)
                for l in range(2):
                    out[g, o8 + 2 * i + l] = w[r, o + l]
                    if has_min:
                        out[g, o8 + 16 + 2 * i + l] = w[r, o + 2 + l]
                if has_qh:
                    qh = np.uint32(0)
                    for l in range(4):
                        qh |= np.uint32(w[r, o + src_qh + l]) << np.uint32(8 * l)
                    for l in range(4):
                        byte = np.uint32(0)
                        for k in range(8):
                            byte |= ((qh >> np.uint32(4 * k + l)) & np.uint32(1)) << np.uint32(k)
                        out[g, o8 + qh_at + 4 * i + l] = np.uint8(byte)
                for k in range(4):
                    for l in range(4):
                        out[g, o8 + q_at + 32 * k + 4 * i + l] = w[r, o + src_q + 4 * k + l]


def repack(w: np.ndarray, tid: int) -> Repacked:
    """w: uint8 [n_rows, row_bytes] of a LAYOUTS type, repacked (a new array, read-only)."""
    block_bytes, has_min, has_qh = LAYOUTS[tid]
    n_rows = w.shape[0]
    out = np.empty(((n_rows + ROWS - 1) // ROWS, ROWS * w.shape[1]), np.uint8)
    _repack(w, block_bytes, has_min, has_qh, out)
    out.flags.writeable = False
    return Repacked(out, X8 + tid, n_rows)
