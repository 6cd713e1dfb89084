"""Fused dots of quantized rows with float32 x (numba). Of the FUSED_IDS types only Q5_K reaches them in
cpu_quant's dispatch: the others take the int8 dots (cpu_dot_int8).

The quants are multiplied with x as they are unpacked and each block's scale is applied once to its
partial sum. Q4_0, Q4_1, Q5_0 and Q5_1 take two rows at a time (a, b), which share the loads of x and
keep two sums in flight (Q4_1 on one core: +30% in cache, +10% from DRAM); Q8_0 and the k-quants take
one row (two rows streamed Q8_0 from DRAM 35% slower). Block minimums (Q4_1, Q5_1, Q4_K, Q5_K) go
through xsum, the sums of x over each run of 32 values: sum((d*q + m)*x) = d*sum(q*x) + m*sum(x).
a, b, row: uint8 [row_bytes], x: float32 [n_cols], xsum: float32 [n_cols // 32]. Integer results pass
through np.int32 before np.float32: numba computes in int64, and the narrowing lets LLVM use 16 lanes.
"""
import numpy as np

from kernels.cpu_dequant import half, qh32, scale_min_k4
from kernels.cpu_types import Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q8_0, fast

# numba's cache keys these kernels on this file alone: kernels/cpu_cache.py says how edits to the modules they
# inline reach them (INLINED, INLINED_DIGEST, checked by tests/kernels/test_cpu_cache.py)
INLINED = ("cpu_types", "cpu_dequant")
INLINED_DIGEST = "c616b1e1f005596a"


@fast
def dot_q4_0(a, b, x, xsum, f16, n16):
    acc_a = np.float32(0)
    acc_b = np.float32(0)
    for i in range(a.size // 18):
        o, xo = 18 * i, 32 * i
        sa = np.float32(0)
        sb = np.float32(0)
        for l in range(n16):
            x0, x1 = x[xo + l], x[xo + 16 + l]
            qa, qb = np.int64(a[o + 2 + l]), np.int64(b[o + 2 + l])
            sa += np.float32(np.int32((qa & 0xF) - 8)) * x0 + np.float32(np.int32((qa >> 4) - 8)) * x1
            sb += np.float32(np.int32((qb & 0xF) - 8)) * x0 + np.float32(np.int32((qb >> 4) - 8)) * x1
        acc_a += half(a, o, f16) * sa
        acc_b += half(b, o, f16) * sb
    return acc_a, acc_b


@fast
def dot_q4_1(a, b, x, xsum, f16, n16):
    acc_a = np.float32(0)
    acc_b = np.float32(0)
    for i in range(a.size // 20):
        o, xo = 20 * i, 32 * i
        sa = np.float32(0)
        sb = np.float32(0)
        for l in range(n16):
            x0, x1 = x[xo + l], x[xo + 16 + l]
            qa, qb = np.int64(a[o + 4 + l]), np.int64(b[o + 4 + l])
            sa += np.float32(np.int32(qa & 0xF)) * x0 + np.float32(np.int32(qa >> 4)) * x1
            sb += np.float32(np.int32(qb & 0xF)) * x0 + np.float32(np.int32(qb >> 4)) * x1
        acc_a += half(a, o, f16) * sa + half(a, o + 2, f16) * xsum[i]
        acc_b += half(b, o, f16) * sb + half(b, o + 2, f16) * xsum[i]
    return acc_a, acc_b


@fast
def dot_q5_0(a, b, x, xsum, f16, n16):
    acc_a = np.float32(0)
    acc_b = np.float32(0)
    for i in range(a.size // 22):
        o, xo = 22 * i, 32 * i
        ha, hb = qh32(a, o + 2), qh32(b, o + 2)
        sa = np.float32(0)
        sb = np.float32(0)
        for l in range(n16):
            x0, x1 = x[xo + l], x[xo + 16 + l]
            qa, qb = np.int64(a[o + 6 + l]), np.int64(b[o + 6 + l])
            sa += (np.float32(np.int32(((qa & 0xF) | (((ha >> l) & 1) << 4)) - 16)) * x0
                   + np.float32(np.int32(((qa >> 4) | (((ha >> (l + 16)) & 1) << 4)) - 16)) * x1)
            sb += (np.float32(np.int32(((qb & 0xF) | (((hb >> l) & 1) << 4)) - 16)) * x0
                   + np.float32(np.int32(((qb >> 4) | (((hb >> (l + 16)) & 1) << 4)) - 16)) * x1)
        acc_a += half(a, o, f16) * sa
        acc_b += half(b, o, f16) * sb
    return acc_a, acc_b


@fast
def dot_q5_1(a, b, x, xsum, f16, n16):
    acc_a = np.float32(0)
    acc_b = np.float32(0)
    for i in range(a.size // 24):
        o, xo = 24 * i, 32 * i
        ha, hb = qh32(a, o + 4), qh32(b, o + 4)
        sa = np.float32(0)
        sb = np.float32(0)
        for l in range(n16):
            x0, x1 = x[xo + l], x[xo + 16 + l]
            qa, qb = np.int64(a[o + 8 + l]), np.int64(b[o + 8 + l])
            sa += (np.float32(np.int32((qa & 0xF) | (((ha >> l) & 1) << 4))) * x0
                   + np.float32(np.int32((qa >> 4) | (((ha >> (l + 16)) & 1) << 4))) * x1)
            sb += (np.float32(np.int32((qb & 0xF) | (((hb >> l) & 1) << 4))) * x0
                   + np.float32(np.int32((qb >> 4) | (((hb >> (l + 16)) & 1) << 4))) * x1)
        acc_a += half(a, o, f16) * sa + half(a, o + 2, f16) * xsum[i]
        acc_b += half(b, o, f16) * sb + half(b, o + 2, f16) * xsum[i]
    return acc_a, acc_b


@fast
def dot_q8_0(row, x, xsum, f16, n16):
    qs = row.view(np.int8)
    acc = np.float32(0)
    for i in range(row.size // 34):
        o, xo = 34 * i, 32 * i
        s = np.float32(0)
        for l in range(2 * n16):
            s += np.float32(qs[o + 2 + l]) * x[xo + l]
        acc += half(row, o, f16) * s
    return acc


@fast
def dot_q4_k(row, x, xsum, f16, n16):
    acc = np.float32(0)
    for i in range(row.size // 144):
        o = 144 * i
        d = half(row, o, f16)
        dmin = half(row, o + 2, f16)
        for j in range(4):
            sc1, m1 = scale_min_k4(2 * j, row, o + 4)
            sc2, m2 = scale_min_k4(2 * j + 1, row, o + 4)
            qo, xo = o + 16 + 32 * j, 256 * i + 64 * j
            s1 = np.float32(0)
            s2 = np.float32(0)
            for l in range(2 * n16):
                q = np.int64(row[qo + l])
                s1 += np.float32(q & 0xF) * x[xo + l]
                s2 += np.float32(q >> 4) * x[xo + 32 + l]
            ms = np.float32(m1) * xsum[8 * i + 2 * j] + np.float32(m2) * xsum[8 * i + 2 * j + 1]
            acc += d * (np.float32(sc1) * s1 + np.float32(sc2) * s2) - dmin * ms
    return acc


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
def dot_q6_k(row, x, xsum, f16, n16):
    # one loop of 32 picking each lane's scale (l >> 4) ran 3x faster than two loops of 16 with fixed scales
    scales = row.view(np.int8)
    acc = np.float32(0)
    for i in range(row.size // 210):
        o = 210 * i
        blk = np.float32(0)
        for n in range(2):
            lo, ho, so, xo = o + 64 * n, o + 128 + 32 * n, o + 192 + 8 * n, 256 * i + 128 * n
            for l in range(2 * n16):
                ql0, ql1, qh = np.int64(row[lo + l]), np.int64(row[lo + 32 + l]), np.int64(row[ho + l])
                sc = so + (l >> 4)
                blk += (np.float32(scales[sc]) * np.float32(np.int32(((ql0 & 0xF) | ((qh & 3) << 4)) - 32)) * x[xo + l]
                        + np.float32(scales[sc + 2]) * np.float32(np.int32(((ql1 & 0xF) | (((qh >> 2) & 3) << 4)) - 32))
                        * x[xo + 32 + l]
                        + np.float32(scales[sc + 4]) * np.float32(np.int32(((ql0 >> 4) | (((qh >> 4) & 3) << 4)) - 32))
                        * x[xo + 64 + l]
                        + np.float32(scales[sc + 6]) * np.float32(np.int32(((ql1 >> 4) | (((qh >> 6) & 3) << 4)) - 32))
                        * x[xo + 96 + l])
        acc += half(row, o + 208, f16) * blk
    return acc


@fast
def dot_rows(tid, a, b, x, xsum, f16, n16):
    """(a . x, b . x) for the FUSED_IDS types. a, b: uint8 [row_bytes], x: float32 [n_cols]."""
    if tid == Q4_0:
        return dot_q4_0(a, b, x, xsum, f16, n16)
    if tid == Q4_1:
        return dot_q4_1(a, b, x, xsum, f16, n16)
    if tid == Q5_0:
        return dot_q5_0(a, b, x, xsum, f16, n16)
    if tid == Q5_1:
        return dot_q5_1(a, b, x, xsum, f16, n16)
    if tid == Q8_0:
        return dot_q8_0(a, x, xsum, f16, n16), dot_q8_0(b, x, xsum, f16, n16)
    if tid == Q4_K:
        return dot_q4_k(a, x, xsum, f16, n16), dot_q4_k(b, x, xsum, f16, n16)
    if tid == Q5_K:
        return dot_q5_k(a, x, xsum, f16, n16), dot_q5_k(b, x, xsum, f16, n16)
    return dot_q6_k(a, x, xsum, f16, n16), dot_q6_k(b, x, xsum, f16, n16)
