"""The int8 GEMM of a prompt's tokens (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K rows): numba intrinsics that emit
LLVM vector IR (a packing step and a register-tile micro-kernel); gemm drives them.

x is quantized per 32 values as for the matvecs, but stored biased, xu = xq + 128 (uint8), because the byte dot
(vpdpbusd: u8 x s8 summed in fours into int32) takes one operand unsigned and the weights' values are signed;
for the types of values up to 128 (SIGNED_X_IDS, tile_q8_0) on AVX2 without VNNI it is stored signed, xq, which
that path's dot of them takes (signed_x).
A tile of ROWS rows (16 with AVX-512 VNNI, in 512-bit vectors, else 8: ir.tile_rows) is packed once, into scratch
that stays in L1 or L2, for all the prompt's tokens, as groups of 32 values (a block of the 32-value types, a run of
a k-quant's 256; Q6_K's scales cover 16 values: two halves):
- packed: per group, ROWS x 32 signed values as 8 vectors, vector k lane i = values 4k..4k+3 of row i (so a
  broadcast of 4 bytes of one token's x dots all the tile's rows at once: one int32 lane per row);
- corrs: per group (half) and row, -128 * (sum of its values): the bias of xu taken back, the int32 sums' start;
- scales (d, d * sc), mins (m, -dmin * m for Q4_K), per group (half) and row, float32.
The micro-kernel then runs TOKENS tokens x ROWS rows over all groups in registers: a group's int32 sums times
scale * xd into float accumulators, plus min * (xd * sum of xq) where there is a minimum. Offsets (Q4_0's -8,
Q5_0's -16, Q6_K's -32) are in the packed values, so they need no sums of x.
"""
from llvmlite import ir
from numba.core import types
from numba.core.registry import cpu_target
from numba.extending import intrinsic

from kernels.cpu.dot_int8 import (IQ4_NL_TABLE, MXFP4_TABLE, _high_bits32, _nibbles32, _row_at, e8m0_half_ir,
                                  iq4_xs_scales)
from kernels.cpu.iq_grid import grid_sub_block, iq1_m_d
from kernels.cpu import ir as cpu_ir
from kernels.cpu.ir import (abs_signed, array_data, call, dot4, dot4_many, fma, half_ir, i64, ir_loop, load_bytes,
                            lookup16, ptr, shuffle, splat, splat_f)
from kernels.cpu.types import (IQ1_M, IQ1_S, IQ2_S, IQ2_XS, IQ2_XXS, IQ3_S, IQ3_XXS, IQ4_NL, IQ4_XS, MXFP4, Q4_0, Q4_1,
                               Q4_K, Q5_0, Q5_1, Q6_K, Q8_0)

# numba's cache keys these kernels on this file alone: kernels/cpu/cache.py says how edits to the modules they
# inline reach them (INLINED, INLINED_DIGEST, checked by tests/kernels/test_cpu_cache.py)
INLINED = ("types", "ir", "dot_int8", "iq_grid")
INLINED_DIGEST = "a77d43e303777bbf"

# values up to 128 in size: their tile (tile_q8_0) takes x's bytes signed (xq) where signed_x, else biased (xq + 128)
SIGNED_X_IDS = (Q8_0, IQ4_NL, IQ4_XS)
ROWS = cpu_ir.tile_rows(cpu_target.target_context)  # this host's rows of a tile: gemm's scratch and output
TOKENS = 4  # tokens of the micro-kernel's register tile (4 float + 4 int32 accumulators, 8 weight vectors)

# 32-value block types: type id -> (block bytes, quants at, 5th bits at, offset, minimum at); d (f16) at 0 in each
BLOCKS = {Q4_0: (18, 2, None, 8, None), Q4_1: (20, 4, None, 0, 2), Q5_0: (22, 6, 2, 16, None),
          Q5_1: (24, 8, 4, 0, 2), Q8_0: (34, 2, None, 0, None)}


def signed_x(context) -> bool:
    """Whether tile_q8_0 takes x's bytes signed (xq): on AVX2 without VNNI, whose dot of values up to 128
    (_signed_sums) moves their signs onto x. With VNNI (vpdpbusd) and in generic IR it takes them biased, as the
    other tiles: a xor of every 4 bytes back to xu cost those paths a quarter of the tile (IQ4_XS 2048x2048, 512
    tokens, one thread on the AVX-512 VNNI 2-core VM: 217 GFLOP/s, Q4_0's tile 300)."""
    return bool(cpu_ir.simd(context)) and not cpu_ir.vnni(context)


def x_bias(tid) -> int:
    """quantize_biased's bias of x for a GEMM of type tid on this host: 0 where its tile takes xq (signed_x), else
    128."""
    return 0 if tid in SIGNED_X_IDS and signed_x(cpu_target.target_context) else 128


def _byte(context, builder, row_t, row, off):
    """row[off] as an i32 (zero-extended)."""
    return builder.zext(builder.load(ptr(context, builder, row_t, row, off, ir.IntType(8))), ir.IntType(32))


def _block32(tid):
    """group(context, builder, row_t, row, o, j, f16_t, f16) -> (<32 x i8> signed values, [d], m or None) of the
    block of type tid at row[o:] (j is 0: one group a block)."""
    _, quants_at, qh_at, offset, min_at = BLOCKS[tid]

    def group(context, builder, row_t, row, o, j, f16_t, f16):
        if tid == Q8_0:
            values = load_bytes(context, builder, row_t, row, builder.add(o, i64(quants_at)), 32)
        else:
            values = _nibbles32(context, builder, row_t, row, builder.add(o, i64(quants_at)))
            if qh_at is not None:
                values = builder.or_(values, _high_bits32(context, builder, row_t, row, builder.add(o, i64(qh_at))))
            values = builder.sub(values, splat(builder, offset, 32)) if offset else values
        d = half_ir(context, builder, row_t, row, o, f16_t, f16)
        m = half_ir(context, builder, row_t, row, builder.add(o, i64(min_at)), f16_t, f16) if min_at else None
        return values, [d], m

    return group


def _q4_k_group(context, builder, row_t, row, o, j, f16_t, f16):
    """Run j (of 8) of the Q4_K block at row[o:]: its quants, [d * sc_j], -dmin * m_j (6-bit sc_j, m_j as ggml's
    get_scale_min_k4)."""
    q = load_bytes(context, builder, row_t, row, builder.add(o, i64(16 + 32 * (j // 2))), 32)
    values = builder.and_(q, splat(builder, 0xF, 32)) if j % 2 == 0 else builder.lshr(q, splat(builder, 4, 32))
    i32 = ir.IntType(32)
    s = [_byte(context, builder, row_t, row, builder.add(o, i64(4 + k))) for k in range(12)]
    c = lambda v: ir.Constant(i32, v)  # noqa: E731
    if j < 4:
        sc, m = builder.and_(s[j], c(63)), builder.and_(s[j + 4], c(63))
    else:
        sc = builder.or_(builder.and_(s[j + 4], c(0xF)), builder.shl(builder.lshr(s[j - 4], c(6)), c(4)))
        m = builder.or_(builder.lshr(s[j + 4], c(4)), builder.shl(builder.lshr(s[j], c(6)), c(4)))
    f32 = ir.FloatType()
    d = half_ir(context, builder, row_t, row, o, f16_t, f16)
    dmin = half_ir(context, builder, row_t, row, builder.add(o, i64(2)), f16_t, f16)
    return values, [builder.fmul(d, builder.uitofp(sc, f32))], builder.fneg(builder.fmul(dmin, builder.uitofp(m, f32)))


def _q6_k_group(context, builder, row_t, row, o, j, f16_t, f16):
    """Run j (of 8) of the Q6_K block at row[o:]: its quants less 32, [d * sc_2j, d * sc_2j+1] (a scale per 16)."""
    n, r = j // 4, j % 4  # values 128 n + 32 r..: ql's low (r < 2) or high nibbles, qh's bits 2r, 2r + 1
    ql = load_bytes(context, builder, row_t, row, builder.add(o, i64(64 * n + 32 * (r % 2))), 32)
    qh = load_bytes(context, builder, row_t, row, builder.add(o, i64(128 + 32 * n)), 32)
    low = builder.and_(builder.lshr(ql, splat(builder, 4 * (r // 2), 32)), splat(builder, 0xF, 32))
    high = builder.shl(builder.and_(builder.lshr(qh, splat(builder, 2 * r, 32)), splat(builder, 3, 32)),
                       splat(builder, 4, 32))
    values = builder.sub(builder.or_(low, high), splat(builder, 32, 32))
    d = half_ir(context, builder, row_t, row, builder.add(o, i64(208)), f16_t, f16)
    scales = []
    for h in range(2):
        sc = builder.load(ptr(context, builder, row_t, row, builder.add(o, i64(192 + 2 * j + h)), ir.IntType(8)))
        scales.append(builder.fmul(d, builder.sitofp(sc, ir.FloatType())))
    return values, scales, None


def _table_group(table, quants_at, scale_at):
    """group function of a 4-bit codebook type: codes at quants_at (16 bytes of group j: low nibbles, then high)
    looked up in table (lookup16), scale scale_at(context, builder, row_t, row, o, j, f16_t, f16)."""
    def group(context, builder, row_t, row, o, j, f16_t, f16):
        codes = _nibbles32(context, builder, row_t, row, builder.add(o, i64(quants_at + 16 * j)))
        scale = scale_at(context, builder, row_t, row, o, j, f16_t, f16)
        return lookup16(context, builder, table, codes), [scale], None
    return group


def _f16_d(context, builder, row_t, row, o, j, f16_t, f16):
    return half_ir(context, builder, row_t, row, o, f16_t, f16)


def _e8m0_d(context, builder, row_t, row, o, j, f16_t, f16):
    """MXFP4's e8m0_half(e) (gemm's x scales come rounded to fp16 for it, as llama.cpp's q8_0)."""
    return e8m0_half_ir(builder, builder.load(ptr(context, builder, row_t, row, o, ir.IntType(8))))


def _iq4_xs_d(context, builder, row_t, row, o, j, f16_t, f16):
    """d * (ls_j - 32) of sub-block j of an IQ4_XS block."""
    ls = builder.extract_element(iq4_xs_scales(context, builder, row_t, row, o), i64(j))
    return builder.fmul(half_ir(context, builder, row_t, row, o, f16_t, f16), builder.sitofp(ls, ir.FloatType()))


def _grid_group(tid, factor):
    """group function of a grid type (tid): sub-block j's grid values with their signs, [d * (2 ls + 1) * factor]
    for each of its scales (one, or one a 16 values: IQ2_XS, IQ2_S, IQ1_M; the block's d * (0.5 + ls) / 4 or / 2,
    as gguf-py's: 0.5 + ls and the powers of two are exact; IQ3_S's d * (1 + 2 ls); IQ1_S's and IQ1_M's d * (2 ls +
    1) / 8 of their values 8 (g + delta))."""
    def group(context, builder, row_t, row, o, j, f16_t, f16):
        values, signs, scales = grid_sub_block(tid, context, builder, row_t, row, o, j)
        f32 = ir.FloatType()
        d = (iq1_m_d if tid == IQ1_M else half_ir)(context, builder, row_t, row, o, f16_t, f16)
        return abs_signed(context, builder, signs, values)[1], [
            builder.fmul(builder.fmul(d, builder.sitofp(s, f32)), ir.Constant(f32, factor)) for s in scales], None
    return group


# type id -> (block bytes, groups of 32 a block, scales a group, has a minimum, group function)
GROUPS = {**{tid: (spec[0], 1, 1, spec[4] is not None, _block32(tid)) for tid, spec in BLOCKS.items()},
          Q4_K: (144, 8, 1, True, _q4_k_group), Q6_K: (210, 8, 2, False, _q6_k_group),
          MXFP4: (17, 1, 1, False, _table_group(MXFP4_TABLE, 1, _e8m0_d)),
          IQ4_NL: (18, 1, 1, False, _table_group(IQ4_NL_TABLE, 2, _f16_d)),
          IQ4_XS: (136, 8, 1, False, _table_group(IQ4_NL_TABLE, 8, _iq4_xs_d)),
          IQ2_XXS: (66, 8, 1, False, _grid_group(IQ2_XXS, 0.125)),
          IQ3_XXS: (98, 8, 1, False, _grid_group(IQ3_XXS, 0.25)),
          IQ3_S: (110, 8, 1, False, _grid_group(IQ3_S, 1.0)),
          IQ2_XS: (74, 8, 2, False, _grid_group(IQ2_XS, 0.125)),
          IQ2_S: (82, 8, 2, False, _grid_group(IQ2_S, 0.125)),
          IQ1_S: (50, 8, 1, False, _grid_group(IQ1_S, 0.125)),
          IQ1_M: (56, 8, 2, False, _grid_group(IQ1_M, 0.125))}


# the grid types (_grid_group's) and the types whose groups of 32 have a scale a 16 values (two halves)
GRID_IDS = (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M)
HALVES_IDS = tuple(tid for tid, (_, _, halves, _, _) in GROUPS.items() if halves == 2)


def _pack(tid):
    """An intrinsic f(w, r0, packed, corrs, scales, mins, f16) that packs rows r0..r0 + ROWS - 1 of w (uint8
    [n_rows, row_bytes] of type tid; rows past the last repeat it) as the module docstring says: packed uint8
    [n_groups * ROWS * 32], corrs int32 and scales float32 [n_groups * halves * ROWS], mins float32
    [n_groups * ROWS] (untouched without a minimum)."""
    block_bytes, n_groups, halves, with_min, group = GROUPS[tid]

    @intrinsic
    def pack(typingctx, w, r0, packed, corrs, scales, mins, f16):
        def codegen(context, builder, sig, args):
            w_t, r0_t, packed_t, corrs_t, scales_t, mins_t, f16_t = sig.args
            w, r0, packed, corrs, scales, mins, f16 = args
            i32, f32 = ir.IntType(32), ir.FloatType()
            rows = cpu_ir.tile_rows(context)
            v8, vr, fr = ir.VectorType(i32, 8), ir.VectorType(i32, rows), ir.VectorType(f32, rows)
            n_rows = builder.extract_value(array_data(context, builder, w_t, w).shape, 0)
            r0 = context.cast(builder, r0, r0_t, types.int64)
            bases, n_blocks = [], None
            for i in range(rows):
                r = builder.add(r0, i64(i))
                r = builder.select(builder.icmp_signed("<", r, n_rows), r, builder.sub(n_rows, i64(1)))
                base, n_blocks = _row_at(context, builder, w_t, w, types.int64, r, block_bytes)
                bases.append(base)

            def body(b, _):
                for j in range(n_groups):
                    values_of, ds, m = [], [fr(ir.Undefined)] * halves, fr(ir.Undefined)
                    for i, base in enumerate(bases):
                        o = builder.add(base, builder.mul(b, i64(block_bytes)))
                        values, row_scales, row_min = group(context, builder, w_t, w, o, j, f16_t, f16)
                        values_of.append(builder.bitcast(values, v8))
                        ds = [builder.insert_element(d, v, i64(i)) for d, v in zip(ds, row_scales)]
                        if with_min:
                            m = builder.insert_element(m, row_min, i64(i))
                    while len(values_of) > 1:  # the rows' vectors of 8 int32 concatenated: lane 8 i + k = row i's 4k..
                        values_of = [shuffle(builder, a, c, range(2 * a.type.count))
                                     for a, c in zip(values_of[0::2], values_of[1::2])]
                    g = builder.add(builder.mul(b, i64(n_groups)), i64(j))
                    biases = [vr([0] * rows)] * halves
                    for k in range(8):
                        vec = shuffle(builder, values_of[0], None, [8 * i + k for i in range(rows)])
                        at = builder.mul(builder.add(builder.mul(g, i64(8)), i64(k)), i64(4 * rows))
                        builder.store(vec, ptr(context, builder, packed_t, packed, at, vr), align=1)
                        h = k * halves // 8
                        biases[h] = dot4(context, builder, biases[h], splat(builder, 128, 4 * rows),
                                         builder.bitcast(vec, ir.VectorType(ir.IntType(8), 4 * rows)))
                    for h in range(halves):
                        at = builder.mul(builder.add(builder.mul(g, i64(halves)), i64(h)), i64(rows))
                        builder.store(builder.sub(vr([0] * rows), biases[h]), ptr(context, builder, corrs_t, corrs, at,
                                                                                  vr), align=4)
                        builder.store(ds[h], ptr(context, builder, scales_t, scales, at, fr), align=4)
                    if with_min:
                        builder.store(m, ptr(context, builder, mins_t, mins, builder.mul(g, i64(rows)), fr), align=4)
                return []

            ir_loop(builder, n_blocks, [], body)
            return context.get_dummy_value()

        return types.void(w, r0, packed, corrs, scales, mins, f16), codegen

    return pack


def _signed_sums(context, builder, packed_t, packed, xq_t, xq, g, xg):
    """[[<8 x i32>]] a token: group g's 8 weight vectors of the packed tile (values up to 128 in size) dotted with
    token j's signed x bytes of the group (xq at 32 xg[j]), on AVX2 without VNNI: x given the values' signs,
    pmaddubsw of |v| by it, pmaddwd by ones, as llama.cpp's x86 Q8_0 dot. A loop over the weight vectors, each
    dotted with every token in turn (its trip count hidden from LLVM, which unrolled it and ordered the work token by
    token: the 8 weights and their 8 |v| then stayed live together, spilled to the stack on AVX2's 16 registers)."""
    i32 = ir.IntType(32)
    b32, v8 = ir.VectorType(ir.IntType(8), 32), ir.VectorType(i32, 8)

    def body(k, sums):
        w = builder.load(ptr(context, builder, packed_t, packed, builder.mul(builder.add(builder.mul(g, i64(8)), k),
                                                                             i64(32)), b32), align=1)
        new = []
        for j, s in enumerate(sums):
            x4 = builder.load(ptr(context, builder, xq_t, xq, builder.add(builder.mul(xg[j], i64(32)),
                                                                          builder.mul(k, i64(4))), i32), align=1)
            operand = abs_signed(context, builder, w, builder.bitcast(splat(builder, x4, 8, 32), b32))
            new.append(dot4_many(context, builder, s, [operand], 128 * 127))
        return new

    eight = builder.asm(ir.FunctionType(ir.IntType(64), [ir.IntType(64)]), "", "=r,0", [i64(8)], False, "opaque")
    return [[s] for s in ir_loop(builder, eight, [v8([0] * 8)] * len(xg), body)]


def _tile(with_min, halves=1, max_abs=128):
    """An intrinsic f(packed, corrs, scales, mins, xu, xd, xds, t0, y): y[j * ROWS + i] = token t0 + j's x8 . row i
    of a packed tile, for j < TOKENS, over all groups. xu uint8 [n_tokens, n_groups * 32]: x's bytes, xq + 128
    (|xq| <= 127), or xq itself where max_abs is 128 (signed_x); xd and xds float32 [n_tokens, n_groups] (xds: xd *
    the sum of xq over the group; read only with_min); halves: scales a group (2: Q6_K's, one a 16); max_abs: the
    largest |packed value| of the types it runs (ir.dot4_many: below 64, AVX2's pmaddubsw of xu where there is no
    VNNI). At 128 (Q8_0, IQ4_NL, IQ4_XS), without VNNI but with AVX2 (signed_x), the tile dots xq with the values'
    signs moved onto it (_signed_sums), as llama.cpp's x86 Q8_0 dot does: generic IR (bytes widened to int32) made
    IQ4_XS's prompt 3x slower than dequantizing to BLAS on the AVX2-only 2-core VM; xq rather than xu ^ 0x80 made
    the tile 1.4x faster there (the xor, done narrow before the splat, cost two vector ops of six); elsewhere (VNNI,
    generic IR) it takes xu as the other tiles."""

    @intrinsic
    def tile(typingctx, packed, corrs, scales, mins, xu, xd, xds, t0, y):
        def codegen(context, builder, sig, args):
            packed_t, corrs_t, scales_t, mins_t, xu_t, xd_t, xds_t, t0_t, y_t = sig.args
            packed, corrs, scales, mins, xu, xd, xds, t0, y = args
            i8, i32, f32 = ir.IntType(8), ir.IntType(32), ir.FloatType()
            # through the module, as ir's own helpers look them up: a test's patch of the path reaches this
            rows = cpu_ir.tile_rows(context)
            vr, fr, br = ir.VectorType(i32, rows), ir.VectorType(f32, rows), ir.VectorType(i8, 4 * rows)
            signed_dots = max_abs == 128 and signed_x(context)  # AVX2 without VNNI: rows is 8
            n_groups = builder.extract_value(array_data(context, builder, xd_t, xd).shape, 1)
            t0 = context.cast(builder, t0, t0_t, types.int64)
            rows_of = [builder.mul(builder.add(t0, i64(j)), n_groups) for j in range(TOKENS)]  # flat xd index of g 0

            def body(g, accs):
                at = [builder.mul(builder.add(builder.mul(g, i64(halves)), i64(h)), i64(rows)) for h in range(halves)]
                corr = [builder.load(ptr(context, builder, corrs_t, corrs, a, vr), align=4) for a in at]
                d = [builder.load(ptr(context, builder, scales_t, scales, a, fr), align=4) for a in at]
                if with_min:
                    m = builder.load(ptr(context, builder, mins_t, mins, builder.mul(g, i64(rows)), fr), align=4)
                xg = [builder.add(rows_of[j], g) for j in range(TOKENS)]  # token j's group g in xd, xds; 32 xg: xu
                if signed_dots:
                    sums = _signed_sums(context, builder, packed_t, packed, xu_t, xu, g, xg)
                else:
                    weights = [builder.load(ptr(context, builder, packed_t, packed, builder.mul(builder.add(
                        builder.mul(g, i64(8)), i64(k)), i64(4 * rows)), br), align=1) for k in range(8)]
                    sums = []
                    for j in range(TOKENS):  # a splat of 4 bytes of x as one int32: against every row's 4 values k
                        x4 = [builder.load(ptr(context, builder, xu_t, xu, builder.add(builder.mul(xg[j], i64(32)),
                                                                                       i64(4 * k)), i32), align=1)
                              for k in range(8)]
                        operands = [(builder.bitcast(splat(builder, x4[k], rows, 32), br), weights[k])
                                    for k in range(8)]
                        sums.append([dot4_many(context, builder, corr[h], operands[8 * h // halves:8 * (h + 1) //
                                                                                   halves], 255 * max_abs)
                                     for h in range(halves)])
                new = []
                for j, acc in enumerate(accs):
                    xd_g = splat_f(builder, builder.load(builder.gep(array_data(context, builder, xd_t, xd).data,
                                                                     [xg[j]])), rows)
                    for h in range(halves):
                        acc = fma(builder, builder.sitofp(sums[j][h], fr), builder.fmul(d[h], xd_g), acc)
                    if with_min:
                        xs = builder.load(builder.gep(array_data(context, builder, xds_t, xds).data, [xg[j]]))
                        acc = fma(builder, m, splat_f(builder, xs, rows), acc)
                    new.append(acc)
                return new

            totals = ir_loop(builder, n_groups, [fr([0.0] * rows)] * TOKENS, body)
            for j, total in enumerate(totals):
                builder.store(total, ptr(context, builder, y_t, y, i64(j * rows), fr), align=4)
            return context.get_dummy_value()

        return types.void(packed, corrs, scales, mins, xu, xd, xds, t0, y), codegen

    return tile


@intrinsic
def amax32(typingctx, x, t, at):
    """max |x[t, at:at + 32]| of a C-contiguous float32 [n_tokens, n_cols] x, in one vector (numba's scalar loop
    of max and abs did not vectorize: quantize_biased's 128 x 1024 took 55-72 us on 2 cores, with this and
    quantize32 9-12)."""
    def codegen(context, builder, sig, args):
        x_t, t_t, at_t = sig.args
        f32v = ir.VectorType(ir.FloatType(), 32)
        values = builder.load(ptr(context, builder, x_t, args[0], _flat(context, builder, sig, args), f32v), align=4)
        return call(builder, "llvm.vector.reduce.fmax.v32f32", ir.FloatType(),
                    [call(builder, "llvm.fabs.v32f32", f32v, [values])])
    return types.float32(x, t, at), codegen


@intrinsic
def quantize32(typingctx, x, t, at, inv, bias, xu):
    """xu[t, at:at + 32] = rint(x[t, at:at + 32] * inv) + bias as bytes (x C-contiguous float32, xu uint8, both
    [n_tokens, n_cols]); returns the sum of the rounded values (int64). rint rounds half to even, as np.rint."""
    def codegen(context, builder, sig, args):
        x_t, t_t, at_t, inv_t, bias_t, xu_t = sig.args
        x, _, _, inv, bias, xu = args
        f32v, i32v = ir.VectorType(ir.FloatType(), 32), ir.VectorType(ir.IntType(32), 32)
        at = _flat(context, builder, sig, args)
        values = builder.load(ptr(context, builder, x_t, x, at, f32v), align=4)
        q = builder.fptosi(call(builder, "llvm.rint.v32f32", f32v, [builder.fmul(values, splat_f(builder, inv, 32))]),
                           i32v)
        biased = builder.add(q, splat(builder, context.cast(builder, bias, bias_t, types.int64), 32, 32))
        builder.store(builder.trunc(biased, ir.VectorType(ir.IntType(8), 32)),
                      ptr(context, builder, xu_t, xu, at, ir.VectorType(ir.IntType(8), 32)), align=1)
        return builder.sext(call(builder, "llvm.vector.reduce.add.v32i32", ir.IntType(32), [q]), ir.IntType(64))
    return types.int64(x, t, at, inv, bias, xu), codegen


def _flat(context, builder, sig, args):
    """The flat index of [t, at] in args[0], a C-contiguous 2-d array (args: x, t, at, ...)."""
    x_t, t_t, at_t = sig.args[:3]
    n_cols = builder.extract_value(array_data(context, builder, x_t, args[0]).shape, 1)
    return builder.add(builder.mul(context.cast(builder, args[1], t_t, types.int64), n_cols),
                       context.cast(builder, args[2], at_t, types.int64))


pack_q4_0, pack_q4_1, pack_q5_0, pack_q5_1, pack_q8_0, pack_q4_k, pack_q6_k, pack_mxfp4, pack_iq4_nl, pack_iq4_xs = (
    _pack(tid) for tid in (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K, MXFP4, IQ4_NL, IQ4_XS))
pack_iq2_xxs, pack_iq3_xxs, pack_iq3_s, pack_iq2_xs, pack_iq2_s, pack_iq1_s, pack_iq1_m = (
    _pack(t) for t in (IQ2_XXS, IQ3_XXS, IQ3_S, IQ2_XS, IQ2_S, IQ1_S, IQ1_M))
# the packed values' largest size: Q4_1, Q4_K 15, Q5_1 31 (with a minimum); Q4_0 8, Q5_0 16, MXFP4 12; Q6_K 32;
# Q8_0 128, IQ4_NL and IQ4_XS 127 (tile_q8_0: SIGNED_X_IDS, x given as xq where signed_x); IQ2_XXS 43, IQ3_XXS 62,
# IQ3_S 15, IQ1_S 9 (tile_grid); IQ2_XS, IQ2_S 43, IQ1_M 9, a scale a 16 (tile_grid_halves)
tile_with_min, tile_no_min, tile_halves = _tile(True, max_abs=31), _tile(False, max_abs=16), _tile(False, 2, 32)
tile_q8_0, tile_grid, tile_grid_halves = _tile(False), _tile(False, max_abs=62), _tile(False, 2, 62)
