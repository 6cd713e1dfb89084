// Token embedding: out[t, :] = dequant(table row ids[t]) * scale, for t < n_tokens (ids read on the device).
//
// The table is in the repacked layout of kernels/cuda/layout.py (bulk [n_rows, nb, BULK] then meta
// [n_rows, nb, META]), so a tied output head and the embedding share one copy in VRAM. Each value is
// formed exactly as models/dequant.py forms it (float32 products of integers and fp16 scales, one rounding
// at the final add of a min), so the result is bit-identical to that reference.
// Launch: grid (n_tokens, ceil(n_cols / 256)), block 256; thread = one column.
#include "ops_common.cuh"

// One block as it lay in the file, read through the repacked split: byte o of the original block.
template <int FRONT, int BULK>
struct Block {
    const uint8_t* bulk;
    const uint8_t* meta;
    __device__ __forceinline__ int at(int o) const {
        return o < FRONT ? meta[o] : (o < FRONT + BULK ? bulk[o - FRONT] : meta[o - BULK]);
    }
    __device__ __forceinline__ float f16(int o) const {
        return __half2float(__ushort_as_half((unsigned short)(at(o) | (at(o + 1) << 8))));
    }
};

// Q4_K / Q5_K six-bit scale and min j of the 12 scale bytes at offset 4
template <class B>
__device__ __forceinline__ void k_scale_min(const B& b, int j, float& sc, float& mn) {
    if (j < 4) {
        sc = (float)(b.at(4 + j) & 63);
        mn = (float)(b.at(8 + j) & 63);
    } else {
        sc = (float)((b.at(8 + j) & 15) | ((b.at(j) >> 6) << 4));
        mn = (float)((b.at(8 + j) >> 4) | ((b.at(4 + j) >> 6) << 4));
    }
}

struct Q4_0 { static constexpr int QK = 32, BB = 18, FRONT = 2, BACK = 0;
    template <class B> static __device__ float value(const B& b, int e) {
        int q = e < 16 ? (b.at(2 + e) & 15) : (b.at(2 + e - 16) >> 4);
        return b.f16(0) * (float)(q - 8);
    } };
struct Q4_1 { static constexpr int QK = 32, BB = 20, FRONT = 4, BACK = 0;
    template <class B> static __device__ float value(const B& b, int e) {
        int q = e < 16 ? (b.at(4 + e) & 15) : (b.at(4 + e - 16) >> 4);
        return b.f16(0) * (float)q + b.f16(2);
    } };
struct Q5_0 { static constexpr int QK = 32, BB = 22, FRONT = 6, BACK = 0;
    template <class B> static __device__ float value(const B& b, int e) {
        int q = e < 16 ? (b.at(6 + e) & 15) : (b.at(6 + e - 16) >> 4);
        q |= ((b.at(2 + e / 8) >> (e % 8)) & 1) << 4;  // bit e of the little-endian u32 qh
        return b.f16(0) * (float)(q - 16);
    } };
struct Q5_1 { static constexpr int QK = 32, BB = 24, FRONT = 8, BACK = 0;
    template <class B> static __device__ float value(const B& b, int e) {
        int q = e < 16 ? (b.at(8 + e) & 15) : (b.at(8 + e - 16) >> 4);
        q |= ((b.at(4 + e / 8) >> (e % 8)) & 1) << 4;
        return b.f16(0) * (float)q + b.f16(2);
    } };
struct Q8_0 { static constexpr int QK = 32, BB = 34, FRONT = 2, BACK = 0;
    template <class B> static __device__ float value(const B& b, int e) {
        return b.f16(0) * (float)(int8_t)b.at(2 + e);
    } };
// Q2_K: element e = 128h + 32f + l takes bits 2f of qs[32h + l]; sub-block e / 16
struct Q2_K { static constexpr int QK = 256, BB = 84, FRONT = 0, BACK = 4;
    template <class B> static __device__ float value(const B& b, int e) {
        int h = e / 128, f = (e % 128) / 32, l = e % 32;
        int q = (b.at(16 + 32 * h + l) >> (2 * f)) & 3;
        int sc = b.at(e / 16);
        float scale = b.f16(80) * (float)(sc & 15), minimum = b.f16(82) * (float)(sc >> 4);
        return scale * (float)q - minimum;
    } };
// Q3_K: low bits as Q2_K (qs at 32); bit e / 32 of hmask[e % 32] clear: subtract 4; 6-bit scales minus 32
struct Q3_K { static constexpr int QK = 256, BB = 110, FRONT = 0, BACK = 14;
    template <class B> static __device__ float value(const B& b, int e) {
        int h = e / 128, f = (e % 128) / 32, l = e % 32;
        int q = (b.at(32 + 32 * h + l) >> (2 * f)) & 3;
        if (!((b.at(l) >> (e / 32)) & 1)) q -= 4;
        int i = e / 16;
        int lo = i < 8 ? (b.at(96 + i) & 15) : (b.at(96 + i - 8) >> 4);
        int hi = (b.at(104 + i % 4) >> (2 * (i / 4))) & 3;
        return (b.f16(108) * (float)((lo | (hi << 4)) - 32)) * (float)q;
    } };
// Q4_K: element e = 64g + 32n + l is nibble n of qs[32g + l] (qs at 16); sub-block e / 32
struct Q4_K { static constexpr int QK = 256, BB = 144, FRONT = 0, BACK = 0;
    template <class B> static __device__ float value(const B& b, int e) {
        int g = e / 64, n = (e % 64) / 32, l = e % 32;
        int q = (b.at(16 + 32 * g + l) >> (4 * n)) & 15;
        float sc, mn;
        k_scale_min(b, e / 32, sc, mn);
        return (b.f16(0) * sc) * (float)q - b.f16(2) * mn;
    } };
// Q5_K: low nibble as Q4_K (qs at 48), bit 4 is bit e / 32 of qh[e % 32] (qh at 16)
struct Q5_K { static constexpr int QK = 256, BB = 176, FRONT = 0, BACK = 0;
    template <class B> static __device__ float value(const B& b, int e) {
        int g = e / 64, n = (e % 64) / 32, l = e % 32;
        int q = ((b.at(48 + 32 * g + l) >> (4 * n)) & 15) | (((b.at(16 + l) >> (e / 32)) & 1) << 4);
        float sc, mn;
        k_scale_min(b, e / 32, sc, mn);
        return (b.f16(0) * sc) * (float)q - b.f16(2) * mn;
    } };
// Q6_K: e = 128h + 64n + l2 (l2 < 64): nibble n of ql[64h + l2]; e = 128h + 32f + l: bits 2f of qh[32h + l]
struct Q6_K { static constexpr int QK = 256, BB = 210, FRONT = 0, BACK = 2;
    template <class B> static __device__ float value(const B& b, int e) {
        int h = e / 128, r = e % 128;
        int low = (b.at(64 * h + r % 64) >> (4 * (r / 64))) & 15;
        int high = (b.at(128 + 32 * h + r % 32) >> (2 * (r / 32))) & 3;
        float scale = b.f16(208) * (float)(int8_t)b.at(192 + e / 16);
        return scale * (float)((low | (high << 4)) - 32);
    } };

template <class T>
__device__ __forceinline__ void embed_q(const uint8_t* __restrict__ w, const int* __restrict__ ids,
                                        float* __restrict__ out, int n_rows, int n_cols, float scale) {
    constexpr int BULK = T::BB - T::FRONT - T::BACK, META = T::FRONT + T::BACK;
    int col = blockIdx.y * blockDim.x + threadIdx.x;
    if (col >= n_cols) return;
    int row = ids[blockIdx.x];
    float* o = out + (size_t)blockIdx.x * n_cols + col;
    if (row < 0 || row >= n_rows) {  // a bad id shows as NaN instead of reading past the table
        *o = QUIET_NAN;
        return;
    }
    int nb = n_cols / T::QK, blk = col / T::QK;
    Block<T::FRONT, BULK> b;
    b.bulk = w + ((size_t)row * nb + blk) * BULK;
    b.meta = w + (size_t)n_rows * nb * BULK + ((size_t)row * nb + blk) * META;
    *o = T::value(b, col % T::QK) * scale;
}

#define EMBED_Q(NAME, T)                                                                                \
    extern "C" __global__ void NAME(const uint8_t* w, const int* ids, float* out, int n_rows, int n_cols, \
                                    float scale) {                                                     \
        wait_prior();                                                                                  \
        embed_q<T>(w, ids, out, n_rows, n_cols, scale);                                                 \
    }

EMBED_Q(embed_q4_0, Q4_0)
EMBED_Q(embed_q4_1, Q4_1)
EMBED_Q(embed_q5_0, Q5_0)
EMBED_Q(embed_q5_1, Q5_1)
EMBED_Q(embed_q8_0, Q8_0)
EMBED_Q(embed_q2_k, Q2_K)
EMBED_Q(embed_q3_k, Q3_K)
EMBED_Q(embed_q4_k, Q4_K)
EMBED_Q(embed_q5_k, Q5_K)
EMBED_Q(embed_q6_k, Q6_K)

// Float tables keep the file layout: row-major [n_rows, n_cols].
__device__ __forceinline__ float float_value(const float* w, size_t i) { return w[i]; }
__device__ __forceinline__ float float_value(const __half* w, size_t i) { return __half2float(w[i]); }
__device__ __forceinline__ float float_value(const uint16_t* w, size_t i) {  // bf16: top half of a float32
    return __uint_as_float((uint32_t)w[i] << 16);
}

template <class E>
__device__ __forceinline__ void embed_float(const E* __restrict__ w, const int* __restrict__ ids,
                                            float* __restrict__ out, int n_rows, int n_cols, float scale) {
    int col = blockIdx.y * blockDim.x + threadIdx.x;
    if (col >= n_cols) return;
    int row = ids[blockIdx.x];
    float* o = out + (size_t)blockIdx.x * n_cols + col;
    *o = (row < 0 || row >= n_rows) ? QUIET_NAN
                                    : float_value(w, (size_t)row * n_cols + col) * scale;
}

#define EMBED_F(NAME, E)                                                                                \
    extern "C" __global__ void NAME(const E* w, const int* ids, float* out, int n_rows, int n_cols,    \
                                    float scale) {                                                     \
        wait_prior();                                                                                  \
        embed_float<E>(w, ids, out, n_rows, n_cols, scale);                                             \
    }

EMBED_F(embed_f32, float)
EMBED_F(embed_f16, __half)
EMBED_F(embed_bf16, uint16_t)
