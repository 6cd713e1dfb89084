"""Fused dots with float32 x (numba): Q5_K, IQ4_NL and IQ4_XS, the types with a fused dot but no int8 one (the
INT8_IDS types dot int8 x, dot_int8; the rest are decoded to a float32 row first, matvec.matvec_decoded).

The quants are multiplied with x as they are unpacked and each run's scale is applied once to its partial sum;
Q5_K's block minimums go through xsum, the sums of x over each run of 32 values: sum((d*q - m)*x) = d*sum(q*x) -
m*sum(x). row: uint8 [row_bytes], x: float32 [n_cols], xsum: float32 [n_cols // 32]. Integer results pass
through np.int32 before np.float32: numba computes in int64, and the narrowing lets LLVM use 16 lanes.
"""
import numpy as np

from kernels.cpu.dequant import half, scale_min_k4
from kernels.cpu.types import IQ4_NL, Q5_K, fast
from models.iq_grids import KVALUES_IQ4NL

# numba's cache keys these kernels on this file alone: kernels/cpu/cache.py says how edits to the modules they
# inline reach them (INLINED, INLINED_DIGEST, checked by tests/kernels/test_cpu_cache.py)
INLINED = ("types", "dequant", "models.iq_grids")
INLINED_DIGEST = "b450c1dfb5847faa"


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


@fast
def dot_iq4_nl(row, x, f16, n16):  # d f16 | qs[16]: value KVALUES_IQ4NL[nibble] * d
    acc = np.float32(0)
    for i in range(row.size // 18):
        o, xo = 18 * i, 32 * i
        s = np.float32(0)
        for l in range(n16):
            q = np.int32(row[o + 2 + l])
            s += KVALUES_IQ4NL[q & 0xF] * x[xo + l] + KVALUES_IQ4NL[q >> 4] * x[xo + 16 + l]
        acc += half(row, o, f16) * s
    return acc


@fast
def dot_iq4_xs(row, x, f16, n16):  # d f16 | scales_h u16 | scales_l[4] | qs[128]: 8 x (6-bit scale, IQ4_NL's 32)
    acc = np.float32(0)
    for i in range(row.size // 136):
        o = 136 * i
        scales_h = np.int32(row[o + 2]) | (np.int32(row[o + 3]) << 8)
        s_block = np.float32(0)
        for ib in range(8):
            ls = ((np.int32(row[o + 4 + ib // 2]) >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4)
            qo, xo = o + 8 + 16 * ib, 256 * i + 32 * ib
            s = np.float32(0)
            for l in range(n16):
                q = np.int32(row[qo + l])
                s += KVALUES_IQ4NL[q & 0xF] * x[xo + l] + KVALUES_IQ4NL[q >> 4] * x[xo + 16 + l]
            s_block += np.float32(ls - 32) * s
        acc += half(row, o, f16) * s_block
    return acc


@fast
def dot_fused(tid, row, x, xsum, f16, n16):
    """row (of type tid, one of FUSED_IDS) . x; xsum: Q5_K's sums of x over each 32 values."""
    if tid == Q5_K:
        return dot_q5_k(row, x, xsum, f16, n16)
    if tid == IQ4_NL:
        return dot_iq4_nl(row, x, f16, n16)
    return dot_iq4_xs(row, x, f16, n16)
