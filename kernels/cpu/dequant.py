"""Dequantization of ggml blocks on the CPU, bit-exact: one row of blocks -> float32 (numba).

Each decoder reads row: uint8 [row_bytes] (whole blocks) into y: float32 [n_cols] with ggml's order of float
operations, compiled without fastmath (no fused a*b+c), so they are bit-exact with ggml and gguf-py.
Every decoder and dot takes f16 (F16_TO_F32) and n16 (always N16 = 16). n16 is a run-time value on purpose:
with a constant trip count LLVM fully unrolls the element loops and vectorizes across blocks with
gathers instead, measured several times slower.
"""
import math

import numpy as np

from kernels.cpu.types import (BF16, F16, IQ1_M, IQ1_S, IQ2_S, IQ2_XS, IQ2_XXS, IQ3_S, IQ3_XXS, IQ4_NL, IQ4_XS, MXFP4,
                               Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, jit)
from models.iq_grids import GRIDS, IQ1_DELTA, KSIGNS, KVALUES_IQ4NL

# numba's cache keys these kernels on this file alone: kernels/cpu/cache.py says how edits to the modules they
# inline reach them (INLINED, INLINED_DIGEST, checked by tests/kernels/test_cpu_cache.py)
INLINED = ("types", "models.iq_grids")  # the IQ tables are frozen into the kernels as constants
INLINED_DIGEST = "bef03ca411a7eb36"


@jit
def half(b, i, f16):
    """The little-endian IEEE half at b[i:i+2] as float32."""
    return f16[np.int32(b[i]) | (np.int32(b[i + 1]) << 8)]


@jit
def scale_min_k4(j, b, o):
    """Scale and min number j (6 bits each) of a Q4_K/Q5_K block whose 12 scale bytes start at b[o]."""
    if j < 4:
        return np.int32(b[o + j]) & 63, np.int32(b[o + j + 4]) & 63
    lo, mid, hi = np.int32(b[o + j - 4]), np.int32(b[o + j]), np.int32(b[o + j + 4])
    return (hi & 0xF) | ((lo >> 6) << 4), (hi >> 4) | ((mid >> 6) << 4)


@jit
def decode_f16(row, y, f16, n16):
    for k in range(y.size):
        y[k] = half(row, 2 * k, f16)


@jit
def decode_bf16(row, y, f16, n16):  # bfloat16 is the top half of a float32
    yu = y.view(np.uint32)
    for k in range(y.size):
        yu[k] = (np.uint32(row[2 * k]) | (np.uint32(row[2 * k + 1]) << np.uint32(8))) << np.uint32(16)


@jit
def decode_q4_0(row, y, f16, n16):  # d f16 | qs[16]: y[l] = low nibble of qs[l], y[l+16] = high nibble
    for i in range(row.size // 18):
        o, yo = 18 * i, 32 * i
        d = half(row, o, f16)
        for l in range(n16):
            q = np.int64(row[o + 2 + l])
            y[yo + l] = np.float32((q & 0xF) - 8) * d
            y[yo + 16 + l] = np.float32((q >> 4) - 8) * d


@jit
def decode_q4_1(row, y, f16, n16):  # d f16 | m f16 | qs[16]
    for i in range(row.size // 20):
        o, yo = 20 * i, 32 * i
        d = half(row, o, f16)
        m = half(row, o + 2, f16)
        for l in range(n16):
            q = np.int64(row[o + 4 + l])
            y[yo + l] = d * np.float32(q & 0xF) + m
            y[yo + 16 + l] = d * np.float32(q >> 4) + m


@jit
def qh32(b, o):
    """The little-endian uint32 at b[o:o+4] (the 5th bits of a Q5_0/Q5_1 block) as int64."""
    return np.int64(b[o]) | (np.int64(b[o + 1]) << 8) | (np.int64(b[o + 2]) << 16) | (np.int64(b[o + 3]) << 24)


@jit
def decode_q5_0(row, y, f16, n16):  # d f16 | qh u32 (bit l: 5th bit of y[l]) | qs[16]
    for i in range(row.size // 22):
        o, yo = 22 * i, 32 * i
        d = half(row, o, f16)
        qh = qh32(row, o + 2)
        for l in range(n16):
            q = np.int64(row[o + 6 + l])
            y[yo + l] = np.float32(((q & 0xF) | (((qh >> l) & 1) << 4)) - 16) * d
            y[yo + 16 + l] = np.float32(((q >> 4) | (((qh >> (l + 16)) & 1) << 4)) - 16) * d


@jit
def decode_q5_1(row, y, f16, n16):  # d f16 | m f16 | qh u32 | qs[16]
    for i in range(row.size // 24):
        o, yo = 24 * i, 32 * i
        d = half(row, o, f16)
        m = half(row, o + 2, f16)
        qh = qh32(row, o + 4)
        for l in range(n16):
            q = np.int64(row[o + 8 + l])
            y[yo + l] = d * np.float32((q & 0xF) | (((qh >> l) & 1) << 4)) + m
            y[yo + 16 + l] = d * np.float32((q >> 4) | (((qh >> (l + 16)) & 1) << 4)) + m


@jit
def decode_q8_0(row, y, f16, n16):  # d f16 | qs int8[32]
    qs = row.view(np.int8)
    for i in range(row.size // 34):
        o, yo = 34 * i, 32 * i
        d = half(row, o, f16)
        for l in range(2 * n16):
            y[yo + l] = np.float32(qs[o + 2 + l]) * d


@jit
def decode_q2_k(row, y, f16, n16):  # scales[16] (low 4 bits scale, high 4 min) | qs[64] 2-bit | d | dmin
    for i in range(row.size // 84):
        o, yo = 84 * i, 256 * i
        d = half(row, o + 80, f16)
        dmin = half(row, o + 82, f16)
        for n in range(2):  # 128 values from 32 bytes: 4 shifts x 2 halves of 16
            for j in range(4):
                for h in range(2):
                    sc = np.int64(row[o + 8 * n + 2 * j + h])
                    dl = d * np.float32(sc & 0xF)
                    ml = dmin * np.float32(sc >> 4)
                    qo, yy = o + 16 + 32 * n + 16 * h, yo + 128 * n + 32 * j + 16 * h
                    for l in range(n16):
                        y[yy + l] = dl * np.float32((np.int64(row[qo + l]) >> (2 * j)) & 3) - ml


@jit
def decode_q3_k(row, y, f16, n16):  # hmask[32] | qs[64] 2-bit | scales[12] 6-bit | d f16
    for i in range(row.size // 110):
        o, yo = 110 * i, 256 * i
        d = half(row, o + 108, f16)
        for n in range(2):
            for j in range(4):
                bit = 4 * n + j  # hmask bit of these 32 values: set means no -4 offset
                for h in range(2):
                    k = 8 * n + 2 * j + h  # 6-bit scale k: 4 low bits, then 2 high bits
                    lo = np.int64(row[o + 96 + k]) & 0xF if k < 8 else np.int64(row[o + 96 + k - 8]) >> 4
                    hi = (np.int64(row[o + 104 + k % 4]) >> (2 * (k // 4))) & 3
                    dl = d * np.float32((lo | (hi << 4)) - 32)
                    qo, mo, yy = o + 32 + 32 * n + 16 * h, o + 16 * h, yo + 128 * n + 32 * j + 16 * h
                    for l in range(n16):
                        q = ((np.int64(row[qo + l]) >> (2 * j)) & 3) - 4 * (1 - ((np.int64(row[mo + l]) >> bit) & 1))
                        y[yy + l] = dl * np.float32(q)


@jit
def decode_q4_k(row, y, f16, n16):  # d f16 | dmin f16 | scales[12] 6-bit | qs[128]
    for i in range(row.size // 144):
        o, yo = 144 * i, 256 * i
        d = half(row, o, f16)
        dmin = half(row, o + 2, f16)
        for j in range(4):  # 64 values from 32 bytes: low nibbles, then high nibbles
            sc, mn = scale_min_k4(2 * j, row, o + 4)
            d1, m1 = d * np.float32(sc), dmin * np.float32(mn)
            sc, mn = scale_min_k4(2 * j + 1, row, o + 4)
            d2, m2 = d * np.float32(sc), dmin * np.float32(mn)
            qo, yy = o + 16 + 32 * j, yo + 64 * j
            for l in range(2 * n16):
                q = np.int64(row[qo + l])
                y[yy + l] = d1 * np.float32(q & 0xF) - m1
                y[yy + 32 + l] = d2 * np.float32(q >> 4) - m2


@jit
def decode_q5_k(row, y, f16, n16):  # d f16 | dmin f16 | scales[12] 6-bit | qh[32] | qs[128]
    for i in range(row.size // 176):
        o, yo = 176 * i, 256 * i
        d = half(row, o, f16)
        dmin = half(row, o + 2, f16)
        for j in range(4):
            sc, mn = scale_min_k4(2 * j, row, o + 4)
            d1, m1 = d * np.float32(sc), dmin * np.float32(mn)
            sc, mn = scale_min_k4(2 * j + 1, row, o + 4)
            d2, m2 = d * np.float32(sc), dmin * np.float32(mn)
            qo, yy = o + 48 + 32 * j, yo + 64 * j
            for l in range(2 * n16):
                q = np.int64(row[qo + l])
                qh = np.int64(row[o + 16 + l])
                y[yy + l] = d1 * np.float32((q & 0xF) | (((qh >> (2 * j)) & 1) << 4)) - m1
                y[yy + 32 + l] = d2 * np.float32((q >> 4) | (((qh >> (2 * j + 1)) & 1) << 4)) - m2


@jit
def decode_q6_k(row, y, f16, n16):  # ql[128] | qh[64] | scales int8[16] | d f16
    scales = row.view(np.int8)
    for i in range(row.size // 210):
        o, yo = 210 * i, 256 * i
        d = half(row, o + 208, f16)
        for n in range(2):  # 128 values: 4 runs of 32 sharing 32 qh bytes, a scale per 16 values
            lo, ho, so, yy = o + 64 * n, o + 128 + 32 * n, o + 192 + 8 * n, yo + 128 * n
            for h in range(2):  # values 16h..16h + 15 of each run: (d * scale) hoisted, int32 math, so it vectorizes
                d0, d1 = d * np.float32(scales[so + h]), d * np.float32(scales[so + h + 2])
                d2, d3 = d * np.float32(scales[so + h + 4]), d * np.float32(scales[so + h + 6])
                for l in range(16 * h, 16 * h + n16):
                    ql0, ql1, qh = np.int32(row[lo + l]), np.int32(row[lo + 32 + l]), np.int32(row[ho + l])
                    y[yy + l] = d0 * np.float32(((ql0 & 0xF) | ((qh & 3) << 4)) - 32)
                    y[yy + 32 + l] = d1 * np.float32(((ql1 & 0xF) | (((qh >> 2) & 3) << 4)) - 32)
                    y[yy + 64 + l] = d2 * np.float32(((ql0 >> 4) | (((qh >> 4) & 3) << 4)) - 32)
                    y[yy + 96 + l] = d3 * np.float32(((ql1 >> 4) | (((qh >> 6) & 3) << 4)) - 32)


@jit
def e8m0_half(e):
    """An MXFP4 block's scale byte e as float32 2^(e - 128) (ggml's ggml_e8m0_to_fp32_half; exact, 2^-128 and
    2^-127 subnormal)."""
    return np.float32(math.ldexp(1.0, np.int64(e) - 128))


@jit
def mxfp4_value(nibble):
    """The doubled e2m1 value of a 4-bit code (ggml's kvalues_mxfp4): 0 1 2 3 4 6 8 12, bit 3 the sign."""
    m = nibble & 7
    v = m if m < 5 else (6 if m == 5 else (8 if m == 6 else 12))
    return -v if nibble & 8 else v


@jit
def decode_mxfp4(row, y, f16, n16):  # e (e8m0) | qs[16]: y[l] = value of the low nibble of qs[l], y[l+16] high
    for i in range(row.size // 17):
        o, yo = 17 * i, 32 * i
        d = e8m0_half(row[o])
        for l in range(n16):
            q = np.int64(row[o + 1 + l])
            y[yo + l] = np.float32(mxfp4_value(q & 0xF)) * d
            y[yo + 16 + l] = np.float32(mxfp4_value(q >> 4)) * d


# The IQ types (models/dequant_iq.py has their layouts): a group of 4 or 8 values is a grid entry times a scale,
# its signs from a byte (8 bits, or KSIGNS of 7); the grids are constants of the compiled kernels.
GRID_IQ2_XXS, GRID_IQ2_XS, GRID_IQ2_S = GRIDS["IQ2_XXS"], GRIDS["IQ2_XS"], GRIDS["IQ2_S"]
GRID_IQ3_XXS, GRID_IQ3_S, GRID_IQ1_S = GRIDS["IQ3_XXS"], GRIDS["IQ3_S"], GRIDS["IQ1_S"]


@jit
def decode_iq4_nl(row, y, f16, n16):  # d f16 | qs[16]: as Q4_0, each nibble an index into KVALUES_IQ4NL
    for i in range(row.size // 18):
        o, yo = 18 * i, 32 * i
        d = half(row, o, f16)
        for l in range(n16):
            q = np.int64(row[o + 2 + l])
            y[yo + l] = d * KVALUES_IQ4NL[q & 0xF]
            y[yo + 16 + l] = d * KVALUES_IQ4NL[q >> 4]


@jit
def decode_iq4_xs(row, y, f16, n16):  # d f16 | scales_h u16 | scales_l[4] | qs[128]: 8 x (6-bit scale, IQ4_NL's 32)
    for i in range(row.size // 136):
        o = 136 * i
        d = half(row, o, f16)
        scales_h = np.int64(row[o + 2]) | (np.int64(row[o + 3]) << 8)
        for ib in range(8):
            ls = ((np.int64(row[o + 4 + ib // 2]) >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4)
            dl = d * np.float32(ls - 32)
            qo, yo = o + 8 + 16 * ib, 256 * i + 32 * ib
            for l in range(n16):
                q = np.int64(row[qo + l])
                y[yo + l] = dl * KVALUES_IQ4NL[q & 0xF]
                y[yo + 16 + l] = dl * KVALUES_IQ4NL[q >> 4]


@jit
def signed(y, yo, db, grid, g, signs):
    """y[yo:yo+8] = db * grid[g] with the minus signs of the bits of signs."""
    for j in range(8):
        v = db * np.float32(grid[g, j])
        y[yo + j] = -v if (signs >> j) & 1 else v


@jit
def decode_iq2_xxs(row, y, f16, n16):  # d f16 | per 32 values: 4 grid bytes, u32 of 4 x 7 sign bits | 4-bit scale
    for i in range(row.size // 66):
        o = 66 * i
        d = half(row, o, f16)
        for ib in range(8):
            a = o + 2 + 8 * ib
            aux = qh32(row, a + 4)
            db = d * (np.float32(0.5) + np.float32(aux >> 28)) * np.float32(0.25)
            for l in range(4):
                signed(y, 256 * i + 32 * ib + 8 * l, db, GRID_IQ2_XXS, row[a + l], KSIGNS[(aux >> (7 * l)) & 127])


@jit
def decode_iq2_xs(row, y, f16, n16):  # d f16 | qs u16[32] (9-bit grid index, 7 sign bits) | scales[8] (4 bits a 16)
    for i in range(row.size // 74):
        o = 74 * i
        d = half(row, o, f16)
        for ib in range(8):
            sc = np.int64(row[o + 66 + ib])
            for l in range(4):
                db = d * (np.float32(0.5) + np.float32((sc >> (4 * (l // 2))) & 0xF)) * np.float32(0.25)
                q = np.int64(row[o + 2 + 8 * ib + 2 * l]) | (np.int64(row[o + 3 + 8 * ib + 2 * l]) << 8)
                signed(y, 256 * i + 32 * ib + 8 * l, db, GRID_IQ2_XS, q & 511, KSIGNS[q >> 9])


@jit
def decode_iq2_s(row, y, f16, n16):  # d f16 | qs[32] | signs[32] | qh[8] (2 high index bits each) | scales[8]
    for i in range(row.size // 82):
        o = 82 * i
        d = half(row, o, f16)
        for ib in range(8):
            sc = np.int64(row[o + 74 + ib])
            qh = np.int64(row[o + 66 + ib])
            for l in range(4):
                db = d * (np.float32(0.5) + np.float32((sc >> (4 * (l // 2))) & 0xF)) * np.float32(0.25)
                g = np.int64(row[o + 2 + 4 * ib + l]) | (((qh >> (2 * l)) & 3) << 8)
                signed(y, 256 * i + 32 * ib + 8 * l, db, GRID_IQ2_S, g, row[o + 34 + 4 * ib + l])


@jit
def signed4(y, yo, db, grid, g0, g1, signs):
    """y[yo:yo+8] = db * (grid[g0], grid[g1]) (4 values each) with the minus signs of the bits of signs."""
    for j in range(8):
        v = db * np.float32(grid[g0 if j < 4 else g1, j % 4])
        y[yo + j] = -v if (signs >> j) & 1 else v


@jit
def decode_iq3_xxs(row, y, f16, n16):  # d f16 | qs[64] (a grid byte per 4 values) | u32[8]: 4 x 7 signs | scale
    for i in range(row.size // 98):
        o = 98 * i
        d = half(row, o, f16)
        for ib in range(8):
            aux = qh32(row, o + 66 + 4 * ib)
            db = d * (np.float32(0.5) + np.float32(aux >> 28)) * np.float32(0.5)
            for l in range(4):
                q = o + 2 + 8 * ib + 2 * l
                signed4(y, 256 * i + 32 * ib + 8 * l, db, GRID_IQ3_XXS, row[q], row[q + 1],
                        KSIGNS[(aux >> (7 * l)) & 127])


@jit
def decode_iq3_s(row, y, f16, n16):  # d f16 | qs[64] | qh[8] (bit 8 of each index) | signs[32] | scales[4]
    for i in range(row.size // 110):
        o = 110 * i
        d = half(row, o, f16)
        for ib in range(8):
            db = d * np.float32(1 + 2 * ((np.int64(row[o + 106 + ib // 2]) >> (4 * (ib % 2))) & 0xF))
            qh = np.int64(row[o + 66 + ib])
            for l in range(4):
                e = 8 * ib + 2 * l  # its two grid entries' number
                g0 = np.int64(row[o + 2 + e]) | (((qh >> (2 * l)) & 1) << 8)
                g1 = np.int64(row[o + 3 + e]) | (((qh >> (2 * l + 1)) & 1) << 8)
                signed4(y, 256 * i + 32 * ib + 8 * l, db, GRID_IQ3_S, g0, g1, row[o + 74 + 4 * ib + l])


@jit
def decode_iq1_s(row, y, f16, n16):  # d f16 | qs[32] | qh u16[8]: per 32 values 4 x 3 index bits, scale, shift sign
    for i in range(row.size // 50):
        o = 50 * i
        d = half(row, o, f16)
        for ib in range(8):
            qh = np.int64(row[o + 34 + 2 * ib]) | (np.int64(row[o + 35 + 2 * ib]) << 8)
            dl = d * np.float32(2 * ((qh >> 12) & 7) + 1)
            delta = -IQ1_DELTA if qh & 0x8000 else IQ1_DELTA
            for l in range(4):
                g = np.int64(row[o + 2 + 4 * ib + l]) | (((qh >> (3 * l)) & 7) << 8)
                yo = 256 * i + 32 * ib + 8 * l
                for j in range(8):
                    y[yo + j] = dl * (np.float32(GRID_IQ1_S[g, j]) + delta)


@jit
def decode_iq1_m(row, y, f16, n16):  # qs[32] | qh[16] (a nibble per 8 values) | scales u16[4] (3-bit scales, d)
    for i in range(row.size // 56):
        o = 56 * i
        sc = np.empty(4, np.int64)
        for k in range(4):
            sc[k] = np.int64(row[o + 48 + 2 * k]) | (np.int64(row[o + 49 + 2 * k]) << 8)
        d = f16[(sc[0] >> 12) | ((sc[1] >> 8) & 0xF0) | ((sc[2] >> 4) & 0xF00) | (sc[3] & 0xF000)]
        for ib in range(8):
            for l in range(4):
                dl = d * np.float32(2 * ((sc[ib // 2] >> (6 * (ib % 2) + 3 * (l // 2))) & 7) + 1)
                nibble = (np.int64(row[o + 32 + 2 * ib + l // 2]) >> (4 * (l % 2))) & 15
                g = np.int64(row[o + 4 * ib + l]) | ((nibble & 7) << 8)
                delta = -IQ1_DELTA if nibble & 8 else IQ1_DELTA
                yo = 256 * i + 32 * ib + 8 * l
                for j in range(8):
                    y[yo + j] = dl * (np.float32(GRID_IQ1_S[g, j]) + delta)

@jit
def decode_row(tid, row, y, f16, n16):
    """Dequantize row: uint8 [row_bytes] into y: float32 [n_cols]."""
    if tid == F16:
        decode_f16(row, y, f16, n16)
    elif tid == BF16:
        decode_bf16(row, y, f16, n16)
    elif tid == Q4_0:
        decode_q4_0(row, y, f16, n16)
    elif tid == Q4_1:
        decode_q4_1(row, y, f16, n16)
    elif tid == Q5_0:
        decode_q5_0(row, y, f16, n16)
    elif tid == Q5_1:
        decode_q5_1(row, y, f16, n16)
    elif tid == Q8_0:
        decode_q8_0(row, y, f16, n16)
    elif tid == Q2_K:
        decode_q2_k(row, y, f16, n16)
    elif tid == Q3_K:
        decode_q3_k(row, y, f16, n16)
    elif tid == Q4_K:
        decode_q4_k(row, y, f16, n16)
    elif tid == Q5_K:
        decode_q5_k(row, y, f16, n16)
    elif tid == Q6_K:
        decode_q6_k(row, y, f16, n16)
    elif tid == MXFP4:
        decode_mxfp4(row, y, f16, n16)
    elif tid == IQ4_NL:
        decode_iq4_nl(row, y, f16, n16)
    elif tid == IQ4_XS:
        decode_iq4_xs(row, y, f16, n16)
    elif tid == IQ2_XXS:
        decode_iq2_xxs(row, y, f16, n16)
    elif tid == IQ2_XS:
        decode_iq2_xs(row, y, f16, n16)
    elif tid == IQ2_S:
        decode_iq2_s(row, y, f16, n16)
    elif tid == IQ3_XXS:
        decode_iq3_xxs(row, y, f16, n16)
    elif tid == IQ3_S:
        decode_iq3_s(row, y, f16, n16)
    elif tid == IQ1_S:
        decode_iq1_s(row, y, f16, n16)
    elif tid == IQ1_M:
        decode_iq1_m(row, y, f16, n16)


@jit
def decode_rows(tid, w, rows, out, f16, n16):
    """out[i] = dequantized row rows[i] of w. w: uint8 [n_rows, row_bytes], out: float32 [len(rows), n_cols].

    One thread: it runs between BLAS calls, whose worker thread spins on the other core for a while after
    each call; numba's threads competing with it made the prompt path several times slower."""
    for i in range(rows.size):
        decode_row(tid, w[rows[i]], out[i], f16, n16)
