"""CPU matmul and row lookup straight from quantized ggml blocks (numba).

A weight W [n_rows, n_cols] arrives as its raw bytes w: uint8 [n_rows, row_bytes] (a ggml tensor of
shape (n_cols, n_rows)). Nothing here dequantizes a whole matrix:
- few tokens (generation): a matrix-vector kernel decodes each row's blocks and dots them with x,
  rows spread over all cores (prange);
- many tokens (prompt): tiles of rows are dequantized to float32 and multiplied with numpy BLAS.
Activations stay float32 (no int8 quantization), so results match x @ dequantize(W).T to float32 rounding.

Block layouts follow ggml-common.h; each decoder below reads one block of bytes into float32 in the same
order of operations as ggml's dequantize_row_*, so dequantize_rows is bit-exact with it.
"""
import math

import numba as nb
import numpy as np

from models.ggml_types import GGMLType

# ggml type ids, the dispatch key inside the kernels
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 30
QUANT_IDS = (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)

MATVEC_MAX_TOKENS = 4  # up to this many tokens the matvec kernel beats dequantize + BLAS
TILE_BYTES = 1 << 20  # float32 bytes of one dequantized tile of rows in the prompt path

_jit = nb.njit(cache=True, nogil=True)


@_jit
def _f16(b, i):
    """The IEEE half at bytes b[i:i+2] (little-endian) as float32, exactly."""
    h = np.int32(b[i]) | (np.int32(b[i + 1]) << 8)
    exp = (h >> 10) & 0x1F
    mant = h & 0x3FF
    if exp == 0:
        v = math.ldexp(float(mant), -24)
    elif exp == 31:
        v = math.inf if mant == 0 else math.nan
    else:
        v = math.ldexp(float(mant | 0x400), exp - 25)
    return np.float32(-v if h & 0x8000 else v)


@_jit
def _i8(u):
    return np.int32(u) - 256 if u > 127 else np.int32(u)


@_jit
def _scale_min_k4(j, s):
    """The 6-bit scale and min number j of a Q4_K/Q5_K block, packed in s[0:12]."""
    if j < 4:
        return np.int32(s[j]) & 63, np.int32(s[j + 4]) & 63
    a, b, c = np.int32(s[j - 4]), np.int32(s[j]), np.int32(s[j + 4])
    return (c & 0xF) | ((a >> 6) << 4), (c >> 4) | ((b >> 6) << 4)


@_jit
def _decode_q4_0(b, y):  # d f16 | qs[16]: y[j] = low nibble, y[j+16] = high nibble
    d = _f16(b, 0)
    for j in range(16):
        q = np.int32(b[2 + j])
        y[j] = np.float32(np.int32(q & 0xF) - 8) * d
        y[j + 16] = np.float32(np.int32(q >> 4) - 8) * d


@_jit
def _decode_q4_1(b, y):  # d f16 | m f16 | qs[16]
    d = _f16(b, 0)
    m = _f16(b, 2)
    for j in range(16):
        q = np.int32(b[4 + j])
        y[j] = np.float32(q & 0xF) * d + m
        y[j + 16] = np.float32(q >> 4) * d + m


@_jit
def _decode_q5_0(b, y):  # d f16 | qh u32 (bit j: 5th bit of y[j]) | qs[16]
    d = _f16(b, 0)
    qh = np.int64(b[2]) | (np.int64(b[3]) << 8) | (np.int64(b[4]) << 16) | (np.int64(b[5]) << 24)
    for j in range(16):
        q = np.int32(b[6 + j])
        h0 = ((qh >> j) & 1) << 4
        h1 = ((qh >> (j + 16)) & 1) << 4
        y[j] = np.float32(np.int32((q & 0xF) | h0) - 16) * d
        y[j + 16] = np.float32(np.int32((q >> 4) | h1) - 16) * d


@_jit
def _decode_q5_1(b, y):  # d f16 | m f16 | qh u32 | qs[16]
    d = _f16(b, 0)
    m = _f16(b, 2)
    qh = np.int64(b[4]) | (np.int64(b[5]) << 8) | (np.int64(b[6]) << 16) | (np.int64(b[7]) << 24)
    for j in range(16):
        q = np.int32(b[8 + j])
        h0 = ((qh >> j) & 1) << 4
        h1 = ((qh >> (j + 16)) & 1) << 4
        y[j] = np.float32((q & 0xF) | h0) * d + m
        y[j + 16] = np.float32((q >> 4) | h1) * d + m


@_jit
def _decode_q8_0(b, y):  # d f16 | qs int8[32]
    d = _f16(b, 0)
    for j in range(32):
        y[j] = np.float32(_i8(b[2 + j])) * d


@_jit
def _decode_q2_k(b, y):  # scales[16] (low: scale, high: min) | qs[64] 2-bit | d f16 | dmin f16
    d = _f16(b, 80)
    dmin = _f16(b, 82)
    for n in range(2):
        for j in range(4):
            shift = 2 * j
            for h in range(2):
                sc = np.int32(b[8 * n + 2 * j + h])
                dl = d * np.float32(sc & 0xF)
                ml = dmin * np.float32(sc >> 4)
                for l in range(16):
                    q = (np.int32(b[16 + 32 * n + 16 * h + l]) >> shift) & 3
                    y[128 * n + 32 * j + 16 * h + l] = dl * np.float32(q) - ml


@_jit
def _decode_q3_k(b, y):  # hmask[32] | qs[64] 2-bit | scales[12] 6-bit | d f16
    d = _f16(b, 108)
    for n in range(2):
        for j in range(4):
            shift = 2 * j
            m = 1 << (4 * n + j)
            for h in range(2):
                k = 8 * n + 2 * j + h  # scale index 0..15: 4 low bits, then 2 high bits
                lo = np.int32(b[96 + k]) & 0xF if k < 8 else np.int32(b[96 + k - 8]) >> 4
                hi = (np.int32(b[104 + k % 4]) >> (2 * (k // 4))) & 3
                dl = d * np.float32(np.int32(lo | (hi << 4)) - 32)
                for l in range(16):
                    i = 16 * h + l
                    q = ((np.int32(b[32 + 32 * n + i]) >> shift) & 3) - (0 if np.int32(b[i]) & m else 4)
                    y[128 * n + 32 * j + i] = dl * np.float32(q)


@_jit
def _decode_q4_k(b, y):  # d f16 | dmin f16 | scales[12] 6-bit | qs[128]
    d = _f16(b, 0)
    dmin = _f16(b, 2)
    s = b[4:16]
    for j in range(4):
        sc, mn = _scale_min_k4(2 * j, s)
        d1 = d * np.float32(sc)
        m1 = dmin * np.float32(mn)
        sc, mn = _scale_min_k4(2 * j + 1, s)
        d2 = d * np.float32(sc)
        m2 = dmin * np.float32(mn)
        for l in range(32):
            q = np.int32(b[16 + 32 * j + l])
            y[64 * j + l] = d1 * np.float32(q & 0xF) - m1
            y[64 * j + 32 + l] = d2 * np.float32(q >> 4) - m2


@_jit
def _decode_q5_k(b, y):  # d f16 | dmin f16 | scales[12] 6-bit | qh[32] | qs[128]
    d = _f16(b, 0)
    dmin = _f16(b, 2)
    s = b[4:16]
    for j in range(4):
        sc, mn = _scale_min_k4(2 * j, s)
        d1 = d * np.float32(sc)
        m1 = dmin * np.float32(mn)
        sc, mn = _scale_min_k4(2 * j + 1, s)
        d2 = d * np.float32(sc)
        m2 = dmin * np.float32(mn)
        for l in range(32):
            q = np.int32(b[48 + 32 * j + l])
            qh = np.int32(b[16 + l])
            h1 = ((qh >> (2 * j)) & 1) << 4
            h2 = ((qh >> (2 * j + 1)) & 1) << 4
            y[64 * j + l] = d1 * np.float32((q & 0xF) | h1) - m1
            y[64 * j + 32 + l] = d2 * np.float32((q >> 4) | h2) - m2


@_jit
def _decode_q6_k(b, y):  # ql[128] | qh[64] | scales int8[16] | d f16
    d = _f16(b, 208)
    for n in range(2):
        for l in range(32):
            ql0 = np.int32(b[64 * n + l])
            ql1 = np.int32(b[64 * n + 32 + l])
            qh = np.int32(b[128 + 32 * n + l])
            q1 = np.int32((ql0 & 0xF) | ((qh & 3) << 4)) - 32
            q2 = np.int32((ql1 & 0xF) | (((qh >> 2) & 3) << 4)) - 32
            q3 = np.int32((ql0 >> 4) | (((qh >> 4) & 3) << 4)) - 32
            q4 = np.int32((ql1 >> 4) | (((qh >> 6) & 3) << 4)) - 32
            sc = 192 + 8 * n + l // 16
            y[128 * n + l] = d * np.float32(_i8(b[sc])) * np.float32(q1)
            y[128 * n + 32 + l] = d * np.float32(_i8(b[sc + 2])) * np.float32(q2)
            y[128 * n + 64 + l] = d * np.float32(_i8(b[sc + 4])) * np.float32(q3)
            y[128 * n + 96 + l] = d * np.float32(_i8(b[sc + 6])) * np.float32(q4)


@_jit
def _decode_row(tid, row, y):
    """Dequantize one row of blocks (row: uint8 [row_bytes]) into y: float32 [n_cols]."""
    if tid == Q4_0:
        for i in range(row.size // 18):
            _decode_q4_0(row[18 * i:18 * i + 18], y[32 * i:32 * i + 32])
    elif tid == Q4_1:
        for i in range(row.size // 20):
            _decode_q4_1(row[20 * i:20 * i + 20], y[32 * i:32 * i + 32])
    elif tid == Q5_0:
        for i in range(row.size // 22):
            _decode_q5_0(row[22 * i:22 * i + 22], y[32 * i:32 * i + 32])
    elif tid == Q5_1:
        for i in range(row.size // 24):
            _decode_q5_1(row[24 * i:24 * i + 24], y[32 * i:32 * i + 32])
    elif tid == Q8_0:
        for i in range(row.size // 34):
            _decode_q8_0(row[34 * i:34 * i + 34], y[32 * i:32 * i + 32])
    elif tid == Q2_K:
        for i in range(row.size // 84):
            _decode_q2_k(row[84 * i:84 * i + 84], y[256 * i:256 * i + 256])
    elif tid == Q3_K:
        for i in range(row.size // 110):
            _decode_q3_k(row[110 * i:110 * i + 110], y[256 * i:256 * i + 256])
    elif tid == Q4_K:
        for i in range(row.size // 144):
            _decode_q4_k(row[144 * i:144 * i + 144], y[256 * i:256 * i + 256])
    elif tid == Q5_K:
        for i in range(row.size // 176):
            _decode_q5_k(row[176 * i:176 * i + 176], y[256 * i:256 * i + 256])
    elif tid == Q6_K:
        for i in range(row.size // 210):
            _decode_q6_k(row[210 * i:210 * i + 210], y[256 * i:256 * i + 256])


@nb.njit(cache=True, nogil=True, parallel=True)
def _dequantize_rows(tid, w, rows, out):
    """out[i] = dequantized row rows[i] of w. w: uint8 [n_rows, row_bytes], out: float32 [len(rows), n_cols]."""
    for i in nb.prange(rows.size):
        _decode_row(tid, w[rows[i]], out[i])


@nb.njit(cache=True, nogil=True, parallel=True, fastmath=True)
def _matvec(tid, w, x, out, n_chunks):
    """out[t, r] = x[t] . row r of W, rows in n_chunks parallel chunks.

    w: uint8 [n_rows, row_bytes], x: float32 [n_tokens, n_cols], out: float32 [n_tokens, n_rows]."""
    n_rows = w.shape[0]
    n_tokens, n_cols = x.shape
    for c in nb.prange(n_chunks):
        y = np.empty(n_cols, np.float32)  # one dequantized row, reused across the chunk
        for r in range(c * n_rows // n_chunks, (c + 1) * n_rows // n_chunks):
            _decode_row(tid, w[r], y)
            for t in range(n_tokens):
                acc = np.float32(0.0)
                for k in range(n_cols):
                    acc += y[k] * x[t, k]
                out[t, r] = acc


def _float_rows(w: np.ndarray, tid: int, rows) -> np.ndarray:
    """Rows of an unquantized weight as float32 [len(rows), n_cols] (numpy; a copy only for F16/BF16)."""
    if tid == F32:
        return w.view(np.float32)[rows]
    if tid == F16:
        return w.view(np.float16)[rows].astype(np.float32)
    return (w.view(np.uint16)[rows].astype(np.uint32) << 16).view(np.float32)  # BF16


def _check(w: np.ndarray, qtype: GGMLType) -> None:
    if qtype.id not in QUANT_IDS and qtype.id not in (F32, F16, BF16):
        raise ValueError(f"no CPU kernel for ggml type {qtype.name}")
    if w.dtype != np.uint8 or w.ndim != 2 or w.shape[1] % qtype.block_bytes:
        raise ValueError(f"{qtype.name} weight must be uint8 [n_rows, k * {qtype.block_bytes}], got "
                         f"{w.dtype} {w.shape}")
    if not w.flags.c_contiguous:
        raise ValueError("weight bytes must be C-contiguous")


def n_cols_of(w: np.ndarray, qtype: GGMLType) -> int:
    return w.shape[1] // qtype.block_bytes * qtype.block_elems


def dequantize_rows(w: np.ndarray, qtype: GGMLType, rows: np.ndarray) -> np.ndarray:
    """Rows of the dequantized weight (an embedding lookup): float32 [len(rows), n_cols].

    w: uint8 [n_rows, row_bytes]; rows: int [n]."""
    _check(w, qtype)
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    if rows.size and (rows.min() < 0 or rows.max() >= w.shape[0]):
        raise IndexError(f"row index out of range [0, {w.shape[0]})")
    if qtype.id not in QUANT_IDS:
        return np.ascontiguousarray(_float_rows(w, qtype.id, rows))
    out = np.empty((rows.size, n_cols_of(w, qtype)), np.float32)
    _dequantize_rows(qtype.id, w, rows, out)
    return out


def quantized_matmul(w: np.ndarray, qtype: GGMLType, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """y = x @ W.T for W [n_rows, n_cols] given as its quantized bytes w: uint8 [n_rows, row_bytes].

    x: float32 [n_tokens, n_cols] -> float32 [n_tokens, n_rows] (written into out when given)."""
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
    if qtype.id == F32:
        np.matmul(x, w.view(np.float32).T, out=out)
        return out
    if n_tokens <= MATVEC_MAX_TOKENS and qtype.id in QUANT_IDS:
        _matvec(qtype.id, w, x, out, min(n_rows, 16 * nb.get_num_threads()))
        return out
    tile_rows = max(1, TILE_BYTES // (4 * n_cols))
    tile = np.empty((min(tile_rows, n_rows), n_cols), np.float32)
    for r0 in range(0, n_rows, tile_rows):
        r1 = min(r0 + tile_rows, n_rows)
        rows = np.arange(r0, r1)
        if qtype.id in QUANT_IDS:
            _dequantize_rows(qtype.id, w, rows, tile[:r1 - r0])
            part = tile[:r1 - r0]
        else:
            part = _float_rows(w, qtype.id, rows)
        out[:, r0:r1] = x @ part.T
    return out
