// Small-batch matmul for a few tokens: out[t, row] = W[row, :] . x_t for NT = 8 tokens at once, x quantized
// to q8_1 (quantize_q8_1 of kernels/cuda/matvec.cu over the whole [n_tokens, n_cols] array), dp4a dot products
// of quant_dot.cuh. Each weight item is loaded once and dotted with all NT activations (the NT inlined
// T::dot calls read the same addresses through the read-only path, which the compiler loads once), so W
// is read once per NT tokens instead of once per token.
//
// Launch: 128 threads a block, one warp a row (4 rows a block); x rows padded to a multiple of NT (pad rows
// are read, never stored): xq int8 [NT * n_groups, n_cols], xds float2 [NT * n_groups, n_cols / 32];
// blockIdx.y is the group of NT tokens.
#include "quant_dot.cuh"
#include "ops_common.cuh"

constexpr int NT = 8;

template <class T>
__device__ __forceinline__ void matmul_q8(const uint8_t* __restrict__ w, const int8_t* __restrict__ xq,
                                          const float2* __restrict__ xds, float* __restrict__ out, int n_rows,
                                          int nb, int n_tokens) {
    int row = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
    int t0 = blockIdx.y * NT, n_cols = nb * T::QK;
    if (row >= n_rows) return;  // whole warps leave together
    const uint8_t* bulk = w + (size_t)row * nb * T::BULK;
    const uint8_t* meta = w + (size_t)n_rows * nb * T::BULK + (size_t)row * nb * T::META;
    const int8_t* x0 = xq + (size_t)t0 * n_cols;
    const float2* d0 = xds + (size_t)t0 * (n_cols / 32);
    float acc[NT] = {};
#pragma unroll 4  // (1, 2 and 3 spill a register on some types)
    for (int i = lane; i < nb * T::ITEMS; i += 32) {
        int blk = i / T::ITEMS, k = i % T::ITEMS;
#pragma unroll
        for (int t = 0; t < NT; ++t)
            acc[t] += T::dot(bulk + blk * T::BULK, meta + blk * T::META, k, x0 + (size_t)t * n_cols + blk * T::QK,
                             d0 + (size_t)t * (n_cols / 32) + blk * (T::QK / 32));
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], o);
    }
#pragma unroll
    for (int t = 0; t < NT; ++t)
        if (lane == t && t0 + t < n_tokens) out[(size_t)(t0 + t) * n_rows + row] = acc[t];
}

#define MATMUL_Q8(NAME, T)                                                                              \
    extern "C" __global__ void __launch_bounds__(128)                                                   \
        NAME(const uint8_t* w, const int8_t* xq, const float2* xds, float* out, int n_rows, int nb,    \
             int n_tokens) {                                                                            \
        wait_prior();                                                                                   \
        matmul_q8<T>(w, xq, xds, out, n_rows, nb, n_tokens);                                            \
    }

MATMUL_Q8(matmul_q8_q4_0, Q4_0)
MATMUL_Q8(matmul_q8_q4_1, Q4_1)
MATMUL_Q8(matmul_q8_q5_0, Q5_0)
MATMUL_Q8(matmul_q8_q5_1, Q5_1)
MATMUL_Q8(matmul_q8_q8_0, Q8_0)
MATMUL_Q8(matmul_q8_q2_k, Q2_K)
MATMUL_Q8(matmul_q8_q3_k, Q3_K)
MATMUL_Q8(matmul_q8_q4_k, Q4_K)
MATMUL_Q8(matmul_q8_q5_k, Q5_K)
MATMUL_Q8(matmul_q8_q6_k, Q6_K)
MATMUL_Q8(matmul_q8_mxfp4, MXFP4)
MATMUL_Q8(matmul_q8_iq4_nl, IQ4_NL)
MATMUL_Q8(matmul_q8_iq4_xs, IQ4_XS)
MATMUL_Q8(matmul_q8_iq2_xxs, IQ2_XXS)
MATMUL_Q8(matmul_q8_iq2_xs, IQ2_XS)
MATMUL_Q8(matmul_q8_iq2_s, IQ2_S)
MATMUL_Q8(matmul_q8_iq3_xxs, IQ3_XXS)
MATMUL_Q8(matmul_q8_iq3_s, IQ3_S)
MATMUL_Q8(matmul_q8_iq1_s, IQ1_S)
MATMUL_Q8(matmul_q8_iq1_m, IQ1_M)
