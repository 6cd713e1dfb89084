"""Batched matmuls for prompt processing: y[n_tokens, n_rows] = x[n_tokens, n_cols] @ W.T, W quantized.

Two paths, picked by matmul() from the token count:
- many tokens (matmul_f16): tiles of W's rows are dequantized to fp16 (kernels/cuda/dequant.cu, from the
  repacked layout of cuda_layout.py) into a Scratch buffer the caller allocates once, and each tile is
  multiplied by cuBLAS with fp16 inputs and float32 accumulation and output (cublasGemmEx,
  CUBLAS_COMPUTE_32F), written straight into its columns of y. No dequantized copy of the model exists:
  the scratch holds one tile. F16 weights need no tile: cuBLAS reads them in place.
- a few tokens (matmul_q8, quantized W only): x quantized to q8_1 and dp4a dot products as in the decode
  matvec, 8 tokens per pass over W (kernels/cuda/matmul_q8.cu): dequantizing W to fp16 would move ~4x the
  bytes of W for little arithmetic.

cuBLAS cannot be captured in a CUDA graph from CuPy, so this runs eagerly (prefill does).
"""
from dataclasses import dataclass

import cupy as cp
import numpy as np

from kernels.cuda.module import kernel
from kernels.cuda.quant import DeviceWeight, Q8Vector, quantize_q8_1

DEQUANT_THREADS = 256  # a block of dequant_* (THREADS in dequant.cu); each thread makes 32 weights
NT = 8  # tokens per pass of matmul_q8 (matmul_q8.cu)
SMALL_BATCH = 8  # matmul() takes the q8 path up to this many tokens: one pass (bench_prefill.py, H100)
CUDA_R_16F, CUDA_R_32F = 2, 0  # cudaDataType_t values (library_types.h), for cublasGemmEx
_ONE, _ZERO = np.ones(1, dtype=np.float32), np.zeros(1, dtype=np.float32)  # gemm alpha, beta (host pointers)


@dataclass(frozen=True)
class Scratch:
    """Workspace of the prefill matmuls; allocate once and pass it to every matmul on its stream."""

    w16: cp.ndarray  # float16 [max_weight_elems]: one tile of dequantized weight rows
    x16: cp.ndarray  # float16 [max_tokens * max_cols]: x for cuBLAS
    xq: Q8Vector  # q8_1 of [round_up(max_tokens, NT), max_cols]: x for matmul_q8, rows padded to NT

    @classmethod
    def empty(cls, max_tokens: int, max_cols: int, max_weight_elems: int) -> "Scratch":
        """max_weight_elems: e.g. the elements of the largest weight, so that each matmul is one tile."""
        n_q8 = -(-max_tokens // NT) * NT * max_cols
        # zeros: the pad rows, read but never stored, stay finite
        xq = Q8Vector(cp.zeros(n_q8, dtype=cp.int8), cp.zeros((n_q8 // 32, 2), dtype=cp.float32))
        return cls(cp.empty(max_weight_elems, dtype=cp.float16), cp.empty(max_tokens * max_cols, dtype=cp.float16),
                   xq)


def takes_f16(w: DeviceWeight, n_tokens: int) -> bool:
    """Whether matmul() multiplies n_tokens tokens by w on the fp16 path (matmul_f16), else by q8_1 dot products."""
    return not (w.takes_q8 and n_tokens <= SMALL_BATCH)


def matmul(w: DeviceWeight, x: cp.ndarray, out: cp.ndarray, scratch: Scratch,
           stream: cp.cuda.Stream | None = None) -> None:
    """out float32 [n_tokens, w.n_rows] = x float32 [n_tokens, w.n_cols] @ W.T."""
    n_tokens = x.shape[0]
    if x.dtype != cp.float32 or x.shape != (n_tokens, w.n_cols) or not x.flags.c_contiguous:
        raise ValueError(f"prefill matmul: x must be contiguous float32 [n_tokens, {w.n_cols}], "
                         f"got {x.dtype} {x.shape}")
    n = n_tokens * w.n_cols
    with stream or cp.cuda.get_current_stream():
        if not takes_f16(w, n_tokens):
            if scratch.xq.qs.size < -(-n_tokens // NT) * NT * w.n_cols:
                raise ValueError(f"scratch holds q8_1 activations of {scratch.xq.qs.size} values, "
                                 f"{n_tokens} tokens of {w.n_cols} need more")
            xq = Q8Vector(scratch.xq.qs[:n], scratch.xq.ds[: n // 32])
            quantize_q8_1(x.reshape(-1), xq)
            matmul_q8(w, scratch.xq, n_tokens, out)
        else:
            if scratch.x16.size < n:
                raise ValueError(f"scratch holds {scratch.x16.size} fp16 activations, {n_tokens} tokens of "
                                 f"{w.n_cols} need {n}")
            x16 = scratch.x16[:n].reshape(n_tokens, w.n_cols)
            x16[...] = x
            matmul_f16(w, x16, out, scratch)


def matmul_q8(w: DeviceWeight, xq: Q8Vector, n_tokens: int, out: cp.ndarray) -> None:
    """out float32 [n_tokens, w.n_rows] = x @ W.T, x the first n_tokens rows of xq ([>= round_up(n_tokens,
    NT), w.n_cols] q8_1; the rows past n_tokens up to a multiple of NT are read but not used). Current stream."""
    _check_out(out, n_tokens, w.n_rows)
    if not w.takes_q8:
        raise ValueError(f"matmul_q8: {w.qtype.name} weights take the fp16 path")
    if xq.qs.size < -(-n_tokens // NT) * NT * w.n_cols:
        raise ValueError(f"matmul_q8: xq must hold {n_tokens} tokens of {w.n_cols} padded to a multiple of {NT}")
    grid = ((w.n_rows + 3) // 4, -(-n_tokens // NT))
    args = (w.data, xq.qs, xq.ds, out, np.int32(w.n_rows), np.int32(w.n_cols // w.qtype.block_elems),
            np.int32(n_tokens))
    kernel("matmul_q8.cu", "matmul_q8_" + w.qtype.name.lower())(grid, (128,), args)


def matmul_f16(w: DeviceWeight, x16: cp.ndarray, out: cp.ndarray | list, scratch: Scratch) -> None:
    """out float32 [n_tokens, w.n_rows] = x16 float16 [n_tokens, w.n_cols] @ W.T, by tiles of scratch.w16, on
    the current stream. Share one x16 among the weights that read the same activation (q, k, v; gate, up).
    out may be a list of outputs [n_tokens, rows] that take W's rows in turn: the members of a fused weight,
    each written whole for the op that reads it (no copy of its columns out of one output)."""
    n_tokens = x16.shape[0]
    if x16.dtype != cp.float16 or x16.shape != (n_tokens, w.n_cols) or not x16.flags.c_contiguous:
        raise ValueError(f"matmul_f16: x16 must be contiguous float16 [n_tokens, {w.n_cols}], "
                         f"got {x16.dtype} {x16.shape}")
    outs = out if isinstance(out, list) else [out]
    widths = [o.shape[1] if isinstance(o, cp.ndarray) and o.ndim == 2 else -1 for o in outs] if \
        isinstance(out, list) else [w.n_rows]
    for o, rows in zip(outs, widths):
        _check_out(o, n_tokens, rows)
    if sum(widths) != w.n_rows:
        raise ValueError(f"matmul_f16: out must take the {w.n_rows} rows of W, the outputs take {sum(widths)}")
    firsts = np.cumsum([0] + widths)  # W's row where each output starts
    if w.qtype.name == "F16":
        for o, first in zip(outs, firsts):
            _gemm(w.data.data.ptr + 2 * int(first) * w.n_cols, o.shape[1], x16, o, 0)
        return
    step = min(w.n_rows, scratch.w16.size // w.n_cols)
    if step == 0:
        raise ValueError(f"scratch of {scratch.w16.size} elements cannot hold a row of {w.n_cols}")
    if 64 < step < w.n_rows:
        step -= step % 64  # tiles' output columns start 256-byte aligned, as cuBLAS's fast kernels want
    for row0 in range(0, w.n_rows, step):
        n = min(step, w.n_rows - row0)
        dequantize_rows(w, row0, n, scratch.w16)
        for o, first in zip(outs, firsts):  # the rows of each output inside this tile
            a, b = max(int(first), row0), min(int(first) + o.shape[1], row0 + n)
            if a < b:
                _gemm(scratch.w16.data.ptr + 2 * (a - row0) * w.n_cols, b - a, x16, o, a - int(first))


def matmul_f32(a: cp.ndarray, x: cp.ndarray, out: cp.ndarray) -> None:
    """out float32 [n, m] = x float32 [n, k] @ a.T for a float32 [m, k] (cuBLAS sgemm, no TF32), on the current
    stream: what cp.matmul does, without its ~100 us of host time a call."""
    m, k = a.shape
    n = x.shape[0]
    for name, arr, shape in (("a", a, (m, k)), ("x", x, (n, k)), ("out", out, (n, m))):
        if arr.dtype != cp.float32 or arr.shape != shape or not arr.flags.c_contiguous:
            raise ValueError(f"matmul_f32: {name} must be contiguous float32 {shape}, got {arr.dtype} {arr.shape}")
    cublas = cp.cuda.cublas
    handle = cp.cuda.device.get_cublas_handle()
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    cublas.sgemm(handle, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, m, n, k, _ONE.ctypes.data, a.data.ptr, k,
                 x.data.ptr, k, _ZERO.ctypes.data, out.data.ptr, m)


def _check_out(out: cp.ndarray, n_tokens: int, n_rows: int) -> None:
    if out.dtype != cp.float32 or out.shape != (n_tokens, n_rows) or not out.flags.c_contiguous:
        raise ValueError(f"prefill matmul: out must be contiguous float32 ({n_tokens}, {n_rows}), "
                         f"got {out.dtype} {out.shape}")


def dequantize_rows(w: DeviceWeight, row0: int, n: int, out: cp.ndarray) -> None:
    """out float16 [n * w.n_cols] = rows row0 .. row0 + n of W (not for F16: its rows are fp16 already)."""
    block_elems = 32 if w.qtype.name in ("F32", "BF16") else w.qtype.block_elems  # dequant.cu's blocks
    n_chunks = n * w.n_cols // 32
    args = (w.data, out, np.int32(w.n_rows), np.int32(w.n_cols // block_elems), np.int32(row0), np.int32(n))
    grid = ((n_chunks + DEQUANT_THREADS - 1) // DEQUANT_THREADS,)
    kernel("dequant.cu", "dequant_" + w.qtype.name.lower())(grid, (DEQUANT_THREADS,), args)


def _gemm(a16_ptr: int, m: int, x16: cp.ndarray, out: cp.ndarray, col0: int) -> None:
    """out[:, col0 : col0 + m] = x16 @ A.T, A fp16 [m, n_cols] row-major at a16_ptr, on the current stream.

    cuBLAS is column-major: row-major A [m, k] is column-major A.T, so out.T[col0:col0+m, :] (column-major,
    leading dimension out.shape[1]) = op_T(A.T) @ x16.T."""
    cublas = cp.cuda.cublas
    n_tokens, k = x16.shape
    handle = cp.cuda.device.get_cublas_handle()
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    cublas.gemmEx(handle, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, m, n_tokens, k,
                  _ONE.ctypes.data, a16_ptr, CUDA_R_16F, k,
                  x16.data.ptr, CUDA_R_16F, k,
                  _ZERO.ctypes.data, out.data.ptr + 4 * col0, CUDA_R_32F, out.shape[1],
                  cublas.CUBLAS_COMPUTE_32F, cublas.CUBLAS_GEMM_DEFAULT)
