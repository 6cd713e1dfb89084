"""Q5_K's fused dot with float32 x (numba): the one type with a fused dot but no int8 one (the INT8_IDS types
dot int8 x, dot_int8; the rest are decoded to a float32 row first, matvec.matvec_decoded).

The quants are multiplied with x as they are unpacked and each run's scale is applied once to its partial sum;
the block minimums go through xsum, the sums of x over each run of 32 values: sum((d*q - m)*x) = d*sum(q*x) -
m*sum(x). row: uint8 [row_bytes], x: float32 [n_cols], xsum: float32 [n_cols // 32]. Integer results pass
through np.int32 before np.float32: numba computes in int64, and the narrowing lets LLVM use 16 lanes.
"""
import numpy as np

from kernels.cpu.dequant import half, scale_min_k4
from kernels.cpu.types import fast

# numba's cache keys these kernels on this file alone: kernels/cpu/cache.py says how edits to the modules they
# inline reach them (INLINED, INLINED_DIGEST, checked by tests/kernels/test_cpu_cache.py)
INLINED = ("types", "dequant")
INLINED_DIGEST = "1050eff5451aa221"


@fast
def dot_q5_k(row, x, xsum, f16, n16):
    acc = np.float32(0)
    for i in range(row.size // 176):
        o = 176 * i
        d = half(row, o, f16)
        dmin = half(row, o + 2, f16)
        for j in range(4):
            sc1, m1 = scale_min_k4(2 * j, row, o + 4)
            sc2, m2 = scale_min_k4(2 * j + 1, row, o + 4)
            qo, xo = o + 48 + 32 * j, 256 * i + 64 * j
            s1 = np.float32(0)
            s2 = np.float32(0)
            for l in range(2 * n16):
                q = np.int64(row[qo + l])
                qh = np.int64(row[o + 16 + l])
                s1 += np.float32(np.int32((q & 0xF) | (((qh >> (2 * j)) & 1) << 4))) * x[xo + l]
                s2 += np.float32(np.int32((q >> 4) | (((qh >> (2 * j + 1)) & 1) << 4))) * x[xo + 32 + l]
            ms = np.float32(m1) * xsum[8 * i + 2 * j] + np.float32(m2) * xsum[8 * i + 2 * j + 1]
            acc += d * (np.float32(sc1) * s1 + np.float32(sc2) * s2) - dmin * ms
    return acc
