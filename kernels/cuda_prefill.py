"""Batched matmul for prompt processing: y[n_tokens, n_rows] = x[n_tokens, n_cols] @ W.T, W quantized.

Tiles of W's rows are dequantized to fp16 (kernels/dequant.cu, from the repacked layout of cuda_layout.py)
into a Scratch buffer the caller allocates once, and each tile is multiplied by cuBLAS with fp16 inputs
and float32 accumulation and output (cublasGemmEx, CUBLAS_COMPUTE_32F), written straight into its columns
of y. No dequantized copy of the model exists: the scratch holds one tile. F16 weights need no tile: cuBLAS
reads them in place.

Activations are fp16: convert x once (x16[...] = x) and reuse it for every weight that reads it (q, k, v;
gate, up). cuBLAS cannot be captured in a CUDA graph from CuPy, so this runs eagerly (prefill does).
"""
from dataclasses import dataclass

import cupy as cp
import numpy as np

from kernels.cuda_module import kernel
from kernels.cuda_quant import DeviceWeight

THREADS = 256  # a block of dequant_*; each thread makes 32 weights
_ONE, _ZERO = np.ones(1, dtype=np.float32), np.zeros(1, dtype=np.float32)  # gemm alpha, beta (host pointers)


@dataclass(frozen=True)
class Scratch:
    """fp16 room for one tile of dequantized weight rows. Allocate once (e.g. the elements of the largest
    weight, so that each matmul is one tile) and pass it to every matmul on its stream."""

    w16: cp.ndarray  # float16 [max_elems]

    @classmethod
    def empty(cls, max_elems: int) -> "Scratch":
        return cls(cp.empty(max_elems, dtype=cp.float16))


def tile_rows(w: DeviceWeight, scratch: Scratch) -> int:
    """Rows of w dequantized at a time."""
    rows = min(w.n_rows, scratch.w16.size // w.n_cols)
    if rows == 0:
        raise ValueError(f"scratch of {scratch.w16.size} elements cannot hold a row of {w.n_cols}")
    return rows


def dequantize_rows(w: DeviceWeight, row0: int, n: int, out: cp.ndarray) -> None:
    """out float16 [n * w.n_cols] = rows row0 .. row0 + n of W (not for F16: its rows are fp16 already)."""
    block_elems = 32 if w.qtype.name in ("F32", "BF16") else w.qtype.block_elems  # kernel's block of floats
    n_chunks = n * w.n_cols // 32
    args = (w.data, out, np.int32(w.n_rows), np.int32(w.n_cols // block_elems), np.int32(row0), np.int32(n))
    kernel("dequant.cu", "dequant_" + w.qtype.name.lower())(((n_chunks + THREADS - 1) // THREADS,), (THREADS,), args)


def _gemm(a16_ptr: int, m: int, x16: cp.ndarray, out: cp.ndarray, col0: int) -> None:
    """out[:, col0 : col0 + m] = x16 @ A.T, A fp16 [m, n_cols] row-major at a16_ptr.

    cuBLAS is column-major: row-major A [m, k] is column-major A.T, so out.T[col0:col0+m, :] (column-major,
    leading dimension out.shape[1]) = op_T(A.T) @ x16.T."""
    cublas = cp.cuda.cublas
    n_tokens, k = x16.shape
    handle = cp.cuda.device.get_cublas_handle()
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    cublas.gemmEx(handle, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, m, n_tokens, k,
                  _ONE.ctypes.data, a16_ptr, cp.cuda.runtime.CUDA_R_16F, k,
                  x16.data.ptr, cp.cuda.runtime.CUDA_R_16F, k,
                  _ZERO.ctypes.data, out.data.ptr + 4 * col0, cp.cuda.runtime.CUDA_R_32F, out.shape[1],
                  cublas.CUBLAS_COMPUTE_32F, cublas.CUBLAS_GEMM_DEFAULT)


def matmul(w: DeviceWeight, x16: cp.ndarray, out: cp.ndarray, scratch: Scratch,
           stream: cp.cuda.Stream | None = None) -> None:
    """out float32 [n_tokens, w.n_rows] = x16 float16 [n_tokens, w.n_cols] @ W.T."""
    n_tokens = x16.shape[0]
    if x16.dtype != cp.float16 or x16.shape != (n_tokens, w.n_cols) or not x16.flags.c_contiguous:
        raise ValueError(f"prefill matmul: x16 must be contiguous float16 [n_tokens, {w.n_cols}], "
                         f"got {x16.dtype} {x16.shape}")
    if out.dtype != cp.float32 or out.shape != (n_tokens, w.n_rows) or not out.flags.c_contiguous:
        raise ValueError(f"prefill matmul: out must be contiguous float32 ({n_tokens}, {w.n_rows}), "
                         f"got {out.dtype} {out.shape}")
    with stream or cp.cuda.get_current_stream():
        if w.qtype.name == "F16":
            _gemm(w.data.data.ptr, w.n_rows, x16, out, 0)
            return
        step = tile_rows(w, scratch)
        for row0 in range(0, w.n_rows, step):
            n = min(step, w.n_rows - row0)
            dequantize_rows(w, row0, n, scratch.w16)
            _gemm(scratch.w16.data.ptr, n, x16, out, row0)
