"""The parallel int8 GEMM of a prompt's tokens (more than a few) by a quantized matrix (numba): x
quantized once to biased bytes, then tiles of rows claimed by all cores in turn, each packed once and run against all
tokens by the micro-kernel of gemm_int8."""
from kernels.cpu.threads import configure_thread_waits

configure_thread_waits()  # before numba's first parallel region loads libgomp (numpy may be loaded already)

import numba as nb  # noqa: E402
import numpy as np  # noqa: E402

from kernels.cpu.dot_x8 import pack_x8_q4_0, pack_x8_q4_1, pack_x8_q5_0, pack_x8_q5_1  # noqa: E402
from kernels.cpu.gemm_int8 import (GRID_IDS, HALVES_IDS, ROWS, SIGNED_X_IDS, TOKENS, amax32,  # noqa: E402
                                   pack_iq1_m, pack_iq1_s, pack_iq2_s, pack_iq2_xs, pack_iq2_xxs, pack_iq3_s,
                                   pack_iq3_xxs, pack_iq4_nl, pack_iq4_xs, pack_mxfp4, pack_q4_0, pack_q4_1,
                                   pack_q4_k, pack_q5_0, pack_q5_1, pack_q6_k, pack_q8_0, quantize32, tile_grid,
                                   tile_grid_halves, tile_halves, tile_no_min, tile_q8_0, tile_with_min)
from kernels.cpu.claim import claim, counters  # noqa: E402
from kernels.cpu.types import (IQ1_M, IQ1_S, IQ2_S, IQ2_XS, IQ2_XXS, IQ3_S, IQ3_XXS, IQ4_NL, IQ4_XS, MXFP4,  # noqa: E402
                               Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q6_K, Q8_0, X8, fast)

# numba's cache keys these kernels on this file alone: kernels/cpu/cache.py says how edits to the modules they
# inline reach them (INLINED, INLINED_DIGEST, checked by tests/kernels/test_cpu_cache.py)
INLINED = ("types", "claim", "gemm_int8", "dot_x8")
INLINED_DIGEST = "bebffc19735f72a0"


def padded_tokens(n_tokens: int) -> int:
    """The rows of xu, xd, xds for n_tokens: whole register tiles of TOKENS."""
    return -(-n_tokens // TOKENS) * TOKENS


@nb.njit(cache=True, nogil=True, parallel=True, fastmath=True)
def quantize_biased(x, xu, xd, xds, block, bias):
    """x: float32 [n_tokens, n_cols] -> xu: uint8 [n_padded, n_cols] = xq + bias (128, or 0 where the SIGNED_X_IDS
    tile takes xq's bytes: gemm_int8.x_bias), xq int8 to the nearest of x / xd,
    xd: float32 [n_padded, n_cols // 32] = amax / 127 of each block (32, as quantize_q8; or 256: one amax
    for 8 groups of 32, llama.cpp's q8_K, which IQ4_XS's dots take there), xds: xd * the sum of xq over each 32.
    Rows from n_tokens on are zeros (xq 0)."""
    n_tokens = x.shape[0]
    per = block // 32  # groups of 32 under one scale
    for t in nb.prange(xu.shape[0]):
        for b0 in range(0, xd.shape[1], per):
            amax = np.float32(0)
            if t < n_tokens:
                for b in range(b0, b0 + per):
                    amax = max(amax, amax32(x, t, 32 * b))
            inv = np.float32(127) / amax if amax > 0 else np.float32(0)
            for b in range(b0, b0 + per):
                if t < n_tokens:
                    s = quantize32(x, t, 32 * b, inv, bias, xu)
                else:
                    s = 0
                    for l in range(32 * b, 32 * b + 32):
                        xu[t, l] = np.uint8(bias)
                xd[t, b] = amax / np.float32(127)
                xds[t, b] = xd[t, b] * np.float32(s)


@nb.njit(cache=True, nogil=True, parallel=True, fastmath=True)
def gemm_int8(tid, w, xu, xd, xds, out, f16, n_workers):
    """out[t, r] = x8[t] . row r of W for W of an INT8_IDS type tid, w: uint8 [n_rows, row_bytes] (or tid X8 +
    a type and w repacked, repack: uint8 [n_groups, 8 * row_bytes]), x8 given by quantize_biased (xu, xd, xds; its
    bias gemm_int8.x_bias(tid)),
    out: float32 [n_tokens, n_rows]. Tiles of ROWS rows are claimed by the n_workers threads one at a time (as the
    matvecs' chunks: prange's equal shares wait for the slowest thread); each is packed into its thread's scratch
    (~11 bytes a column at 8 rows, ~22 at 16: a 48 KiB L1 holds rows of ~2000 values at 16, L2 longer ones), then
    multiplied with every TOKENS tokens."""
    n_rows, n_groups = out.shape[1], xd.shape[1]
    halves = 2 if tid in HALVES_IDS else 1  # scales a group of 32
    n_tiles = (n_rows + ROWS - 1) // ROWS
    counter = counters(1)
    for worker in nb.prange(n_workers):
        packed = np.empty(n_groups * ROWS * 32, np.uint8)
        corrs = np.empty(n_groups * halves * ROWS, np.int32)
        scales, mins = np.empty(n_groups * halves * ROWS, np.float32), np.empty(n_groups * ROWS, np.float32)
        y = np.empty(TOKENS * ROWS, np.float32)
        tile = claim(counter)
        while tile < n_tiles:
            _gemm_tile(tid, w, tile, xu, xd, xds, out, f16, halves, packed, corrs, scales, mins, y)
            tile = claim(counter)


@fast
def _gemm_tile(tid, w, tile, xu, xd, xds, out, f16, halves, packed, corrs, scales, mins, y):
    """gemm_int8's rows tile * ROWS .. + ROWS - 1: packed into the scratch (packed, corrs, scales, mins), then
    multiplied with every TOKENS tokens through y."""
    n_tokens, n_rows = out.shape[0], out.shape[1]
    r0 = tile * ROWS
    if tid == Q4_0:
        pack_q4_0(w, r0, packed, corrs, scales, mins, f16)
    elif tid == Q4_1:
        pack_q4_1(w, r0, packed, corrs, scales, mins, f16)
    elif tid == Q5_0:
        pack_q5_0(w, r0, packed, corrs, scales, mins, f16)
    elif tid == Q5_1:
        pack_q5_1(w, r0, packed, corrs, scales, mins, f16)
    elif tid == Q8_0:
        pack_q8_0(w, r0, packed, corrs, scales, mins, f16)
    elif tid == Q4_K:
        pack_q4_k(w, r0, packed, corrs, scales, mins, f16)
    elif tid == Q6_K:
        pack_q6_k(w, r0, packed, corrs, scales, mins, f16)
    elif tid == MXFP4:
        pack_mxfp4(w, r0, packed, corrs, scales, mins, f16)
    elif tid == IQ4_NL:
        pack_iq4_nl(w, r0, packed, corrs, scales, mins, f16)
    elif tid == IQ4_XS:
        pack_iq4_xs(w, r0, packed, corrs, scales, mins, f16)
    elif tid == IQ2_XXS:
        pack_iq2_xxs(w, r0, packed, corrs, scales, mins, f16)
    elif tid == IQ3_XXS:
        pack_iq3_xxs(w, r0, packed, corrs, scales, mins, f16)
    elif tid == IQ3_S:
        pack_iq3_s(w, r0, packed, corrs, scales, mins, f16)
    elif tid == IQ2_XS:
        pack_iq2_xs(w, r0, packed, corrs, scales, mins, f16)
    elif tid == IQ2_S:
        pack_iq2_s(w, r0, packed, corrs, scales, mins, f16)
    elif tid == IQ1_S:
        pack_iq1_s(w, r0, packed, corrs, scales, mins, f16)
    elif tid == IQ1_M:
        pack_iq1_m(w, r0, packed, corrs, scales, mins, f16)
    elif tid == X8 + Q4_0:
        pack_x8_q4_0(w, tile, packed, corrs, scales, mins)
    elif tid == X8 + Q4_1:
        pack_x8_q4_1(w, tile, packed, corrs, scales, mins)
    elif tid == X8 + Q5_0:
        pack_x8_q5_0(w, tile, packed, corrs, scales, mins)
    else:
        pack_x8_q5_1(w, tile, packed, corrs, scales, mins)
    with_min = tid == Q4_1 or tid == Q5_1 or tid == Q4_K or tid == X8 + Q4_1 or tid == X8 + Q5_1
    for t0 in range(0, xu.shape[0], TOKENS):
        if tid in GRID_IDS and halves == 2:  # up to 43, a scale a 16
            tile_grid_halves(packed, corrs, scales, mins, xu, xd, xds, t0, y)
        elif halves == 2:
            tile_halves(packed, corrs, scales, mins, xu, xd, xds, t0, y)
        elif with_min:
            tile_with_min(packed, corrs, scales, mins, xu, xd, xds, t0, y)
        elif tid in SIGNED_X_IDS:  # values up to 128 in size
            tile_q8_0(packed, corrs, scales, mins, xu, xd, xds, t0, y)
        elif tid in GRID_IDS:  # up to 62
            tile_grid(packed, corrs, scales, mins, xu, xd, xds, t0, y)
        else:
            tile_no_min(packed, corrs, scales, mins, xu, xd, xds, t0, y)
        for j in range(min(TOKENS, n_tokens - t0)):
            for i in range(min(ROWS, n_rows - r0)):
                out[t0 + j, r0 + i] = y[j * ROWS + i]
