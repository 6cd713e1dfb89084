"""Integer dots of weights repacked eight rows at a time (repack's layout) with int8-quantized x: numba
intrinsics that emit LLVM vector IR, one int32 (then float) lane a row.

A block of a group of 8 rows unpacks to 8 vectors <32 x i8>, vector k lane i = row i's values 4k..4k+3 (unsigned:
its quants, 5th bits included), its d (and m) to <8 x float> (vcvtph2ps). One token's x (blocks of 32, as
quantize_q8) goes as a broadcast of its 4 values 4k..4k+3 into the byte dot with vector k (vpdpbusd): the 8 rows'
int32 sums of the block at once; the offsets of Q4_0 (-8) and Q5_0 (-16) are the sums' start, -offset * sum of
the block's xq; d * xd scales them into a float accumulator a row, m * xd * (sum of xq) adds the minimums.
"""
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from kernels.cpu.ir import array_data, dot4, dot4_many, fma, i64, ir_loop, ptr, splat, splat_f, tile_rows
from kernels.cpu.repack import LAYOUTS, ROWS
from kernels.cpu.types import Q4_0, Q4_1, Q5_0, X8, fast

# numba's cache keys these kernels on this file alone: kernels/cpu/cache.py says how edits to the modules they
# inline reach them (INLINED, INLINED_DIGEST, checked by tests/kernels/test_cpu_cache.py)
INLINED = ("types", "ir", "repack")
INLINED_DIGEST = "64a941b07064a497"

OFFSETS = {Q4_0: 8, Q5_0: 16}


def _halves(context, builder, w_t, w, off):
    """<8 x float> of the 8 f16 at w's flat byte offset off."""
    h8 = builder.load(ptr(context, builder, w_t, w, off, ir.VectorType(ir.HalfType(), 8)), align=1)
    return builder.fpext(h8, ir.VectorType(ir.FloatType(), 8))


def unpack(context, builder, tid, w_t, w, base):
    """(8 <32 x i8> of the unsigned values, d <8 x float>, m <8 x float> or None) of the repacked block of 8 rows at
    w's flat byte offset base (tid: the ggml type)."""
    _, has_min, has_qh = LAYOUTS[tid]
    b32 = ir.VectorType(ir.IntType(8), 32)
    quants_at = 16 + 16 * has_min + 32 * has_qh
    low, high = [], []
    for k in range(4):
        q = builder.load(ptr(context, builder, w_t, w, builder.add(base, i64(quants_at + 32 * k)), b32), align=1)
        low.append(builder.and_(q, splat(builder, 0xF, 32)))
        high.append(builder.lshr(q, splat(builder, 4, 32)))
    values = low + high  # vector k: values 4k..4k+3 of each row (k >= 4: 16 + 4(k - 4)...)
    if has_qh:  # bit k of byte l of a row's qh word: the 5th bit of vector k's byte l
        qh = builder.load(ptr(context, builder, w_t, w, builder.add(base, i64(16 + 16 * has_min)), b32), align=1)
        for k in range(8):
            shift = splat(builder, abs(4 - k), 32)
            moved = builder.shl(qh, shift) if k <= 4 else builder.lshr(qh, shift)
            values[k] = builder.or_(values[k], builder.and_(moved, splat(builder, 0x10, 32)))
    d = _halves(context, builder, w_t, w, base)
    m = _halves(context, builder, w_t, w, builder.add(base, i64(16))) if has_min else None
    return values, d, m


def _group_base(context, builder, w_t, w, g_t, g, block_bytes):
    """(flat byte offset of group g's row in w, its number of blocks)."""
    row_bytes = builder.extract_value(array_data(context, builder, w_t, w).shape, 1)
    g = context.cast(builder, g, g_t, types.int64)
    return builder.mul(g, row_bytes), builder.udiv(row_bytes, i64(ROWS * block_bytes))


def _dot(tid):
    """An intrinsic f(w, g, xq, xd, xs16) -> UniTuple(float32, 8): group g of the repacked w (uint8 [n_groups,
    row_bytes]) dotted with one token's x8 (xq int8 [n_cols], xd float32 [n_cols // 32], xs16 int16 [n_cols // 16])."""
    block_bytes, has_min, has_qh = LAYOUTS[tid]
    offset = OFFSETS.get(tid, 0)

    @intrinsic
    def dot(typingctx, w, g, xq, xd, xs16):
        def codegen(context, builder, sig, args):
            w_t, g_t, xq_t, xd_t, xs_t = sig.args
            w, g, xq, xd, xs16 = args
            i16, i32, f32 = ir.IntType(16), ir.IntType(32), ir.FloatType()
            v8, f8, b32 = ir.VectorType(i32, 8), ir.VectorType(f32, 8), ir.VectorType(ir.IntType(8), 32)
            base, n_blocks = _group_base(context, builder, w_t, w, g_t, g, block_bytes)

            def body(b, accs):
                at = builder.add(base, builder.mul(b, i64(ROWS * block_bytes)))
                values, d, m = unpack(context, builder, tid, w_t, w, at)
                sums16 = builder.load(ptr(context, builder, xs_t, xs16, builder.mul(b, i64(2)), ir.VectorType(i16, 2)))
                xsum = builder.add(*[builder.sext(builder.extract_element(sums16, i64(h)), i32) for h in range(2)])
                sums = splat(builder, builder.mul(xsum, ir.Constant(i32, -offset)), 8, 32) if offset else v8([0] * 8)
                x4s = [builder.load(ptr(context, builder, xq_t, xq, builder.add(builder.mul(b, i64(32)), i64(4 * k)),
                                        i32), align=1) for k in range(8)]
                sums = dot4_many(context, builder, sums, [(values[k], builder.bitcast(splat(builder, x4s[k], 8, 32), b32))
                                                          for k in range(8)], (31 if has_qh else 15) * 128)
                xd_b = builder.load(builder.gep(array_data(context, builder, xd_t, xd).data, [b]))
                acc = fma(builder, builder.sitofp(sums, f8), builder.fmul(d, splat_f(builder, xd_b, 8)), accs[0])
                if has_min:
                    acc = fma(builder, m, splat_f(builder, builder.fmul(xd_b, builder.sitofp(xsum, f32)), 8), acc)
                return [acc]

            total, = ir_loop(builder, n_blocks, [f8([0.0] * 8)], body)
            lanes = [builder.extract_element(total, i64(i)) for i in range(ROWS)]
            return context.make_tuple(builder, sig.return_type, lanes)

        return types.UniTuple(types.float32, ROWS)(w, g, xq, xd, xs16), codegen

    return dot


def _pack(tid):
    """An intrinsic f(w, tile, packed, corrs, scales, mins): rows of the repacked w in the prompt GEMM's tile format
    (gemm_int8: signed values, -128 * their sums, d, m), from the layout the matvec reads: group tile of 8 rows, or
    groups 2 tile and 2 tile + 1 where a tile has 16 rows (ir.tile_rows; past the last group it repeats it)."""
    block_bytes, has_min, _ = LAYOUTS[tid]
    offset = OFFSETS.get(tid, 0)

    @intrinsic
    def pack(typingctx, w, tile, packed, corrs, scales, mins):
        def codegen(context, builder, sig, args):
            w_t, tile_t, packed_t, corrs_t, scales_t, mins_t = sig.args
            w, tile, packed, corrs, scales, mins = args
            rows = tile_rows(context)
            v8, f8 = ir.VectorType(ir.IntType(32), 8), ir.VectorType(ir.FloatType(), 8)
            n_groups = builder.extract_value(array_data(context, builder, w_t, w).shape, 0)
            tile = context.cast(builder, tile, tile_t, types.int64)
            groups = []  # (base, blocks) of the tile's groups of 8 rows
            for s in range(rows // ROWS):
                g = builder.add(builder.mul(tile, i64(rows // ROWS)), i64(s))
                g = builder.select(builder.icmp_signed("<", g, n_groups), g, builder.sub(n_groups, i64(1)))
                groups.append(_group_base(context, builder, w_t, w, types.int64, g, block_bytes))

            def body(b, _):
                for s, (base, _) in enumerate(groups):  # lanes 8 s..8 s + 7 of the tile's vectors
                    values, d, m = unpack(context, builder, tid, w_t, w,
                                          builder.add(base, builder.mul(b, i64(ROWS * block_bytes))))
                    at = builder.add(builder.mul(b, i64(rows)), i64(ROWS * s))
                    bias = v8([0] * 8)
                    for k, vec in enumerate(values):
                        vec = builder.sub(vec, splat(builder, offset, 32)) if offset else vec
                        vec_at = builder.add(builder.mul(builder.add(builder.mul(b, i64(8)), i64(k)), i64(4 * rows)),
                                             i64(4 * ROWS * s))
                        builder.store(vec, ptr(context, builder, packed_t, packed, vec_at, vec.type), align=1)
                        bias = dot4(context, builder, bias, splat(builder, 128, 32), vec)
                    builder.store(builder.sub(v8([0] * 8), bias), ptr(context, builder, corrs_t, corrs, at, v8),
                                  align=4)
                    builder.store(d, ptr(context, builder, scales_t, scales, at, f8), align=4)
                    if has_min:
                        builder.store(m, ptr(context, builder, mins_t, mins, at, f8), align=4)
                return []

            ir_loop(builder, groups[0][1], [], body)
            return context.get_dummy_value()

        return types.void(w, tile, packed, corrs, scales, mins), codegen

    return pack


dot_x8_q4_0, dot_x8_q4_1, dot_x8_q5_0, dot_x8_q5_1 = (_dot(t) for t in LAYOUTS)
pack_x8_q4_0, pack_x8_q4_1, pack_x8_q5_0, pack_x8_q5_1 = (_pack(t) for t in LAYOUTS)


@fast
def dot8_x8(tid, w, g0, g1, xq, xd, xs16, out):
    """out[8g + i] = row 8g + i of W . x8 for the groups g0..g1 - 1 of the repacked w (tid: X8 + its type) and one
    token's x8; rows past out's end (the last group's repeats) are dropped."""
    n_rows = out.shape[0]
    for g in range(g0, g1):
        if tid == X8 + Q4_0:
            ys = dot_x8_q4_0(w, g, xq, xd, xs16)
        elif tid == X8 + Q4_1:
            ys = dot_x8_q4_1(w, g, xq, xd, xs16)
        elif tid == X8 + Q5_0:
            ys = dot_x8_q5_0(w, g, xq, xd, xs16)
        else:
            ys = dot_x8_q5_1(w, g, xq, xd, xs16)
        for i in range(min(ROWS, n_rows - ROWS * g)):
            out[ROWS * g + i] = ys[i]
