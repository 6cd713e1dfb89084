"""The IQ grid types' sub-blocks of 32 values as LLVM vector IR (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S,
IQ1_M): grid_sub_block gives the values' sizes, their signs and their scales, which the row dots (dot_int8's
_grid_block) and the GEMM's packs (gemm_int8's _grid_group) both take. Each gathers its grid entries from a
constant table (ir.gather), as ggml's x86 dots build theirs with _mm256_set_epi64x; block layouts: models/dequant_iq.py.
"""
import numpy as np
from llvmlite import ir

from kernels.cpu.ir import array_data, constant_table, gather, i64, load_bytes, ptr, shuffle, splat
from kernels.cpu.types import IQ1_M, IQ1_S, IQ2_S, IQ2_XS, IQ2_XXS, IQ3_S, IQ3_XXS
from models.iq_grids import GRIDS, KSIGNS

# numba's cache keys the kernels that inline this on their own files: kernels/cpu/cache.py (INLINED, INLINED_DIGEST)
INLINED = ("types", "ir", "models.iq_grids")
INLINED_DIGEST = "975f63b2336d0a01"


# ggml's keven_signs_q2xs: KSIGNS[i]'s 8 sign bits as 8 bytes, 0xFF (minus) or 1, for psignb; as int64 words
SIGN_BYTES = np.where((KSIGNS[:, None] >> np.arange(8)) & 1, 0xFF, 1).astype(np.uint8).view("<i8").ravel().tolist()
# grid type -> (its grid's entries as little-endian words: 8 values of IQ2_XXS in an int64, 4 of IQ3_XXS in an
# int32; the byte offsets in a block of sub-block j's grid indices, and of its u32 of 4 x 7 sign bits and a scale)
GRID_SUBS = {IQ2_XXS: (GRIDS["IQ2_XXS"].view("<i8").ravel().tolist(), lambda j: 2 + 8 * j, lambda j: 6 + 8 * j),
             IQ3_XXS: (GRIDS["IQ3_XXS"].view("<i4").ravel().tolist(), lambda j: 2 + 8 * j, lambda j: 66 + 4 * j)}
# the grids of the other grid types as little-endian words: 512 entries of 8 values (IQ2_XS), 1024 of 8 (IQ2_S),
# 512 of 4 (IQ3_S)
IQ2_XS_GRID = GRIDS["IQ2_XS"].view("<i8").ravel().tolist()
IQ2_S_GRID = GRIDS["IQ2_S"].view("<i8").ravel().tolist()
IQ3_S_GRID = GRIDS["IQ3_S"].view("<i4").ravel().tolist()
# IQ1_S's 2048 entries of 8 values g (-1, 0, 1) times 8, as little-endian int64 words
IQ1_GRID8 = (GRIDS["IQ1_S"].astype(np.int8) * 8).view("<i8").ravel().tolist()


def grid_sub_block(tid, context, builder, row_t, row, o, j):
    """(<32 x i8> values' sizes, <32 x i8> with the values' signs (+1 or -1, or the values themselves where none is
    0), [i16 2 ls + 1] for its one scale or each 16 values') of sub-block j (32 values) of the grid-type (tid)
    block at row[o:]. IQ2_XXS, IQ3_XXS: its grid entries' values (unsigned: 8, 25, 43 / 4..62), the signs of its
    u32's 4 x 7 bits (ggml's keven_signs_q2xs: the 8th is their parity) and its 4-bit scale ls from the u32's top,
    which ggml's dots take as 2 ls + 1 (the block's d * (0.5 + ls) / 4 or / 2 = d * (2 ls + 1) / 8 or / 4); the
    others: _iq2_xs_sub_block, _iq2_s_sub_block, _iq3_s_sub_block, _iq1_s_sub_block, _iq1_m_sub_block."""
    if tid == IQ1_S:
        return _iq1_s_sub_block(context, builder, row_t, row, o, j)
    if tid == IQ1_M:
        return _iq1_m_sub_block(context, builder, row_t, row, o, j)
    if tid == IQ3_S:
        return _iq3_s_sub_block(context, builder, row_t, row, o, j)
    if tid == IQ2_S:
        return _iq2_s_sub_block(context, builder, row_t, row, o, j)
    if tid == IQ2_XS:
        return _iq2_xs_sub_block(context, builder, row_t, row, o, j)
    entries, index_at, word_at = GRID_SUBS[tid]
    i32, i64t = ir.IntType(32), ir.IntType(64)
    n = 32 // (8 if tid == IQ2_XXS else 4)  # entries a sub-block
    idx = load_bytes(context, builder, row_t, row, builder.add(o, i64(index_at(j))), n)
    grid = constant_table(builder, f"grid_{tid}", entries, 64 if tid == IQ2_XXS else 32)
    values = gather(builder, grid, [builder.zext(builder.extract_element(idx, i64(k)), i64t) for k in range(n)])
    word = builder.load(ptr(context, builder, row_t, row, builder.add(o, i64(word_at(j))), i32), align=1)
    sign_idx = [builder.zext(builder.and_(builder.lshr(word, i32(7 * k)), i32(127)), i64t) for k in range(4)]
    signs = gather(builder, constant_table(builder, "ksigns_bytes", SIGN_BYTES, 64), sign_idx)
    b32 = ir.VectorType(ir.IntType(8), 32)
    scale = builder.trunc(builder.add(builder.shl(builder.lshr(word, i32(28)), i32(1)), i32(1)), ir.IntType(16))
    return builder.bitcast(values, b32), builder.bitcast(signs, b32), [scale]


def _byte_at(context, builder, row_t, row, off, ty):
    """row[off] zero-extended to the integer type ty."""
    return builder.zext(builder.load(ptr(context, builder, row_t, row, off, ir.IntType(8))), ty)


def _sign_bits(builder, word):
    """<32 x i8>: +1 or -1 (bit v of the i32 word set) for each value v of a sub-block: each of the word's bytes
    spread over 8 lanes, tested against that lane's bit (a byte shuffle, an and and a compare, as ggml's x86 dots
    expand IQ2_S's and IQ3_S's sign bytes)."""
    i8 = ir.IntType(8)
    b32 = ir.VectorType(i8, 32)
    spread = shuffle(builder, builder.bitcast(word, ir.VectorType(i8, 4)), None, [v // 8 for v in range(32)])
    bit = builder.and_(spread, b32([1 << (v % 8) for v in range(32)]))
    minus = builder.sext(builder.icmp_unsigned("!=", bit, splat(builder, 0, 32)), b32)
    return builder.or_(minus, splat(builder, 1, 32))


def _nibble_scales(builder, sc, i32):
    """[2 lo + 1, 2 hi + 1] as i16 of the low and high nibble of the i32 byte value sc."""
    return [builder.trunc(builder.add(builder.shl(builder.and_(builder.lshr(sc, i32(4 * h)), i32(15)), i32(1)),
                                      i32(1)), ir.IntType(16)) for h in range(2)]


def _iq2_xs_sub_block(context, builder, row_t, row, o, j):
    """grid_sub_block of IQ2_XS (d | qs u16[32] | scales[8]): 4 u16 at qs[4j], each a 9-bit index of an 8-value
    entry (8, 25, 43) and 7 sign bits (keven_signs_q2xs, as IQ2_XXS's); scales[j]'s low nibble for values 0-15, its
    high one for 16-31."""
    i32, i64t = ir.IntType(32), ir.IntType(64)
    words = [builder.zext(builder.load(ptr(context, builder, row_t, row, builder.add(o, i64(2 + 8 * j + 2 * k)),
                                           ir.IntType(16)), align=1), i64t) for k in range(4)]
    values = gather(builder, constant_table(builder, "grid_iq2_xs", IQ2_XS_GRID, 64),
                    [builder.and_(w, i64(511)) for w in words])
    signs = gather(builder, constant_table(builder, "ksigns_bytes", SIGN_BYTES, 64),
                   [builder.lshr(w, i64(9)) for w in words])
    b32 = ir.VectorType(ir.IntType(8), 32)
    scales = _nibble_scales(builder, _byte_at(context, builder, row_t, row, builder.add(o, i64(66 + j)), i32), i32)
    return builder.bitcast(values, b32), builder.bitcast(signs, b32), scales


def _iq2_s_sub_block(context, builder, row_t, row, o, j):
    """grid_sub_block of IQ2_S (d | qs[32] | signs[32] | qh[8] | scales[8]): 4 entries of a 1024-entry grid of 8
    values (8, 25, 43), entry l's index qs[4j + l] with bits 2l, 2l + 1 of qh[j] as its ninth and tenth; the 32 sign
    bits of the u32 at signs[4j], one a value; scales[j]'s low nibble for values 0-15, its high one for 16-31."""
    i32, i64t = ir.IntType(32), ir.IntType(64)
    idx = load_bytes(context, builder, row_t, row, builder.add(o, i64(2 + 4 * j)), 4)
    qh = _byte_at(context, builder, row_t, row, builder.add(o, i64(66 + j)), i64t)
    indices = [builder.or_(builder.zext(builder.extract_element(idx, i64(k)), i64t),
                           builder.shl(builder.and_(builder.lshr(qh, i64(2 * k)), i64(3)), i64(8))) for k in range(4)]
    values = gather(builder, constant_table(builder, "grid_iq2_s", IQ2_S_GRID, 64), indices)
    word = builder.load(ptr(context, builder, row_t, row, builder.add(o, i64(34 + 4 * j)), i32), align=1)
    scales = _nibble_scales(builder, _byte_at(context, builder, row_t, row, builder.add(o, i64(74 + j)), i32), i32)
    return builder.bitcast(values, ir.VectorType(ir.IntType(8), 32)), _sign_bits(builder, word), scales


def _iq3_s_sub_block(context, builder, row_t, row, o, j):
    """grid_sub_block of IQ3_S (d | qs[64] | qh[8] | signs[32] | scales[4]): 8 grid entries of 4 values (1..15),
    entry k's index qs[8j + k] with bit k of qh[j] as its ninth; the 32 sign bits of the u32 at signs[4j], one a
    value; ls a nibble of scales[j / 2] (low for even j), taken as 2 ls + 1 (ggml's d * (1 + 2 ls))."""
    i32, i64t = ir.IntType(32), ir.IntType(64)
    idx = load_bytes(context, builder, row_t, row, builder.add(o, i64(2 + 8 * j)), 8)
    qh = _byte_at(context, builder, row_t, row, builder.add(o, i64(66 + j)), i64t)
    indices = [builder.or_(builder.zext(builder.extract_element(idx, i64(k)), i64t),
                           builder.shl(builder.and_(builder.lshr(qh, i64(k)), i64(1)), i64(8))) for k in range(8)]
    values = gather(builder, constant_table(builder, "grid_iq3_s", IQ3_S_GRID, 32), indices)
    word = builder.load(ptr(context, builder, row_t, row, builder.add(o, i64(74 + 4 * j)), i32), align=1)
    sc = _byte_at(context, builder, row_t, row, builder.add(o, i64(106 + j // 2)), i32)
    scale = _nibble_scales(builder, sc, i32)[j % 2]
    return builder.bitcast(values, ir.VectorType(ir.IntType(8), 32)), _sign_bits(builder, word), [scale]


def _iq1_values(builder, indices, delta):
    """(|v|, v) of v = 8 g + delta (<32 x i8>: +-1 each), g the 8 values of each of the 4 IQ1 grid entries at
    indices."""
    g8 = builder.bitcast(gather(builder, constant_table(builder, "grid_iq1_8", IQ1_GRID8, 64), indices),
                         ir.VectorType(ir.IntType(8), 32))
    v = builder.add(g8, delta)
    zero = splat(builder, 0, 32)
    return builder.select(builder.icmp_signed("<", v, zero), builder.sub(zero, v), v), v


def _iq1_s_sub_block(context, builder, row_t, row, o, j):
    """grid_sub_block of IQ1_S (d | qs[32] | qh u16[8]): 4 entries of a 2048-entry grid of 8 values g (-1, 0, 1),
    entry l's index qs[4j + l] with bits 3l..3l + 2 of qh[j] as its top three; the sub-block's delta +-1/8 (bit 15 of
    qh[j]: minus) and ls (bits 12-14). Its values come as v = 8 (g + delta) (+-9, +-7, +-1: none 0, so v carries its
    own sign) with 2 ls + 1, the block's d * (2 ls + 1) / 8 its factor: d (2 ls + 1) (g + delta) in integer sums,
    as ggml's dot sums g . x and delta's sum of x."""
    i8, i64t = ir.IntType(8), ir.IntType(64)
    idx = load_bytes(context, builder, row_t, row, builder.add(o, i64(2 + 4 * j)), 4)
    qh = builder.zext(builder.load(ptr(context, builder, row_t, row, builder.add(o, i64(34 + 2 * j)), ir.IntType(16)),
                                   align=1), i64t)
    indices = [builder.or_(builder.zext(builder.extract_element(idx, i64(k)), i64t),
                           builder.shl(builder.and_(builder.lshr(qh, i64(3 * k)), i64(7)), i64(8))) for k in range(4)]
    minus = builder.icmp_unsigned("!=", builder.and_(qh, i64(0x8000)), i64(0))
    delta = splat(builder, builder.select(minus, ir.Constant(i8, -1), ir.Constant(i8, 1)), 32)
    size, v = _iq1_values(builder, indices, delta)
    scale = builder.trunc(builder.add(builder.shl(builder.and_(builder.lshr(qh, i64(12)), i64(7)), i64(1)), i64(1)),
                          ir.IntType(16))
    return size, v, [scale]


def _iq1_m_sub_block(context, builder, row_t, row, o, j):
    """grid_sub_block of IQ1_M (qs[32] | qh[16] | scales u16[4]): IQ1_S's grid, entry l's index qs[4j + l] with the
    low 3 bits of its qh nibble (qh[2j + l / 2], low nibble for even l) as its top three, the nibble's bit 3 the sign
    of its own delta; 3-bit scales at bits 6 (j % 2) and 6 (j % 2) + 3 of scales[j / 2] for values 0-15 and 16-31.
    Values 8 (g + delta) as IQ1_S's; the block's d is iq1_m_d."""
    i8, i32, i64t = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    idx = load_bytes(context, builder, row_t, row, builder.add(o, i64(4 * j)), 4)
    qh = [_byte_at(context, builder, row_t, row, builder.add(o, i64(32 + 2 * j + h)), i64t) for h in range(2)]
    nibbles = [builder.and_(builder.lshr(qh[k // 2], i64(4 * (k % 2))), i64(15)) for k in range(4)]
    indices = [builder.or_(builder.zext(builder.extract_element(idx, i64(k)), i64t),
                           builder.shl(builder.and_(nibbles[k], i64(7)), i64(8))) for k in range(4)]
    deltas = [splat(builder, builder.select(builder.icmp_unsigned("!=", builder.and_(n, i64(8)), i64(0)),
                                            ir.Constant(i8, -1), ir.Constant(i8, 1)), 8) for n in nibbles]
    size, v = _iq1_values(builder, indices, shuffle(builder, shuffle(builder, deltas[0], deltas[1], range(16)),
                                                    shuffle(builder, deltas[2], deltas[3], range(16)), range(32)))
    sc = builder.zext(builder.load(ptr(context, builder, row_t, row, builder.add(o, i64(48 + 2 * (j // 2))),
                                       ir.IntType(16)), align=1), i32)
    scales = [builder.trunc(builder.add(builder.shl(builder.and_(builder.lshr(sc, i32(6 * (j % 2) + 3 * h)), i32(7)),
                                                    i32(1)), i32(1)), ir.IntType(16)) for h in range(2)]
    return size, v, scales


def iq1_m_d(context, builder, row_t, row, o, f16_t, f16):
    """IQ1_M's block scale: the fp16 whose four nibbles are the top nibbles of its scales u16[4] (at 48), lowest
    first, looked up in the table f16."""
    words = [builder.zext(builder.load(ptr(context, builder, row_t, row, builder.add(o, i64(48 + 2 * k)),
                                           ir.IntType(16)), align=1), ir.IntType(64)) for k in range(4)]
    bits = builder.lshr(words[0], i64(12))
    for k in range(1, 4):
        bits = builder.or_(bits, builder.and_(builder.lshr(words[k], i64(12 - 4 * k)), i64(0xF << (4 * k))))
    return builder.load(builder.gep(array_data(context, builder, f16_t, f16).data, [bits]))
