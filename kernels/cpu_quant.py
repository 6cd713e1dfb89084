"""CPU matmul and row lookup straight from quantized ggml blocks (numba).

A weight W [n_rows, n_cols] arrives as its raw bytes w: uint8 [n_rows, row_bytes] (a ggml tensor of
shape (n_cols, n_rows)). Nothing here dequantizes a whole matrix:
- few tokens (generation): a matrix-vector kernel reads each row's blocks once and dots them with every
  token's x, rows spread over all cores (prange). The hot types use fused dots (cpu_dot), the others
  decode the row to float32 first (cpu_decode).
- many tokens (prompt): tiles of rows are dequantized to float32 and multiplied with numpy BLAS.
Activations stay float32 (no int8 quantization), so results match x @ dequantize(W).T to float32 rounding.
"""
import numba as nb
import numpy as np

from kernels import cpu_decode as dec
from kernels import cpu_dot as dot
from models.ggml_types import GGMLType

# ggml type ids, the dispatch key inside the kernels
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 30
DECODED_IDS = (F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)
FUSED_IDS = (Q4_1, Q5_0, Q8_0, Q4_K, Q6_K)  # types with a fused dot in cpu_dot

MATVEC_MAX_TOKENS = 4  # up to this many tokens the matvec kernel beats dequantize + BLAS
TILE_BYTES = 1 << 23  # float32 bytes of one dequantized tile of rows in the prompt path (few, big BLAS calls)
N16 = 16  # passed at run time, see cpu_decode


@dec.jit
def _decode_row(tid, row, y, f16, n16):
    """Dequantize row: uint8 [row_bytes] into y: float32 [n_cols]."""
    if tid == F16:
        dec.decode_f16(row, y, f16, n16)
    elif tid == BF16:
        dec.decode_bf16(row, y, f16, n16)
    elif tid == Q4_0:
        dec.decode_q4_0(row, y, f16, n16)
    elif tid == Q4_1:
        dec.decode_q4_1(row, y, f16, n16)
    elif tid == Q5_0:
        dec.decode_q5_0(row, y, f16, n16)
    elif tid == Q5_1:
        dec.decode_q5_1(row, y, f16, n16)
    elif tid == Q8_0:
        dec.decode_q8_0(row, y, f16, n16)
    elif tid == Q2_K:
        dec.decode_q2_k(row, y, f16, n16)
    elif tid == Q3_K:
        dec.decode_q3_k(row, y, f16, n16)
    elif tid == Q4_K:
        dec.decode_q4_k(row, y, f16, n16)
    elif tid == Q5_K:
        dec.decode_q5_k(row, y, f16, n16)
    elif tid == Q6_K:
        dec.decode_q6_k(row, y, f16, n16)


@dot.fast
def _dot_row(tid, row, x, xsum, f16, n16):
    """x . row for the FUSED_IDS types. row: uint8 [row_bytes], x: float32 [n_cols]."""
    if tid == Q4_1:
        return dot.dot_q4_1(row, x, xsum, f16, n16)
    if tid == Q5_0:
        return dot.dot_q5_0(row, x, xsum, f16, n16)
    if tid == Q8_0:
        return dot.dot_q8_0(row, x, xsum, f16, n16)
    if tid == Q4_K:
        return dot.dot_q4_k(row, x, xsum, f16, n16)
    return dot.dot_q6_k(row, x, xsum, f16, n16)


@dec.jit
def _dequantize_rows(tid, w, rows, out, f16, n16):
    """out[i] = dequantized row rows[i] of w. w: uint8 [n_rows, row_bytes], out: float32 [len(rows), n_cols].

    One thread: it runs between BLAS calls, whose worker thread spins on the other core for a while after
    each call; numba's threads competing with it made the prompt path several times slower."""
    for i in range(rows.size):
        _decode_row(tid, w[rows[i]], out[i], f16, n16)


@nb.njit(cache=True, nogil=True, parallel=True, fastmath=True)
def _matvec(tid, fused, w, x, xsum, out, f16, n16, n_chunks):
    """out[t, r] = x[t] . row r of W, the rows in n_chunks parallel chunks.

    w: uint8 [n_rows, row_bytes], x: float32 [n_tokens, n_cols], xsum: float32 [n_tokens, n_cols // 32]
    (sums of x over runs of 32), out: float32 [n_tokens, n_rows]."""
    n_rows = w.shape[0]
    n_tokens, n_cols = x.shape
    for c in nb.prange(n_chunks):
        y = np.empty(n_cols, np.float32)  # one dequantized row, for the types without a fused dot
        for r in range(c * n_rows // n_chunks, (c + 1) * n_rows // n_chunks):
            if fused:
                for t in range(n_tokens):
                    out[t, r] = _dot_row(tid, w[r], x[t], xsum[t], f16, n16)
            else:
                _decode_row(tid, w[r], y, f16, n16)
                for t in range(n_tokens):
                    acc = np.float32(0)
                    for k in range(n_cols):
                        acc += y[k] * x[t, k]
                    out[t, r] = acc


def _check(w: np.ndarray, qtype: GGMLType) -> None:
    if qtype.id not in DECODED_IDS and qtype.id != F32:
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
    if qtype.id == F32:
        return w.view(np.float32)[rows]
    out = np.empty((rows.size, n_cols_of(w, qtype)), np.float32)
    _dequantize_rows(qtype.id, w, rows, out, dec.F16_TO_F32, N16)
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
    elif n_tokens <= MATVEC_MAX_TOKENS:
        xsum = x.reshape(n_tokens, -1, 32).sum(axis=2) if n_cols % 32 == 0 else np.zeros((n_tokens, 0), np.float32)
        n_chunks = min(n_rows, 16 * nb.get_num_threads())
        _matvec(qtype.id, qtype.id in FUSED_IDS, w, x, xsum, out, dec.F16_TO_F32, N16, n_chunks)
    else:
        tile_rows = max(1, TILE_BYTES // (4 * n_cols))
        tile = np.empty((min(tile_rows, n_rows), n_cols), np.float32)  # dequantized rows r0:r1
        for r0 in range(0, n_rows, tile_rows):
            r1 = min(r0 + tile_rows, n_rows)
            _dequantize_rows(qtype.id, w, np.arange(r0, r1), tile[:r1 - r0], dec.F16_TO_F32, N16)
            np.matmul(x, tile[:r1 - r0].T, out=out[:, r0:r1])
    return out
