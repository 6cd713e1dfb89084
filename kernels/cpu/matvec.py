"""The parallel matrix-vector kernels of a few tokens (generation): chunks of rows claimed by all cores in turn
(claim), each row's blocks read once and dotted with every token's x (numba)."""
from kernels.cpu.threads import configure_thread_waits

configure_thread_waits()  # before numba's first parallel region loads libgomp (numpy may be loaded already)

import math  # noqa: E402

import numba as nb  # noqa: E402
import numpy as np  # noqa: E402
from numba.core import types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

from kernels.cpu.claim import claim, count_done, counters, publish, published  # noqa: E402
from kernels.cpu.dequant import decode_row  # noqa: E402
from kernels.cpu.dot_float import dot_fused  # noqa: E402
from kernels.cpu.dot_int8 import (dot8_b32, dot8_k256, dot8_k_tokens, dot8_q4_k, dot8_q8_0, q4_k_order,  # noqa: E402
                                  quantize_q8)
from kernels.cpu.dot_x8 import dot8_x8  # noqa: E402
from kernels.cpu.ir import prefetch  # noqa: E402
from kernels.cpu.ops import _glu_act, _glu_one  # noqa: E402
from kernels.cpu.types import IQ4_XS, K256_IDS, Q4_K, Q6_K, Q8_0, X8, fast  # noqa: E402

# numba's cache keys these kernels on this file alone: kernels/cpu/cache.py says how edits to the modules they
# inline reach them (INLINED, INLINED_DIGEST, checked by tests/kernels/test_cpu_cache.py)
INLINED = ("types", "claim", "dequant", "dot_float", "dot_int8", "dot_x8", "ir", "ops")
INLINED_DIGEST = "0daab2d6e1d2d4a2"

# A matvec's rows go in chunks that the threads claim one at a time (claim) until none are left: numba's prange
# hands each thread an equal share up front, and on the 16-core host one slow thread then held up the region
# (Q6_K 14336 x 4096 in L3 read 141 -> 204-211 GB/s once claimed; BENCHMARKS.md, session 15).
# n_workers, the kernels' prange over workers (one iteration a thread, each claiming chunks), is an argument: a
# global would be frozen into numba's cached kernel, and one compiled with fewer threads would leave cores idle.
N_WORKERS = nb.config.NUMBA_NUM_THREADS
MATVEC_CHUNKS = 16 * N_WORKERS  # chunks of a matvec: 16 a thread (64 and 256 on 16 threads: 256 faster)
# rows that each of a few tokens passes over in turn (see matvecs_int8): they stay in L2 while each token passes over
# them. 16 (in L1) made a pass's row pairs neighbours and restarted the prefetch streams every 16 rows: on the 2-core
# VM a 248320 x 1024 Q6_K head for 2 tokens took 8.9 ms against 6.5 for two 1-token passes; 256: 5.4 (BENCHMARKS.md,
# session 34, CPU)
TOKEN_PASS_ROWS = 256


@intrinsic
def prefetch_at(typingctx, a, i):
    """A hint to fetch the cache line of a[i] (a 1-d array; i may lie past its end): cpu_bench's DRAM read, which
    prefetches as the row dots do."""
    def codegen(context, builder, sig, args):
        prefetch(context, builder, sig.args[0], args[0], args[1])
        return context.get_dummy_value()
    return types.none(a, i), codegen


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
def matvec_fused(tid, w, x, out, f16, n16, n_chunks):
    """out[t, r] = x[t] . row r of W for the FUSED_IDS type tid, the rows in n_chunks parallel chunks.

    w: uint8 [n_rows, row_bytes], x: float32 [n_tokens, n_cols], out: float32 [n_tokens, n_rows]."""
    n_rows = w.shape[0]
    n_tokens = x.shape[0]
    xsum = _block_sums(x)
    for c in nb.prange(n_chunks):
        for r in range(c * n_rows // n_chunks, (c + 1) * n_rows // n_chunks):
            for t in range(n_tokens):
                out[t, r] = dot_fused(tid, w[r], x[t], xsum[t], f16, n16)


@fast
def _x_arrays(n_tokens, n_cols, tids):
    """Room for n_tokens rows of n_cols values quantized as the int8 dots of the types tids (INT8_IDS, X8_IDS) read
    them, once per block size in use: (xq, xd, xs16) in blocks of 256 (K256_IDS), xq4 (xq in q4_k_order,
    Q4_K), (xq8, xd8, xs8) in blocks of 32 (the rest); those no type reads are empty."""
    k_quant = q4_k = b32 = False
    for tid in tids:
        q4_k |= tid == Q4_K
        in_256 = tid in K256_IDS
        k_quant |= in_256
        b32 |= not in_256
    nk, n8 = n_cols if k_quant else 0, n_cols if b32 else 0
    xq, xd, xs16 = np.empty((n_tokens, nk), np.int8), np.empty((n_tokens, nk // 256), np.float32), np.empty(
        (n_tokens, nk // 16), np.int16)
    xq8, xd8, xs8 = np.empty((n_tokens, n8), np.int8), np.empty((n_tokens, n8 // 32), np.float32), np.empty(
        (n_tokens, n8 // 16), np.int16)
    xq4 = np.empty((n_tokens, nk if q4_k else 0), np.int8)
    return xq, xd, xs16, xq4, xq8, xd8, xs8


@fast
def _quantize_rows(x, xs, t0, t1):
    """Rows t0..t1 - 1 of x [n_tokens, n_cols] quantized into xs, _x_arrays' arrays of x's shape."""
    xq, xd, xs16, xq4, xq8, xd8, xs8 = xs
    if xq.shape[1]:
        quantize_q8(x[t0:t1], xq[t0:t1], xd[t0:t1], xs16[t0:t1])
    if xq4.shape[1]:
        q4_k_order(xq[t0:t1], xq4[t0:t1])
    if xq8.shape[1]:
        quantize_q8(x[t0:t1], xq8[t0:t1], xd8[t0:t1], xs8[t0:t1])


@fast
def _quantize_x(x, tids):
    """x [n_tokens, n_cols] quantized for the types tids: _x_arrays' arrays, filled."""
    xs = _x_arrays(x.shape[0], x.shape[1], tids)
    _quantize_rows(x, xs, 0, x.shape[0])
    return xs


@fast
def _chunk_starts(nbytes, n_rows, n_chunks):
    """first: int64 [n_mats + 1], matrix m (nbytes[m] bytes, n_rows[m] rows) has chunks first[m]..first[m + 1] - 1:
    about n_chunks in all, each matrix's number in proportion to its bytes, at least one, at most one a row (none
    for a matrix of no rows: quant.padded_matvecs_args' padding)."""
    n_mats = len(nbytes)
    total = 0
    for m in range(n_mats):
        total += nbytes[m]
    first = np.empty(n_mats + 1, np.int64)
    first[0] = 0
    for m in range(n_mats):
        share = (n_chunks * nbytes[m] + total // 2) // max(total, 1)
        first[m + 1] = first[m] + min(n_rows[m], max(1, share))
    return first


@fast
def _chunk(first, n_rows, c):
    """(m, r0, r1): chunk c of _chunk_starts' table is rows r0..r1 - 1 of matrix m."""
    m = 0
    while c >= first[m + 1]:
        m += 1
    k, j = first[m + 1] - first[m], c - first[m]
    return m, j * n_rows[m] // k, (j + 1) * n_rows[m] // k


@fast
def _dot_rows(tid, w, r0, r1, xs, t0, t1, out, o, f16):
    """out[o + t - t0, r] = x[t] . row r of w (type tid) for rows r0..r1 - 1, tokens t0..t1 - 1; xs: _quantize_x's
    arrays of x. A few tokens: TOKEN_PASS_ROWS rows at a time, which stay in L2 while each token passes over them."""
    xq, xd, xs16, xq4, xq8, xd8, xs8 = xs
    if 1 < t1 - t0 <= 4 and (tid == Q4_K or tid == Q6_K or tid == IQ4_XS):  # dot8_k_tokens: a block decoded once
        dot8_k_tokens(tid, w, r0, r1, xq4 if tid == Q4_K else xq, xd, xs16, out, o, t0, t1 - t0, f16)
        return
    step = r1 - r0 if t1 - t0 == 1 else TOKEN_PASS_ROWS
    for ra in range(r0, r1, step):
        rb = min(ra + step, r1)
        for t in range(t0, t1):
            y = out[o + t - t0]
            if tid == Q4_K:
                dot8_q4_k(w, ra, rb, xq4[t], xd[t], xs16[t], y, f16)
            elif tid in K256_IDS:
                dot8_k256(tid, w, ra, rb, xq[t], xd[t], xs16[t], y, f16)
            elif tid == Q8_0:
                dot8_q8_0(w, ra, rb, xq8[t], xd8[t], xs8[t], y, f16)
            elif tid > X8:
                dot8_x8(tid, w, ra, rb, xq8[t], xd8[t], xs8[t], y)
            else:
                dot8_b32(tid, w, ra, rb, xq8[t], xd8[t], xs8[t], y, f16)


@nb.njit(cache=True, nogil=True, parallel=True, fastmath=True)
def matvecs_int8(tids, ws, x, outs, f16, n_chunks, n_workers, own_row):
    """outs[m][t, r] = x[t] . row r of ws[m] for matrices of the INT8_IDS or X8_IDS types tids[m] sharing x, in ONE
    parallel region (an X8_IDS matrix is repacked, repack: its "rows" are groups of 8): x is quantized once
    per block size in use (_quantize_x), and about n_chunks chunks of rows, each matrix's number in proportion to
    its bytes (_chunk_starts), go to the threads.
    own_row: matrix m multiplies row m of x alone (outs[m] [1, n_rows_m]).

    One region instead of one per matrix, because each region wakes and joins every thread (7-8 us on the 16-core
    host); chunks of equal bytes, claimed as threads come free, keep the work even across matrices.
    tids: tuple of type ids, ws: tuple of uint8 [n_rows_m, row_bytes_m], x: float32 [n_tokens, n_cols],
    outs: tuple of float32 [n_tokens, n_rows_m]."""
    n_tokens = x.shape[0]
    n_mats = len(ws)
    xs = _quantize_x(x, tids)
    nbytes, n_rows = np.empty(n_mats, np.int64), np.empty(n_mats, np.int64)
    for m in range(n_mats):
        nbytes[m], n_rows[m] = ws[m].size, ws[m].shape[0]
    first = _chunk_starts(nbytes, n_rows, n_chunks)
    counter = counters(1)
    for worker in nb.prange(n_workers):
        c = claim(counter)
        while c < first[n_mats]:
            m, r0, r1 = _chunk(first, n_rows, c)
            t0, t1 = (m, m + 1) if own_row else (0, n_tokens)  # the rows of x this matrix multiplies
            _dot_rows(tids[m], ws[m], r0, r1, xs, t0, t1, outs[m], 0, f16)
            c = claim(counter)


@fast
def _check_ids(ids, n_expert):
    for s in range(len(ids)):
        if ids[s] < 0 or ids[s] >= n_expert:
            raise IndexError("expert id out of range")


@nb.njit(cache=True, nogil=True, parallel=True, fastmath=True)
def expert_matvecs_int8(tids, stacks, ids, x, out, f16, n_chunks, n_workers, own_row):
    """out[m, s] = expert ids[s]'s matrix of stacks[m] times x[0] (own_row: times x[s]) for one token's chosen
    experts, in ONE parallel region as matvecs_int8's (x quantized once, chunks of rows in proportion to bytes):
    gate and up as two stacks of one call, the downs (own_row: each slot its own activation row) as one.

    One call of few arguments instead of matvecs_int8's tuples of 2k views: numba types every array of a call's
    arguments, and the Python that builds k views and their outputs costs more than the kernel at small shapes.
    tids: tuple of the stacks' type ids (INT8_IDS), stacks: tuple of uint8 [n_expert, n_rows, row_bytes_m] (the
    file's stacks: n_rows alike), ids: int32 [k], x: float32 [1 or k, n_cols], out: float32 [n_stacks, k, n_rows]."""
    k = len(ids)
    n_pairs = len(stacks) * k
    _check_ids(ids, stacks[0].shape[0])
    xs = _quantize_x(x, tids)
    nbytes, n_rows = np.empty(n_pairs, np.int64), np.empty(n_pairs, np.int64)
    for p in range(n_pairs):  # pair p: stack p // k, slot p % k
        nbytes[p], n_rows[p] = stacks[p // k][0].size, stacks[p // k].shape[1]
    first = _chunk_starts(nbytes, n_rows, n_chunks)
    counter = counters(1)
    for worker in nb.prange(n_workers):
        c = claim(counter)
        while c < first[n_pairs]:
            p, r0, r1 = _chunk(first, n_rows, c)
            m, s = p // k, p % k
            t = s if own_row else 0
            _dot_rows(tids[m], stacks[m][ids[s]], r0, r1, xs, t, t + 1, out[m], s, f16)
            c = claim(counter)


@nb.njit(cache=True, nogil=True, parallel=True, fastmath=True)
def expert_ffn_int8(gate_up_tids, gate_up, step, down_tid, down, ids, weights, x, act, biases, table, out, f16,
                    n_chunks, n_workers):
    """out[0] = the sum over slots s of weights[s] * down(glu(gate x[0], up x[0])) of expert ids[s], one token's
    chosen experts in ONE parallel region: ops.glu of expert_matvecs_int8's gate and up, and expert_matvecs_int8
    (own_row) of the downs on that, bit for bit, summed in slot order. Each gate/up chunk multiplies the same rows of
    an expert's gate and up and applies the GLU to them, so the products stay in the core that made them.
    act: the GLU's code (ops.ACTIVATIONS); biases: (gate, up, down) float32 [n_expert, n_ff] x 2, [n_expert,
    n_embd], added to each expert's gate, up and down outputs (gpt-oss), or three [0, 0] (none).

    The chunks, claimed in this order, are (slot, rows) of gate and up with their GLU, then (slot, rows) of the downs,
    about n_chunks in all in proportion to bytes. The thread that finishes a slot's last gate/up chunk quantizes its
    activation row and publishes it; a down chunk of that slot waits for it. Every chunk waited on was claimed
    earlier by a running thread, so this cannot deadlock however few threads run. The thread that finishes a row
    range's last slot sums that range. One region instead of two (gate/up, then downs) saves a region's start and
    join and a call, and threads go on to downs while others finish gate and up: in cache on the 16-core host
    219-254 -> 184-194 us a token's 8 experts (BENCHMARKS.md, session 16).

    gate_up_tids, gate_up: the (gate, up) stacks' type ids (INT8_IDS) and uint8 [n_expert, n_ff, row_bytes_m];
    step: 1, or 2 where gate and up are one stack of both (gemma4's ffn_gate_up_exps) seen as [2 n_expert, n_ff,
    row_bytes] and given twice: expert e's gate is gate_up[0][step e], its up gate_up[1][step e + step - 1];
    down_tid, down: the same of uint8 [n_expert, n_embd, row_bytes]; ids: int32 [k], weights: float32 [k],
    x: float32 [1, n_embd], table: ops.GELU_TABLE, out: float32 [1, n_embd]."""
    k, n_ff, n_embd = len(ids), gate_up[0].shape[1], down.shape[1]
    gate_bias, up_bias, down_bias = biases
    with_bias = down_bias.shape[0] > 0
    _check_ids(ids, down.shape[0])
    xs = _quantize_x(x, gate_up_tids)
    nbytes, rows = np.empty(2 * k, np.int64), np.empty(2 * k, np.int64)
    for s in range(k):  # pair s: slot s's gate and up, pair k + s: its down (loops, not slices: see counters)
        nbytes[s], rows[s] = gate_up[0][0].size + gate_up[1][0].size, n_ff
        nbytes[k + s], rows[k + s] = down[0].size, n_embd
    first = _chunk_starts(nbytes, rows, n_chunks)
    n_ranges = first[k + 1] - first[k]  # the downs' row ranges, alike for every slot (equal bytes)
    gate, up, glu = np.empty((k, n_ff), np.float32), np.empty((k, n_ff), np.float32), np.empty((k, n_ff), np.float32)
    acts = _x_arrays(k, n_ff, (down_tid,))
    ys = np.empty((k, n_embd), np.float32)  # each slot's down dots
    act_chunks_done, act_ready, slots_done = counters(k), counters(k), counters(n_ranges)
    counter = counters(1)
    for worker in nb.prange(n_workers):
        c = claim(counter)
        while c < first[2 * k]:
            p, r0, r1 = _chunk(first, rows, c)
            if p < k:
                _dot_rows(gate_up_tids[0], gate_up[0][step * ids[p]], r0, r1, xs, 0, 1, gate, p, f16)
                _dot_rows(gate_up_tids[1], gate_up[1][step * ids[p] + step - 1], r0, r1, xs, 0, 1, up, p, f16)
                if with_bias:
                    for r in range(r0, r1):
                        gate[p, r] += gate_bias[ids[p], r]
                        up[p, r] += up_bias[ids[p], r]
                for r in range(r0, r1):
                    glu[p, r] = _glu_act(gate[p, r], up[p, r], act, table)
                if count_done(act_chunks_done, p) == first[p + 1] - first[p] - 1:
                    _quantize_rows(glu, acts, p, p + 1)
                    publish(act_ready, p)
            else:
                s = p - k
                while not published(act_ready, s):
                    pass
                _dot_rows(down_tid, down[ids[s]], r0, r1, acts, s, s + 1, ys, s, f16)
                if with_bias:
                    for r in range(r0, r1):
                        ys[s, r] += down_bias[ids[s], r]
                if count_done(slots_done, c - first[p]) == k - 1:
                    for r in range(r0, r1):
                        out[0, r] = weights[0] * ys[0, r]
                    for s in range(1, k):  # in slot order, rows innermost: the same sums whichever thread adds
                        for r in range(r0, r1):
                            out[0, r] += weights[s] * ys[s, r]
            c = claim(counter)


@nb.njit(cache=True, nogil=True, parallel=True, fastmath=True)
def matvec_decoded(tid, w, x, out, f16, n16, n_chunks):
    """As matvec_fused for the other types: each row is dequantized to float32, then dotted."""
    n_rows = w.shape[0]
    n_tokens, n_cols = x.shape
    for c in nb.prange(n_chunks):
        y = np.empty(n_cols, np.float32)  # one dequantized row
        for r in range(c * n_rows // n_chunks, (c + 1) * n_rows // n_chunks):
            decode_row(tid, w[r], y, f16, n16)
            for t in range(n_tokens):
                acc = np.float32(0)
                for k in range(n_cols):
                    acc += y[k] * x[t, k]
                out[t, r] = acc


@nb.njit(cache=True, nogil=True, parallel=True, fastmath=True)
def matvec_add_int8(tids, ws, x, resid, norm, eps, out, f16, n_chunks, n_workers):
    """out[0] = resid[0] + W x[0] for ONE token and ONE matrix (ws, tids: 1-tuples, as matvecs_int8 takes them):
    a decode step's attention output and down projections with their residual add in the same call. norm (its
    size > 0): out[0] = resid[0] + rms_norm(W x[0]) * norm (a sandwich norm), as ops.rms_norm computes it.

    x: float32 [1, n_cols], resid, out: float32 [1, n_rows], norm: float32 [n_rows] or [0]."""
    xs = _quantize_x(x, (tids[0], tids[0], tids[0], tids[0]))  # matvecs_int8's padded 4-tuple: one compile
    nbytes, n_rows = np.empty(1, np.int64), np.empty(1, np.int64)
    nbytes[0], n_rows[0] = ws[0].size, ws[0].shape[0]
    first = _chunk_starts(nbytes, n_rows, n_chunks)
    y = np.empty((1, out.shape[1]), np.float32)
    counter = counters(1)
    for worker in nb.prange(n_workers):
        c = claim(counter)
        while c < first[1]:
            _, r0, r1 = _chunk(first, n_rows, c)
            # token range 0..1 as int64, not literals: the signature matvecs_int8 compiles
            _dot_rows(tids[0], ws[0], r0, r1, xs, np.int64(0), np.int64(1), y, 0, f16)
            c = claim(counter)
    if norm.size > 0:
        ss = 0.0
        for j in range(y.shape[1]):
            ss += y[0, j] * y[0, j]
        scale = np.float32(1.0 / math.sqrt(ss / y.shape[1] + eps))
        # the norm, then the add, in loops of their own: an add in the norm's loop became a fused multiply-add, a
        # rounding that resid + ops.rms_norm(y) (a verify step's tokens) does not have, so decode and verify parted
        for j in range(y.shape[1]):
            y[0, j] = y[0, j] * scale * norm[j]
        for j in range(y.shape[1]):
            out[0, j] = resid[0, j] + y[0, j]
    else:
        for j in range(y.shape[1]):
            out[0, j] = resid[0, j] + y[0, j]


@nb.njit(cache=True, nogil=True, parallel=True, fastmath=True)
def glu_matvecs_int8(tids, ws, x, gelu, table, out, f16, n_chunks, n_workers):
    """out[0, r] = act(gate[r]) * up[r] for ONE token, gate and up = ws[0] x[0], ws[1] x[0] (a layer's gate and
    up: one type tids[0] == tids[1], one shape), act silu or gelu (gelu: ops' table) as ops.glu computes it:
    each chunk multiplies the same rows of both and applies the GLU to them, so the products stay in the core that
    made them and the decode step's GLU call goes (SmolLM2 on the 2-core VM: ~22 us a layer, most of it reading
    the other core's half of gate and up). gate and up are what matvecs_int8 gives, bit for bit.

    x: float32 [1, n_cols], out: float32 [1, n_rows], table: ops.GELU_TABLE."""
    xs = _quantize_x(x, (tids[0], tids[1], tids[0], tids[0]))  # matvecs_int8's padded 4-tuple: one compile
    n_units = ws[0].shape[0]  # rows, or groups of 8 rows for a repacked type
    n_rows = out.shape[1]
    per_unit = 8 if tids[0] > X8 else 1
    gate, up = np.empty((1, n_rows), np.float32), np.empty((1, n_rows), np.float32)
    n_chunks = min(n_chunks, n_units)
    counter = counters(1)
    for worker in nb.prange(n_workers):
        c = claim(counter)
        while c < n_chunks:
            u0, u1 = c * n_units // n_chunks, (c + 1) * n_units // n_chunks
            _dot_rows(tids[0], ws[0], u0, u1, xs, np.int64(0), np.int64(1), gate, 0, f16)  # not literals: one compile
            _dot_rows(tids[1], ws[1], u0, u1, xs, np.int64(0), np.int64(1), up, 0, f16)
            for r in range(u0 * per_unit, min(u1 * per_unit, n_rows)):
                out[0, r] = _glu_one(gate[0, r], up[0, r], gelu, table)
            c = claim(counter)
