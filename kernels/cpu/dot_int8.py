"""Integer dots of quantized rows with int8-quantized x (numba intrinsics that emit LLVM vector IR).

x [n_tokens, n_cols] is quantized once per call: xq int8 (|xq| <= 127) times xd float32, one scale per
block of x (256 values for the K256_IDS types, as llama.cpp's q8_K; 32 for the BLOCK32_IDS types, as its q8_0),
and xs16, the int16 sums of xq over each 16 (for block minimums and offsets: Q6_K's -32, Q4_0's -8, Q5_0's
-16). numba computes integers in int64, which hides byte dot products from LLVM's loop vectorizer (a numba
loop ran 4x slower), so the dots are intrinsics that emit LLVM vector IR: byte products summed in pairs to
int16 (pmaddubsw, which takes one operand unsigned), the pairs times their scales summed to int32 (pmaddwd).
The K256_IDS types: a whole super-block of 256 of two rows at a time, as llama.cpp does for one; the 32-value
blocks one row. Each loops over a row's blocks in IR, scales every block's int32 sums into float accumulators and
ends in one horizontal sum a row. The 4-bit codebook types (MXFP4, IQ4_NL, IQ4_XS) look their codes' signed values
up by a byte shuffle (ir.lookup16) and dot them as Q8_0's signed bytes (ir.abs_signed), as llama.cpp's x86 dots
(ggml_vec_dot_iq4_nl_q8_0, ggml_vec_dot_mxfp4_q8_0, ggml_vec_dot_iq4_xs_q8_K). The grid types (IQ2_XXS, IQ2_XS,
IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M: iq_grid.grid_sub_block) gather their grid entries' magnitudes and their sign bytes
from tables (ir.gather) and move the signs onto x, as ggml_vec_dot_iq2_xxs_q8_K and ggml_vec_dot_iq3_xxs_q8_K do.
"""
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from kernels.cpu.iq_grid import grid_sub_block, iq1_m_d
from kernels.cpu.ir import (abs_signed, array_data, call, fma, fold, fsum, half_ir, i64, ir_loop, load, load_bytes,
                            lookup16, madd, madd32, madd_scaled, prefetch, ptr, shuffle, splat, splat_f)
from kernels.cpu.types import (IQ1_M, IQ1_S, IQ2_S, IQ2_XS, IQ2_XXS, IQ3_S, IQ3_XXS, IQ4_NL, IQ4_XS, MXFP4, Q4_0, Q4_1,
                               Q4_K, Q5_0, Q6_K, fast)
from models.dequant import KVALUES_MXFP4
from models.iq_grids import KVALUES_IQ4NL

# numba's cache keys these kernels on this file alone: kernels/cpu/cache.py says how edits to the modules they
# inline reach them (INLINED, INLINED_DIGEST, checked by tests/kernels/test_cpu_cache.py)
INLINED = ("types", "ir", "iq_grid", "models.dequant", "models.iq_grids")  # the 4-bit tables: constants
PREFETCH_BYTES = 2048
# Q4_K and Q6_K: two cache lines of each row's block this far ahead, as the 32-value blocks' PREFETCH_BYTES. On the
# 16-core host 2048 read Q4_K from DRAM ~1.3x faster than none, 1024 in between (BENCHMARKS.md, session 15).
K_PREFETCH_BYTES = 2048
INLINED_DIGEST = "0ea482cf2af02dd6"


def _nibbles32(context, builder, row_t, row, off):
    """<32 x i8>: the low nibbles of row[off:off + 16], then the high ones (a Q4_0/Q4_1 block's values 0-15,
    16-31)."""
    q = load_bytes(context, builder, row_t, row, off, 16)
    return shuffle(builder, builder.and_(q, splat(builder, 0xF, 16)), builder.lshr(q, splat(builder, 4, 16)),
                   range(32))


def _high_bits32(context, builder, row_t, row, off):
    """<32 x i8>: 16 where bit l of the little-endian uint32 at row[off:off + 4] is set, else 0 (the 5th bits of a
    Q5_0/Q5_1 block). Bit l is bit l % 8 of byte l // 8: each byte spread over 8 lanes and tested against its bit
    (a byte shuffle and a compare: shifting 32 int32 lanes apart took a quarter longer a block)."""
    qh = shuffle(builder, load_bytes(context, builder, row_t, row, off, 4), None, [lane // 8 for lane in range(32)])
    bit = builder.and_(qh, ir.VectorType(ir.IntType(8), 32)([1 << (lane % 8) for lane in range(32)]))
    return builder.select(builder.icmp_unsigned("!=", bit, splat(builder, 0, 32)), splat(builder, 16, 32),
                          splat(builder, 0, 32))


def _q4_k_block(context, builder, row_t, row, o, xq_t, xq, xs_t, xs16, idx):
    """For each block i of x in idx (one a token: _k_rows), [<8 x i32> summing to sum over its 8 runs j of
    sc_j * (q . xq), one summing to sum over j of m_j * (sum of xq over run j)] of the Q4_K block at row[o:o + 144]
    and x's block i (xq[256 i:256 i + 256], in q4_k_order; xs16[16 i:16 i + 16]). The block's scales and nibbles are
    decoded once for all of idx."""
    i32, v4 = ir.IntType(32), ir.VectorType(ir.IntType(32), 4)
    # the 12 scale bytes as <4 x i32> u (its last lane quants) -> 8 scales, then 8 mins, a byte each: ggml's
    # utmp lane-wise, word k = ((u[a_k] >> s_k) & mask_k) | ((u[b_k] >> 6) & top_k) << 4
    u = builder.bitcast(load(context, builder, row_t, row, builder.add(o, i64(4)), 16), v4)
    low6, low4, top2 = 0x3F3F3F3F, 0x0F0F0F0F, 0x03030303
    low = builder.and_(builder.lshr(shuffle(builder, u, None, [0, 2, 1, 2]), v4([0, 0, 0, 4])),
                       v4([low6, low4, low6, low4]))
    top = builder.shl(builder.and_(builder.lshr(shuffle(builder, u, None, [0, 0, 1, 1]), v4([6] * 4)),
                                   v4([0, top2, 0, top2])), v4([4] * 4))
    scale_bytes = builder.bitcast(builder.or_(low, top), ir.VectorType(ir.IntType(8), 16))
    # zero-extended by interleaving zero bytes: a zext would be moved past each run's shuffle of the scales
    # below, to a byte permute plus a zext per run instead of one 16-bit permute
    zero_bytes = ir.VectorType(ir.IntType(8), 16)([0] * 16)
    scales = builder.bitcast(shuffle(builder, scale_bytes, zero_bytes, [k // 2 + 16 * (k % 2) for k in range(32)]),
                             ir.VectorType(ir.IntType(16), 16))
    # 128 values from each 64 bytes: runs 4h and 4h + 2 in the low nibbles, 4h + 1 and 4h + 3 high (k = 0, 1)
    runs = []
    for h in range(2):
        q = load(context, builder, row_t, row, builder.add(o, i64(16 + 64 * h)), 64)
        nibbles = builder.and_(q, splat(builder, 0xF, 64)), builder.lshr(q, splat(builder, 4, 64))
        for k, quants in enumerate(nibbles):
            run_scales = shuffle(builder, scales, None, [4 * h + k] * 16 + [4 * h + k + 2] * 16)
            runs.append((128 * h + 64 * k, quants, run_scales))
    mins = shuffle(builder, scales, None, [8 + k // 2 for k in range(16)])  # each twice: runs of 32 = 2 x 16
    out = []
    for i in idx:
        x0 = builder.mul(i, i64(256))
        acc = ir.VectorType(i32, 16)([0] * 16)
        for at, quants, run_scales in runs:  # xq in Q4_K order (see q4_k_order): runs 4h + k and 4h + k + 2
            x = load(context, builder, xq_t, xq, builder.add(x0, i64(at)), 64)
            acc = builder.add(acc, madd_scaled(context, builder, quants, x, run_scales))
        sums16 = load(context, builder, xs_t, xs16, builder.mul(i, i64(16)), 16, bits=16)
        out.append([fold(builder, acc), madd(builder, mins, sums16)])
    return out


def _q6_k_block(context, builder, row_t, row, o, xq_t, xq, xs_t, xs16, idx):
    """For each block i of x in idx (one a token: _k_rows), [<8 x i32> summing to sum over its 16 runs g of 16
    values of sc_g * ((q - 32) . xq)] of the Q6_K block at row[o:o + 210] and x's block i (xq[256 i:256 i + 256],
    xs16[16 i:16 i + 16]). The block's scales and 6-bit values are decoded once for all of idx."""
    i32 = ir.IntType(32)
    scale_bytes = load(context, builder, row_t, row, builder.add(o, i64(192)), 16)  # int8, a run each
    scales = builder.sext(scale_bytes, ir.VectorType(ir.IntType(16), 16))
    c = lambda v: splat(builder, v, 32)  # noqa: E731
    runs = []
    for n in range(2):  # 128 values: 4 runs of 32 from ql[64 n:64 n + 64] and qh[32 n:32 n + 32], see decode_q6_k
        ql0 = load(context, builder, row_t, row, builder.add(o, i64(64 * n)), 32)
        ql1 = load(context, builder, row_t, row, builder.add(o, i64(64 * n + 32)), 32)
        qh = load(context, builder, row_t, row, builder.add(o, i64(128 + 32 * n)), 32)
        high = [builder.shl(builder.and_(builder.lshr(qh, c(2 * k)), c(3)), c(4)) for k in range(4)]
        low = [builder.and_(ql0, c(0xF)), builder.and_(ql1, c(0xF)), builder.lshr(ql0, c(4)), builder.lshr(ql1, c(4))]
        for h in range(2):  # runs 2h and 2h + 1: x[128 n + 64 h:][:64]
            quants = shuffle(builder, builder.or_(low[2 * h], high[2 * h]),
                             builder.or_(low[2 * h + 1], high[2 * h + 1]), range(64))
            g = 8 * n + 4 * h  # the scales of these 4 runs of 16
            runs.append((128 * n + 64 * h, quants,
                         shuffle(builder, scales, None, [g] * 8 + [g + 1] * 8 + [g + 2] * 8 + [g + 3] * 8)))
    out = []
    for i in idx:
        x0 = builder.mul(i, i64(256))
        acc = ir.VectorType(i32, 16)([0] * 16)
        for at, quants, run_scales in runs:
            x = load(context, builder, xq_t, xq, builder.add(x0, i64(at)), 64)
            acc = builder.add(acc, madd_scaled(context, builder, quants, x, run_scales))
        sums16 = load(context, builder, xs_t, xs16, builder.mul(i, i64(16)), 16, bits=16)
        offset = builder.shl(madd(builder, scales, sums16), ir.VectorType(i32, 8)([5] * 8))  # 32 * sc_g * sum
        out.append([builder.sub(fold(builder, acc), offset)])
    return out


def iq4_xs_scales(context, builder, row_t, row, o):
    """<8 x i16>: ls_j - 32 of the IQ4_XS block at row[o:], its 8 sub-blocks' 6-bit scales (low 4 bits from
    scales_l[j // 2]'s nibble j % 2, high 2 from bits 2j, 2j + 1 of scales_h), as ggml's dequantize_row_iq4_xs."""
    v8 = ir.VectorType(ir.IntType(16), 8)
    low = builder.zext(shuffle(builder, load_bytes(context, builder, row_t, row, builder.add(o, i64(4)), 4), None,
                               [j // 2 for j in range(8)]), v8)
    low = builder.and_(builder.lshr(low, v8([4 * (j % 2) for j in range(8)])), v8([0xF] * 8))
    high = splat(builder, builder.load(ptr(context, builder, row_t, row, builder.add(o, i64(2)), ir.IntType(16))),
                 8, 16)
    high = builder.shl(builder.and_(builder.lshr(high, v8([2 * j for j in range(8)])), v8([3] * 8)), v8([4] * 8))
    return builder.sub(builder.or_(low, high), v8([32] * 8))


def _iq4_xs_block(context, builder, row_t, row, o, xq_t, xq, xs_t, xs16, idx):
    """For each block i of x in idx (one a token: _k_rows), [<8 x i32> summing to sum over its 8 sub-blocks j of
    (ls_j - 32) * (v . xq)] of the IQ4_XS block at row[o:o + 136] (values v from IQ4_NL's table) and x's block i
    (xq[256 i:256 i + 256]): each 64 values (two sub-blocks, 32 bytes of codes) looked up, dotted as Q8_0's
    (abs_signed), their int16 pair sums times the sub-block's scale summed to int32 (pmaddwd), as llama.cpp's
    ggml_vec_dot_iq4_xs_q8_K does. The block's scales and values are looked up once for all of idx."""
    scales = iq4_xs_scales(context, builder, row_t, row, o)
    runs = []
    for h in range(4):  # sub-blocks 2h, 2h + 1: codes at qs[32 h:32 h + 32], low nibbles then high of each 16
        q = load_bytes(context, builder, row_t, row, builder.add(o, i64(8 + 32 * h)), 32)
        low, high = builder.and_(q, splat(builder, 0xF, 32)), builder.lshr(q, splat(builder, 4, 32))
        codes = shuffle(builder, low, high, [*range(16), *range(32, 48), *range(16, 32), *range(48, 64)])
        runs.append((64 * h, lookup16(context, builder, IQ4_NL_TABLE, codes),
                     shuffle(builder, scales, None, [2 * h] * 16 + [2 * h + 1] * 16)))
    out = []
    for i in idx:
        x0 = builder.mul(i, i64(256))
        acc = ir.VectorType(ir.IntType(32), 16)([0] * 16)
        for at, values, run_scales in runs:
            x = load(context, builder, xq_t, xq, builder.add(x0, i64(at)), 64)
            unsigned, signed = abs_signed(context, builder, values, x)
            acc = builder.add(acc, madd_scaled(context, builder, unsigned, signed, run_scales))
        out.append([fold(builder, acc)])
    return out


def _grid_block(tid):
    """block function of _k_rows for a grid type's (tid) block: [<8 x i32> summing to sum over its 8 sub-blocks j
    of (2 ls_j + 1) * (signed grid values . xq)] (ls per 16 values for IQ2_XS, IQ2_S), two sub-blocks a step: x
    given the values' signs (psignb), pmaddubsw of the grid values by it, pmaddwd by the scales, as
    ggml_vec_dot_iq2_xxs_q8_K / ggml_vec_dot_iq3_xxs_q8_K do on AVX2."""
    def lanes(builder, scales):  # pmaddubsw's 16 pair sums of a sub-block, each by its values' scale
        if len(scales) == 1:
            return splat(builder, scales[0], 16, 16)
        return shuffle(builder, splat(builder, scales[0], 8, 16), splat(builder, scales[1], 8, 16), range(16))

    def block(context, builder, row_t, row, o, xq_t, xq, xs_t, xs16, i):
        x0 = builder.mul(i, i64(256))
        acc = ir.VectorType(ir.IntType(32), 16)([0] * 16)
        for h in range(4):
            (va, sa, la), (vb, sb, lb) = (grid_sub_block(tid, context, builder, row_t, row, o, 2 * h + k)
                                          for k in range(2))
            x = load(context, builder, xq_t, xq, builder.add(x0, i64(64 * h)), 64)
            signed = abs_signed(context, builder, shuffle(builder, sa, sb, range(64)), x)[1]
            scales = shuffle(builder, lanes(builder, la), lanes(builder, lb), range(32))
            acc = builder.add(acc, madd_scaled(context, builder, shuffle(builder, va, vb, range(64)), signed, scales))
        return [fold(builder, acc)]
    return _each_token(block)


def _row_at(context, builder, w_t, w, r_t, r, block_bytes):
    """(byte offset of row r, its number of blocks) in w, a C-contiguous uint8 [n_rows, row_bytes]. The dots take
    the matrix and a row number, not a row: numba made a view of each row (and of x's row) it passed, a cost a
    row that 20-block rows (Gemma's and SmolLM2's 640 and 576 columns) felt: Q8_0 640 x 4096, one thread, 15
    GB/s against 24 for rows of 20480."""
    row_bytes = builder.extract_value(array_data(context, builder, w_t, w).shape, 1)
    r = context.cast(builder, r, r_t, types.int64)
    return builder.mul(r, row_bytes), builder.udiv(row_bytes, i64(block_bytes))


def _each_token(block):
    """A block function of _k_rows from one that dots one token's block i: called for each of idx."""
    def each(context, builder, row_t, row, o, xq_t, xq, xs_t, xs16, idx):
        return [block(context, builder, row_t, row, o, xq_t, xq, xs_t, xs16, i) for i in idx]
    return each


def _k_rows(block, block_bytes, scales_at, factor=1.0, n_tokens=1):
    """An intrinsic f(w, ra, rb, xq, xd, xs16, f16) -> (w[ra] . x8, w[rb] . x8) for two rows of a k-quant's matrix
    w (uint8 [n_rows, row_bytes], see _row_at) and one token's x8 (xq in the block's order, xd [n_blocks], xs16): a
    loop over the blocks in IR that scales the int32 vectors of block(...) by their f16 scale at scales_at (byte
    offset, or a function of the block that gives it, as iq1_m_d; sign) times xd (times factor) into one float
    vector a row, summed once a row. A numba loop over the blocks reduced every block's vectors to scalars first: a
    shuffle tree a block, on the shuffle port that Q4_K is bound by on the Xeon (llvm-mca).
    n_tokens > 1: f(w, ra, rb, xq, xd, xs16, f16, t0) -> the n_tokens dots of row ra with tokens t0.. of x8 (xq, xd,
    xs16 the [n_tokens, ...] arrays, C-contiguous), then those of row rb: each block of both rows read and decoded
    once for all of them (block(..., idx) gives each token's vectors; token t's blocks are x's i + t * n_blocks).
    A verify step's few tokens then cost their dots, not a decode each (kernels/cpu/NOTES_cpu.md, session 35)."""
    def codegen(context, builder, sig, args):
        row_t, ra_t, rb_t, xq_t, xd_t, xs_t, f16_t = sig.args[:7]
        row, ra, rb, xq, xd, xs16, f16 = args[:7]
        t0 = context.cast(builder, args[7], sig.args[7], types.int64) if n_tokens > 1 else i64(0)
        vec = ir.VectorType(ir.FloatType(), 8)
        base_a, n_blocks = _row_at(context, builder, row_t, row, ra_t, ra, block_bytes)
        base_b = _row_at(context, builder, row_t, row, rb_t, rb, block_bytes)[0]

        def body(i, accs):  # one block of both rows: their accumulators plus the block's scaled vectors
            idx = [builder.add(i, builder.mul(builder.add(t0, i64(t)), n_blocks)) for t in range(n_tokens)]
            xd_data = array_data(context, builder, xd_t, xd).data
            xds = [builder.load(builder.gep(xd_data, [k])) for k in idx]
            new = []
            for r, base in enumerate((base_a, base_b)):
                o = builder.add(base, builder.mul(i, i64(block_bytes)))
                for ahead in (K_PREFETCH_BYTES, K_PREFETCH_BYTES + 64):
                    prefetch(context, builder, row_t, row, builder.add(o, i64(ahead)))
                ds = [(at(context, builder, row_t, row, o, f16_t, f16) if callable(at) else
                       half_ir(context, builder, row_t, row, builder.add(o, i64(at)), f16_t, f16), sign)
                      for at, sign in scales_at]
                for t, vecs in enumerate(block(context, builder, row_t, row, o, xq_t, xq, xs_t, xs16, idx)):
                    acc = accs[r * n_tokens + t]
                    for v, (d, sign) in zip(vecs, ds):
                        scale = builder.fmul(d, xds[t])
                        if factor != 1.0:
                            scale = builder.fmul(scale, ir.Constant(ir.FloatType(), factor))
                        # one fused multiply-add (a call, which numba's fast-math flags do not reach): each token's
                        # sum rounds as one token's does whatever else the loop holds, so that a few tokens' dots are
                        # bit for bit their one-token dots (a verify step's logits are the decode step's)
                        v = v if sign > 0 else builder.neg(v)
                        acc = fma(builder, builder.sitofp(v, vec), splat_f(builder, scale, 8), acc)
                    new.append(acc)
            return new

        totals = ir_loop(builder, n_blocks, [vec([0.0] * 8)] * (2 * n_tokens), body)
        return context.make_tuple(builder, sig.return_type, [fsum(builder, total) for total in totals])

    returns = types.UniTuple(types.float32, 2 * n_tokens)
    if n_tokens == 1:
        @intrinsic
        def rows_dot(typingctx, w, ra, rb, xq, xd, xs16, f16):
            return returns(w, ra, rb, xq, xd, xs16, f16), codegen
    else:
        @intrinsic
        def rows_dot(typingctx, w, ra, rb, xq, xd, xs16, f16, t0):
            return returns(w, ra, rb, xq, xd, xs16, f16, t0), codegen
    return rows_dot


# xd * (d * sum of sc * (q . xq) - dmin * sum of m * (sum of xq)) a block; Q6_K: xd * d * sum of sc * ((q - 32) . xq)
dot_q4_k_rows = _k_rows(_q4_k_block, 144, ((0, 1), (2, -1)))
dot_q6_k_rows = _k_rows(_q6_k_block, 210, ((208, 1),))
# two rows with 2, 3 or 4 tokens at once (a verify step's: dot8_k_tokens)
dot_q4_k_rows_2, dot_q4_k_rows_3, dot_q4_k_rows_4 = (_k_rows(_q4_k_block, 144, ((0, 1), (2, -1)), n_tokens=n)
                                                     for n in (2, 3, 4))
dot_q6_k_rows_2, dot_q6_k_rows_3, dot_q6_k_rows_4 = (_k_rows(_q6_k_block, 210, ((208, 1),), n_tokens=n)
                                                     for n in (2, 3, 4))
dot_iq4_xs_rows_2, dot_iq4_xs_rows_3, dot_iq4_xs_rows_4 = (_k_rows(_iq4_xs_block, 136, ((0, 1),), n_tokens=n)
                                                           for n in (2, 3, 4))
dot_iq4_xs_rows = _k_rows(_iq4_xs_block, 136, ((0, 1),))  # xd * d * sum of (ls - 32) * (v . xq) a block
# xd * d * sum of (2 ls + 1) * (v . xq) / 8 (IQ2_XXS), / 4 (IQ3_XXS) a block
dot_iq2_xxs_rows = _k_rows(_grid_block(IQ2_XXS), 66, ((0, 1),), 0.125)
dot_iq3_xxs_rows = _k_rows(_grid_block(IQ3_XXS), 98, ((0, 1),), 0.25)
dot_iq3_s_rows = _k_rows(_grid_block(IQ3_S), 110, ((0, 1),))  # xd * d * sum of (2 ls + 1) * (v . xq) a block
dot_iq2_xs_rows = _k_rows(_grid_block(IQ2_XS), 74, ((0, 1),), 0.125)  # / 8 as IQ2_XXS
dot_iq2_s_rows = _k_rows(_grid_block(IQ2_S), 82, ((0, 1),), 0.125)
dot_iq1_s_rows = _k_rows(_grid_block(IQ1_S), 50, ((0, 1),), 0.125)  # its values 8 (g + delta)
dot_iq1_m_rows = _k_rows(_grid_block(IQ1_M), 56, ((iq1_m_d, 1),), 0.125)



def _f16_scale(context, builder, row_t, row, o, xd_k, f16_t, f16):
    """d * xd of a block whose scale d is the f16 at its start (every 32-value type but MXFP4)."""
    return builder.fmul(half_ir(context, builder, row_t, row, o, f16_t, f16), xd_k)


def _b32_rows(block_bytes, operands, min_at, offset, scale=_f16_scale):
    """An intrinsic f(w, ra, rb, xq, xd, xs16, f16) -> (w[ra] . x8, w[rb] . x8) for two rows of a 32-value block
    type's matrix w (C-contiguous uint8 [n_rows, row_bytes]: no row view is made, see _row_at) and one token's x8
    (xq, xd a block, xs16), in one IR loop over the blocks: each block's int32 partial sums times d * xd into a
    float vector a row, its minimum (min_at) or offset (-offset * d), if any, times the sum of xq into a float;
    one horizontal sum a row, where a numba loop paid one a block. Two rows share each block of x (its load, scale
    and sum) and keep two chains in flight. operands(context, builder, row_t, row, o, x) -> (unsigned, signed)
    <32 x i8> whose products are the block's quants times x; scale(context, builder, row_t, row, o, xd_k, f16_t,
    f16) -> d * xd of the block at o."""
    @intrinsic
    def rows_dot(typingctx, w, ra, rb, xq, xd, xs16, f16):
        def codegen(context, builder, sig, args):
            row_t, ra_t, rb_t, xq_t, xd_t, xs_t, f16_t = sig.args
            row, ra, rb, xq, xd, xs16, f16 = args
            f32, vec = ir.FloatType(), ir.VectorType(ir.FloatType(), 8)
            base_a, n_blocks = _row_at(context, builder, row_t, row, ra_t, ra, block_bytes)
            base_b = _row_at(context, builder, row_t, row, rb_t, rb, block_bytes)[0]

            def body(k, values):  # block k: per row (float vector of d * xd * sums, float of the minimums or offsets)
                x = load_bytes(context, builder, xq_t, xq, builder.mul(k, i64(32)), 32)
                xd_k = builder.load(builder.gep(array_data(context, builder, xd_t, xd).data, [k]))
                sums = load(context, builder, xs_t, xs16, builder.mul(k, i64(2)), 2, bits=16)
                halves = [builder.sext(builder.extract_element(sums, i64(h)), ir.IntType(32)) for h in range(2)]
                xsum = builder.sitofp(builder.add(*halves), f32)
                new = []
                for base, acc, acc_s in ((base_a, *values[:2]), (base_b, *values[2:])):
                    o = builder.add(base, builder.mul(k, i64(block_bytes)))
                    prefetch(context, builder, row_t, row, builder.add(o, i64(PREFETCH_BYTES)))
                    unsigned, signed = operands(context, builder, row_t, row, o, x)
                    d = scale(context, builder, row_t, row, o, xd_k, f16_t, f16)
                    if min_at is not None:
                        m = half_ir(context, builder, row_t, row, builder.add(o, i64(min_at)), f16_t, f16)
                        acc_s = builder.fadd(acc_s, builder.fmul(builder.fmul(m, xd_k), xsum))
                    elif offset:
                        acc_s = builder.fadd(acc_s, builder.fmul(builder.fmul(d, ir.Constant(f32, -float(offset))),
                                                                 xsum))
                    dots = builder.sitofp(madd32(context, builder, unsigned, signed), vec)
                    new += [builder.fadd(acc, builder.fmul(dots, splat_f(builder, d, 8))), acc_s]
                return new

            zeros = [vec([0.0] * 8), ir.Constant(f32, 0.0)]
            total_a, total_sa, total_b, total_sb = ir_loop(builder, n_blocks, zeros * 2, body)
            return context.make_tuple(builder, sig.return_type, [builder.fadd(fsum(builder, total_a), total_sa),
                                                                 builder.fadd(fsum(builder, total_b), total_sb)])

        return types.UniTuple(types.float32, 2)(w, ra, rb, xq, xd, xs16, f16), codegen

    return rows_dot


def _nibbles_at(quants_at, qh_at=None):
    """operands of _b32_rows for 4-bit quants at quants_at (their 5th bits in the word at qh_at) and x."""
    def operands(context, builder, row_t, row, o, x):
        quants = _nibbles32(context, builder, row_t, row, builder.add(o, i64(quants_at)))
        if qh_at is not None:
            quants = builder.or_(quants, _high_bits32(context, builder, row_t, row, builder.add(o, i64(qh_at))))
        return quants, x
    return operands


def _q8_0_operands(context, builder, row_t, row, o, x):
    """|q| and x with q's sign, as llama.cpp's x86 Q8_0 dot: pmaddubsw takes one operand unsigned, and
    2 * 128 * 127 keeps its int16 pair sums from saturating (q + 128 would not: 2 * 255 * 127)."""
    return abs_signed(context, builder, load_bytes(context, builder, row_t, row, builder.add(o, i64(2)), 32), x)


def _table_at(table, quants_at):
    """operands of _b32_rows for 4-bit codes at quants_at (16 bytes: low nibbles, then high, as Q4_0's) into the
    16 signed values of table, looked up by a byte shuffle (lookup16), dotted as Q8_0's values (|v| <= 127: the
    pair sums 2 * 127 * 127 stay below pmaddubsw's saturation)."""
    def operands(context, builder, row_t, row, o, x):
        codes = _nibbles32(context, builder, row_t, row, builder.add(o, i64(quants_at)))
        return abs_signed(context, builder, lookup16(context, builder, table, codes), x)
    return operands


def e8m0_half_ir(builder, e):
    """float32 2^(e - 128) of an MXFP4 block's scale byte e (an i8), exactly as ggml's ggml_e8m0_to_fp32_half:
    the float's exponent field e - 1, or for e < 2 the subnormal 2^-128, 2^-127."""
    i32 = ir.IntType(32)
    e = builder.zext(e, i32)
    bits = builder.select(builder.icmp_unsigned("<", e, i32(2)), builder.shl(i32(0x00200000), e),
                          builder.shl(builder.sub(e, i32(1)), i32(23)))
    return builder.bitcast(bits, ir.FloatType())


def _mxfp4_scale(context, builder, row_t, row, o, xd_k, f16_t, f16):
    """e8m0_half(e) * xd of an MXFP4 block, xd rounded to fp16 as llama.cpp's q8_0 block of x stores it (its CPU
    dots MXFP4 with q8_0: our experts see the activations its experts see)."""
    e = builder.load(ptr(context, builder, row_t, row, o, ir.IntType(8)))
    xd_h = builder.fpext(builder.fptrunc(xd_k, ir.HalfType()), ir.FloatType())
    return builder.fmul(e8m0_half_ir(builder, e), xd_h)


MXFP4_TABLE = [int(v) for v in KVALUES_MXFP4]  # the e2m1 values doubled: 0 1 2 3 4 6 8 12, bit 3 the sign
IQ4_NL_TABLE = [int(v) for v in KVALUES_IQ4NL]

# (block bytes, its operands, minimum at, offset[, scale]) of ggml's blocks: d f16 first in each but MXFP4's (e8m0)
dot_q4_0_rows = _b32_rows(18, _nibbles_at(2), None, 8)
dot_q4_1_rows = _b32_rows(20, _nibbles_at(4), 2, 0)
dot_q5_0_rows = _b32_rows(22, _nibbles_at(6, 2), None, 16)
dot_q5_1_rows = _b32_rows(24, _nibbles_at(8, 4), 2, 0)
dot_q8_0_rows = _b32_rows(34, _q8_0_operands, None, 0)
dot_iq4_nl_rows = _b32_rows(18, _table_at(IQ4_NL_TABLE, 2), None, 0)
dot_mxfp4_rows = _b32_rows(17, _table_at(MXFP4_TABLE, 1), None, 0, _mxfp4_scale)


@intrinsic
def abs_max(typingctx, x, off, n):
    """max |x.flat[off:off + n]| of a C-contiguous float32 array, n a multiple of 32: vector fabs and maxnum, 32
    lanes, halved at the end. numba left this loop scalar (four forms tried): 3.8-4.5 us of quantize_q8's ~5.2 for
    4096 values on the 2-core VM, and quantizing x took ~10 us of every one-token call on the 16-core host."""
    if not (isinstance(x, types.Array) and x.dtype == types.float32 and x.layout == "C"):
        return None

    def codegen(context, builder, sig, args):
        x_t, off_t, n_t = sig.args
        xa, off, n = args
        off, n = context.cast(builder, off, off_t, types.int64), context.cast(builder, n, n_t, types.int64)
        vec = ir.VectorType(ir.FloatType(), 32)

        def body(k, acc):
            v = builder.load(ptr(context, builder, x_t, xa, builder.add(off, builder.mul(k, i64(32))), vec), align=4)
            return [call(builder, "llvm.maxnum.v32f32", vec, [acc[0], call(builder, "llvm.fabs.v32f32", vec, [v])])]

        (acc,) = ir_loop(builder, builder.udiv(n, i64(32)), [vec([0.0] * 32)], body)
        while acc.type.count > 1:
            half = acc.type.count // 2
            acc = call(builder, f"llvm.maxnum.v{half}f32", ir.VectorType(ir.FloatType(), half),
                       [shuffle(builder, acc, None, range(half)), shuffle(builder, acc, None, range(half, 2 * half))])
        return builder.extract_element(acc, i64(0))

    return types.float32(x, off, n), codegen


@fast
def quantize_q8(x, xq, xd, xs16):
    """x: float32 [n_tokens, n_cols] (C-contiguous) -> xq: int8 [n_tokens, n_cols] times xd: float32 [n_tokens,
    n_blocks], one scale per block of n_cols // n_blocks values (to the nearest), xs16: int16 [n_tokens, n_cols //
    16]."""
    size = x.shape[1] // xd.shape[1]
    for t in range(x.shape[0]):
        for b in range(xd.shape[1]):
            amax = abs_max(x, t * x.shape[1] + size * b, size)
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
def dot8_q4_k(w, r0, r1, xq, xd, xs16, out, f16):
    """out[r] = w[r] . x8 for the Q4_K rows r0..r1 - 1 of w: uint8 [n_rows, row_bytes] and one token's x8 (xq in
    q4_k_order, blocks of 256). Row r pairs with the row half the range on, so both walk on through memory (a pair
    of neighbours restarts two streams every pair: half the speed from DRAM); an odd last row pairs with itself."""
    half_rows = (r1 - r0 + 1) // 2
    for r in range(r0, r0 + half_rows):  # xd * (d * sum of sc * (q . xq) - dmin * sum of m * (sum of xq)) a block
        r_b = r + half_rows if r + half_rows < r1 else r
        out[r], out[r_b] = dot_q4_k_rows(w, r, r_b, xq, xd, xs16, f16)


@fast
def dot8_k_tokens(tid, w, r0, r1, xq, xd, xs16, out, o, t0, n, f16):
    """out[o + j, r] = w[r] . x8 of token t0 + j, j < n (2 to 4), for the Q4_K, Q6_K or IQ4_XS (tid) rows r0..r1 - 1
    of w: as dot8_q4_k and dot8_k256, but each row pair's blocks read and decoded once for all n tokens (_k_rows'
    n_tokens). x8's arrays are all tokens' (xq [n_tokens, n_cols], Q4_K's in q4_k_order)."""
    half_rows = (r1 - r0 + 1) // 2
    for r in range(r0, r0 + half_rows):
        r_b = r + half_rows if r + half_rows < r1 else r
        if n == 2:
            _put_rows(out, o, r, r_b, dot_q4_k_rows_2(w, r, r_b, xq, xd, xs16, f16, t0) if tid == Q4_K else
                      dot_q6_k_rows_2(w, r, r_b, xq, xd, xs16, f16, t0) if tid == Q6_K else
                      dot_iq4_xs_rows_2(w, r, r_b, xq, xd, xs16, f16, t0))
        elif n == 3:
            _put_rows(out, o, r, r_b, dot_q4_k_rows_3(w, r, r_b, xq, xd, xs16, f16, t0) if tid == Q4_K else
                      dot_q6_k_rows_3(w, r, r_b, xq, xd, xs16, f16, t0) if tid == Q6_K else
                      dot_iq4_xs_rows_3(w, r, r_b, xq, xd, xs16, f16, t0))
        else:
            _put_rows(out, o, r, r_b, dot_q4_k_rows_4(w, r, r_b, xq, xd, xs16, f16, t0) if tid == Q4_K else
                      dot_q6_k_rows_4(w, r, r_b, xq, xd, xs16, f16, t0) if tid == Q6_K else
                      dot_iq4_xs_rows_4(w, r, r_b, xq, xd, xs16, f16, t0))


@fast
def _put_rows(out, o, r, r_b, dots):
    """dots (row r's with n tokens, then row r_b's: _k_rows' n_tokens) into out[o:o + n, r] and out[o:o + n, r_b]."""
    n = len(dots) // 2
    for j in range(n):
        out[o + j, r] = dots[j]
        out[o + j, r_b] = dots[n + j]


@fast
def dot8_k256(tid, w, r0, r1, xq, xd, xs16, out, f16):
    """As dot8_q4_k for Q6_K, IQ4_XS or the grid types' (tid) rows, x in blocks of 256 as it lies (llama.cpp's
    q8_K)."""
    half_rows = (r1 - r0 + 1) // 2
    for r in range(r0, r0 + half_rows):
        r_b = r + half_rows if r + half_rows < r1 else r
        if tid == Q6_K:
            out[r], out[r_b] = dot_q6_k_rows(w, r, r_b, xq, xd, xs16, f16)
        elif tid == IQ4_XS:
            out[r], out[r_b] = dot_iq4_xs_rows(w, r, r_b, xq, xd, xs16, f16)
        elif tid == IQ2_XXS:
            out[r], out[r_b] = dot_iq2_xxs_rows(w, r, r_b, xq, xd, xs16, f16)
        elif tid == IQ3_XXS:
            out[r], out[r_b] = dot_iq3_xxs_rows(w, r, r_b, xq, xd, xs16, f16)
        elif tid == IQ3_S:
            out[r], out[r_b] = dot_iq3_s_rows(w, r, r_b, xq, xd, xs16, f16)
        elif tid == IQ2_XS:
            out[r], out[r_b] = dot_iq2_xs_rows(w, r, r_b, xq, xd, xs16, f16)
        elif tid == IQ2_S:
            out[r], out[r_b] = dot_iq2_s_rows(w, r, r_b, xq, xd, xs16, f16)
        elif tid == IQ1_S:
            out[r], out[r_b] = dot_iq1_s_rows(w, r, r_b, xq, xd, xs16, f16)
        else:
            out[r], out[r_b] = dot_iq1_m_rows(w, r, r_b, xq, xd, xs16, f16)


@fast
def dot8_q8_0(w, r0, r1, xq, xd, xs16, out, f16):
    """As dot8_q4_k for Q8_0 rows, whose blocks of 32 match x's."""
    half_rows = (r1 - r0 + 1) // 2
    for r in range(r0, r0 + half_rows):
        r_b = r + half_rows if r + half_rows < r1 else r
        out[r], out[r_b] = dot_q8_0_rows(w, r, r_b, xq, xd, xs16, f16)


@fast
def dot8_b32(tid, w, r0, r1, xq, xd, xs16, out, f16):
    """As dot8_q8_0 for rows of Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL or MXFP4 (tid): a block is d * (q - 8) (Q4_0),
    d * (q - 16) (Q5_0), d * q + m (Q4_1, Q5_1), d * table[q] (IQ4_NL; MXFP4 with its e8m0 scale)."""
    half_rows = (r1 - r0 + 1) // 2
    for r in range(r0, r0 + half_rows):
        r_b = r + half_rows if r + half_rows < r1 else r
        if tid == Q4_0:
            out[r], out[r_b] = dot_q4_0_rows(w, r, r_b, xq, xd, xs16, f16)
        elif tid == Q5_0:
            out[r], out[r_b] = dot_q5_0_rows(w, r, r_b, xq, xd, xs16, f16)
        elif tid == Q4_1:
            out[r], out[r_b] = dot_q4_1_rows(w, r, r_b, xq, xd, xs16, f16)
        elif tid == MXFP4:
            out[r], out[r_b] = dot_mxfp4_rows(w, r, r_b, xq, xd, xs16, f16)
        elif tid == IQ4_NL:
            out[r], out[r_b] = dot_iq4_nl_rows(w, r, r_b, xq, xd, xs16, f16)
        else:
            out[r], out[r_b] = dot_q5_1_rows(w, r, r_b, xq, xd, xs16, f16)
