"""MXFP4 matmuls on the CPU (numba): the weight stays in its blocks, x goes in int8 blocks of 32, as llama.cpp's.

llama.cpp's CPU multiplies an MXFP4 row by x quantized to q8_0 (ggml_vec_dot_mxfp4_q8_0: per block of 32, the
integer dot of the doubled e2m1 codes with x's int8 values, times e8m0_half(e) times x's fp16 scale). We do the
same, x's scale rounded to fp16 as a q8_0 block stores it, so our experts see the activations llama.cpp's see:
with random weights its 8-bit rounding of x is noise a test file amplifies, and a different rounding here would
add ours to it. The result is x8 @ dequantize(W).T to float32 rounding, x8 the int8 x times its fp16 scales.

One kernel for any number of tokens: each row's codes are decoded once to int8 and dotted with every token's x.
"""
import numba as nb
import numpy as np

from kernels.cpu.dequant import e8m0_half, mxfp4_value

# numba's cache keys these kernels on this file alone: kernels/cpu/cache.py says how edits to the modules they
# inline reach them (INLINED, INLINED_DIGEST, checked by tests/kernels/test_cpu_cache.py)
INLINED = ("dequant",)
INLINED_DIGEST = "13993cb7c7dfef98"

BLOCK_BYTES = 17  # e | qs[16]


@nb.njit(cache=True, nogil=True, parallel=True)
def matmul_mxfp4(w, xq, xd, out, n_chunks):
    """out[t, r] = sum over blocks b of e8m0_half(e) * xd[t, b] * (codes . xq[t, 32 b:32 b + 32]) for the MXFP4 rows
    r of w: uint8 [n_rows, row_bytes]; xq: int8 [n_tokens, n_cols], xd: float32 [n_tokens, n_cols // 32] (x's
    blocks); out: float32 [n_tokens, n_rows]. The rows go in n_chunks parallel chunks."""
    n_rows = w.shape[0]
    n_tokens, n_cols = xq.shape
    n_blocks = n_cols // 32
    for c in nb.prange(n_chunks):
        codes = np.empty(n_cols, np.int32)  # one row's doubled e2m1 values
        scales = np.empty(n_blocks, np.float32)
        for r in range(c * n_rows // n_chunks, (c + 1) * n_rows // n_chunks):
            row = w[r]
            for b in range(n_blocks):
                o = BLOCK_BYTES * b
                scales[b] = e8m0_half(row[o])
                for l in range(16):
                    q = np.int64(row[o + 1 + l])
                    codes[32 * b + l] = mxfp4_value(q & 0xF)
                    codes[32 * b + 16 + l] = mxfp4_value(q >> 4)
            for t in range(n_tokens):
                acc = np.float32(0.0)
                for b in range(n_blocks):
                    s = np.int32(0)
                    for l in range(32 * b, 32 * b + 32):
                        s += codes[l] * np.int32(xq[t, l])
                    acc += scales[b] * xd[t, b] * np.float32(s)
                out[t, r] = acc
