// Dequantize 32 consecutive weights (a "chunk") of one block to float32, for every type the CUDA kernels
// read, from the repacked layout of kernels/cuda/layout.py (see quant_dot.cuh for each type's bulk / meta
// split). Values are formed exactly as models/dequant.py forms them: integer-scale products are exact in
// float32, and the one rounding is the add of the min, so the results are bit-identical.
//
// __host__ __device__, so that tests/kernels/dequant_host.cu checks them bit for bit on a CPU in CI.
#pragma once
#include "quant_dot.cuh"


// 16 or 32 bytes in registers, read with 16-byte loads; byte i by a shift (i is a constant once unrolled)
struct Bytes16 {
    uint4 u;
    QD int operator[](int i) const {
        uint32_t w = i < 4 ? u.x : i < 8 ? u.y : i < 12 ? u.z : u.w;
        return (w >> (8 * (i & 3))) & 0xFF;
    }
};
struct Bytes32 {
    Bytes16 lo, hi;
    QD int operator[](int i) const { return i < 16 ? lo[i] : hi[i - 16]; }
};
QD Bytes16 load_b16(const uint8_t* p) { return {load16(p)}; }
QD Bytes32 load_b32(const uint8_t* p) { return {{load16(p)}, {load16(p + 16)}}; }

// ---- chunk c (32 weights) of one block -> v[32] float32. b: the block's bulk, m: its meta.

QD void chunk(Q4_0, const uint8_t* b, const uint8_t* m, int, float* v) {
    float d = half_at(m);
    Bytes16 q = load_b16(b);
#pragma unroll
    for (int l = 0; l < 16; ++l) {
        v[l] = d * (float)((q[l] & 15) - 8);
        v[l + 16] = d * (float)((q[l] >> 4) - 8);
    }
}

QD void chunk(Q4_1, const uint8_t* b, const uint8_t* m, int, float* v) {
    float d = half_at(m), mn = half_at(m + 2);
    Bytes16 q = load_b16(b);
#pragma unroll
    for (int l = 0; l < 16; ++l) {
        v[l] = d * (float)(q[l] & 15) + mn;
        v[l + 16] = d * (float)(q[l] >> 4) + mn;
    }
}

// 32 high bits of Q5_0 / Q5_1 from a 2-aligned little-endian u32: bit j is bit 4 of weight j
QD uint32_t qh32(const uint8_t* p) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
    return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}

QD void chunk(Q5_0, const uint8_t* b, const uint8_t* m, int, float* v) {
    float d = half_at(m);
    uint32_t qh = qh32(m + 2);
    Bytes16 q = load_b16(b);
#pragma unroll
    for (int l = 0; l < 16; ++l) {
        v[l] = d * (float)((int)((q[l] & 15) | (((qh >> l) & 1) << 4)) - 16);
        v[l + 16] = d * (float)((int)((q[l] >> 4) | (((qh >> (l + 16)) & 1) << 4)) - 16);
    }
}

QD void chunk(Q5_1, const uint8_t* b, const uint8_t* m, int, float* v) {
    float d = half_at(m), mn = half_at(m + 2);
    uint32_t qh = qh32(m + 4);
    Bytes16 q = load_b16(b);
#pragma unroll
    for (int l = 0; l < 16; ++l) {
        v[l] = d * (float)((q[l] & 15) | (((qh >> l) & 1) << 4)) + mn;
        v[l + 16] = d * (float)((q[l] >> 4) | (((qh >> (l + 16)) & 1) << 4)) + mn;
    }
}

QD void chunk(Q8_0, const uint8_t* b, const uint8_t* m, int, float* v) {
    float d = half_at(m);
    Bytes32 q = load_b32(b);
#pragma unroll
    for (int l = 0; l < 32; ++l) v[l] = d * (float)(int8_t)q[l];
}

// Q2_K / Q3_K / Q6_K chunk c: weights 128h + 32s + l (h = c / 4, s = c % 4, l < 32), 16-weight sub-block
// 8h + 2s + l / 16.
QD void chunk(Q2_K, const uint8_t* b, const uint8_t* m, int c, float* v) {
    int h = c >> 2, s = c & 3;
    float d = half_at(m), dmin = half_at(m + 2);
    Bytes32 q = load_b32(b + 16 + 32 * h);
#pragma unroll
    for (int half16 = 0; half16 < 2; ++half16) {
        int sc = b[8 * h + 2 * s + half16];  // low nibble scale, high nibble min
        float scale = d * (float)(sc & 15), mn = dmin * (float)(sc >> 4);
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            int l = 16 * half16 + i;
            v[l] = scale * (float)((q[l] >> (2 * s)) & 3) - mn;
        }
    }
}

QD void chunk(Q3_K, const uint8_t* b, const uint8_t* m, int c, float* v) {
    int h = c >> 2, s = c & 3;
    float d = half_at(m + 12);
    Bytes32 qs = load_b32(b + 32 + 32 * h), hm = load_b32(b);
#pragma unroll
    for (int half16 = 0; half16 < 2; ++half16) {
        float scale = d * (float)scale_q3_k(m, 8 * h + 2 * s + half16);
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            int l = 16 * half16 + i;
            int q = (qs[l] >> (2 * s)) & 3;
            int minus4 = ((hm[l] >> (4 * h + s)) & 1) ? 0 : 4;  // hmask bit 4h + s of byte l
            v[l] = scale * (float)(q - minus4);
        }
    }
}

QD void chunk(Q6_K, const uint8_t* b, const uint8_t* m, int c, float* v) {
    int h = c >> 2, g = c & 3;
    float d = half_at(m);
    Bytes32 ql = load_b32(b + 64 * h + 32 * (g & 1)), qh = load_b32(b + 128 + 32 * h);
#pragma unroll
    for (int half16 = 0; half16 < 2; ++half16) {
        float scale = d * (float)(int8_t)b[192 + 8 * h + 2 * g + half16];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            int l = 16 * half16 + i;
            int lo = g < 2 ? (ql[l] & 15) : (ql[l] >> 4);
            int q = lo | (((qh[l] >> (2 * g)) & 3) << 4);
            v[l] = scale * (float)(q - 32);
        }
    }
}

// Q4_K / Q5_K chunk j = sub-block j (0..7): qs byte 32 * (j / 2) + l, low nibble for even j, high for odd.
QD void k4_scale_min(const uint8_t* b, int j, float& scale, float& mn) {
    int sc0, sc1, m0, m1;
    k4_scales(load16(b), j >> 1, sc0, sc1, m0, m1);
    scale = half_at(b) * (float)((j & 1) ? sc1 : sc0);
    mn = half_at(b + 2) * (float)((j & 1) ? m1 : m0);
}

QD void chunk(Q4_K, const uint8_t* b, const uint8_t*, int j, float* v) {
    float scale, mn;
    k4_scale_min(b, j, scale, mn);
    Bytes32 qs = load_b32(b + 16 + 32 * (j >> 1));
    int shift = 4 * (j & 1);
#pragma unroll
    for (int l = 0; l < 32; ++l) v[l] = scale * (float)((qs[l] >> shift) & 15) - mn;
}

QD void chunk(Q5_K, const uint8_t* b, const uint8_t*, int j, float* v) {
    float scale, mn;
    k4_scale_min(b, j, scale, mn);
    Bytes32 qs = load_b32(b + 48 + 32 * (j >> 1)), qh = load_b32(b + 16);
    int shift = 4 * (j & 1);
#pragma unroll
    for (int l = 0; l < 32; ++l) {
        int q = ((qs[l] >> shift) & 15) | (((qh[l] >> j) & 1) << 4);  // bit j of qh[l]
        v[l] = scale * (float)q - mn;
    }
}

// Float weights: a "block" is 32 values of the row.
struct F32B {
    static constexpr int QK = 32, BULK = 128, META = 0;
};
struct BF16B {
    static constexpr int QK = 32, BULK = 64, META = 0;
};

QD void chunk(F32B, const uint8_t* b, const uint8_t*, int, float* v) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        uint4 f = load16(b + 16 * k);
        v[4 * k] = bits_float(f.x), v[4 * k + 1] = bits_float(f.y);
        v[4 * k + 2] = bits_float(f.z), v[4 * k + 3] = bits_float(f.w);
    }
}

QD void chunk(BF16B, const uint8_t* b, const uint8_t*, int, float* v) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        uint4 f = load16(b + 16 * k);
        uint32_t w[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
        for (int p = 0; p < 4; ++p) {
            v[8 * k + 2 * p] = bits_float(w[p] << 16);  // bf16 is the top half of a float32
            v[8 * k + 2 * p + 1] = bits_float(w[p] & 0xFFFF0000u);
        }
    }
}
#include "dequant_chunk_iq.cuh"  // MXFP4 and the IQ types
