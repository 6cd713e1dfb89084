"""CPU matmul and row lookup straight from quantized ggml blocks (numba).

A weight W [n_rows, n_cols] arrives as its raw bytes w: uint8 [n_rows, row_bytes] (a ggml tensor of
shape (n_cols, n_rows)). Nothing here dequantizes a whole matrix:
- few tokens (generation): a matrix-vector kernel reads each row's blocks once and dots them with every
  token's x, rows spread over all cores (prange). Q4_K, Q6_K and the types in blocks of 32 (Q4_0, Q4_1,
  Q5_0, Q5_1, Q8_0) dot integers: x is quantized once per call to int8 with one float scale per block of 256
  (Q4_K, Q6_K) or 32 (the others), as llama.cpp does on the CPU, so the result is x8 @ dequantize(W).T, x8
  the dequantized int8 x, to float32 rounding; |x8 - x| <= amax/254 per element (amax of its block of x).
  Other types dot float32 x: Q5_K fused, Q2_K, Q3_K, F16 and BF16 decoded to a float32 row first.
- many tokens (prompt): tiles of rows are dequantized to float32 and multiplied with numpy BLAS; these
  and the float32 matvecs match x @ dequantize(W).T to float32 rounding.

Kernels compile once per argument layout and are cached on disk (numba cache=True); w is meant to be a
read-only view of the file's mmap: a writable w is a second signature, compiled (and cached) apart.
"""
from kernels.cpu_threads import configure_thread_waits

configure_thread_waits()  # before numba's first parallel region loads libgomp (numpy may be loaded already)

import numba as nb  # noqa: E402
import numpy as np  # noqa: E402
from llvmlite import ir  # noqa: E402
from numba.core import types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

from models.ggml_types import GGMLType, UnsupportedTypeError  # noqa: E402

# One file on purpose: numba's cache (cache=True) invalidates a kernel only when its own file changes, so
# a kernel that inlined a decoder from another file would keep running the old decoder after an edit.

# ggml type ids, the dispatch key inside the kernels
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 30
DECODED_IDS = (F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)
FUSED_IDS = (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)  # types with a fused dot
BLOCK32_IDS = (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)  # blocks of 32 values: x goes in int8 blocks of 32 alike
INT8_IDS = (Q4_K, Q6_K) + BLOCK32_IDS  # fused dots of int8-quantized x (the rest of FUSED_IDS dot float32 x)

MATVEC_MAX_TOKENS = 4  # up to this many tokens the matvec kernel beats dequantize + BLAS
TILE_BYTES = 1 << 23  # float32 bytes of one dequantized tile of rows in the prompt path (few, big BLAS calls)
N16 = 16  # passed at run time, see the decoders
MATVEC_CHUNKS = 64  # row chunks of a matvec shared out to the threads: several per thread evens out their finish

# ---- Decoders: one row of blocks -> float32 ----------------------------------------------------------
# Each reads row: uint8 [row_bytes] (whole blocks) into y: float32 [n_cols] with ggml's order of float
# operations, compiled without fastmath (no fused a*b+c), so they are bit-exact with ggml and gguf-py.
# Every decoder and dot takes f16 (F16_TO_F32) and n16 (always N16 = 16). n16 is a run-time value on purpose:
# with a constant trip count LLVM fully unrolls the element loops and vectorizes across blocks with
# gathers instead, measured several times slower.

F16_TO_F32 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)

jit = nb.njit(cache=True, nogil=True)


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
            for l in range(2 * n16):
                ql0, ql1, qh = np.int64(row[lo + l]), np.int64(row[lo + 32 + l]), np.int64(row[ho + l])
                sc = so + (l >> 4)
                y[yy + l] = d * np.float32(scales[sc]) * np.float32(((ql0 & 0xF) | ((qh & 3) << 4)) - 32)
                y[yy + 32 + l] = d * np.float32(scales[sc + 2]) * np.float32(((ql1 & 0xF) | (((qh >> 2) & 3) << 4)) - 32)
                y[yy + 64 + l] = d * np.float32(scales[sc + 4]) * np.float32(((ql0 >> 4) | (((qh >> 4) & 3) << 4)) - 32)
                y[yy + 96 + l] = d * np.float32(scales[sc + 6]) * np.float32(((ql1 >> 4) | (((qh >> 6) & 3) << 4)) - 32)


# ---- Fused dots: quantized rows . x ---------------------------------------------------------------
# The quants are multiplied with x as they are unpacked and each block's scale is applied once to its
# partial sum. Q4_0, Q4_1, Q5_0 and Q5_1 take two rows at a time (a, b), which share the loads of x and
# keep two sums in flight (Q4_1 on one core: +30% in cache, +10% from DRAM); Q8_0 and the k-quants take
# one row (two rows streamed Q8_0 from DRAM 35% slower). Block minimums (Q4_1, Q5_1, Q4_K, Q5_K) go
# through xsum, the sums of x over each run of 32 values: sum((d*q + m)*x) = d*sum(q*x) + m*sum(x).
# a, b, row: uint8 [row_bytes], x: float32 [n_cols], xsum: float32 [n_cols // 32]. Integer results pass
# through np.int32 before np.float32: numba computes in int64, and the narrowing lets LLVM use 16 lanes.

fast = nb.njit(cache=True, nogil=True, fastmath=True)


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


# ---- Integer dots: quantized rows . int8-quantized x --------------------------------------------------
# x [n_tokens, n_cols] is quantized once per call: xq int8 (|xq| <= 127) times xd float32, one scale per
# block of x (256 values for Q4_K and Q6_K, as llama.cpp's q8_K; 32 for the BLOCK32_IDS types, as its q8_0),
# and xs16, the int16 sums of xq over each 16 (for block minimums and offsets: Q6_K's -32, Q4_0's -8, Q5_0's
# -16). numba computes integers in int64, which hides byte dot products from LLVM's loop vectorizer (a numba
# loop ran 4x slower), so the dots are intrinsics that emit LLVM vector IR: byte products summed in pairs to
# int16 (pmaddubsw, which takes one operand unsigned), the pairs times their scales summed to int32 (pmaddwd).
# Q4_K, Q6_K: a whole super-block of 256 of two rows at a time, as llama.cpp does for one; the 32-value blocks
# one row. Each loops over a row's blocks in IR, scales every block's int32 sums into float accumulators and
# ends in one horizontal sum a row.

def _i64(v):
    return ir.Constant(ir.IntType(64), v)


def _load(context, builder, arr_type, arr, off, lanes, bits=8):
    """<lanes x i{bits}> from a 1-d array at element off (an array of that width)."""
    ptr = builder.gep(context.make_array(arr_type)(context, builder, arr).data, [off])
    return builder.load(builder.bitcast(ptr, ir.VectorType(ir.IntType(bits), lanes).as_pointer()), align=1)


def _load_bytes(context, builder, arr_type, arr, off, lanes):
    """<lanes x i8> from arr[off:off + lanes] (a 1-d uint8 or int8 array)."""
    return _load(context, builder, arr_type, arr, off, lanes)


def _splat(builder, value, lanes, bits=8):
    """<lanes x i{bits}> of the integer value (an ir value or a Python int)."""
    vec = ir.VectorType(ir.IntType(bits), lanes)
    if isinstance(value, int):
        return vec([value] * lanes)
    v = builder.trunc(value, ir.IntType(bits)) if value.type.width > bits else value
    return builder.shuffle_vector(builder.insert_element(vec(ir.Undefined), v, ir.Constant(ir.IntType(32), 0)),
                                  vec(ir.Undefined), ir.VectorType(ir.IntType(32), lanes)([0] * lanes))


def _shuffle(builder, a, b, idx):
    """The lanes idx of a ++ b (b None: of a alone)."""
    return builder.shuffle_vector(a, b if b is not None else a.type(ir.Undefined),
                                  ir.VectorType(ir.IntType(32), len(idx))(list(idx)))


def _call(builder, name, ret, args):
    fn = builder.module.globals.get(name) or ir.Function(builder.module, ir.FunctionType(ret, [a.type for a in args]),
                                                         name=name)
    return builder.call(fn, args)


def _fold(builder, vec):
    """Its first half plus its second half: <n/2 x iN> of an <n x iN>, lanes summing to the same."""
    n = vec.type.count
    return builder.add(_shuffle(builder, vec, None, range(n // 2)), _shuffle(builder, vec, None, range(n // 2, n)))


def _madd(builder, a, b):
    """<n/2 x i32>: a[2k] * b[2k] + a[2k + 1] * b[2k + 1] for <n x i16> a, b (pmaddwd)."""
    wide = ir.VectorType(ir.IntType(32), a.type.count)
    return _pairs(builder, builder.mul(builder.sext(a, wide), builder.sext(b, wide)))


def _pairs(builder, vec):
    """Even plus odd lanes of vec: <n/2 x iN> of an <n x iN>."""
    n = vec.type.count
    return builder.add(_shuffle(builder, vec, None, range(0, n, 2)), _shuffle(builder, vec, None, range(1, n, 2)))


def _simd(context):
    """"avx512bw", "avx2" or "" (none): the widest pmaddubsw of the CPU the code is compiled for (the host, or
    NUMBA_CPU_NAME and NUMBA_CPU_FEATURES)."""
    features = context.codegen()._tm_features
    return next((simd for simd in ("avx512bw", "avx2") if "+" + simd in features), "")


def _madd_scaled(context, builder, quants, xq, scales):
    """<16 x i32>: lane k = scales[2k] * (q.x of values 4k, 4k+1) + scales[2k+1] * (q.x of values 4k+2, 4k+3)
    for quants <64 x i8> (unsigned, < 64), xq <64 x i8> (signed), scales <32 x i16>.

    The x86 pmaddubsw + pmaddwd pair, 512 bits wide with AVX-512 BW, twice 256 with AVX2, else the same sums
    in generic IR. pmaddubsw saturates its int16 pair sums, never here: 2 * 63 * 128 < 32767."""
    simd = _simd(context)
    i16, i32 = ir.IntType(16), ir.IntType(32)
    if simd == "avx512bw":
        pairs = _call(builder, "llvm.x86.avx512.pmaddubs.w.512", ir.VectorType(i16, 32), [quants, xq])
        return _call(builder, "llvm.x86.avx512.pmaddw.d.512", ir.VectorType(i32, 16), [pairs, scales])
    if simd == "avx2":
        halves = []
        for h in (range(0, 32), range(32, 64)):
            pairs = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", ir.VectorType(i16, 16),
                          [_shuffle(builder, quants, None, h), _shuffle(builder, xq, None, h)])
            halves.append(_call(builder, "llvm.x86.avx2.pmadd.wd", ir.VectorType(i32, 8),
                                [pairs, _shuffle(builder, scales, None, range(h.start // 2, h.stop // 2))]))
        return _shuffle(builder, halves[0], halves[1], range(16))
    products = builder.mul(builder.zext(quants, ir.VectorType(i16, 64)), builder.sext(xq, ir.VectorType(i16, 64)))
    scaled = builder.mul(builder.sext(_pairs(builder, products), ir.VectorType(i32, 32)),
                         builder.sext(scales, ir.VectorType(i32, 32)))
    return _pairs(builder, scaled)


def _nibbles32(context, builder, row_t, row, off):
    """<32 x i8>: the low nibbles of row[off:off + 16], then the high ones (a Q4_0/Q4_1 block's values 0-15,
    16-31)."""
    q = _load_bytes(context, builder, row_t, row, off, 16)
    return _shuffle(builder, builder.and_(q, _splat(builder, 0xF, 16)), builder.lshr(q, _splat(builder, 4, 16)),
                    range(32))


def _high_bits32(context, builder, row_t, row, off):
    """<32 x i8>: 16 where bit l of the little-endian uint32 at row[off:off + 4] is set, else 0 (the 5th bits of a
    Q5_0/Q5_1 block). Bit l is bit l % 8 of byte l // 8: each byte spread over 8 lanes and tested against its bit
    (a byte shuffle and a compare: shifting 32 int32 lanes apart took a quarter longer a block)."""
    qh = _shuffle(builder, _load_bytes(context, builder, row_t, row, off, 4), None, [lane // 8 for lane in range(32)])
    bit = builder.and_(qh, ir.VectorType(ir.IntType(8), 32)([1 << (lane % 8) for lane in range(32)]))
    return builder.select(builder.icmp_unsigned("!=", bit, _splat(builder, 0, 32)), _splat(builder, 16, 32),
                          _splat(builder, 0, 32))


def _q4_k_block(context, builder, row_t, row, o, xq_t, xq, xs_t, xs16, i):
    """[<8 x i32> summing to sum over its 8 runs j of sc_j * (q . xq), one summing to sum over j of
    m_j * (sum of xq over run j)] of the Q4_K block at row[o:o + 144] and x's block i (xq[256 i:256 i + 256],
    in q4_k_order; xs16[16 i:16 i + 16])."""
    i32, v4 = ir.IntType(32), ir.VectorType(ir.IntType(32), 4)
    # the 12 scale bytes as <4 x i32> u (its last lane quants) -> 8 scales, then 8 mins, a byte each: ggml's
    # utmp lane-wise, word k = ((u[a_k] >> s_k) & mask_k) | ((u[b_k] >> 6) & top_k) << 4
    u = builder.bitcast(_load(context, builder, row_t, row, builder.add(o, _i64(4)), 16), v4)
    low6, low4, top2 = 0x3F3F3F3F, 0x0F0F0F0F, 0x03030303
    low = builder.and_(builder.lshr(_shuffle(builder, u, None, [0, 2, 1, 2]), v4([0, 0, 0, 4])),
                       v4([low6, low4, low6, low4]))
    top = builder.shl(builder.and_(builder.lshr(_shuffle(builder, u, None, [0, 0, 1, 1]), v4([6] * 4)),
                                   v4([0, top2, 0, top2])), v4([4] * 4))
    scale_bytes = builder.bitcast(builder.or_(low, top), ir.VectorType(ir.IntType(8), 16))
    # zero-extended by interleaving zero bytes: a zext would be moved past each run's shuffle of the scales
    # below, to a byte permute plus a zext per run instead of one 16-bit permute
    zero_bytes = ir.VectorType(ir.IntType(8), 16)([0] * 16)
    scales = builder.bitcast(_shuffle(builder, scale_bytes, zero_bytes, [k // 2 + 16 * (k % 2) for k in range(32)]),
                             ir.VectorType(ir.IntType(16), 16))
    x0 = builder.mul(i, _i64(256))
    acc = ir.VectorType(i32, 16)([0] * 16)
    for h in range(2):  # 128 values from 64 bytes: runs 4h and 4h + 2 in the low nibbles, 4h + 1 and 4h + 3 high
        q = _load(context, builder, row_t, row, builder.add(o, _i64(16 + 64 * h)), 64)
        nibbles = builder.and_(q, _splat(builder, 0xF, 64)), builder.lshr(q, _splat(builder, 4, 64))
        for k, quants in enumerate(nibbles):  # xq in Q4_K order (see q4_k_order): runs 4h + k and 4h + k + 2
            x = _load(context, builder, xq_t, xq, builder.add(x0, _i64(128 * h + 64 * k)), 64)
            run_scales = _shuffle(builder, scales, None, [4 * h + k] * 16 + [4 * h + k + 2] * 16)
            acc = builder.add(acc, _madd_scaled(context, builder, quants, x, run_scales))
    mins = _shuffle(builder, scales, None, [8 + k // 2 for k in range(16)])  # each twice: runs of 32 = 2 x 16
    sums16 = _load(context, builder, xs_t, xs16, builder.mul(i, _i64(16)), 16, bits=16)
    return [_fold(builder, acc), _madd(builder, mins, sums16)]


def _q6_k_block(context, builder, row_t, row, o, xq_t, xq, xs_t, xs16, i):
    """[<8 x i32> summing to sum over its 16 runs g of 16 values of sc_g * ((q - 32) . xq)] of the Q6_K block
    at row[o:o + 210] and x's block i (xq[256 i:256 i + 256], xs16[16 i:16 i + 16])."""
    i32 = ir.IntType(32)
    scale_bytes = _load(context, builder, row_t, row, builder.add(o, _i64(192)), 16)  # int8, a run each
    scales = builder.sext(scale_bytes, ir.VectorType(ir.IntType(16), 16))
    c = lambda v: _splat(builder, v, 32)  # noqa: E731
    x0 = builder.mul(i, _i64(256))
    acc = ir.VectorType(i32, 16)([0] * 16)
    for n in range(2):  # 128 values: 4 runs of 32 from ql[64 n:64 n + 64] and qh[32 n:32 n + 32], see decode_q6_k
        ql0 = _load(context, builder, row_t, row, builder.add(o, _i64(64 * n)), 32)
        ql1 = _load(context, builder, row_t, row, builder.add(o, _i64(64 * n + 32)), 32)
        qh = _load(context, builder, row_t, row, builder.add(o, _i64(128 + 32 * n)), 32)
        high = [builder.shl(builder.and_(builder.lshr(qh, c(2 * k)), c(3)), c(4)) for k in range(4)]
        low = [builder.and_(ql0, c(0xF)), builder.and_(ql1, c(0xF)), builder.lshr(ql0, c(4)), builder.lshr(ql1, c(4))]
        for h in range(2):  # runs 2h and 2h + 1: x[128 n + 64 h:][:64]
            quants = _shuffle(builder, builder.or_(low[2 * h], high[2 * h]),
                              builder.or_(low[2 * h + 1], high[2 * h + 1]), range(64))
            x = _load(context, builder, xq_t, xq, builder.add(x0, _i64(128 * n + 64 * h)), 64)
            g = 8 * n + 4 * h  # the scales of these 4 runs of 16
            run_scales = _shuffle(builder, scales, None, [g] * 8 + [g + 1] * 8 + [g + 2] * 8 + [g + 3] * 8)
            acc = builder.add(acc, _madd_scaled(context, builder, quants, x, run_scales))
    sums16 = _load(context, builder, xs_t, xs16, builder.mul(i, _i64(16)), 16, bits=16)
    offset = builder.shl(_madd(builder, scales, sums16), ir.VectorType(i32, 8)([5] * 8))  # 32 * sc_g * sum
    return [builder.sub(_fold(builder, acc), offset)]


def _array_data(context, builder, arr_t, arr):
    return context.make_array(arr_t)(context, builder, arr)


def _half_ir(context, builder, row_t, row, off, f16_t, f16):
    """float32 of the little-endian IEEE half at row[off:off + 2] (an i64), looked up in the table f16."""
    ptr = builder.gep(_array_data(context, builder, row_t, row).data, [off])
    ptr = builder.bitcast(ptr, ir.IntType(16).as_pointer())
    bits = builder.zext(builder.load(ptr, align=1), ir.IntType(64))
    return builder.load(builder.gep(_array_data(context, builder, f16_t, f16).data, [bits]))


def _splat_f(builder, value, lanes):
    """<lanes x float> of the float ir value."""
    vec = ir.VectorType(ir.FloatType(), lanes)
    return builder.shuffle_vector(builder.insert_element(vec(ir.Undefined), value, ir.Constant(ir.IntType(32), 0)),
                                  vec(ir.Undefined), ir.VectorType(ir.IntType(32), lanes)([0] * lanes))


def _fsum(builder, vec):
    """The float sum of the lanes of a <n x float> (n a power of two), by halves."""
    while vec.type.count > 1:
        n = vec.type.count
        vec = builder.fadd(_shuffle(builder, vec, None, range(n // 2)), _shuffle(builder, vec, None, range(n // 2, n)))
    return builder.extract_element(vec, _i64(0))


def _ir_loop(builder, n, starts, body):
    """A counted loop in IR: values = body(i, values) for i in range(n) (an i64), from starts; returns the values
    after it (starts when n is 0). The phis of the loop and of its exit lead their blocks, as LLVM requires."""
    entry = builder.block
    loop, done = builder.append_basic_block("loop"), builder.append_basic_block("done")
    builder.cbranch(builder.icmp_signed(">", n, _i64(0)), loop, done)
    builder.position_at_end(loop)
    i = builder.phi(ir.IntType(64))
    values = [builder.phi(start.type) for start in starts]
    new = body(i, values)
    i_next = builder.add(i, _i64(1))
    last = builder.block
    for phi, start, value in zip([i, *values], [_i64(0), *starts], [i_next, *new]):
        phi.add_incoming(start, entry)
        phi.add_incoming(value, last)
    builder.cbranch(builder.icmp_signed("<", i_next, n), loop, done)
    builder.position_at_end(done)
    finals = [builder.phi(start.type) for start in starts]
    for phi, start, value in zip(finals, starts, new):
        phi.add_incoming(start, entry)
        phi.add_incoming(value, last)
    return finals


def _k_rows(block, block_bytes, scales_at):
    """An intrinsic f(a, b, xq, xd, xs16, f16) -> (a . x8, b . x8) for two whole rows of a k-quant and one
    token's x8 (xq in the block's order, xd [n_blocks], xs16): a loop over the blocks in IR that scales the
    int32 vectors of block(...) by their f16 scale at scales_at (byte offset, sign) times xd into one float
    vector a row, summed once a row. A numba loop over the blocks reduced every block's vectors to scalars first:
    a shuffle tree a block, on the shuffle port that Q4_K is bound by on the Xeon (llvm-mca)."""
    @intrinsic
    def rows_dot(typingctx, a, b, xq, xd, xs16, f16):
        def codegen(context, builder, sig, args):
            a_t, b_t, xq_t, xd_t, xs_t, f16_t = sig.args
            a, b, xq, xd, xs16, f16 = args
            vec = ir.VectorType(ir.FloatType(), 8)
            n_blocks = builder.udiv(builder.extract_value(_array_data(context, builder, a_t, a).shape, 0),
                                    _i64(block_bytes))

            def body(i, accs):  # one block of both rows: their accumulators plus the block's scaled vectors
                o = builder.mul(i, _i64(block_bytes))
                xd_i = builder.load(builder.gep(_array_data(context, builder, xd_t, xd).data, [i]))
                new = []
                for row_t, row, acc in ((a_t, a, accs[0]), (b_t, b, accs[1])):
                    vecs = block(context, builder, row_t, row, o, xq_t, xq, xs_t, xs16, i)
                    for v, (at, sign) in zip(vecs, scales_at):
                        scale = builder.fmul(_half_ir(context, builder, row_t, row, builder.add(o, _i64(at)), f16_t,
                                                      f16), xd_i)
                        scaled = builder.fmul(builder.sitofp(v, vec), _splat_f(builder, scale, 8))
                        acc = builder.fadd(acc, scaled) if sign > 0 else builder.fsub(acc, scaled)
                    new.append(acc)
                return new

            totals = _ir_loop(builder, n_blocks, [vec([0.0] * 8)] * 2, body)
            return context.make_tuple(builder, sig.return_type, [_fsum(builder, total) for total in totals])

        return types.UniTuple(types.float32, 2)(a, b, xq, xd, xs16, f16), codegen

    return rows_dot


# xd * (d * sum of sc * (q . xq) - dmin * sum of m * (sum of xq)) a block; Q6_K: xd * d * sum of sc * ((q - 32) . xq)
dot_q4_k_rows = _k_rows(_q4_k_block, 144, ((0, 1), (2, -1)))
dot_q6_k_rows = _k_rows(_q6_k_block, 210, ((208, 1),))


def _madd32(context, builder, quants, xq):
    """<8 x i32>: lane k = the sum of quants[l] * xq[l] for l in 4k..4k + 3, quants <32 x i8> unsigned (< 64),
    xq <32 x i8> signed: pmaddubsw + pmaddwd by ones, 256 bits wide where there is AVX2, else generic IR."""
    i16, i32 = ir.IntType(16), ir.IntType(32)
    if _simd(context):
        pairs = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", ir.VectorType(i16, 16), [quants, xq])
        ones = ir.VectorType(i16, 16)([1] * 16)
        return _call(builder, "llvm.x86.avx2.pmadd.wd", ir.VectorType(i32, 8), [pairs, ones])
    products = builder.mul(builder.zext(quants, ir.VectorType(i16, 32)), builder.sext(xq, ir.VectorType(i16, 32)))
    return _pairs(builder, builder.sext(_pairs(builder, products), ir.VectorType(i32, 16)))


def _b32_row(block_bytes, operands, min_at, offset):
    """An intrinsic f(row, xq, xd, xs16, f16) -> float32: row . x8 for one row of a 32-value block type and one
    token's x8 (xq, xd a block, xs16), in one IR loop over the blocks: each block's int32 partial sums times
    d * xd into a float vector, its minimum (min_at) or offset (-offset * d), if any, times the sum of xq into
    a float; one horizontal sum a row, where a numba loop paid one a block. operands(context, builder, row_t,
    row, o, x) -> (unsigned, signed) <32 x i8> whose products are the block's quants times x."""
    @intrinsic
    def row_dot(typingctx, row, xq, xd, xs16, f16):
        def codegen(context, builder, sig, args):
            row_t, xq_t, xd_t, xs_t, f16_t = sig.args
            row, xq, xd, xs16, f16 = args
            f32, vec = ir.FloatType(), ir.VectorType(ir.FloatType(), 8)
            n_blocks = builder.udiv(builder.extract_value(_array_data(context, builder, row_t, row).shape, 0),
                                    _i64(block_bytes))

            def body(k, values):  # block k: (float vector of d * xd * sums, float of the minimums or offsets)
                acc, acc_s = values
                o = builder.mul(k, _i64(block_bytes))
                x = _load_bytes(context, builder, xq_t, xq, builder.mul(k, _i64(32)), 32)
                unsigned, signed = operands(context, builder, row_t, row, o, x)
                xd_k = builder.load(builder.gep(_array_data(context, builder, xd_t, xd).data, [k]))
                d = builder.fmul(_half_ir(context, builder, row_t, row, o, f16_t, f16), xd_k)
                sums = _load(context, builder, xs_t, xs16, builder.mul(k, _i64(2)), 2, bits=16)
                halves = [builder.sext(builder.extract_element(sums, _i64(h)), ir.IntType(32)) for h in range(2)]
                xsum = builder.sitofp(builder.add(*halves), f32)
                if min_at is not None:
                    m = _half_ir(context, builder, row_t, row, builder.add(o, _i64(min_at)), f16_t, f16)
                    acc_s = builder.fadd(acc_s, builder.fmul(builder.fmul(m, xd_k), xsum))
                elif offset:
                    acc_s = builder.fadd(acc_s, builder.fmul(builder.fmul(d, ir.Constant(f32, -float(offset))), xsum))
                dots = builder.sitofp(_madd32(context, builder, unsigned, signed), vec)
                return [builder.fadd(acc, builder.fmul(dots, _splat_f(builder, d, 8))), acc_s]

            total, total_s = _ir_loop(builder, n_blocks, [vec([0.0] * 8), ir.Constant(f32, 0.0)], body)
            return builder.fadd(_fsum(builder, total), total_s)

        return types.float32(row, xq, xd, xs16, f16), codegen

    return row_dot


def _nibbles_at(quants_at, qh_at=None):
    """operands of _b32_row for 4-bit quants at quants_at (their 5th bits in the word at qh_at) and x."""
    def operands(context, builder, row_t, row, o, x):
        quants = _nibbles32(context, builder, row_t, row, builder.add(o, _i64(quants_at)))
        if qh_at is not None:
            quants = builder.or_(quants, _high_bits32(context, builder, row_t, row, builder.add(o, _i64(qh_at))))
        return quants, x
    return operands


def _q8_0_operands(context, builder, row_t, row, o, x):
    """|q| and x with q's sign, as llama.cpp's x86 Q8_0 dot: pmaddubsw takes one operand unsigned, and
    2 * 128 * 127 keeps its int16 pair sums from saturating (q + 128 would not: 2 * 255 * 127)."""
    q = _load_bytes(context, builder, row_t, row, builder.add(o, _i64(2)), 32)
    zero = _splat(builder, 0, 32)
    negative = builder.icmp_signed("<", q, zero)
    return builder.select(negative, builder.sub(zero, q), q), builder.select(negative, builder.sub(zero, x), x)


# (block bytes, its operands, minimum at, offset) of ggml's blocks: d f16 first in each
dot_q4_0_row = _b32_row(18, _nibbles_at(2), None, 8)
dot_q4_1_row = _b32_row(20, _nibbles_at(4), 2, 0)
dot_q5_0_row = _b32_row(22, _nibbles_at(6, 2), None, 16)
dot_q5_1_row = _b32_row(24, _nibbles_at(8, 4), 2, 0)
dot_q8_0_row = _b32_row(34, _q8_0_operands, None, 0)


@fast
def quantize_q8(x, xq, xd, xs16):
    """x: float32 [n_tokens, n_cols] -> xq: int8 [n_tokens, n_cols] times xd: float32 [n_tokens, n_blocks], one
    scale per block of n_cols // n_blocks values (to the nearest), xs16: int16 [n_tokens, n_cols // 16]."""
    size = x.shape[1] // xd.shape[1]
    for t in range(x.shape[0]):
        for b in range(xd.shape[1]):
            amax = np.float32(0)
            for l in range(size):
                amax = max(amax, abs(x[t, size * b + l]))
            inv = np.float32(127) / amax if amax > 0 else np.float32(0)
            for l in range(size):
                xq[t, size * b + l] = np.int8(np.rint(x[t, size * b + l] * inv))
            xd[t, b] = amax / np.float32(127)
        for g in range(x.shape[1] // 16):
            s = 0
            for l in range(16):
                s += xq[t, 16 * g + l]
            xs16[t, g] = s


@fast
def q4_k_order(xq, xq4):
    """xq4 = xq [n_tokens, n_cols] with the runs of 32 of each 128 values in the order 0, 2, 1, 3: the order
    of the low, then the high nibbles of 64 bytes of Q4_K quants, so these dot xq4 as they lie."""
    for t in range(xq.shape[0]):
        for k in range(xq.shape[1] // 128):
            for run in range(4):
                o4, o = 128 * k + 32 * run, 128 * k + 32 * (2 * (run % 2) + run // 2)
                for l in range(32):
                    xq4[t, o4 + l] = xq[t, o + l]


@fast
def dot8_q4_k(a, b, xq, xd, xs16, out, ra, rb, f16):
    """out[t, ra] = a . x8[t] and out[t, rb] = b . x8[t] for every token t; a, b: uint8 [row_bytes] of Q4_K rows
    ra and rb, x in blocks of 256."""
    for t in range(xq.shape[0]):  # xd * (d * sum of sc * (q . xq) - dmin * sum of m * (sum of xq)) a block
        out[t, ra], out[t, rb] = dot_q4_k_rows(a, b, xq[t], xd[t], xs16[t], f16)


@fast
def dot8_q6_k(a, b, xq, xd, xs16, out, ra, rb, f16):
    """As dot8_q4_k for Q6_K."""
    for t in range(xq.shape[0]):
        out[t, ra], out[t, rb] = dot_q6_k_rows(a, b, xq[t], xd[t], xs16[t], f16)


@fast
def dot8_q8_0(row, xq, xd, xs16, out, r, f16):
    """As dot8_q4_k for one Q8_0 row, whose blocks of 32 match x's (its own function: called from dot8_b32's
    dispatch it ran 12% slower on one core, 12.1 -> 10.8 GB/s)."""
    for t in range(xq.shape[0]):
        out[t, r] = dot_q8_0_row(row, xq[t], xd[t], xs16[t], f16)


@fast
def dot8_b32(tid, row, xq, xd, xs16, out, r, f16):
    """As dot8_q8_0 for one row of Q4_0, Q4_1, Q5_0 or Q5_1 (tid): a block is d * (q - 8) (Q4_0), d * (q - 16)
    (Q5_0), d * q + m (Q4_1, Q5_1)."""
    for t in range(xq.shape[0]):
        if tid == Q4_0:
            out[t, r] = dot_q4_0_row(row, xq[t], xd[t], xs16[t], f16)
        elif tid == Q5_0:
            out[t, r] = dot_q5_0_row(row, xq[t], xd[t], xs16[t], f16)
        elif tid == Q4_1:
            out[t, r] = dot_q4_1_row(row, xq[t], xd[t], xs16[t], f16)
        else:
            out[t, r] = dot_q5_1_row(row, xq[t], xd[t], xs16[t], f16)


# ---- Kernels ------------------------------------------------------------------------------------------

@jit
def _decode_row(tid, row, y, f16, n16):
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


@fast
def _dot_rows(tid, a, b, x, xsum, f16, n16):
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


@jit
def _dequantize_rows(tid, w, rows, out, f16, n16):
    """out[i] = dequantized row rows[i] of w. w: uint8 [n_rows, row_bytes], out: float32 [len(rows), n_cols].

    One thread: it runs between BLAS calls, whose worker thread spins on the other core for a while after
    each call; numba's threads competing with it made the prompt path several times slower."""
    for i in range(rows.size):
        _decode_row(tid, w[rows[i]], out[i], f16, n16)


@fast
def _block_sums(x):
    """xsum: float32 [n_tokens, n_cols // 32], the sums of x [n_tokens, n_cols] over runs of 32."""
    n_tokens, n_cols = x.shape
    xsum = np.zeros((n_tokens, n_cols // 32), np.float32)
    for t in range(n_tokens):
        for k in range(n_cols // 32 * 32):
            xsum[t, k // 32] += x[t, k]
    return xsum


@nb.njit(cache=True, nogil=True, parallel=True, fastmath=True)
def _matvec_fused(tid, w, x, out, f16, n16, n_chunks):
    """out[t, r] = x[t] . row r of W for the FUSED_IDS types, the rows in n_chunks parallel chunks.

    w: uint8 [n_rows, row_bytes], x: float32 [n_tokens, n_cols], out: float32 [n_tokens, n_rows]."""
    n_rows = w.shape[0]
    n_tokens = x.shape[0]
    xsum = _block_sums(x)
    for c in nb.prange(n_chunks):
        r1 = (c + 1) * n_rows // n_chunks
        for r in range(c * n_rows // n_chunks, r1, 2):
            r_b = min(r + 1, r1 - 1)  # an odd last row pairs with itself
            for t in range(n_tokens):
                out[t, r], out[t, r_b] = _dot_rows(tid, w[r], w[r_b], x[t], xsum[t], f16, n16)


@nb.njit(cache=True, nogil=True, parallel=True, fastmath=True)
def _matvecs_int8(tids, ws, x, outs, f16, n_chunks, own_row=False):
    """outs[m][t, r] = x[t] . row r of ws[m] for matrices of the INT8_IDS types tids[m] sharing x, in ONE
    parallel region: x is quantized once per block size in use (see quantize_q8), and about n_chunks chunks
    of rows, each matrix's number in proportion to its bytes (at most one a row), go to the threads.
    own_row: matrix m multiplies row m of x alone (outs[m] [1, n_rows_m]): the chosen experts' down
    projections of one token, each of its own activation.

    One region instead of one per matrix, because numba splits a prange evenly between its threads, each
    woken and joined per region; chunks of equal bytes keep that split even across matrices.
    tids: tuple of type ids, ws: tuple of uint8 [n_rows_m, row_bytes_m], x: float32 [n_tokens, n_cols],
    outs: tuple of float32 [n_tokens, n_rows_m]."""
    n_tokens, n_cols = x.shape
    n_mats = len(ws)
    k_quant = q4_k = b32 = False
    nbytes = 0
    for m in range(n_mats):
        q4_k |= tids[m] == Q4_K
        k_quant |= tids[m] == Q4_K or tids[m] == Q6_K
        b32 |= tids[m] != Q4_K and tids[m] != Q6_K
        nbytes += ws[m].size
    nk, n8 = n_cols if k_quant else 0, n_cols if b32 else 0  # x in blocks of 256 (Q4_K, Q6_K), of 32 (the rest)
    xq, xd, xs16 = np.empty((n_tokens, nk), np.int8), np.empty((n_tokens, nk // 256), np.float32), np.empty(
        (n_tokens, nk // 16), np.int16)
    xq8, xd8, xs8 = np.empty((n_tokens, n8), np.int8), np.empty((n_tokens, n8 // 32), np.float32), np.empty(
        (n_tokens, n8 // 16), np.int16)
    xq4 = np.empty((n_tokens, nk if q4_k else 0), np.int8)  # xq in Q4_K's nibble order
    if k_quant:
        quantize_q8(x, xq, xd, xs16)
    if q4_k:
        q4_k_order(xq, xq4)
    if b32:
        quantize_q8(x, xq8, xd8, xs8)
    first = np.empty(n_mats + 1, np.int64)  # matrix m has chunks first[m]..first[m + 1] - 1
    first[0] = 0  # not np.zeros: under parallel=True that is a parallel region of its own (+9 us on 2 threads)
    for m in range(n_mats):
        share = (n_chunks * ws[m].size + nbytes // 2) // max(nbytes, 1)
        first[m + 1] = first[m] + max(1, min(ws[m].shape[0], share))
    for c in nb.prange(first[n_mats]):
        m = 0
        while c >= first[m + 1]:
            m += 1
        w, out, tid = ws[m], outs[m], tids[m]
        k, j = first[m + 1] - first[m], c - first[m]
        r0, r1 = j * w.shape[0] // k, (j + 1) * w.shape[0] // k
        t0, t1 = (m, m + 1) if own_row else (0, n_tokens)  # the rows of x this matrix multiplies
        if tid == Q8_0:
            for r in range(r0, r1):
                dot8_q8_0(w[r], xq8[t0:t1], xd8[t0:t1], xs8[t0:t1], out, r, f16)
            continue
        if tid != Q4_K and tid != Q6_K:
            for r in range(r0, r1):
                dot8_b32(tid, w[r], xq8[t0:t1], xd8[t0:t1], xs8[t0:t1], out, r, f16)
            continue
        half_rows = (r1 - r0 + 1) // 2
        for r in range(r0, r0 + half_rows):
            # row r pairs with the row half a chunk on, so both walk on through memory (a pair of neighbours
            # restarts two streams every pair: half the speed from DRAM); an odd last row pairs with itself
            r_b = r + half_rows if r + half_rows < r1 else r
            if tid == Q4_K:
                dot8_q4_k(w[r], w[r_b], xq4[t0:t1], xd[t0:t1], xs16[t0:t1], out, r, r_b, f16)
            else:
                dot8_q6_k(w[r], w[r_b], xq[t0:t1], xd[t0:t1], xs16[t0:t1], out, r, r_b, f16)


@nb.njit(cache=True, nogil=True, parallel=True, fastmath=True)
def _matvec_decoded(tid, w, x, out, f16, n16, n_chunks):
    """As _matvec_fused for the other types: each row is dequantized to float32, then dotted."""
    n_rows = w.shape[0]
    n_tokens, n_cols = x.shape
    for c in nb.prange(n_chunks):
        y = np.empty(n_cols, np.float32)  # one dequantized row
        for r in range(c * n_rows // n_chunks, (c + 1) * n_rows // n_chunks):
            _decode_row(tid, w[r], y, f16, n16)
            for t in range(n_tokens):
                acc = np.float32(0)
                for k in range(n_cols):
                    acc += y[k] * x[t, k]
                out[t, r] = acc


def _check(w: np.ndarray, qtype: GGMLType) -> None:
    if qtype.id not in DECODED_IDS and qtype.id != F32:
        raise UnsupportedTypeError(f"no CPU kernel for ggml type {qtype.name}")
    if w.dtype != np.uint8 or w.ndim != 2 or w.shape[1] % qtype.block_bytes:
        raise ValueError(f"{qtype.name} weight must be uint8 [n_rows, k * {qtype.block_bytes}], got "
                         f"{w.dtype} {w.shape}")
    if not w.flags.c_contiguous:
        raise ValueError("weight bytes must be C-contiguous")


def _read_only(w: np.ndarray) -> np.ndarray:
    """w, or a read-only view of it: a tuple of weights compiles as one type (and once) only if all are alike."""
    if w.flags.writeable:
        w = w.view()
        w.flags.writeable = False
    return w


def n_cols_of(w: np.ndarray, qtype: GGMLType) -> int:
    return w.shape[1] // qtype.block_bytes * qtype.block_elems


def dequantize_rows(w: np.ndarray, qtype: GGMLType, rows: np.ndarray) -> np.ndarray:
    """Rows of the dequantized weight (an embedding lookup): float32 [len(rows), n_cols].

    w: uint8 [n_rows, row_bytes]; rows: int [n]."""
    _check(w, qtype)
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    if rows.size and (rows.min() < 0 or rows.max() >= w.shape[0]):
        raise IndexError(f"row index out of range [0, {w.shape[0]})")
    if qtype.id == F32:
        return w.view(np.float32)[rows]
    out = np.empty((rows.size, n_cols_of(w, qtype)), np.float32)
    _dequantize_rows(qtype.id, w, rows, out, F16_TO_F32, N16)
    return out


def _matmul_args(w: np.ndarray, qtype: GGMLType, x: np.ndarray, out: np.ndarray | None):
    """(x, out) of y = x @ W.T checked: x C-contiguous, out allocated when None."""
    _check(w, qtype)
    n_rows, n_cols = w.shape[0], n_cols_of(w, qtype)
    if x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != n_cols:
        raise ValueError(f"x must be float32 [n_tokens, {n_cols}], got {x.dtype} {x.shape}")
    x = np.ascontiguousarray(x)
    n_tokens = x.shape[0]
    if out is None:
        out = np.empty((n_tokens, n_rows), np.float32)
    elif out.shape != (n_tokens, n_rows) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous float32 [{n_tokens}, {n_rows}], got {out.dtype} {out.shape}")
    return x, out


def quantized_matmul(w: np.ndarray, qtype: GGMLType, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """y = x @ W.T for W [n_rows, n_cols] given as its quantized bytes w: uint8 [n_rows, row_bytes].

    x: float32 [n_tokens, n_cols] -> float32 [n_tokens, n_rows] (written into out when given)."""
    x, out = _matmul_args(w, qtype, x, out)
    n_tokens, n_rows, n_cols = x.shape[0], w.shape[0], x.shape[1]
    if qtype.id == F32:
        np.matmul(x, w.view(np.float32).T, out=out)
    elif n_tokens <= MATVEC_MAX_TOKENS:
        if qtype.id in INT8_IDS:
            _matvecs_int8((qtype.id,), (_read_only(w),), x, (out,), F16_TO_F32, MATVEC_CHUNKS)
        else:
            kernel = _matvec_fused if qtype.id in FUSED_IDS else _matvec_decoded
            kernel(qtype.id, w, x, out, F16_TO_F32, N16, min(n_rows, MATVEC_CHUNKS))
    else:
        tile_rows = max(1, TILE_BYTES // (4 * n_cols))
        tile = np.empty((min(tile_rows, n_rows), n_cols), np.float32)  # dequantized rows r0:r1
        for r0 in range(0, n_rows, tile_rows):
            r1 = min(r0 + tile_rows, n_rows)
            _dequantize_rows(qtype.id, w, np.arange(r0, r1), tile[:r1 - r0], F16_TO_F32, N16)
            np.matmul(x, tile[:r1 - r0].T, out=out[:, r0:r1])
    return out


def quantized_matvecs_own_rows(ws: list[np.ndarray], qtypes: list[GGMLType], x: np.ndarray) -> list[np.ndarray]:
    """[quantized_matmul(w, qtype, x[m:m + 1]) for the m-th w]: each matrix by its own row of x, in one parallel
    region when all are INT8_IDS types (a token's chosen experts' down projections), else one call each."""
    if len(ws) != len(x) or any(q.id not in INT8_IDS for q in qtypes):
        return [quantized_matmul(w, q, x[m:m + 1]) for m, (w, q) in enumerate(zip(ws, qtypes))]
    x = _matmul_args(ws[0], qtypes[0], np.ascontiguousarray(x, np.float32), None)[0]
    outs = tuple(np.empty((1, w.shape[0]), np.float32) for w in ws)
    for w, q in zip(ws, qtypes):
        _check(w, q)
    _matvecs_int8(tuple(q.id for q in qtypes), tuple(_read_only(w) for w in ws), x, outs, F16_TO_F32, MATVEC_CHUNKS,
                  True)
    return list(outs)


def quantized_matmuls(ws: list[np.ndarray], qtypes: list[GGMLType], x: np.ndarray) -> list[np.ndarray]:
    """[quantized_matmul(w, qtype, x) for each w], bit for bit, for matrices that multiply the same x (a layer's
    q, k, v; gate, up). Up to MATVEC_MAX_TOKENS tokens, the INT8_IDS matrices go in one kernel call: x is
    quantized once and all their rows run in one parallel region; the other matrices go one call each."""
    few = x.ndim == 2 and len(x) <= MATVEC_MAX_TOKENS
    fused = [i for i, qtype in enumerate(qtypes) if few and qtype.id in INT8_IDS]
    outs = [None if i in fused else quantized_matmul(w, qtype, x) for i, (w, qtype) in enumerate(zip(ws, qtypes))]
    if fused:
        for i in fused:
            x, outs[i] = _matmul_args(ws[i], qtypes[i], x, None)
        _matvecs_int8(tuple(qtypes[i].id for i in fused), tuple(_read_only(ws[i]) for i in fused), x,
                      tuple(outs[i] for i in fused), F16_TO_F32, MATVEC_CHUNKS)
    return outs
