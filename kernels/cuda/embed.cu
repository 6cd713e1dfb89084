// Token embedding: out[t, :] = dequant(table row ids[t]) * scale, for t < n_tokens (ids read on the device).
//
// A quantized table is in the repacked layout of kernels/cuda/layout.py (bulk [n_rows, nb, BULK] then meta
// [n_rows, nb, META]), so a tied output head and the embedding share one copy in VRAM; its rows are dequantized
// by the prefill's chunk decoders (dequant_chunk.cuh), bit-identical to models/dequant.py, then times scale.
// Launch (quantized): grid (n_tokens, ceil(n_cols / 32 / 256)), block 256; thread = one chunk of 32 columns.
// Launch (float): grid (n_tokens, ceil(n_cols / 256)), block 256; thread = one column.
#include "dequant_chunk.cuh"
#include "ops_common.cuh"

template <class T>
__device__ __forceinline__ void embed_q(const uint8_t* __restrict__ w, const int* __restrict__ ids,
                                        float* __restrict__ out, int n_rows, int n_cols, float scale) {
    constexpr int CPB = T::QK / 32;  // chunks a block
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= n_cols / 32) return;
    int row = ids[blockIdx.x];
    float* o = out + (size_t)blockIdx.x * n_cols + 32 * c;
    float v[32];
    if (row < 0 || row >= n_rows) {  // a bad id shows as NaN instead of reading past the table
#pragma unroll
        for (int l = 0; l < 32; ++l) v[l] = QUIET_NAN;
    } else {
        int nb = n_cols / T::QK;
        size_t blk = (size_t)row * nb + c / CPB;
        chunk(T{}, w + blk * T::BULK, w + (size_t)n_rows * nb * T::BULK + blk * T::META, c % CPB, v);
    }
#pragma unroll
    for (int l = 0; l < 32; ++l) o[l] = v[l] * scale;
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
EMBED_Q(embed_mxfp4, MXFP4)
EMBED_Q(embed_iq4_nl, IQ4_NL)
EMBED_Q(embed_iq4_xs, IQ4_XS)
EMBED_Q(embed_iq2_xxs, IQ2_XXS)
EMBED_Q(embed_iq2_xs, IQ2_XS)
EMBED_Q(embed_iq2_s, IQ2_S)
EMBED_Q(embed_iq3_xxs, IQ3_XXS)
EMBED_Q(embed_iq3_s, IQ3_S)
EMBED_Q(embed_iq1_s, IQ1_S)
EMBED_Q(embed_iq1_m, IQ1_M)

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
