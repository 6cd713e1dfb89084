// A few tokens' products with quantized weights on the int8 tensor cores (mma.sync m16n8k32): a warp
// takes 16 rows of W and up to 8 tokens' x (q8_1), so a weight is unpacked once for all the tokens and their dots
// are one instruction a 16x32 tile (matvec_tokens.cu's matvec_tokens_mma).
//
// Fragments (PTX ISA, mma.m16n8k32 .s8): lane = 4g + q. A (16 rows x 32 k): a0 = row g, k 4q..4q+3; a1 = row g+8,
// same k; a2, a3 = k 16+4q..16+4q+3 of rows g, g+8. B (32 k x 8 tokens): b0 = token g, k 4q..4q+3; b1 = k 16+4q...
// C (16 x 8, int32): c0, c1 = row g, tokens 2q, 2q+1; c2, c3 = row g+8, the same tokens. The sum over k does not
// care which k a lane holds as long as A and B agree, so for m16n8k32 lane q holds real k 8q..8q+7 (one 8-byte load
// of weights and of x) as mma's 4q..4q+3 (a0, b0) and 16+4q..16+4q+3 (a2, b1).
//
// Each type's Mma<T>::block<NT> adds one ggml block's products for rows g and g+8 to acc[4] (C's order): w0, w1 the
// block of rows g and g+8 (bulk and meta as quant_dot.cuh splits them), xb the x of B's token at the block's
// columns, ds0, ds1 the xds of the tokens of the lane's two C columns (which tokens, for NT = 8 and NT = 4: the
// type's comment and matvec_tokens_mma).
#pragma once
#include "quant_dot.cuh"

// c = a . b + acc (an int32 16x8 tile; the fragments above)
__device__ __forceinline__ void mma_k32(int (&c)[4], int a0, int a1, int a2, int a3, int b0, int b1,
                                        const int (&acc)[4]) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(acc[0]), "r"(acc[1]), "r"(acc[2]), "r"(acc[3]));
}

// c = a . b
__device__ __forceinline__ void mma_k32(int (&c)[4], int a0, int a1, int a2, int a3, int b0, int b1) {
    const int zero[4] = {};
    mma_k32(c, a0, a1, a2, a3, b0, b1, zero);
}

__device__ __forceinline__ uint2 load8(const void* p) { return __ldg(reinterpret_cast<const uint2*>(p)); }
__device__ __forceinline__ uint32_t load4(const void* p) { return __ldg(reinterpret_cast<const uint32_t*>(p)); }

template <class T>
struct Mma;

// Q4_K / Q5_K header (d, dmin, 12 bytes of 6-bit scales and mins) to the 8 scales and 8 mins, a byte each:
// sc[0] sub-blocks 0..3, sc[1] 4..7 (ggml's get_scale_min_k4 for all eight at once).
__device__ __forceinline__ void k4_scale_words(uint4 hdr, uint32_t (&sc)[2], uint32_t (&mn)[2]) {
    const uint32_t LOW6 = 0x3F3F3F3F, LOW4 = 0x0F0F0F0F, TOP2 = 0x03030303;
    sc[0] = hdr.y & LOW6;
    mn[0] = hdr.z & LOW6;
    sc[1] = (hdr.w & LOW4) | (((hdr.y >> 6) & TOP2) << 4);
    mn[1] = ((hdr.w >> 4) & LOW4) | (((hdr.z >> 6) & TOP2) << 4);
}

__device__ __forceinline__ float byte_float(const uint32_t (&w)[2], int i) {
    return (float)((w[i >> 2] >> (8 * (i & 3))) & 0xFF);
}

// Q4_K and Q5_K: sub-block s = 2c + h (32 weights, its own 6-bit scale and min) is nibble h of qs bytes 32c ..
// 32c+31 (quant_dot.cuh's Q4_K, Q5_K), Q5_K's fifth bit bit s of qh byte l for weight 64c + 32h + l; lane q takes
// bytes 32c + 8q .. +7 of its rows' qs, both sub-blocks of c (and qh bytes 8q .. +7).
// NT = 8: one m16n8k32 a sub-block, B's columns the 8 tokens (lane q's C: tokens 2q, 2q+1).
// NT = 4: B's column 2t + h is token t's x on sub-block 2c + h and zero on the other, and mma's k pairs each low
// nibble with the high nibble of the same byte, so one m16n8k32 takes 16 weights of both sub-blocks for 4 tokens
// and two of them a chunk c: lane q's C is token q, sub-blocks 2c and 2c+1, half the float work of NT = 8 at <= 4
// tokens. A lane's acc: [row g, row g+8] x [its two C columns]. QS: qs's offset in the block.
template <int QS, bool FIFTH>
struct MmaK4 {
    template <int NT>
    static __device__ __forceinline__ void block(const uint8_t* w0, const uint8_t*, const uint8_t* w1, const uint8_t*,
                                                 const int8_t* xb, const float2* ds0, const float2* ds1, int g,
                                                 int q, float (&acc)[4]) {
        const uint32_t M = 0x0F0F0F0F;
        uint4 hdr[2] = {load16(w0), load16(w1)};
        uint2 qh[2] = {};
        if constexpr (FIFTH) qh[0] = load8(w0 + 16 + 8 * q), qh[1] = load8(w1 + 16 + 8 * q);
        uint32_t sc[2][2], mn[2][2];
        k4_scale_words(hdr[0], sc[0], mn[0]);
        k4_scale_words(hdr[1], sc[1], mn[1]);
        float sum[4] = {}, mins[4] = {};  // this block's, before its d and dmin
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            uint2 qs[2] = {load8(w0 + QS + 32 * c + 8 * q), load8(w1 + QS + 32 * c + 8 * q)};
            // the weights of row g + 8r at bytes 8q + 4j .. +3 of the chunk, sub-block 2c + h
            auto a = [&](int r, int j, int h) {
                uint32_t v = ((j ? qs[r].y : qs[r].x) >> (4 * h)) & M;
                if constexpr (FIFTH) v |= (((j ? qh[r].y : qh[r].x) >> (2 * c + h)) & 0x01010101) << 4;
                return (int)v;
            };
            int lo[4], hi[4];
            if constexpr (NT == 8) {
                uint2 xl = load8(xb + 64 * c + 8 * q), xh = load8(xb + 64 * c + 32 + 8 * q);
                mma_k32(lo, a(0, 0, 0), a(1, 0, 0), a(0, 1, 0), a(1, 1, 0), xl.x, xl.y);
                mma_k32(hi, a(0, 0, 1), a(1, 0, 1), a(0, 1, 1), a(1, 1, 1), xh.x, xh.y);
            } else {
                int h = g & 1;
                uint2 x = load8(xb + 64 * c + 32 * h + 8 * q);
                mma_k32(lo, a(0, 0, 0), a(1, 0, 0), a(0, 0, 1), a(1, 0, 1), h ? 0 : x.x, h ? x.x : 0);
                mma_k32(hi, a(0, 1, 0), a(1, 1, 0), a(0, 1, 1), a(1, 1, 1), h ? 0 : x.y, h ? x.y : 0);
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int r = e >> 1, s = NT == 8 ? 2 * c : 2 * c + (e & 1);
                float2 xs = NT == 8 ? ((e & 1) ? ds1 : ds0)[s] : ds0[s];
                if constexpr (NT == 8) {
                    sum[e] = fmaf(byte_float(sc[r], s) * xs.x, (float)lo[e], sum[e]);
                    sum[e] = fmaf(byte_float(sc[r], s + 1) * ((e & 1) ? ds1 : ds0)[s + 1].x, (float)hi[e], sum[e]);
                    mins[e] = fmaf(byte_float(mn[r], s), xs.y, mins[e]);
                    mins[e] = fmaf(byte_float(mn[r], s + 1), ((e & 1) ? ds1 : ds0)[s + 1].y, mins[e]);
                } else {
                    sum[e] = fmaf(byte_float(sc[r], s) * xs.x, (float)(lo[e] + hi[e]), sum[e]);
                    mins[e] = fmaf(byte_float(mn[r], s), xs.y, mins[e]);
                }
            }
        }
        float d[2] = {half_bits(hdr[0].x), half_bits(hdr[1].x)};
        float dmin[2] = {half_bits(hdr[0].x >> 16), half_bits(hdr[1].x >> 16)};
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[e] += d[e >> 1] * sum[e] - dmin[e >> 1] * mins[e];
    }
};
template <>
struct Mma<Q4_K> : MmaK4<16, false> {};
template <>
struct Mma<Q5_K> : MmaK4<48, true> {};

// Q8_0 (bulk qs, meta d): a block is one m16n8k32, B's columns the 8 tokens. NT = 8 only (its float work is one
// scale a block: pairing halves of blocks for 4 tokens would save little).
template <>
struct Mma<Q8_0> {
    template <int NT>
    static __device__ __forceinline__ void block(const uint8_t* w0, const uint8_t* m0, const uint8_t* w1,
                                                 const uint8_t* m1, const int8_t* xb, const float2* ds0,
                                                 const float2* ds1, int, int q, float (&acc)[4]) {
        static_assert(NT == 8, "Q8_0's Mma takes 8 token columns");
        uint2 a0 = load8(w0 + 8 * q), a1 = load8(w1 + 8 * q), x = load8(xb + 8 * q);
        int c[4];
        mma_k32(c, a0.x, a1.x, a0.y, a1.y, x.x, x.y);
        float d[2] = {half_at(m0), half_at(m1)}, xd[2] = {ds0[0].x, ds1[0].x};
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[e] = fmaf(d[e >> 1] * xd[e & 1], (float)c[e], acc[e]);
    }
};

__device__ __forceinline__ int sbyte(uint4 w, int i) {  // signed byte i of 16
    uint32_t v = i < 4 ? w.x : i < 8 ? w.y : i < 12 ? w.z : w.w;
    return (int)(int8_t)(v >> (8 * (i & 3)));
}

// Q6_K (quant_dot.cuh's split: bulk ql(128) qh(64) scales(16), meta d): in half f (128 weights), byte l < 32 of ql
// region p (ql[64f + 32p + l]) holds weight 128f + 32p + l in its low nibble and 128f + 64 + 32p + l in its high
// nibble, their top 2 bits at qh[32f + l] bits 2p and 4 + 2p; a weight is (q - 32) * its 16's int8 scale. NT = 4
// only, as Q4_K's: one m16n8k32 pairs the low and high nibbles of 16 bytes (lane q's 4 at 16i + 4q), columns
// 2t + h token t's x on the low (h = 0) or high weights; a second one with every weight -32 adds the offset.
template <>
struct Mma<Q6_K> {
    template <int NT>
    static __device__ __forceinline__ void block(const uint8_t* w0, const uint8_t* m0, const uint8_t* w1,
                                                 const uint8_t* m1, const int8_t* xb, const float2* ds0,
                                                 const float2*, int g, int q, float (&acc)[4]) {
        static_assert(NT == 4, "Q6_K's Mma takes up to 4 tokens");
        const uint32_t M = 0x0F0F0F0F, TOP = 0x30303030, MINUS32 = 0xE0E0E0E0;
        const uint8_t* w[2] = {w0, w1};
        uint4 sc[2] = {load16(w0 + 192), load16(w1 + 192)};
        int h = g & 1;
        float sum[4] = {};
#pragma unroll
        for (int f = 0; f < 2; ++f)
#pragma unroll
            for (int p = 0; p < 2; ++p) {
                int part[4] = {};  // sum over the two 16s of the lane's rows' scale * dot, [row][low, high]
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    int l = 16 * i + 4 * q;
                    uint32_t a[4];  // a0 a1: low nibbles of rows g, g+8; a2 a3: high
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        uint32_t ql = load4(w[r] + 64 * f + 32 * p + l), qh = load4(w[r] + 128 + 32 * f + l);
                        a[r] = (ql & M) | ((qh << (4 - 2 * p)) & TOP);
                        a[2 + r] = ((ql >> 4) & M) | ((qh >> (2 * p)) & TOP);
                    }
                    uint32_t x = load4(xb + 128 * f + 64 * h + 32 * p + l);
                    int c[4], d[4];
                    mma_k32(c, a[0], a[1], a[2], a[3], h ? 0 : x, h ? x : 0);
                    mma_k32(d, MINUS32, MINUS32, MINUS32, MINUS32, h ? 0 : x, h ? x : 0, c);
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        int s = 8 * f + 2 * p + i + 4 * (e & 1);  // the 16's scale: low nibbles' or high
                        part[e] += sbyte(sc[e >> 1], s) * d[e];
                    }
                }
#pragma unroll
                for (int e = 0; e < 4; ++e) sum[e] = fmaf(ds0[4 * f + p + 2 * (e & 1)].x, (float)part[e], sum[e]);
            }
        float d[2] = {half_at(m0), half_at(m1)};
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[e] += d[e >> 1] * sum[e];
    }
};
