// Dot products of the codebook types with q8_1 activations, as quant_dot.cuh's (included from it): MXFP4 and IQ4_NL
// / IQ4_XS pick each 4-bit code's value from a 16-entry table of int8 (byte permutes in registers), the IQ2 / IQ3 /
// IQ1 types a vector of 4 or 8 values from a grid (iq_tables.cuh) for each index, with sign bits. Every weight is
// then an int8 (the grid's value with its sign, or a table value), dotted with dp4a; the block's float scales
// multiply the int32 sums, as models/dequant_iq.py forms the weights. Block layouts: models/dequant_iq.py.
#pragma once
#include "iq_tables.cuh"

// __byte_perm: byte n of the result is byte (s >> 4n) & 7 of the 8 bytes y:x (the selector's bit 3 ignored)
QD uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, s);
#else
    uint64_t v = ((uint64_t)y << 32) | x;
    uint32_t r = 0;
    for (int n = 0; n < 4; ++n) r |= (uint32_t)((v >> (8 * ((s >> (4 * n)) & 7))) & 0xFF) << (8 * n);
    return r;
#endif
}

QD int popc(uint32_t v) {
#ifdef __CUDA_ARCH__
    return __popc(v);
#else
    return __builtin_popcount(v);
#endif
}

// The table values (int8, 4 a word) of the 8 codes (nibbles) of q: lo those of nibbles 0..3, hi of 4..7. A permute
// picks by a selector's low 3 bits from 8 bytes: values 0-7 and 8-15 apart, then one of the two by the code's bit 3.
template <class K>
QD void table16_seq(uint32_t q, int& lo, int& hi) {
    uint32_t pick = 0x32103210u | ((q & 0x88888888u) >> 1);
    lo = (int)byte_perm(byte_perm(K::K0, K::K1, q), byte_perm(K::K2, K::K3, q), pick);
    hi = (int)byte_perm(byte_perm(K::K0, K::K1, q >> 16), byte_perm(K::K2, K::K3, q >> 16), pick >> 16);
}

// As table16_seq for a word of ggml's order (the low nibbles of its bytes, then the high ones: lo0 hi0 lo1 hi1 ..):
// lo the values of the 4 low nibbles, hi of the high ones; two more permutes sort them.
template <class K>
QD void table16(uint32_t q, int& lo, int& hi) {
    int a, b;
    table16_seq<K>(q, a, b);
    lo = (int)byte_perm(a, b, 0x6420);
    hi = (int)byte_perm(a, b, 0x7531);
}

// table16_seq of a word in sequence (SEQ: kernels/cuda/layout.py's table16_in_sequence stores them so, word j of 16
// bytes holding weights 4j..4j+3, then 16+4j..19+4j), else table16 of one in ggml's order
template <class K, bool SEQ>
QD void table16_word(uint32_t q, int& lo, int& hi) {
    if (SEQ)
        table16_seq<K>(q, lo, hi);
    else
        table16<K>(q, lo, hi);
}

// 32 codes (16 bytes: weight l < 16 the low nibble of byte l, weight 16 + l its high nibble; or in sequence: SEQ)
// . 32 activations
template <class K, bool SEQ = false>
QD int table16_dot(uint4 q, uint4 xlo, uint4 xhi) {
    uint32_t w[4] = {q.x, q.y, q.z, q.w}, a[4] = {xlo.x, xlo.y, xlo.z, xlo.w}, b[4] = {xhi.x, xhi.y, xhi.z, xhi.w};
    int s = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        int lo, hi;
        table16_word<K, SEQ>(w[j], lo, hi);
        s = dp4a(lo, (int)a[j], dp4a(hi, (int)b[j], s));
    }
    return s;
}

// 2^(e - 128): ggml's e8m0_to_fp32_half (e < 2: the subnormals 2^-128, 2^-127)
QD float e8m0_half(uint32_t e) {
    return bits_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

// The 4 bytes of g (grid values, all > 0) negated where bits 0..3 of s are set: a byte all ones where its bit is,
// then (g ^ m) + 1 = -g a byte at a time (no carry crosses a byte, as no g is 0)
QD int signed4(uint32_t g, uint32_t s) {
    uint32_t m = (((s & 15) * 0x00204081u) & 0x01010101u) * 0xFFu;
    return (int)((g ^ m) + (m & 0x01010101u));
}

// 8 grid values (an entry of 8 bytes) with 8 sign bits . 8 activations (two words)
QD int signed8_dot(uint64_t g, uint32_t s, uint32_t x0, uint32_t x1, int acc) {
    acc = dp4a(signed4((uint32_t)g, s), (int)x0, acc);
    return dp4a(signed4((uint32_t)(g >> 32), s >> 4), (int)x1, acc);
}

// IQ2_XXS / IQ2_XS / IQ3_XXS: 7 sign bits and their parity as the 8th (ggml's ksigns_iq2xs)
QD uint32_t ksigns(uint32_t s7) {
    return s7 | ((uint32_t)(popc(s7) & 1) << 7);
}

QD uint2 load8(const uint8_t* p) {
#ifdef __CUDA_ARCH__
    return __ldg(reinterpret_cast<const uint2*>(p));
#else
    return *reinterpret_cast<const uint2*>(p);
#endif
}

QD uint32_t u16_at(const uint8_t* p) {
    return *reinterpret_cast<const uint16_t*>(p);
}

// ---- MXFP4: block e(1) qs(16). bulk qs, meta e. 1 item. w = e8m0_half(e) * kvalues_mxfp4[code]
struct MXFP4 {
    static constexpr int QK = 32, BULK = 16, META = 1, ITEMS = 1;
    static QD float dot(const uint8_t* b, const uint8_t* m, int, const int8_t* xq, const float2* xds) {
        int s = table16_dot<KvaluesMxfp4>(load16(b), xload16(xq), xload16(xq + 16));
        return e8m0_half(m[0]) * xds[0].x * (float)s;
    }
};

// ---- MXFP4 in the file's layout: its 17-byte blocks e | qs as they are (experts in host memory, read in place over
// PCIe, as Q6_K_FILE's), so a block's qs lie at any offset: read a byte at a time. 1 item.
QD uint32_t load4_bytes(const uint8_t* p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

struct MXFP4_FILE {
    static constexpr int QK = 32, BULK = 17, META = 0, ITEMS = 1;
    static QD float dot(const uint8_t* b, const uint8_t*, int, const int8_t* xq, const float2* xds) {
        uint4 q = make_uint4(load4_bytes(b + 1), load4_bytes(b + 5), load4_bytes(b + 9), load4_bytes(b + 13));
        int s = table16_dot<KvaluesMxfp4>(q, xload16(xq), xload16(xq + 16));
        return e8m0_half(b[0]) * xds[0].x * (float)s;
    }
};

// ---- IQ4_NL: block d(2) qs(16). bulk qs, meta d. 1 item. w = d * kvalues_iq4nl[code]
struct IQ4_NL {
    static constexpr int QK = 32, BULK = 16, META = 2, ITEMS = 1;
    static QD float dot(const uint8_t* b, const uint8_t* m, int, const int8_t* xq, const float2* xds) {
        int s = table16_dot<KvaluesIq4nl>(load16(b), xload16(xq), xload16(xq + 16));
        return half_at(m) * xds[0].x * (float)s;
    }
};

// ---- IQ4_XS: block d(2) scales_h(2) scales_l(4) qs(128). bulk qs (its codes in sequence: layout.py), meta d
// scales_h scales_l (8). 4 items of 64: sub-blocks 2c and 2c+1, each 16 qs bytes, scale (4 bits of scales_l, 2 of
// scales_h) - 32.
struct IQ4_XS {
    static constexpr int QK = 256, BULK = 128, META = 8, ITEMS = 4;
    static QD float dot(const uint8_t* b, const uint8_t* m, int c, const int8_t* xq, const float2* xds) {
        uint2 meta = *reinterpret_cast<const uint2*>(m);
        const int8_t* x = xq + 64 * c;
        int s0 = table16_dot<KvaluesIq4nl, true>(load16(b + 32 * c), xload16(x), xload16(x + 16));
        int s1 = table16_dot<KvaluesIq4nl, true>(load16(b + 32 * c + 16), xload16(x + 32), xload16(x + 48));
        uint32_t hi = meta.x >> (16 + 4 * c), lo = meta.y >> (8 * c);  // sub-block 2c: low nibble, 2c+1: high
        int ls0 = (int)((lo & 15) | ((hi & 3) << 4)) - 32, ls1 = (int)(((lo >> 4) & 15) | (((hi >> 2) & 3) << 4)) - 32;
        return half_bits(meta.x) * ((float)ls0 * xds[2 * c].x * (float)s0 + (float)ls1 * xds[2 * c + 1].x * (float)s1);
    }
};

// ---- IQ2_XXS: block d(2) qs(64). bulk qs, meta d. 8 items of 32 (a sub-block): two words, 4 grid indices (a byte
// each, 8 values an entry), then 4 x 7 sign bits and a 4-bit scale. w = d * (0.5 + s) / 4 * grid.
struct IQ2_XXS {
    static constexpr int QK = 256, BULK = 64, META = 2, ITEMS = 8;
    static QD float dot(const uint8_t* b, const uint8_t* m, int c, const int8_t* xq, const float2* xds) {
        uint2 q = load8(b + 8 * c);
        const int8_t* x = xq + 32 * c;
        int s = 0;
#pragma unroll
        for (int p = 0; p < 2; ++p) {  // entries 2p, 2p + 1
            uint4 xv = xload16(x + 16 * p);
            s = signed8_dot(GRID_IQ2_XXS[(q.x >> (16 * p)) & 255], ksigns((q.y >> (14 * p)) & 127), xv.x, xv.y, s);
            s = signed8_dot(GRID_IQ2_XXS[(q.x >> (16 * p + 8)) & 255], ksigns((q.y >> (14 * p + 7)) & 127), xv.z, xv.w,
                            s);
        }
        return half_at(m) * (0.5f + (float)(q.y >> 28)) * 0.25f * xds[c].x * (float)s;
    }
};

// ---- IQ2_XS: block d(2) qs(64: 32 u16) scales(8). bulk qs, meta d scales (10). 4 items of 64: 8 u16 of a 9-bit
// grid index and 7 sign bits (8 values each); a 4-bit scale per 16 values. w = d * (0.5 + s) / 4 * grid.
struct IQ2_XS {
    static constexpr int QK = 256, BULK = 64, META = 10, ITEMS = 4;
    static QD float dot(const uint8_t* b, const uint8_t* m, int c, const int8_t* xq, const float2* xds) {
        uint4 q = load16(b + 16 * c);
        uint32_t w[4] = {q.x, q.y, q.z, q.w}, sc = u16_at(m + 2 + 2 * c);  // scales of values 16j.. of the item
        const int8_t* x = xq + 64 * c;
        float r = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            uint4 xv = xload16(x + 16 * j);
            int s = signed8_dot(GRID_IQ2_XS[w[j] & 511], ksigns((w[j] >> 9) & 127), xv.x, xv.y, 0);
            s = signed8_dot(GRID_IQ2_XS[(w[j] >> 16) & 511], ksigns(w[j] >> 25), xv.z, xv.w, s);
            r += (0.5f + (float)((sc >> (4 * j)) & 15)) * xds[2 * c + j / 2].x * (float)s;
        }
        return half_at(m) * 0.25f * r;
    }
};

// ---- IQ2_S: block d(2) qs(32) signs(32) qh(8) scales(8). bulk qs signs, meta d qh scales (18). 4 items of 64:
// entry e (8 values) has index qs[e] | 2 bits of qh[e / 4] << 8 and sign byte signs[e]; scales as IQ2_XS.
struct IQ2_S {
    static constexpr int QK = 256, BULK = 64, META = 18, ITEMS = 4;
    static QD float dot(const uint8_t* b, const uint8_t* m, int c, const int8_t* xq, const float2* xds) {
        uint2 g = *reinterpret_cast<const uint2*>(b + 8 * c), sg = *reinterpret_cast<const uint2*>(b + 32 + 8 * c);
        uint32_t qh = u16_at(m + 2 + 2 * c), sc = u16_at(m + 10 + 2 * c);
        const int8_t* x = xq + 64 * c;
        float r = 0.0f;
#pragma unroll 2  // unrolled whole, moe_matvec_iq1_m spilled 4 bytes once its expert biases came (gpt-oss)
        for (int j = 0; j < 4; ++j) {  // entries 2j, 2j + 1 of the item: values 16j ..
            uint32_t gw = (j < 2 ? g.x : g.y) >> (16 * (j & 1)), sw = (j < 2 ? sg.x : sg.y) >> (16 * (j & 1));
            uint4 xv = xload16(x + 16 * j);
            int s = signed8_dot(GRID_IQ2_S[(gw & 255) | (((qh >> (4 * j)) & 3) << 8)], sw & 255, xv.x, xv.y, 0);
            s = signed8_dot(GRID_IQ2_S[((gw >> 8) & 255) | (((qh >> (4 * j + 2)) & 3) << 8)], (sw >> 8) & 255, xv.z,
                            xv.w, s);
            r += (0.5f + (float)((sc >> (4 * j)) & 15)) * xds[2 * c + j / 2].x * (float)s;
        }
        return half_at(m) * 0.25f * r;
    }
};

// ---- IQ3_XXS: block d(2) qs(64) aux(32). bulk qs aux (96), meta d. 8 items of 32 (a sub-block): 8 grid bytes (4
// values an entry) and a word of 4 x 7 sign bits (8 values each) and a 4-bit scale. w = d * (0.5 + s) / 2 * grid.
struct IQ3_XXS {
    static constexpr int QK = 256, BULK = 96, META = 2, ITEMS = 8;
    static QD float dot(const uint8_t* b, const uint8_t* m, int c, const int8_t* xq, const float2* xds) {
        uint2 q = load8(b + 8 * c);
        uint32_t a = *reinterpret_cast<const uint32_t*>(b + 64 + 4 * c);
        const int8_t* x = xq + 32 * c;
        int s = 0;
#pragma unroll
        for (int l = 0; l < 4; l += 2) {  // groups l, l + 1 of 8 values: grid word l / 2
            uint32_t gw = l ? q.y : q.x;
            uint4 xv = xload16(x + 8 * l);
            uint32_t s0 = ksigns((a >> (7 * l)) & 127), s1 = ksigns((a >> (7 * l + 7)) & 127);
            s = dp4a(signed4(GRID_IQ3_XXS[gw & 255], s0), (int)xv.x, s);
            s = dp4a(signed4(GRID_IQ3_XXS[(gw >> 8) & 255], s0 >> 4), (int)xv.y, s);
            s = dp4a(signed4(GRID_IQ3_XXS[(gw >> 16) & 255], s1), (int)xv.z, s);
            s = dp4a(signed4(GRID_IQ3_XXS[gw >> 24], s1 >> 4), (int)xv.w, s);
        }
        return half_at(m) * (0.5f + (float)(a >> 28)) * 0.5f * xds[c].x * (float)s;
    }
};

// ---- IQ3_S: block d(2) qs(64) qh(8) signs(32) scales(4). bulk qs, meta d qh signs scales (46, 2-aligned). 8 items
// of 32 (a sub-block: 8 entries of 4 values): index qs[e] | bit e % 8 of qh[e / 8] << 8, a sign byte per 8 values,
// a 4-bit scale. w = d * (1 + 2 s) * grid.
struct IQ3_S {
    static constexpr int QK = 256, BULK = 64, META = 46, ITEMS = 8;
    static QD float dot(const uint8_t* b, const uint8_t* m, int c, const int8_t* xq, const float2* xds) {
        uint2 q = load8(b + 8 * c);
        uint32_t qh = m[2 + c], sg = load4_even(m + 10 + 4 * c), sc = (m[42 + c / 2] >> (4 * (c & 1))) & 15;
        const int8_t* x = xq + 32 * c;
        int s = 0;
#pragma unroll
        for (int l = 0; l < 4; l += 2) {  // groups l, l + 1 of 8 values: entries 2l .. 2l + 3
            uint32_t gw = l ? q.y : q.x, h = qh >> (2 * l), s0 = sg >> (8 * l), s1 = sg >> (8 * l + 8);
            uint4 xv = xload16(x + 8 * l);
            s = dp4a(signed4(GRID_IQ3_S[(gw & 255) | ((h & 1) << 8)], s0), (int)xv.x, s);
            s = dp4a(signed4(GRID_IQ3_S[((gw >> 8) & 255) | ((h & 2) << 7)], s0 >> 4), (int)xv.y, s);
            s = dp4a(signed4(GRID_IQ3_S[((gw >> 16) & 255) | ((h & 4) << 6)], s1), (int)xv.z, s);
            s = dp4a(signed4(GRID_IQ3_S[(gw >> 24) | ((h & 8) << 5)], s1 >> 4), (int)xv.w, s);
        }
        return half_at(m) * (float)(1 + 2 * (int)sc) * xds[c].x * (float)s;
    }
};

// ---- IQ1_S: block d(2) qs(32) qh(16: 8 u16). bulk qs, meta d qh (18). 8 items of 32 (a sub-block): 4 entries (8
// values of -1 / 0 / 1) of index qs[e] | 3 bits of the sub-block's qh word << 8, a 3-bit scale and the sign of a
// shift of 1/8. w = d * (2 s + 1) * (grid +- 1/8): the shift times the sum of x (q8_1's d * sum of qs).
struct IQ1_S {
    static constexpr int QK = 256, BULK = 32, META = 18, ITEMS = 8;
    static QD float dot(const uint8_t* b, const uint8_t* m, int c, const int8_t* xq, const float2* xds) {
        uint32_t g = *reinterpret_cast<const uint32_t*>(b + 4 * c), h = u16_at(m + 2 + 2 * c);
        const int8_t* x = xq + 32 * c;
        int s = 0;
#pragma unroll
        for (int l = 0; l < 4; l += 2) {
            uint4 xv = xload16(x + 8 * l);
            uint64_t e0 = GRID_IQ1_S[((g >> (8 * l)) & 255) | (((h >> (3 * l)) & 7) << 8)];
            uint64_t e1 = GRID_IQ1_S[((g >> (8 * l + 8)) & 255) | (((h >> (3 * l + 3)) & 7) << 8)];
            s = dp4a((int)(uint32_t)e0, (int)xv.x, dp4a((int)(uint32_t)(e0 >> 32), (int)xv.y, s));
            s = dp4a((int)(uint32_t)e1, (int)xv.z, dp4a((int)(uint32_t)(e1 >> 32), (int)xv.w, s));
        }
        float2 ds = xds[c];
        return half_at(m) * (float)(2 * ((h >> 12) & 7) + 1) * (ds.x * (float)s + ((h & 0x8000) ? -0.125f : 0.125f) * ds.y);
    }
};

// ---- IQ1_M: block qs(32) qh(16) scales(8: 4 u16). bulk qs, meta qh scales (24). 4 items of 64: entry e (8 values)
// has index qs[e] | bits 0-2 of nibble e of qh << 8 and its shift's sign in bit 3; a 3-bit scale per 16 values (12
// bits of each scale word), d in the words' top nibbles. w = d * (2 s + 1) * (grid +- 1/8), summed as integers:
// 8 * (grid . x) +- sum(x) over each entry, times 1/8.
struct IQ1_M {
    static constexpr int QK = 256, BULK = 32, META = 24, ITEMS = 4;
    static QD float dot(const uint8_t* b, const uint8_t* m, int c, const int8_t* xq, const float2* xds) {
        uint2 q = load8(b + 8 * c);
        uint32_t qh = *reinterpret_cast<const uint32_t*>(m + 4 * c);  // nibbles of entries 8c ..
        uint2 sv = *reinterpret_cast<const uint2*>(m + 16);
        uint32_t d = ((sv.x >> 12) & 0xF) | ((sv.x >> 24) & 0xF0) | ((sv.y >> 4) & 0xF00) | ((sv.y >> 16) & 0xF000);
        uint32_t sc = ((c < 2 ? sv.x : sv.y) >> (16 * (c & 1))) & 0xFFFF;  // scales of values 16j .. of the item
        const int8_t* x = xq + 64 * c;
        float r = 0.0f;
#pragma unroll 2  // unrolled whole, moe_matvec_iq1_m spilled 4 bytes once its expert biases came (gpt-oss)
        for (int j = 0; j < 4; ++j) {  // entries 2j, 2j + 1
            uint32_t g = (j < 2 ? q.x : q.y) >> (16 * (j & 1)), h = qh >> (8 * j);
            uint4 xv = xload16(x + 16 * j);
            uint64_t e0 = GRID_IQ1_S[(g & 255) | ((h & 7) << 8)], e1 = GRID_IQ1_S[((g >> 8) & 255) | (((h >> 4) & 7) << 8)];
            int g0 = dp4a((int)(uint32_t)e0, (int)xv.x, dp4a((int)(uint32_t)(e0 >> 32), (int)xv.y, 0));
            int g1 = dp4a((int)(uint32_t)e1, (int)xv.z, dp4a((int)(uint32_t)(e1 >> 32), (int)xv.w, 0));
            int x0 = dp4a(0x01010101, (int)xv.x, dp4a(0x01010101, (int)xv.y, 0));
            int x1 = dp4a(0x01010101, (int)xv.z, dp4a(0x01010101, (int)xv.w, 0));
            int s = 8 * (g0 + g1) + ((h & 8) ? -x0 : x0) + ((h & 0x80) ? -x1 : x1);
            r += (float)(2 * ((sc >> (3 * j)) & 7) + 1) * xds[2 * c + j / 2].x * (float)s;
        }
        return half_bits(d) * 0.125f * r;
    }
};
