"""LLVM IR building blocks of the CPU's integer dots (dot_int8): loads, splats, shuffles, x86 pmaddubsw +
pmaddwd (or the same sums in generic IR), a counted loop. Plain Python run while numba compiles an intrinsic:
what they emit is part of the kernels that use them, so an edit here must reach those files (cache.py).
"""
from llvmlite import ir


def i64(v):
    return ir.Constant(ir.IntType(64), v)


def load(context, builder, arr_type, arr, off, lanes, bits=8):
    """<lanes x i{bits}> from a 1-d array at element off (an array of that width)."""
    ptr = builder.gep(context.make_array(arr_type)(context, builder, arr).data, [off])
    return builder.load(builder.bitcast(ptr, ir.VectorType(ir.IntType(bits), lanes).as_pointer()), align=1)


def load_bytes(context, builder, arr_type, arr, off, lanes):
    """<lanes x i8> from arr[off:off + lanes] (a 1-d uint8 or int8 array)."""
    return load(context, builder, arr_type, arr, off, lanes)


def splat(builder, value, lanes, bits=8):
    """<lanes x i{bits}> of the integer value (an ir value or a Python int)."""
    vec = ir.VectorType(ir.IntType(bits), lanes)
    if isinstance(value, int):
        return vec([value] * lanes)
    v = builder.trunc(value, ir.IntType(bits)) if value.type.width > bits else value
    return builder.shuffle_vector(builder.insert_element(vec(ir.Undefined), v, ir.Constant(ir.IntType(32), 0)),
                                  vec(ir.Undefined), ir.VectorType(ir.IntType(32), lanes)([0] * lanes))


def shuffle(builder, a, b, idx):
    """The lanes idx of a ++ b (b None: of a alone)."""
    return builder.shuffle_vector(a, b if b is not None else a.type(ir.Undefined),
                                  ir.VectorType(ir.IntType(32), len(idx))(list(idx)))


def call(builder, name, ret, args):
    fn = builder.module.globals.get(name) or ir.Function(builder.module, ir.FunctionType(ret, [a.type for a in args]),
                                                         name=name)
    return builder.call(fn, args)


def prefetch(context, builder, arr_type, arr, off):
    """A hint to fetch the cache line of arr[off] (a 1-d byte array; off may lie past its end: a prefetch never
    faults)."""
    ptr = builder.gep(context.make_array(arr_type)(context, builder, arr).data, [off])
    i32 = ir.IntType(32)
    call(builder, "llvm.prefetch.p0i8", ir.VoidType(), [builder.bitcast(ptr, ir.IntType(8).as_pointer()),
                                                        i32(0), i32(3), i32(1)])


def fold(builder, vec):
    """Its first half plus its second half: <n/2 x iN> of an <n x iN>, lanes summing to the same."""
    n = vec.type.count
    return builder.add(shuffle(builder, vec, None, range(n // 2)), shuffle(builder, vec, None, range(n // 2, n)))


def madd(builder, a, b):
    """<n/2 x i32>: a[2k] * b[2k] + a[2k + 1] * b[2k + 1] for <n x i16> a, b (pmaddwd)."""
    wide = ir.VectorType(ir.IntType(32), a.type.count)
    return pairs(builder, builder.mul(builder.sext(a, wide), builder.sext(b, wide)))


def pairs(builder, vec):
    """Even plus odd lanes of vec: <n/2 x iN> of an <n x iN>."""
    n = vec.type.count
    return builder.add(shuffle(builder, vec, None, range(0, n, 2)), shuffle(builder, vec, None, range(1, n, 2)))


def simd(context):
    """"avx512bw", "avx2" or "" (none): the widest pmaddubsw of the CPU the code is compiled for (the host, or
    NUMBA_CPU_NAME and NUMBA_CPU_FEATURES)."""
    features = context.codegen()._tm_features
    return next((s for s in ("avx512bw", "avx2") if "+" + s in features), "")


def madd_scaled(context, builder, quants, xq, scales):
    """<16 x i32>: lane k = scales[2k] * (q.x of values 4k, 4k+1) + scales[2k+1] * (q.x of values 4k+2, 4k+3)
    for quants <64 x i8> (unsigned, < 64; or <= 128 where |xq| <= 127: abs_signed's), xq <64 x i8> (signed),
    scales <32 x i16>.

    The x86 pmaddubsw + pmaddwd pair, 512 bits wide with AVX-512 BW, twice 256 with AVX2, else the same sums
    in generic IR. pmaddubsw saturates its int16 pair sums, never here: 2 * 63 * 128, 2 * 128 * 127 < 32767."""
    widest = simd(context)
    i16, i32 = ir.IntType(16), ir.IntType(32)
    if widest == "avx512bw":
        pair_sums = call(builder, "llvm.x86.avx512.pmaddubs.w.512", ir.VectorType(i16, 32), [quants, xq])
        return call(builder, "llvm.x86.avx512.pmaddw.d.512", ir.VectorType(i32, 16), [pair_sums, scales])
    if widest == "avx2":
        halves = []
        for h in (range(0, 32), range(32, 64)):
            pair_sums = call(builder, "llvm.x86.avx2.pmadd.ub.sw", ir.VectorType(i16, 16),
                             [shuffle(builder, quants, None, h), shuffle(builder, xq, None, h)])
            halves.append(call(builder, "llvm.x86.avx2.pmadd.wd", ir.VectorType(i32, 8),
                               [pair_sums, shuffle(builder, scales, None, range(h.start // 2, h.stop // 2))]))
        return shuffle(builder, halves[0], halves[1], range(16))
    products = builder.mul(builder.zext(quants, ir.VectorType(i16, 64)), builder.sext(xq, ir.VectorType(i16, 64)))
    scaled = builder.mul(builder.sext(pairs(builder, products), ir.VectorType(i32, 32)),
                         builder.sext(scales, ir.VectorType(i32, 32)))
    return pairs(builder, scaled)


def constant_table(builder, name, values, bits):
    """The module's global constant array of the ints values, iN each (a grid or sign table an intrinsic gathers
    from; made once a module)."""
    table = builder.module.globals.get(name)
    if table is None:
        ty = ir.ArrayType(ir.IntType(bits), len(values))
        table = ir.GlobalVariable(builder.module, ty, name)
        table.initializer = ty([int(v) for v in values])
        table.global_constant = True
        table.linkage = "internal"
    return table


def gather(builder, table, indices):
    """<len(indices) x iN>: table[i] for each i64 ir value i of indices, a scalar load each (as ggml's x86 dots
    build their grid vectors, _mm256_set_epi64x of table entries)."""
    vec = ir.VectorType(table.type.pointee.element, len(indices))(ir.Undefined)
    for lane, i in enumerate(indices):
        vec = builder.insert_element(vec, builder.load(builder.gep(table, [i64(0), i])), i64(lane))
    return vec


def array_data(context, builder, arr_t, arr):
    return context.make_array(arr_t)(context, builder, arr)


def ptr(context, builder, arr_t, arr, off, ty):
    """A pointer of type ty* to element off of a C-contiguous array (a flat index over all its dimensions)."""
    return builder.bitcast(builder.gep(array_data(context, builder, arr_t, arr).data, [off]), ty.as_pointer())


def fma(builder, a, b, c):
    """a * b + c, fused, for <n x float> vectors."""
    return call(builder, f"llvm.fma.v{a.type.count}f32", a.type, [a, b, c])


def half_ir(context, builder, row_t, row, off, f16_t, f16):
    """float32 of the little-endian IEEE half at row[off:off + 2] (an i64), looked up in the table f16."""
    ptr = builder.gep(array_data(context, builder, row_t, row).data, [off])
    ptr = builder.bitcast(ptr, ir.IntType(16).as_pointer())
    bits = builder.zext(builder.load(ptr, align=1), ir.IntType(64))
    return builder.load(builder.gep(array_data(context, builder, f16_t, f16).data, [bits]))


def splat_f(builder, value, lanes):
    """<lanes x float> of the float ir value."""
    vec = ir.VectorType(ir.FloatType(), lanes)
    return builder.shuffle_vector(builder.insert_element(vec(ir.Undefined), value, ir.Constant(ir.IntType(32), 0)),
                                  vec(ir.Undefined), ir.VectorType(ir.IntType(32), lanes)([0] * lanes))


def fsum(builder, vec):
    """The float sum of the lanes of a <n x float> (n a power of two), by halves."""
    while vec.type.count > 1:
        n = vec.type.count
        vec = builder.fadd(shuffle(builder, vec, None, range(n // 2)), shuffle(builder, vec, None, range(n // 2, n)))
    return builder.extract_element(vec, i64(0))


def ir_loop(builder, n, starts, body):
    """A counted loop in IR: values = body(i, values) for i in range(n) (an i64), from starts; returns the values
    after it (starts when n is 0). The phis of the loop and of its exit lead their blocks, as LLVM requires."""
    entry = builder.block
    loop, done = builder.append_basic_block("loop"), builder.append_basic_block("done")
    builder.cbranch(builder.icmp_signed(">", n, i64(0)), loop, done)
    builder.position_at_end(loop)
    i = builder.phi(ir.IntType(64))
    values = [builder.phi(start.type) for start in starts]
    new = body(i, values)
    i_next = builder.add(i, i64(1))
    last = builder.block
    for phi, start, value in zip([i, *values], [i64(0), *starts], [i_next, *new]):
        phi.add_incoming(start, entry)
        phi.add_incoming(value, last)
    builder.cbranch(builder.icmp_signed("<", i_next, n), loop, done)
    builder.position_at_end(done)
    finals = [builder.phi(start.type) for start in starts]
    for phi, start, value in zip(finals, starts, new):
        phi.add_incoming(start, entry)
        phi.add_incoming(value, last)
    return finals


def vnni(context) -> bool:
    """Whether the CPU the code is compiled for has 256-bit vpdpbusd (AVX-512 VNNI with VL)."""
    features = context.codegen()._tm_features
    return "+avx512vnni" in features and "+avx512vl" in features


def tile_rows(context) -> int:
    """Rows of the prompt GEMM's register tile (gemm_int8; one int32 lane a row): 16, a 512-bit vector, where there
    is AVX-512 VNNI, else 8. The 512-bit vpdpbusd does twice the 256-bit one's products at the same rate on the
    AVX-512 VNNI VM measured (AMD EPYC, 2 cores: 8.5 G instructions/s a core either width)."""
    return 16 if simd(context) == "avx512bw" and vnni(context) else 8


def dot4(context, builder, acc, unsigned, signed):
    """<n x i32>: acc + in lane k the sum of unsigned[4k + l] * signed[4k + l] over l < 4, for <4n x i8> operands,
    n 8 or 16 (vpdpbusd where there is AVX-512 VNNI; else the same sums in generic IR, which never saturate, as
    AVX2's pmaddubsw would: 2 * 255 * 127 > 32767)."""
    i32 = ir.IntType(32)
    n = unsigned.type.count // 4
    vn = ir.VectorType(i32, n)
    if vnni(context):
        return call(builder, f"llvm.x86.avx512.vpdpbusd.{32 * n}", vn,
                    [acc, builder.bitcast(unsigned, vn), builder.bitcast(signed, vn)])
    wide = ir.VectorType(i32, 4 * n)
    products = builder.mul(builder.zext(unsigned, wide), builder.sext(signed, wide))
    for _ in range(2):  # pairs, then pairs of pairs
        products = builder.add(shuffle(builder, products, None, range(0, products.type.count, 2)),
                               shuffle(builder, products, None, range(1, products.type.count, 2)))
    return builder.add(acc, products)


def madd32(context, builder, quants, xq):
    """<8 x i32>: lane k = the sum of quants[l] * xq[l] for l in 4k..4k + 3, quants <32 x i8> unsigned (< 64),
    xq <32 x i8> signed: one vpdpbusd with AVX-512 VNNI, else pmaddubsw + pmaddwd by ones where there is AVX2,
    else generic IR (all the same sums: pmaddubsw's pair sums never saturate here)."""
    i16, i32 = ir.IntType(16), ir.IntType(32)
    if simd(context) == "avx512bw" and vnni(context):
        return dot4(context, builder, ir.VectorType(i32, 8)([0] * 8), quants, xq)
    if simd(context):
        pair_sums = call(builder, "llvm.x86.avx2.pmadd.ub.sw", ir.VectorType(i16, 16), [quants, xq])
        ones = ir.VectorType(i16, 16)([1] * 16)
        return call(builder, "llvm.x86.avx2.pmadd.wd", ir.VectorType(i32, 8), [pair_sums, ones])
    products = builder.mul(builder.zext(quants, ir.VectorType(i16, 32)), builder.sext(xq, ir.VectorType(i16, 32)))
    return pairs(builder, builder.sext(pairs(builder, products), ir.VectorType(i32, 16)))


def dot4_many(context, builder, acc, operands, max_product):
    """<n x i32>: acc + the dot4 sums of every (unsigned, signed) pair of <4n x i8> in operands (n 8, or 16 with
    VNNI), where no product of an unsigned byte and a signed one exceeds max_product in size (a matvec's 4-bit quants
    against x: 15 * 128).

    vpdpbusd a pair with AVX-512 VNNI. Without it, where there is AVX2 and 2 * max_product < 2^15: pmaddubsw a pair
    (its int16 pair sums, at most 2 * max_product, never saturate), as many pairs' int16 sums added as stay below
    2^15 (4-bit quants against x: 8, 5-bit: 4), then one pmaddwd by ones a group: the generic dot4 (32 bytes widened
    to int32, multiplied, two rounds of pair adds) made the repacked Q4_1 matvec 576 x 1536 140 us on one core of
    the AVX2-only Zen 1 VM, this 60 us. Else generic IR (dot4). All give the same int32 sums."""
    per_group = 32767 // (2 * max_product)
    if vnni(context) or not simd(context) or per_group == 0:
        for unsigned, signed in operands:
            acc = dot4(context, builder, acc, unsigned, signed)
        return acc
    i16, i32 = ir.IntType(16), ir.IntType(32)
    ones = ir.VectorType(i16, 16)([1] * 16)
    for g in range(0, len(operands), per_group):
        total = None
        for unsigned, signed in operands[g:g + per_group]:
            pair_sums = call(builder, "llvm.x86.avx2.pmadd.ub.sw", ir.VectorType(i16, 16), [unsigned, signed])
            total = pair_sums if total is None else builder.add(total, pair_sums)
        acc = builder.add(acc, call(builder, "llvm.x86.avx2.pmadd.wd", ir.VectorType(i32, 8), [total, ones]))
    return acc


def lookup16(context, builder, table, codes):
    """<n x i8>: table[codes[l]] in each lane l, for codes <n x i8> in 0..15 (n a multiple of 32) and table 16
    Python ints of int8 range (a 4-bit codebook: MXFP4's doubled e2m1 values, IQ4_NL's): x86's byte shuffle
    (pshufb, the table in each 128-bit half) where there is AVX2, as llama.cpp's CPU looks them up; else 15
    compares and selects in generic IR. The same bytes either way."""
    n = codes.type.count
    b32 = ir.VectorType(ir.IntType(8), 32)
    if simd(context):
        parts = [call(builder, "llvm.x86.avx2.pshuf.b", b32, [b32(list(table) * 2), shuffle(builder, codes, None,
                                                                                         range(h, h + 32))])
                 for h in range(0, n, 32)]
        while len(parts) > 1:
            parts = [shuffle(builder, a, b, range(2 * a.type.count)) for a, b in zip(parts[0::2], parts[1::2])]
        return parts[0]
    out = splat(builder, table[0], n)
    for k in range(1, 16):
        out = builder.select(builder.icmp_unsigned("==", codes, splat(builder, k, n)), splat(builder, table[k], n), out)
    return out


def abs_signed(context, builder, q, x):
    """(|q|, x with q's sign) of <n x i8> q, x (n a multiple of 32), whose products are q * x: a byte dot that
    takes one operand unsigned (pmaddubsw, vpdpbusd) then sums q . x, as llama.cpp's x86 dots of signed quants do
    (pabsb + psignb where there is AVX2, which zeroes x where q is 0; selects in generic IR). |q| may be 128 (q =
    -128, as an unsigned byte); x must not be -128."""
    n = q.type.count
    zero = splat(builder, 0, n)
    if simd(context):
        b32 = ir.VectorType(ir.IntType(8), 32)
        parts = [call(builder, "llvm.x86.avx2.psign.b", b32, [shuffle(builder, x, None, range(h, h + 32)),
                                                               shuffle(builder, q, None, range(h, h + 32))])
                 for h in range(0, n, 32)]
        while len(parts) > 1:
            parts = [shuffle(builder, a, b, range(2 * a.type.count)) for a, b in zip(parts[0::2], parts[1::2])]
        return call(builder, f"llvm.abs.v{n}i8", q.type, [q, ir.Constant(ir.IntType(1), 0)]), parts[0]
    negative = builder.icmp_signed("<", q, zero)
    return builder.select(negative, builder.sub(zero, q), q), builder.select(negative, builder.sub(zero, x), x)
