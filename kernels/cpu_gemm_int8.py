"""The int8 GEMM of a prompt's tokens with rows of 32-value blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): numba
intrinsics that emit LLVM vector IR (a packing step and a register-tile micro-kernel); cpu_gemm drives them.

x is quantized per 32 values as for the matvecs, but stored biased, xu = xq + 128 (uint8), because the byte dot
(vpdpbusd: u8 x s8 summed in fours into int32) takes one operand unsigned and the weights' values are signed.
A tile of ROWS rows is packed once, into scratch that stays in L1, for all the prompt's tokens:
- packed: per block, ROWS x 32 signed values as 8 vectors, vector k lane i = values 4k..4k+3 of row i (so a
  broadcast of 4 bytes of one token's x dots all the tile's rows at once: one int32 lane per row);
- corrs: per block and row, -128 * (sum of its values): the bias of xu taken back, the int32 sums' start;
- scales (d), mins (m, for Q4_1 and Q5_1), per block and row, float32.
The micro-kernel then runs TOKENS tokens x ROWS rows over all blocks in registers: a block's int32 sums times
d * xd into float accumulators, plus m * (xd * sum of xq) where there is a minimum. The offsets of Q4_0 (-8)
and Q5_0 (-16) are in the packed values, so they need no sums of x.
"""
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from kernels.cpu_dot_int8 import _high_bits32, _nibbles32, _row_at
from kernels.cpu_ir import array_data, call, dot4, half_ir, i64, ir_loop, load_bytes, shuffle, splat, splat_f
from kernels.cpu_types import Q4_0, Q4_1, Q5_0, Q5_1, Q8_0

# numba's cache keys these kernels on this file alone: kernels/cpu_cache.py says how edits to the modules they
# inline reach them (INLINED, INLINED_DIGEST, checked by tests/kernels/test_cpu_cache.py)
INLINED = ("cpu_types", "cpu_ir", "cpu_dot_int8")
INLINED_DIGEST = "e08cf0e7043a33f9"

ROWS = 8  # rows of a tile: the int32 lanes of a 256-bit vector
TOKENS = 4  # tokens of the micro-kernel's register tile (4 float + 4 int32 accumulators, 8 weight vectors)

# type id -> (block bytes, quants at, 5th bits at, offset, minimum at); d (f16) is at 0 in each
BLOCKS = {Q4_0: (18, 2, None, 8, None), Q4_1: (20, 4, None, 0, 2), Q5_0: (22, 6, 2, 16, None),
          Q5_1: (24, 8, 4, 0, 2), Q8_0: (34, 2, None, 0, None)}


def _ptr(context, builder, arr_t, arr, off, ty):
    """A pointer of type ty* to element off of a C-contiguous array (any number of dimensions, flat index)."""
    return builder.bitcast(builder.gep(array_data(context, builder, arr_t, arr).data, [off]), ty.as_pointer())


def _values(context, builder, tid, row_t, row, o):
    """<32 x i8>: the signed values of the block at row[o:] (its quants less its offset), without d or m."""
    _, quants_at, qh_at, offset, _ = BLOCKS[tid]
    if tid == Q8_0:
        return load_bytes(context, builder, row_t, row, builder.add(o, i64(quants_at)), 32)
    quants = _nibbles32(context, builder, row_t, row, builder.add(o, i64(quants_at)))
    if qh_at is not None:
        quants = builder.or_(quants, _high_bits32(context, builder, row_t, row, builder.add(o, i64(qh_at))))
    return builder.sub(quants, splat(builder, offset, 32)) if offset else quants


def _pack(tid):
    """An intrinsic f(w, r0, packed, corrs, scales, mins, f16) that packs rows r0..r0 + ROWS - 1 of w (uint8
    [n_rows, row_bytes] of type tid; rows past the last repeat it) as the module docstring says: packed uint8
    [n_blocks * ROWS * 32], corrs int32, scales and mins float32 [n_blocks * ROWS] (mins untouched without a
    minimum)."""
    block_bytes, _, _, _, min_at = BLOCKS[tid]

    @intrinsic
    def pack(typingctx, w, r0, packed, corrs, scales, mins, f16):
        def codegen(context, builder, sig, args):
            w_t, r0_t, packed_t, corrs_t, scales_t, mins_t, f16_t = sig.args
            w, r0, packed, corrs, scales, mins, f16 = args
            i32, f32 = ir.IntType(32), ir.FloatType()
            v8, f8 = ir.VectorType(i32, 8), ir.VectorType(f32, 8)
            n_rows = builder.extract_value(array_data(context, builder, w_t, w).shape, 0)
            r0 = context.cast(builder, r0, r0_t, types.int64)
            bases, n_blocks = [], None
            for i in range(ROWS):
                r = builder.add(r0, i64(i))
                r = builder.select(builder.icmp_signed("<", r, n_rows), r, builder.sub(n_rows, i64(1)))
                base, n_blocks = _row_at(context, builder, w_t, w, types.int64, r, block_bytes)
                bases.append(base)

            def body(b, _):
                rows, d, m = [], f8(ir.Undefined), f8(ir.Undefined)
                for i, base in enumerate(bases):
                    o = builder.add(base, builder.mul(b, i64(block_bytes)))
                    rows.append(builder.bitcast(_values(context, builder, tid, w_t, w, o), v8))
                    d = builder.insert_element(d, half_ir(context, builder, w_t, w, o, f16_t, f16), i64(i))
                    if min_at is not None:
                        m = builder.insert_element(m, half_ir(context, builder, w_t, w, builder.add(o, i64(min_at)),
                                                              f16_t, f16), i64(i))
                while len(rows) > 1:  # ROWS vectors of 8 int32 concatenated: lane 8 i + k = row i's values 4k..4k+3
                    rows = [shuffle(builder, a, c, range(2 * a.type.count)) for a, c in zip(rows[0::2], rows[1::2])]
                at = builder.mul(b, i64(ROWS))
                bias = v8([0] * 8)
                for k in range(8):
                    vec = shuffle(builder, rows[0], None, [ROWS * i + k for i in range(ROWS)])
                    builder.store(vec, _ptr(context, builder, packed_t, packed, builder.mul(builder.add(at, i64(k)),
                                                                                            i64(32)), v8), align=1)
                    bias = dot4(context, builder, bias, splat(builder, 128, 32), builder.bitcast(vec, ir.VectorType(
                        ir.IntType(8), 32)))
                builder.store(builder.sub(v8([0] * 8), bias), _ptr(context, builder, corrs_t, corrs, at, v8),
                              align=4)
                builder.store(d, _ptr(context, builder, scales_t, scales, at, f8), align=4)
                if min_at is not None:
                    builder.store(m, _ptr(context, builder, mins_t, mins, at, f8), align=4)
                return []

            ir_loop(builder, n_blocks, [], body)
            return context.get_dummy_value()

        return types.void(w, r0, packed, corrs, scales, mins, f16), codegen

    return pack


def _tile(with_min):
    """An intrinsic f(packed, corrs, scales, mins, xu, xd, xds, t0, y): y[j * ROWS + i] = token t0 + j's x8 . row i
    of a packed tile, for j < TOKENS, over all blocks. xu uint8 [n_tokens, n_blocks * 32] (xq + 128), xd and xds
    float32 [n_tokens, n_blocks] (xds: xd * the sum of xq over the block; read only with_min)."""
    @intrinsic
    def tile(typingctx, packed, corrs, scales, mins, xu, xd, xds, t0, y):
        def codegen(context, builder, sig, args):
            packed_t, corrs_t, scales_t, mins_t, xu_t, xd_t, xds_t, t0_t, y_t = sig.args
            packed, corrs, scales, mins, xu, xd, xds, t0, y = args
            i8, i32, f32 = ir.IntType(8), ir.IntType(32), ir.FloatType()
            v8, f8, b32 = ir.VectorType(i32, 8), ir.VectorType(f32, 8), ir.VectorType(i8, 32)
            n_blocks = builder.extract_value(array_data(context, builder, xd_t, xd).shape, 1)
            t0 = context.cast(builder, t0, t0_t, types.int64)
            rows_of = [builder.mul(builder.add(t0, i64(j)), n_blocks) for j in range(TOKENS)]  # flat xd index of b 0

            def body(b, accs):
                at = builder.mul(b, i64(ROWS))
                weights = [builder.load(_ptr(context, builder, packed_t, packed,
                                             builder.mul(builder.add(at, i64(k)), i64(32)), b32), align=1)
                           for k in range(8)]
                corr = builder.load(_ptr(context, builder, corrs_t, corrs, at, v8), align=4)
                d = builder.load(_ptr(context, builder, scales_t, scales, at, f8), align=4)
                m = builder.load(_ptr(context, builder, mins_t, mins, at, f8), align=4) if with_min else None
                new = []
                for j, acc in enumerate(accs):
                    xb = builder.add(rows_of[j], b)  # token j's block b in xd, xds; its bytes at 32 xb in xu
                    sums = corr
                    for k in range(8):
                        x4 = builder.load(_ptr(context, builder, xu_t, xu, builder.add(builder.mul(xb, i64(32)),
                                                                                       i64(4 * k)), i32), align=1)
                        sums = dot4(context, builder, sums, builder.bitcast(splat(builder, x4, 8, 32), b32),
                                    weights[k])
                        # (splat of the 4 bytes as one int32: the same 4 x bytes against every row's)
                    scale = builder.fmul(d, splat_f(builder, builder.load(builder.gep(
                        array_data(context, builder, xd_t, xd).data, [xb])), 8))
                    acc = _fma(builder, builder.sitofp(sums, f8), scale, acc)
                    if with_min:
                        xs = builder.load(builder.gep(array_data(context, builder, xds_t, xds).data, [xb]))
                        acc = _fma(builder, m, splat_f(builder, xs, 8), acc)
                    new.append(acc)
                return new

            totals = ir_loop(builder, n_blocks, [f8([0.0] * 8)] * TOKENS, body)
            for j, total in enumerate(totals):
                builder.store(total, _ptr(context, builder, y_t, y, i64(j * ROWS), f8), align=4)
            return context.get_dummy_value()

        return types.void(packed, corrs, scales, mins, xu, xd, xds, t0, y), codegen

    return tile


def _fma(builder, a, b, c):
    return call(builder, "llvm.fma.v8f32", a.type, [a, b, c])


pack_q4_0, pack_q4_1, pack_q5_0, pack_q5_1, pack_q8_0 = (_pack(tid) for tid in (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0))
tile_with_min, tile_no_min = _tile(True), _tile(False)
