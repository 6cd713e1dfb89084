// Chunks (32 weights, dequant_chunk.cuh) of MXFP4 and the IQ types, bit-identical to models/dequant.py and
// models/dequant_iq.py: every value is a product of an fp16 or e8m0 scale, small integers and a table or grid value,
// exact in float32 in any order. Layouts: quant_dot_iq.cuh (the bulk / meta split) and models/dequant_iq.py.
#pragma once
#include "quant_dot.cuh"

// 32 codes of a 16-value table (quant_dot_iq.cuh's table16_dot, SEQ as there) times d
template <class K, bool SEQ = false>
QD void table16_chunk(const uint8_t* b, float d, float* v) {
    uint4 q = load16(b);
    uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        int lo, hi;
        table16_word<K, SEQ>(w[j], lo, hi);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            v[4 * j + i] = d * (float)(int8_t)(lo >> (8 * i));
            v[16 + 4 * j + i] = d * (float)(int8_t)(hi >> (8 * i));
        }
    }
}

QD void chunk(MXFP4, const uint8_t* b, const uint8_t* m, int, float* v) {
    table16_chunk<KvaluesMxfp4>(b, e8m0_half(m[0]), v);
}

QD void chunk(IQ4_NL, const uint8_t* b, const uint8_t* m, int, float* v) {
    table16_chunk<KvaluesIq4nl>(b, half_at(m), v);
}

QD void chunk(IQ4_XS, const uint8_t* b, const uint8_t* m, int c, float* v) {
    uint32_t lo = (m[4 + c / 2] >> (4 * (c & 1))) & 15, hi = (u16_at(m + 2) >> (2 * c)) & 3;
    table16_chunk<KvaluesIq4nl, true>(b + 16 * c, half_at(m) * (float)((int)(lo | (hi << 4)) - 32), v);
}

// 8 values of an 8-byte grid entry g, times db, negated where bits of the sign byte s are set
QD void grid8(uint64_t g, uint32_t s, float db, float* v) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        float w = db * (float)(int8_t)(g >> (8 * i));
        v[i] = ((s >> i) & 1) ? -w : w;
    }
}

// 4 values of a 4-byte grid entry, as grid8
QD void grid4(uint32_t g, uint32_t s, float db, float* v) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float w = db * (float)(int8_t)(g >> (8 * i));
        v[i] = ((s >> i) & 1) ? -w : w;
    }
}

QD void chunk(IQ2_XXS, const uint8_t* b, const uint8_t* m, int c, float* v) {
    uint2 q = *reinterpret_cast<const uint2*>(b + 8 * c);
    float db = half_at(m) * (0.5f + (float)(q.y >> 28)) * 0.25f;
#pragma unroll
    for (int l = 0; l < 4; ++l) grid8(GRID_IQ2_XXS[(q.x >> (8 * l)) & 255], ksigns((q.y >> (7 * l)) & 127), db, v + 8 * l);
}

QD void chunk(IQ2_XS, const uint8_t* b, const uint8_t* m, int c, float* v) {
    uint2 q = *reinterpret_cast<const uint2*>(b + 8 * c);  // entries 4c .. 4c + 3
    float d = half_at(m);
    uint32_t sc = m[2 + c];
#pragma unroll
    for (int l = 0; l < 4; ++l) {
        uint32_t e = ((l < 2 ? q.x : q.y) >> (16 * (l & 1))) & 0xFFFF;
        float db = d * (0.5f + (float)((sc >> (4 * (l / 2))) & 15)) * 0.25f;
        grid8(GRID_IQ2_XS[e & 511], ksigns(e >> 9), db, v + 8 * l);
    }
}

QD void chunk(IQ2_S, const uint8_t* b, const uint8_t* m, int c, float* v) {
    float d = half_at(m);
    uint32_t qh = m[2 + c], sc = m[10 + c];
#pragma unroll
    for (int l = 0; l < 4; ++l) {
        float db = d * (0.5f + (float)((sc >> (4 * (l / 2))) & 15)) * 0.25f;
        grid8(GRID_IQ2_S[b[4 * c + l] | (((qh >> (2 * l)) & 3) << 8)], b[32 + 4 * c + l], db, v + 8 * l);
    }
}

QD void chunk(IQ3_XXS, const uint8_t* b, const uint8_t* m, int c, float* v) {
    uint2 q = *reinterpret_cast<const uint2*>(b + 8 * c);
    uint32_t a = *reinterpret_cast<const uint32_t*>(b + 64 + 4 * c);
    float db = half_at(m) * (0.5f + (float)(a >> 28)) * 0.5f;
#pragma unroll
    for (int l = 0; l < 4; ++l) {
        uint32_t s = ksigns((a >> (7 * l)) & 127), g = l < 2 ? q.x : q.y;
        grid4(GRID_IQ3_XXS[(g >> (16 * (l & 1))) & 255], s, db, v + 8 * l);
        grid4(GRID_IQ3_XXS[(g >> (16 * (l & 1) + 8)) & 255], s >> 4, db, v + 8 * l + 4);
    }
}

QD void chunk(IQ3_S, const uint8_t* b, const uint8_t* m, int c, float* v) {
    uint32_t qh = m[2 + c];
    float db = half_at(m) * (float)(1 + 2 * ((m[42 + c / 2] >> (4 * (c & 1))) & 15));
#pragma unroll
    for (int l = 0; l < 4; ++l) {
        uint32_t s = m[10 + 4 * c + l];
        int e = 8 * c + 2 * l;  // the entry of the group's first 4 values
        grid4(GRID_IQ3_S[b[e] | (((qh >> (2 * l)) & 1) << 8)], s, db, v + 8 * l);
        grid4(GRID_IQ3_S[b[e + 1] | (((qh >> (2 * l + 1)) & 1) << 8)], s >> 4, db, v + 8 * l + 4);
    }
}

// 8 values of an IQ1 grid entry (-1 / 0 / 1) plus delta, times dl
QD void grid8_shift(uint64_t g, float delta, float dl, float* v) {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = dl * ((float)(int8_t)(g >> (8 * i)) + delta);
}

QD void chunk(IQ1_S, const uint8_t* b, const uint8_t* m, int c, float* v) {
    uint32_t h = u16_at(m + 2 + 2 * c);
    float dl = half_at(m) * (float)(2 * ((h >> 12) & 7) + 1), delta = (h & 0x8000) ? -0.125f : 0.125f;
#pragma unroll
    for (int l = 0; l < 4; ++l) grid8_shift(GRID_IQ1_S[b[4 * c + l] | (((h >> (3 * l)) & 7) << 8)], delta, dl, v + 8 * l);
}

QD void chunk(IQ1_M, const uint8_t* b, const uint8_t* m, int c, float* v) {
    uint2 sv = *reinterpret_cast<const uint2*>(m + 16);
    uint32_t dbits = ((sv.x >> 12) & 0xF) | ((sv.x >> 24) & 0xF0) | ((sv.y >> 4) & 0xF00) | ((sv.y >> 16) & 0xF000);
    int w = c / 2;  // the scale word of the chunk's two 16-value scales, fields 2 (c % 2) and 2 (c % 2) + 1
    uint32_t sc = ((w < 2 ? sv.x : sv.y) >> (16 * (w & 1))) & 0xFFFF;
    float d = half_bits(dbits);
#pragma unroll
    for (int l = 0; l < 4; ++l) {
        uint32_t h = m[2 * c + l / 2] >> (4 * (l & 1));  // entry 4c + l's nibble
        float dl = d * (float)(2 * ((sc >> (3 * (2 * (c & 1) + l / 2))) & 7) + 1);
        grid8_shift(GRID_IQ1_S[b[4 * c + l] | ((h & 7) << 8)], (h & 8) ? -0.125f : 0.125f, dl, v + 8 * l);
    }
}
