"""Dot products of one quantized row with a float32 vector, without dequantizing it (numba, fastmath).

The hot types of generation get a fused kernel: the quants are multiplied with x as they are unpacked and
each block's scale is applied once to its partial sum. Block minimums (Q4_1, Q4_K) are applied through
xsum, the sums of x over each run of 32 values: sum(q*d + m)*x = d*sum(q*x) + m*sum(x).

row: uint8 [row_bytes], x: float32 [n_cols], xsum: float32 [n_cols // 32]; f16 and n16 as in cpu_decode
(n16 = 16 at run time keeps the element loops the ones LLVM vectorizes).
"""
import numba as nb
import numpy as np

from kernels.cpu_decode import half, qh32, scale_min_k4

fast = nb.njit(cache=True, nogil=True, fastmath=True)


@fast
def dot_q4_1(row, x, xsum, f16, n16):
    acc = np.float32(0)
    for i in range(row.size // 20):
        o, xo = 20 * i, 32 * i
        s = np.float32(0)
        for l in range(n16):
            q = np.int64(row[o + 4 + l])
            s += np.float32(q & 0xF) * x[xo + l] + np.float32(q >> 4) * x[xo + 16 + l]
        acc += half(row, o, f16) * s + half(row, o + 2, f16) * xsum[i]
    return acc


@fast
def dot_q5_0(row, x, xsum, f16, n16):
    acc = np.float32(0)
    for i in range(row.size // 22):
        o, xo = 22 * i, 32 * i
        qh = qh32(row, o + 2)
        s = np.float32(0)
        for l in range(n16):
            q = np.int64(row[o + 6 + l])
            s += (np.float32(((q & 0xF) | (((qh >> l) & 1) << 4)) - 16) * x[xo + l]
                  + np.float32(((q >> 4) | (((qh >> (l + 16)) & 1) << 4)) - 16) * x[xo + 16 + l])
        acc += half(row, o, f16) * s
    return acc


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
def dot_q6_k(row, x, xsum, f16, n16):
    scales = row.view(np.int8)
    acc = np.float32(0)
    for i in range(row.size // 210):
        o = 210 * i
        blk = np.float32(0)
        for n in range(2):
            for h in range(2):
                lo, ho, xo = o + 64 * n + 16 * h, o + 128 + 32 * n + 16 * h, 256 * i + 128 * n + 16 * h
                s1 = np.float32(0)
                s2 = np.float32(0)
                s3 = np.float32(0)
                s4 = np.float32(0)
                for l in range(n16):
                    ql0, ql1, qh = np.int64(row[lo + l]), np.int64(row[lo + 32 + l]), np.int64(row[ho + l])
                    s1 += np.float32(((ql0 & 0xF) | ((qh & 3) << 4)) - 32) * x[xo + l]
                    s2 += np.float32(((ql1 & 0xF) | (((qh >> 2) & 3) << 4)) - 32) * x[xo + 32 + l]
                    s3 += np.float32(((ql0 >> 4) | (((qh >> 4) & 3) << 4)) - 32) * x[xo + 64 + l]
                    s4 += np.float32(((ql1 >> 4) | (((qh >> 6) & 3) << 4)) - 32) * x[xo + 96 + l]
                so = o + 192 + 8 * n + h
                blk += (np.float32(scales[so]) * s1 + np.float32(scales[so + 2]) * s2
                        + np.float32(scales[so + 4]) * s3 + np.float32(scales[so + 6]) * s4)
        acc += half(row, o + 208, f16) * blk
    return acc
