// Dot products of one quantized weight "item" with activations quantized to q8_1.
//
// A weight row is a run of ggml blocks. kernels/cuda/layout.py repacks a tensor so that each block is split
// into a 16-byte-aligned "bulk" part (the quants, read with 16-byte loads) and a small "meta" part (the
// fields that broke the alignment, mostly the fp16 scale). Q4_K and Q5_K blocks are already multiples of
// 16 bytes and keep their file layout (meta is empty). Each type below states its split; offsets are within
// the bulk / meta of one block. An item is the piece of a block one thread handles: one or a few 16-byte
// loads of quants plus what it needs of the block's high bits and scales.
//
// Activations: x quantized per 32 values (q8_1): xq int8 [n_cols], xds float2 [n_cols/32] = (d, d*sum(q)).
// dp4a (4 int8 products summed into an int32) does the multiplies; int32 sums are exact, scales are float.
// Every dot() gets xq and xds already offset to the first column of its block.
// The types most files hold (Q8_0, Q4_K, Q5_K, Q6_K) have an Item: one item's weights and scales loaded into
// registers, then dotted with any x (their dot() is an Item dotted with one x), so that matvec_tokens.cu loads Q6_K's
// weights once for its 5 to 8 tokens (the other three's few tokens, and Q6_K's up to 4, take quant_mma.cuh's tensor
// cores).
//
// The functions are __host__ __device__ so that tests/kernels/quant_dot_host.cu can check them on a CPU.
#pragma once
#include <cuda_fp16.h>
#ifdef __CUDACC_RTC__  // NVRTC (CuPy) has no <stdint.h>; same typedefs, so a repeat is harmless
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#else
#include <stdint.h>
#endif

#define QD __host__ __device__ __forceinline__

// Not __dp4a, whose asm is volatile: that keeps the compiler from merging the loads of one x that several rows' dots
// make (matvec_tokens.cu).
QD int dp4a(int a, int b, int acc) {
#ifdef __CUDA_ARCH__
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(acc));
    return r;
#else
    for (int i = 0; i < 32; i += 8) acc += (int)(int8_t)(a >> i) * (int)(int8_t)(b >> i);
    return acc;
#endif
}

QD uint4 load16(const uint8_t* p) {
#ifdef __CUDA_ARCH__
    return __ldg(reinterpret_cast<const uint4*>(p));
#else
    return *reinterpret_cast<const uint4*>(p);
#endif
}

// 16 activations. With QUANT_DOT_PLAIN_X (matvec_tokens.cu) a plain load, which the compiler merges across the dots
// of several rows that read the same x; elsewhere __ldg, whose asm is volatile (plain loads there made
// moe_gate_up_glu_q6_k spill at its 128 registers).
QD uint4 xload16(const int8_t* xq) {
#ifdef QUANT_DOT_PLAIN_X
    return *reinterpret_cast<const uint4*>(xq);
#else
    return load16(reinterpret_cast<const uint8_t*>(xq));
#endif
}

QD float half_at(const uint8_t* p) {
    return __half2float(*reinterpret_cast<const __half*>(p));
}

QD float half_bits(uint32_t bits) {
    return __half2float(__ushort_as_half((unsigned short)bits));
}

QD float bits_float(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    union { uint32_t u; float f; } bits = {u};  // type punning through a union: defined by gcc and clang
    return bits.f;
#endif
}

QD int dot16(int a0, int a1, int a2, int a3, uint4 x, int acc) {
    acc = dp4a(a0, (int)x.x, acc);
    acc = dp4a(a1, (int)x.y, acc);
    acc = dp4a(a2, (int)x.z, acc);
    return dp4a(a3, (int)x.w, acc);
}

// sum of 16 int8 activations, for the offset of unsigned quants ("q - 32") and for mins over 16 columns
QD int sum16(uint4 x) {
    return dot16(0x01010101, 0x01010101, 0x01010101, 0x01010101, x, 0);
}

// low nibbles of q . x
QD int lo_dot(uint4 q, uint4 x, int acc) {
    return dot16(q.x & 0x0F0F0F0F, q.y & 0x0F0F0F0F, q.z & 0x0F0F0F0F, q.w & 0x0F0F0F0F, x, acc);
}

// high nibbles of q . x
QD int hi_dot(uint4 q, uint4 x, int acc) {
    return dot16((q.x >> 4) & 0x0F0F0F0F, (q.y >> 4) & 0x0F0F0F0F, (q.z >> 4) & 0x0F0F0F0F,
                 (q.w >> 4) & 0x0F0F0F0F, x, acc);
}

// bits 0..3 of h to bit 4 of bytes 0..3
QD int bits_to_bit4(uint32_t h) {
    return ((h << 4) & 0x00000010) | ((h << 11) & 0x00001000) | ((h << 18) & 0x00100000) |
           ((h << 25) & 0x10000000);
}

// 5-bit weights of Q5_0 / Q5_1: low nibbles = weights 0..15 with qh bits 0..15, high = 16..31 with 16..31
QD int q5_dot(uint4 q, uint32_t qh, uint4 xlo, uint4 xhi) {
    int s = dot16((q.x & 0x0F0F0F0F) | bits_to_bit4(qh), (q.y & 0x0F0F0F0F) | bits_to_bit4(qh >> 4),
                  (q.z & 0x0F0F0F0F) | bits_to_bit4(qh >> 8), (q.w & 0x0F0F0F0F) | bits_to_bit4(qh >> 12),
                  xlo, 0);
    return dot16(((q.x >> 4) & 0x0F0F0F0F) | bits_to_bit4(qh >> 16),
                 ((q.y >> 4) & 0x0F0F0F0F) | bits_to_bit4(qh >> 20),
                 ((q.z >> 4) & 0x0F0F0F0F) | bits_to_bit4(qh >> 24),
                 ((q.w >> 4) & 0x0F0F0F0F) | bits_to_bit4(qh >> 28), xhi, s);
}

// ---- Q8_0: block d(2) qs(32). bulk qs(32), meta d(2). 2 items of 16 weights.
struct Q8_0 {
    static constexpr int QK = 32, BULK = 32, META = 2, ITEMS = 2;
    struct Item {
        uint4 q;
        float d;
        int k;
        Item() = default;
        QD Item(const uint8_t* b, const uint8_t* m, int k) : q(load16(b + 16 * k)), d(half_at(m)), k(k) {}
        QD float dot(const int8_t* xq, const float2* xds) const {
            int s = dot16(q.x, q.y, q.z, q.w, xload16(xq + 16 * k), 0);
            return d * xds[0].x * (float)s;
        }
    };
    static QD float dot(const uint8_t* b, const uint8_t* m, int k, const int8_t* xq, const float2* xds) {
        return Item(b, m, k).dot(xq, xds);
    }
};

// ---- Q4_0: block d(2) qs(16). bulk qs(16), meta d(2). 1 item. w = d*(q-8)
struct Q4_0 {
    static constexpr int QK = 32, BULK = 16, META = 2, ITEMS = 1;
    static QD float dot(const uint8_t* b, const uint8_t* m, int, const int8_t* xq, const float2* xds) {
        uint4 q = load16(b);
        int s = hi_dot(q, xload16(xq + 16), lo_dot(q, xload16(xq), 0));
        float2 ds = xds[0];
        return half_at(m) * (ds.x * (float)s - 8.0f * ds.y);
    }
};

// ---- Q4_1: block d(2) m(2) qs(16). bulk qs(16), meta d m. 1 item. w = d*q + m
struct Q4_1 {
    static constexpr int QK = 32, BULK = 16, META = 4, ITEMS = 1;
    static QD float dot(const uint8_t* b, const uint8_t* m, int, const int8_t* xq, const float2* xds) {
        uint4 q = load16(b);
        int s = hi_dot(q, xload16(xq + 16), lo_dot(q, xload16(xq), 0));
        float2 ds = xds[0];
        return half_at(m) * ds.x * (float)s + half_at(m + 2) * ds.y;
    }
};

// ---- Q5_0: block d(2) qh(4) qs(16). bulk qs(16), meta d qh (6 bytes, 2-aligned). w = d*(q-16)
struct Q5_0 {
    static constexpr int QK = 32, BULK = 16, META = 6, ITEMS = 1;
    static QD float dot(const uint8_t* b, const uint8_t* m, int, const int8_t* xq, const float2* xds) {
        const uint16_t* h = reinterpret_cast<const uint16_t*>(m + 2);
        uint32_t qh = (uint32_t)h[0] | ((uint32_t)h[1] << 16);
        int s = q5_dot(load16(b), qh, xload16(xq), xload16(xq + 16));
        float2 ds = xds[0];
        return half_at(m) * (ds.x * (float)s - 16.0f * ds.y);
    }
};

// ---- Q5_1: block d(2) m(2) qh(4) qs(16). bulk qs(16), meta d m qh (8 bytes). w = d*q + m
struct Q5_1 {
    static constexpr int QK = 32, BULK = 16, META = 8, ITEMS = 1;
    static QD float dot(const uint8_t* b, const uint8_t* m, int, const int8_t* xq, const float2* xds) {
        uint2 meta = *reinterpret_cast<const uint2*>(m);
        int s = q5_dot(load16(b), meta.y, xload16(xq), xload16(xq + 16));
        float2 ds = xds[0];
        return half_at(m) * ds.x * (float)s + half_at(m + 2) * ds.y;
    }
};

// Q4_K / Q5_K header d(2) dmin(2) scales(12) as one uint4. The 6-bit scales and mins of sub-blocks 2c and
// 2c+1 (c = 0..3), packed as in ggml's get_scale_min_k4, read two at a time from 16-bit halves.
QD void k4_scales(uint4 hdr, int c, int& sc0, int& sc1, int& m0, int& m1) {
    int s = 16 * (c & 1);
    uint32_t a = (hdr.y >> s) & 0xFFFF, b = (hdr.z >> s) & 0xFFFF, e = (hdr.w >> s) & 0xFFFF;
    uint32_t sc, mn;
    if (c < 2) {
        sc = a & 0x3F3F;
        mn = b & 0x3F3F;
    } else {
        sc = (e & 0x0F0F) | ((a & 0xC0C0) >> 2);
        mn = ((e >> 4) & 0x0F0F) | ((b & 0xC0C0) >> 2);
    }
    sc0 = sc & 0xFF, sc1 = sc >> 8, m0 = mn & 0xFF, m1 = mn >> 8;
}

// Q4_K / Q5_K item c: weights 64c .. 64c+63 = sub-blocks 2c (dot s_lo) and 2c+1 (dot s_hi); their scales and
// mins from the block's header, unpacked once for every token an Item is dotted with.
struct K4Scales {
    float d, dmin;
    int sc0, sc1, m0, m1;
    K4Scales() = default;
    QD K4Scales(uint4 hdr, int c) : d(half_bits(hdr.x)), dmin(half_bits(hdr.x >> 16)) {
        k4_scales(hdr, c, sc0, sc1, m0, m1);
    }
    QD float combine(int c, int s_lo, int s_hi, const float2* xds) const {
        float2 ds0 = xds[2 * c], ds1 = xds[2 * c + 1];
        return d * ((float)sc0 * ds0.x * (float)s_lo + (float)sc1 * ds1.x * (float)s_hi) -
               dmin * ((float)m0 * ds0.y + (float)m1 * ds1.y);
    }
};

// ---- Q4_K: block d(2) dmin(2) scales(12) qs(128) = 144 bytes, kept as is. 4 items of 64 weights.
// qs byte 32c + l holds weight 64c + l (low nibble) and 64c + 32 + l (high nibble).
struct Q4_K {
    static constexpr int QK = 256, BULK = 144, META = 0, ITEMS = 4;
    struct Item {
        uint4 q0, q1;
        K4Scales s;
        int c;
        Item() = default;
        QD Item(const uint8_t* b, const uint8_t*, int c)
            : q0(load16(b + 16 + 32 * c)), q1(load16(b + 32 + 32 * c)), s(load16(b), c), c(c) {}
        QD float dot(const int8_t* xq, const float2* xds) const {
            const int8_t* x = xq + 64 * c;
            int s_lo = lo_dot(q1, xload16(x + 16), lo_dot(q0, xload16(x), 0));
            int s_hi = hi_dot(q1, xload16(x + 48), hi_dot(q0, xload16(x + 32), 0));
            return s.combine(c, s_lo, s_hi, xds);
        }
    };
    static QD float dot(const uint8_t* b, const uint8_t* m, int c, const int8_t* xq, const float2* xds) {
        return Item(b, m, c).dot(xq, xds);
    }
};

// 4 bytes of Q5_K weights: 4-bit part v (in bits 0..3 of each byte) with the fifth bit from qh at `shift`
QD int q5k(uint32_t v, uint32_t qh, int shift) {
    return (int)(v | (((qh >> shift) & 0x01010101) << 4));
}

// ---- Q5_K: block d(2) dmin(2) scales(12) qh(32) qs(128) = 176 bytes, kept as is. 4 items of 64 weights.
// As Q4_K, plus: weight 64c + l (l < 32) takes bit 2c of qh[l], weight 64c + 32 + l bit 2c + 1.
struct Q5_K {
    static constexpr int QK = 256, BULK = 176, META = 0, ITEMS = 4;
    struct Item {
        uint4 q0, q1, h0, h1;
        K4Scales s;
        int c;
        Item() = default;
        QD Item(const uint8_t* b, const uint8_t*, int c)
            : q0(load16(b + 48 + 32 * c)), q1(load16(b + 64 + 32 * c)), h0(load16(b + 16)), h1(load16(b + 32)),
              s(load16(b), c), c(c) {}
        QD float dot(const int8_t* xq, const float2* xds) const {
            const int8_t* x = xq + 64 * c;
            const uint32_t M = 0x0F0F0F0F;
            int sl = 2 * c, sh = 2 * c + 1;
            int s_lo = dot16(q5k(q0.x & M, h0.x, sl), q5k(q0.y & M, h0.y, sl), q5k(q0.z & M, h0.z, sl),
                             q5k(q0.w & M, h0.w, sl), xload16(x), 0);
            s_lo = dot16(q5k(q1.x & M, h1.x, sl), q5k(q1.y & M, h1.y, sl), q5k(q1.z & M, h1.z, sl),
                         q5k(q1.w & M, h1.w, sl), xload16(x + 16), s_lo);
            int s_hi = dot16(q5k((q0.x >> 4) & M, h0.x, sh), q5k((q0.y >> 4) & M, h0.y, sh),
                             q5k((q0.z >> 4) & M, h0.z, sh), q5k((q0.w >> 4) & M, h0.w, sh), xload16(x + 32), 0);
            s_hi = dot16(q5k((q1.x >> 4) & M, h1.x, sh), q5k((q1.y >> 4) & M, h1.y, sh),
                         q5k((q1.z >> 4) & M, h1.z, sh), q5k((q1.w >> 4) & M, h1.w, sh), xload16(x + 48), s_hi);
            return s.combine(c, s_lo, s_hi, xds);
        }
    };
    static QD float dot(const uint8_t* b, const uint8_t* m, int c, const int8_t* xq, const float2* xds) {
        return Item(b, m, c).dot(xq, xds);
    }
};

// 4 bytes of Q6_K weights (unsigned, 0..63): 4-bit part v with 2 high bits from qh at `shift`
QD int q6k(uint32_t v, uint32_t qh, int shift) {
    return (int)(v | (((qh >> shift) & 0x03030303) << 4));
}

// 16 Q6_K weights . 16 activations, with the -32 offset: sum (q - 32) x = sum q x - 32 sum x
QD int q6k_dot(uint32_t v0, uint32_t v1, uint32_t v2, uint32_t v3, uint4 qh, int shift, uint4 x) {
    return dot16(q6k(v0, qh.x, shift), q6k(v1, qh.y, shift), q6k(v2, qh.z, shift), q6k(v3, qh.w, shift), x, 0) -
           32 * sum16(x);
}

// 4 and 16 bytes at an address known only to be even: a Q6_K block in the file's layout is 210 bytes, so its
// fields lie at any even offset (host memory read in place, see Q6_KL)
QD uint32_t load4_even(const uint8_t* p) {
    const unsigned short* h = reinterpret_cast<const unsigned short*>(p);
    return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}

QD uint4 load16_even(const uint8_t* p) {
    uint4 v;
    v.x = load4_even(p), v.y = load4_even(p + 4), v.z = load4_even(p + 8), v.w = load4_even(p + 12);
    return v;
}

// ---- Q6_K: block ql(128) qh(64) scales(16, int8) d(2). In VRAM (FILE false): bulk ql qh scales (208), meta d.
// FILE true: the file's 210-byte blocks as they are (experts in host memory, read in place over PCIe). 4 items.
// Item k: half = k/2 (128 weights), l0 = 16*(k%2). In a half, weight 32g + l (g = 0..3, l < 32) has its low
// 4 bits in ql[l + 32*(g%2)] (low nibble for g < 2, high for g >= 2) and its top 2 bits in qh[l] at shift 2g;
// scale index l/16 + 2g. The item takes l = l0 .. l0+15 of all four g. w = d * scale * (q - 32).
template <bool FILE>
struct Q6_KL {
    static constexpr int QK = 256, BULK = FILE ? 210 : 208, META = FILE ? 0 : 2, ITEMS = 4;
    static QD uint4 load(const uint8_t* p) { return FILE ? load16_even(p) : load16(p); }
    static QD uint2 load_scales(const uint8_t* p) {
        if (FILE) return make_uint2(load4_even(p), load4_even(p + 4));
        return *reinterpret_cast<const uint2*>(p);
    }
    struct Item {
        uint4 qa, qb, qh;
        uint2 sc;          // the scales of this half
        const uint8_t* d;  // the block's scale, read after the dots (read before, matmul_q8_q6_k spilled)
        int k;
        Item() = default;
        QD Item(const uint8_t* b, const uint8_t* m, int k)
            : qa(load(b + 64 * (k >> 1) + 16 * (k & 1))), qb(load(b + 64 * (k >> 1) + 32 + 16 * (k & 1))),
              qh(load(b + 128 + 32 * (k >> 1) + 16 * (k & 1))), sc(load_scales(b + 192 + 8 * (k >> 1))),
              d(FILE ? b + 208 : m), k(k) {}
        QD float dot(const int8_t* xq, const float2* xds) const {
            int half = k >> 1;
            const int8_t* x = xq + 128 * half + 16 * (k & 1);
            const uint32_t M = 0x0F0F0F0F;
            int s0 = q6k_dot(qa.x & M, qa.y & M, qa.z & M, qa.w & M, qh, 0, xload16(x));
            int s1 = q6k_dot(qb.x & M, qb.y & M, qb.z & M, qb.w & M, qh, 2, xload16(x + 32));
            int s2 = q6k_dot((qa.x >> 4) & M, (qa.y >> 4) & M, (qa.z >> 4) & M, (qa.w >> 4) & M, qh, 4,
                             xload16(x + 64));
            int s3 = q6k_dot((qb.x >> 4) & M, (qb.y >> 4) & M, (qb.z >> 4) & M, (qb.w >> 4) & M, qh, 6,
                             xload16(x + 96));
            int sh = 8 * (k & 1);  // scale l0/16 + 2g: byte (k&1) of sc.x for g = 0, 2 + (k&1) for g = 1, ...
            const float2* ds = xds + 4 * half;
            float r = (float)(int8_t)(sc.x >> sh) * ds[0].x * (float)s0 +
                      (float)(int8_t)(sc.x >> (sh + 16)) * ds[1].x * (float)s1 +
                      (float)(int8_t)(sc.y >> sh) * ds[2].x * (float)s2 +
                      (float)(int8_t)(sc.y >> (sh + 16)) * ds[3].x * (float)s3;
            return half_at(d) * r;
        }
    };
    static QD float dot(const uint8_t* b, const uint8_t* m, int k, const int8_t* xq, const float2* xds) {
        return Item(b, m, k).dot(xq, xds);
    }
};
using Q6_K = Q6_KL<false>;
using Q6_K_FILE = Q6_KL<true>;

// 6-bit scale i (0..15) of Q3_K from its 12 packed bytes, minus 32
QD int scale_q3_k(const uint8_t* s, int i) {
    int lo = i < 8 ? (s[i] & 0x0F) : (s[i - 8] >> 4);
    int hi = (s[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
    return (lo | (hi << 4)) - 32;
}

// 4 bytes of Q3_K weights, unsigned (0..7): 2 bits of q at `shift` and the hmask bit `hb` as bit 2
QD int q3k(uint32_t q, uint32_t hm, int shift, int hb) {
    return (int)(((q >> shift) & 0x03030303) | (((hm >> hb) & 0x01010101) << 2));
}

// ---- Q3_K: block hmask(32) qs(64) scales(12) d(2). bulk hmask qs (96), meta scales d (14). 4 items.
// Item k: half = k/2, l0 = 16*(k%2), qs bytes 32*half + l0 + i. For j in 0..3 the 2-bit field at shift 2j
// is weight 128*half + 32j + l0 + i, with bit (half*4 + j) of hmask[l0 + i] as its third bit; the stored
// value is q + 4, scale index 8*half + 2j + k%2. w = d * scale * q.
struct Q3_K {
    static constexpr int QK = 256, BULK = 96, META = 14, ITEMS = 4;
    static QD float dot(const uint8_t* b, const uint8_t* m, int k, const int8_t* xq, const float2* xds) {
        int half = k >> 1, l0 = 16 * (k & 1);
        uint4 q = load16(b + 32 + 16 * k);
        uint4 hm = load16(b + l0);
        float r = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int hb = half * 4 + j, col = 128 * half + 32 * j + l0;
            uint4 x = xload16(xq + col);
            int s = dot16(q3k(q.x, hm.x, 2 * j, hb), q3k(q.y, hm.y, 2 * j, hb), q3k(q.z, hm.z, 2 * j, hb),
                          q3k(q.w, hm.w, 2 * j, hb), x, 0) - 4 * sum16(x);
            r += (float)scale_q3_k(m, 8 * half + 2 * j + (k & 1)) * xds[col / 32].x * (float)s;
        }
        return half_at(m + 12) * r;
    }
};

// ---- Q2_K: block scales(16) qs(64) d(2) dmin(2). bulk scales qs (80), meta d dmin. 4 items.
// Same weight order as Q3_K without the high bit; scale byte: low nibble scale, high nibble min.
// w = d * (sc & 15) * q - dmin * (sc >> 4).
struct Q2_K {
    static constexpr int QK = 256, BULK = 80, META = 4, ITEMS = 4;
    static QD float dot(const uint8_t* b, const uint8_t* m, int k, const int8_t* xq, const float2* xds) {
        int half = k >> 1, l0 = 16 * (k & 1);
        uint4 q = load16(b + 16 + 16 * k);
        uint2 sc = *reinterpret_cast<const uint2*>(b + 8 * half);  // scale 8*half + 2j + k%2: byte 2j + k%2
        float rd = 0.0f, rm = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int col = 128 * half + 32 * j + l0;
            uint4 x = xload16(xq + col);
            int s = dot16((q.x >> (2 * j)) & 0x03030303, (q.y >> (2 * j)) & 0x03030303,
                          (q.z >> (2 * j)) & 0x03030303, (q.w >> (2 * j)) & 0x03030303, x, 0);
            int scj = ((j < 2 ? sc.x : sc.y) >> (8 * (2 * (j & 1) + (k & 1)))) & 0xFF;
            float dx = xds[col / 32].x;
            rd += (float)(scj & 15) * dx * (float)s;
            rm += (float)(scj >> 4) * dx * (float)sum16(x);
        }
        return half_at(m) * rd - half_at(m + 2) * rm;
    }
};

#include "quant_dot_iq.cuh"  // MXFP4 and the IQ types

// Partial dot of one row with x over items t, t + stride, ...: a thread's share of the row. w is laid out
// as bulk [n_rows, nb, T::BULK] then meta [n_rows, nb, T::META] (cuda_layout.py); nb blocks a row.
template <class T>
QD float row_dot(const uint8_t* w, int row, int n_rows, int nb, int t, int stride, const int8_t* xq,
                 const float2* xds) {
    const uint8_t* bulk = w + (size_t)row * nb * T::BULK;
    const uint8_t* meta = w + (size_t)n_rows * nb * T::BULK + (size_t)row * nb * T::META;
    float acc = 0.0f;
#pragma unroll 4
    for (int i = t; i < nb * T::ITEMS; i += stride) {
        int blk = i / T::ITEMS, k = i % T::ITEMS;
        acc += T::dot(bulk + blk * T::BULK, meta + blk * T::META, k, xq + blk * T::QK, xds + blk * (T::QK / 32));
    }
    return acc;
}

// row_dot of R consecutive rows row0.. (those past n_rows read the last row again; their sums are not stored): each
// item's x is read for the R rows while it sits in L1 (each row's dot loads it again: __ldg's asm is volatile, so
// the compiler does not merge them; matvec_tokens.cu's plain loads are merged). One row a thread group read x from
// L1 twice for every weight byte (an IQ4_XS item: 40 bytes of weights, 80 of x and its scales), and L1 was what
// bounded the decode matvecs (ncu, H200:
// llama3-8b's gate/up at L1 86%, DRAM 39%).
template <class T, int R>
QD void rows_dot(const uint8_t* w, int row0, int n_rows, int nb, int t, int stride, const int8_t* xq,
                 const float2* xds, float (&acc)[R]) {
    const uint8_t *bulk[R], *meta[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        int row = min(row0 + r, n_rows - 1);
        bulk[r] = w + (size_t)row * nb * T::BULK;
        meta[r] = w + (size_t)n_rows * nb * T::BULK + (size_t)row * nb * T::META;
        acc[r] = 0.0f;
    }
#pragma unroll 2
    for (int i = t; i < nb * T::ITEMS; i += stride) {
        int blk = i / T::ITEMS, k = i % T::ITEMS;
#pragma unroll
        for (int r = 0; r < R; ++r)
            acc[r] += T::dot(bulk[r] + blk * T::BULK, meta[r] + blk * T::META, k, xq + blk * T::QK,
                             xds + blk * (T::QK / 32));
    }
}
