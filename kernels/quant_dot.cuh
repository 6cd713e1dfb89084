// Dot products of one quantized weight "item" with activations quantized to q8_1.
//
// A weight row is a run of ggml blocks. kernels/cuda_layout.py repacks a tensor so that each block is split
// into a 16-byte-aligned "bulk" part (the quants, read with 16-byte loads) and a small "meta" part (the
// fields that broke the alignment, mostly the fp16 scale). Q4_K and Q5_K blocks are already multiples of
// 16 bytes and keep their file layout (meta is empty). Each type below states its split; offsets are within
// the bulk / meta of one block. An item is the piece of a block one thread handles: one 16-byte load of
// quants (plus what it needs of the block's high bits and scales).
//
// Activations: x quantized per 32 values (q8_1): xq int8 [n_cols], xds float2 [n_cols/32] = (d, d*sum(q)).
// dp4a (4 int8 products summed into an int32) does the multiplies; int32 sums are exact, scales are float.
// Every dot() gets xq and xds already offset to the first column of its block.
#pragma once
#include <cuda_fp16.h>
#ifdef __CUDACC_RTC__  // NVRTC (CuPy) has no <stdint.h>; same typedefs, so a repeat is harmless
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
#else
#include <stdint.h>
#endif

__device__ __forceinline__ float half_at(const uint8_t* p) {
    return __half2float(*reinterpret_cast<const __half*>(p));
}

__device__ __forceinline__ uint4 load16(const uint8_t* p) {
    return __ldg(reinterpret_cast<const uint4*>(p));
}

__device__ __forceinline__ uint4 xload16(const int8_t* xq) {
    return __ldg(reinterpret_cast<const uint4*>(xq));
}

__device__ __forceinline__ int dot16(int a0, int a1, int a2, int a3, uint4 x, int acc) {
    acc = __dp4a(a0, (int)x.x, acc);
    acc = __dp4a(a1, (int)x.y, acc);
    acc = __dp4a(a2, (int)x.z, acc);
    return __dp4a(a3, (int)x.w, acc);
}

// sum of 16 int8 activations, for "minus min" terms over 16 columns
__device__ __forceinline__ int sum16(uint4 x) {
    return dot16(0x01010101, 0x01010101, 0x01010101, 0x01010101, x, 0);
}

// low nibbles of q . xlo + high nibbles of q . xhi
__device__ __forceinline__ int nibble_dot(uint4 q, uint4 xlo, uint4 xhi) {
    int s = dot16(q.x & 0x0F0F0F0F, q.y & 0x0F0F0F0F, q.z & 0x0F0F0F0F, q.w & 0x0F0F0F0F, xlo, 0);
    return dot16((q.x >> 4) & 0x0F0F0F0F, (q.y >> 4) & 0x0F0F0F0F, (q.z >> 4) & 0x0F0F0F0F,
                 (q.w >> 4) & 0x0F0F0F0F, xhi, s);
}

// bits 0..3 of h to bit 4 of bytes 0..3
__device__ __forceinline__ int bits_to_bit4(uint32_t h) {
    return ((h << 4) & 0x00000010) | ((h << 11) & 0x00001000) | ((h << 18) & 0x00100000) |
           ((h << 25) & 0x10000000);
}

// 5-bit weights of Q5_0 / Q5_1: low nibbles = weights 0..15 with qh bits 0..15, high = 16..31 with 16..31
__device__ __forceinline__ int q5_dot(uint4 q, uint32_t qh, uint4 xlo, uint4 xhi) {
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
    static __device__ __forceinline__ float dot(const uint8_t* b, const uint8_t* m, int k, const int8_t* xq,
                                                const float2* xds) {
        uint4 q = load16(b + 16 * k);
        int s = dot16(q.x, q.y, q.z, q.w, xload16(xq + 16 * k), 0);
        return half_at(m) * xds[0].x * (float)s;
    }
};

// ---- Q4_0: block d(2) qs(16). bulk qs(16), meta d(2). 1 item. w = d*(q-8)
struct Q4_0 {
    static constexpr int QK = 32, BULK = 16, META = 2, ITEMS = 1;
    static __device__ __forceinline__ float dot(const uint8_t* b, const uint8_t* m, int, const int8_t* xq,
                                                const float2* xds) {
        int s = nibble_dot(load16(b), xload16(xq), xload16(xq + 16));
        float2 ds = xds[0];
        return half_at(m) * (ds.x * (float)s - 8.0f * ds.y);
    }
};

// ---- Q4_1: block d(2) m(2) qs(16). bulk qs(16), meta d m. 1 item. w = d*q + m
struct Q4_1 {
    static constexpr int QK = 32, BULK = 16, META = 4, ITEMS = 1;
    static __device__ __forceinline__ float dot(const uint8_t* b, const uint8_t* m, int, const int8_t* xq,
                                                const float2* xds) {
        int s = nibble_dot(load16(b), xload16(xq), xload16(xq + 16));
        float2 ds = xds[0];
        return half_at(m) * ds.x * (float)s + half_at(m + 2) * ds.y;
    }
};

// ---- Q5_0: block d(2) qh(4) qs(16). bulk qs(16), meta d qh (6 bytes, 2-aligned). w = d*(q-16)
struct Q5_0 {
    static constexpr int QK = 32, BULK = 16, META = 6, ITEMS = 1;
    static __device__ __forceinline__ float dot(const uint8_t* b, const uint8_t* m, int, const int8_t* xq,
                                                const float2* xds) {
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
    static __device__ __forceinline__ float dot(const uint8_t* b, const uint8_t* m, int, const int8_t* xq,
                                                const float2* xds) {
        uint2 meta = *reinterpret_cast<const uint2*>(m);
        int s = q5_dot(load16(b), meta.y, xload16(xq), xload16(xq + 16));
        float2 ds = xds[0];
        return half_at(m) * ds.x * (float)s + half_at(m + 2) * ds.y;
    }
};

// Q4_K / Q5_K header d(2) dmin(2) scales(12), loaded as one uint4; byte i (0..11) of the scales
__device__ __forceinline__ int k4_scale_byte(uint4 hdr, int i) {
    uint32_t w = i < 4 ? hdr.y : (i < 8 ? hdr.z : hdr.w);
    return (w >> (8 * (i & 3))) & 0xFF;
}

// 6-bit scale and min j (0..7) of Q4_K / Q5_K
__device__ __forceinline__ void scale_min_k4(uint4 hdr, int j, int& sc, int& mn) {
    if (j < 4) {
        sc = k4_scale_byte(hdr, j) & 63;
        mn = k4_scale_byte(hdr, j + 4) & 63;
    } else {
        sc = (k4_scale_byte(hdr, j + 4) & 0x0F) | ((k4_scale_byte(hdr, j - 4) >> 6) << 4);
        mn = (k4_scale_byte(hdr, j + 4) >> 4) | ((k4_scale_byte(hdr, j) >> 6) << 4);
    }
}

// Q4_K / Q5_K item k (0..7): c = k/2 picks 64 weights (sub-blocks 2c and 2c+1), h = k%2 the 16-byte half.
// Low nibbles are weights 64c+16h+i, high nibbles 64c+32+16h+i (i < 16). The sub-block min term is
// counted once per sub-block, by the h == 0 item, from the q8_1 block sums.
__device__ __forceinline__ float k4_combine(const uint8_t* blk, int c, int h, int s_lo, int s_hi,
                                            const float2* xds) {
    uint4 hdr = load16(blk);
    int sc0, m0, sc1, m1;
    scale_min_k4(hdr, 2 * c, sc0, m0);
    scale_min_k4(hdr, 2 * c + 1, sc1, m1);
    float2 ds0 = xds[2 * c], ds1 = xds[2 * c + 1];
    float d = __half2float(__ushort_as_half((unsigned short)(hdr.x & 0xFFFF)));
    float dmin = __half2float(__ushort_as_half((unsigned short)(hdr.x >> 16)));
    float r = d * ((float)sc0 * ds0.x * (float)s_lo + (float)sc1 * ds1.x * (float)s_hi);
    if (h == 0) r -= dmin * ((float)m0 * ds0.y + (float)m1 * ds1.y);
    return r;
}

// ---- Q4_K: block d(2) dmin(2) scales(12) qs(128) = 144 bytes, kept as is. 8 items.
struct Q4_K {
    static constexpr int QK = 256, BULK = 144, META = 0, ITEMS = 8;
    static __device__ __forceinline__ float dot(const uint8_t* b, const uint8_t*, int k, const int8_t* xq,
                                                const float2* xds) {
        int c = k >> 1, h = k & 1;
        uint4 q = load16(b + 16 + 16 * k);
        uint4 xlo = xload16(xq + 64 * c + 16 * h), xhi = xload16(xq + 64 * c + 32 + 16 * h);
        int s_lo = dot16(q.x & 0x0F0F0F0F, q.y & 0x0F0F0F0F, q.z & 0x0F0F0F0F, q.w & 0x0F0F0F0F, xlo, 0);
        int s_hi = dot16((q.x >> 4) & 0x0F0F0F0F, (q.y >> 4) & 0x0F0F0F0F, (q.z >> 4) & 0x0F0F0F0F,
                         (q.w >> 4) & 0x0F0F0F0F, xhi, 0);
        return k4_combine(b, c, h, s_lo, s_hi, xds);
    }
};

// ---- Q5_K: block d(2) dmin(2) scales(12) qh(32) qs(128) = 176 bytes, kept as is. 8 items.
// Weight 64c+l (l < 32) takes bit 2c of qh[l], weight 64c+32+l bit 2c+1.
struct Q5_K {
    static constexpr int QK = 256, BULK = 176, META = 0, ITEMS = 8;
    static __device__ __forceinline__ float dot(const uint8_t* b, const uint8_t*, int k, const int8_t* xq,
                                                const float2* xds) {
        int c = k >> 1, h = k & 1;
        uint4 q = load16(b + 48 + 16 * k);
        uint4 qh = load16(b + 16 + 16 * h);
        int sl = 2 * c, sh = 2 * c + 1;
        uint4 xlo = xload16(xq + 64 * c + 16 * h), xhi = xload16(xq + 64 * c + 32 + 16 * h);
        int s_lo = dot16((q.x & 0x0F0F0F0F) | (((qh.x >> sl) & 0x01010101) << 4),
                         (q.y & 0x0F0F0F0F) | (((qh.y >> sl) & 0x01010101) << 4),
                         (q.z & 0x0F0F0F0F) | (((qh.z >> sl) & 0x01010101) << 4),
                         (q.w & 0x0F0F0F0F) | (((qh.w >> sl) & 0x01010101) << 4), xlo, 0);
        int s_hi = dot16(((q.x >> 4) & 0x0F0F0F0F) | (((qh.x >> sh) & 0x01010101) << 4),
                         ((q.y >> 4) & 0x0F0F0F0F) | (((qh.y >> sh) & 0x01010101) << 4),
                         ((q.z >> 4) & 0x0F0F0F0F) | (((qh.z >> sh) & 0x01010101) << 4),
                         ((q.w >> 4) & 0x0F0F0F0F) | (((qh.w >> sh) & 0x01010101) << 4), xhi, 0);
        return k4_combine(b, c, h, s_lo, s_hi, xds);
    }
};

// ---- Q6_K: block ql(128) qh(64) scales(16, int8) d(2). bulk ql qh scales (208), meta d. 8 items.
// Item k: half = k/4 (128 weights), ql bytes 64*half + 16*(k%4). With l0 = 16*(k%2) and u = (k%4)/2:
// low nibbles are weights 128*half + 32u + l0 + i, high nibbles 128*half + 64 + 32u + l0 + i; their top
// two bits sit in qh[32*half + l0 + i] at shifts 2u and 2u+4. w = d * scale * (q - 32).
struct Q6_K {
    static constexpr int QK = 256, BULK = 208, META = 2, ITEMS = 8;
    static __device__ __forceinline__ float dot(const uint8_t* b, const uint8_t* m, int k, const int8_t* xq,
                                                const float2* xds) {
        int half = k >> 2, l0 = 16 * (k & 1), u = (k >> 1) & 1;
        uint4 ql = load16(b + 16 * k);
        uint4 qh = load16(b + 128 + 32 * half + l0);
        int sa = 2 * u, sb = 2 * u + 4;
#define Q6(lo, hi, s) __vsubss4((lo) | ((((hi) >> (s)) & 0x03030303) << 4), 0x20202020)
        int lo0 = 128 * half + 32 * u + l0, hi0 = lo0 + 64;
        int s_lo = dot16(Q6(ql.x & 0x0F0F0F0F, qh.x, sa), Q6(ql.y & 0x0F0F0F0F, qh.y, sa),
                         Q6(ql.z & 0x0F0F0F0F, qh.z, sa), Q6(ql.w & 0x0F0F0F0F, qh.w, sa),
                         xload16(xq + lo0), 0);
        int s_hi = dot16(Q6((ql.x >> 4) & 0x0F0F0F0F, qh.x, sb), Q6((ql.y >> 4) & 0x0F0F0F0F, qh.y, sb),
                         Q6((ql.z >> 4) & 0x0F0F0F0F, qh.z, sb), Q6((ql.w >> 4) & 0x0F0F0F0F, qh.w, sb),
                         xload16(xq + hi0), 0);
#undef Q6
        const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
        return half_at(m) * ((float)sc[lo0 / 16] * xds[lo0 / 32].x * (float)s_lo +
                             (float)sc[hi0 / 16] * xds[hi0 / 32].x * (float)s_hi);
    }
};

// 6-bit scale i (0..15) of Q3_K from its 12 packed bytes, minus 32
__device__ __forceinline__ int scale_q3_k(const uint8_t* s, int i) {
    int lo = i < 8 ? (s[i] & 0x0F) : (s[i - 8] >> 4);
    int hi = (s[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
    return (lo | (hi << 4)) - 32;
}

// ---- Q3_K: block hmask(32) qs(64) scales(12) d(2). bulk hmask qs (96), meta scales d (14). 4 items.
// Item k: half = k/2, l0 = 16*(k%2), qs bytes 32*half + l0 + i. For j in 0..3 the 2-bit field at shift 2j
// is weight 128*half + 32j + l0 + i, with high bit (half*4 + j) of hmask[l0 + i] (set: +0, clear: -4),
// scale index 8*half + 2j + k%2. w = d * scale * q.
struct Q3_K {
    static constexpr int QK = 256, BULK = 96, META = 14, ITEMS = 4;
    static __device__ __forceinline__ float dot(const uint8_t* b, const uint8_t* m, int k, const int8_t* xq,
                                                const float2* xds) {
        int half = k >> 1, l0 = 16 * (k & 1);
        uint4 q = load16(b + 32 + 16 * k);
        uint4 hm = load16(b + l0);
        float r = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int hb = half * 4 + j;
#define Q3(qv, hv) __vsubss4((((qv) >> (2 * j)) & 0x03030303) | ((((hv) >> hb) & 0x01010101) << 2), 0x04040404)
            int col = 128 * half + 32 * j + l0;
            int s = dot16(Q3(q.x, hm.x), Q3(q.y, hm.y), Q3(q.z, hm.z), Q3(q.w, hm.w), xload16(xq + col), 0);
#undef Q3
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
    static __device__ __forceinline__ float dot(const uint8_t* b, const uint8_t* m, int k, const int8_t* xq,
                                                const float2* xds) {
        int half = k >> 1, l0 = 16 * (k & 1);
        uint4 q = load16(b + 16 + 16 * k);
        float rd = 0.0f, rm = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int col = 128 * half + 32 * j + l0;
            uint4 x = xload16(xq + col);
            int s = dot16((q.x >> (2 * j)) & 0x03030303, (q.y >> (2 * j)) & 0x03030303,
                          (q.z >> (2 * j)) & 0x03030303, (q.w >> (2 * j)) & 0x03030303, x, 0);
            int sc = b[8 * half + 2 * j + (k & 1)];
            float dx = xds[col / 32].x;
            rd += (float)(sc & 15) * dx * (float)s;
            rm += (float)(sc >> 4) * dx * (float)sum16(x);
        }
        return half_at(m) * rd - half_at(m + 2) * rm;
    }
};
