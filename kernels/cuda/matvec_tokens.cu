// A few tokens' matvecs in one pass over W: speculative decoding's verify step (inference/cuda_graph.VerifyStep),
// compiled apart from matvec.cu so that a model that never speculates does not wait for these.
#define QUANT_DOT_PLAIN_X  // a token's x loads merge across a group's rows (quant_dot.cuh's xload16)
#include "matvec_rows.cuh"
#include "ops_common.cuh"

// out[j][row] = W[row] . x_j (+ res[j][row] when add_res) for j < n_tok <= N, x q8_1 of [n_tok, n_cols]. matvec's
// threads and order of items, each item (T::Item) loaded once and dotted with every token's x: W comes from DRAM
// once, and for the types with their own Item from L1 once too. Rows a group: matvec_tokens_rows_per_group (a
// token's x loaded once for them). Kernels for N = 4 and 8 (a step of n tokens takes the smaller that fits):
// the accumulators of 8 tokens cost registers a step of 4 does not need (H200, session 31: Q4_K 28672x4096 at 4
// tokens 55.9 -> 44.1 us with 4 rows a group and N = 4; Q6_K 128256x4096 239 -> 190 us). The types with no Item of
// their own have the kernel for 8 only, each token's dot loading the weights again (session 30's loop).
#define MAX_TOKENS 8
// 4 for the types of 256-value blocks with their own Item (measured on Q4_K and Q6_K), else matvec's rows
template <class T>
__host__ __device__ constexpr int matvec_tokens_rows_per_group() { return matvec_rows_per_group<T>(); }
template <>
__host__ __device__ constexpr int matvec_tokens_rows_per_group<Q4_K>() { return 4; }
template <>
__host__ __device__ constexpr int matvec_tokens_rows_per_group<Q5_K>() { return 4; }

template <class T, int N, bool OWN_ITEM>
__device__ __forceinline__ void matvec_tokens(const uint8_t* __restrict__ w, const int8_t* __restrict__ xq,
                                              const float2* __restrict__ xds, float* out, int n_rows, int nb,
                                              int tpr, int n_tok, const float* res, int add_res, int block) {
    constexpr int R = matvec_tokens_rows_per_group<T>();
    int row0 = (block * (blockDim.x / tpr) + threadIdx.x / tpr) * R, t = threadIdx.x % tpr;
    size_t n_cols = (size_t)nb * T::QK;
    const uint8_t *bulk[R], *meta[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        int row = min(row0 + r, n_rows - 1);  // past n_rows: the last row again, not stored
        bulk[r] = w + (size_t)row * nb * T::BULK;
        meta[r] = w + (size_t)n_rows * nb * T::BULK + (size_t)row * nb * T::META;
    }
    float acc[N][R] = {};
    if constexpr (OWN_ITEM) {
        for (int i = t; i < nb * T::ITEMS; i += tpr) {
            int blk = i / T::ITEMS, k = i % T::ITEMS;
            typename T::Item item[R];
#pragma unroll
            for (int r = 0; r < R; ++r)
                item[r] = typename T::Item(bulk[r] + blk * T::BULK, meta[r] + blk * T::META, k);
#pragma unroll
            for (int j = 0; j < N; ++j) {
                if (j >= n_tok) break;
                size_t x0 = j * n_cols + (size_t)blk * T::QK;
#pragma unroll
                for (int r = 0; r < R; ++r) acc[j][r] += item[r].dot(xq + x0, xds + x0 / 32);
            }
        }
    } else {  // each token's dot loads the weights again, from L1 (an Items array here spilled a few bytes)
#pragma unroll 2
        for (int i = t; i < nb * T::ITEMS; i += tpr) {
            int blk = i / T::ITEMS, k = i % T::ITEMS;
#pragma unroll
            for (int j = 0; j < N; ++j) {
                if (j >= n_tok) break;
                size_t x0 = j * n_cols + (size_t)blk * T::QK;
#pragma unroll
                for (int r = 0; r < R; ++r)
                    acc[j][r] += T::dot(bulk[r] + blk * T::BULK, meta[r] + blk * T::META, k, xq + x0, xds + x0 / 32);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < N; ++j) {
        if (j >= n_tok) break;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if ((j > 0 || r > 0) && tpr > 32) __syncthreads();  // row_store's shared sums read by all first
            row_store(acc[j][r], row0 + r, n_rows, tpr, out + (size_t)j * n_rows, res + (size_t)j * n_rows, add_res);
        }
    }
}

// matvec_tokens of float W (an F32 router, qwen35's alpha and beta projections), x float32 [n_tok, n_cols]:
// matvec.cu's matvec_f, each 8 weights dotted with every token's x.
template <class T>
__device__ __forceinline__ void matvec_tokens_f(const uint8_t* __restrict__ w, const float* __restrict__ x,
                                                float* out, int n_rows, int n_cols, int tpr, int n_tok,
                                                const float* res, int add_res) {
    int row = blockIdx.x * (blockDim.x / tpr) + threadIdx.x / tpr, t = threadIdx.x % tpr;
    float acc[MAX_TOKENS] = {};
    if (row < n_rows) {
        const uint8_t* wr = w + (size_t)row * n_cols * T::BYTES;
        for (int i = t; i < n_cols / 8; i += tpr) {
            float v[8];
            T::load8(wr + (size_t)i * 8 * T::BYTES, v);
#pragma unroll
            for (int j = 0; j < MAX_TOKENS; ++j) {
                if (j >= n_tok) break;
                const float4* xj = reinterpret_cast<const float4*>(x + (size_t)j * n_cols + 8 * i);
                float4 xa = xj[0], xb = xj[1];
                acc[j] += v[0] * xa.x + v[1] * xa.y + v[2] * xa.z + v[3] * xa.w + v[4] * xb.x + v[5] * xb.y +
                          v[6] * xb.z + v[7] * xb.w;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < MAX_TOKENS; ++j) {
        if (j >= n_tok) break;
        if (j > 0 && tpr > 32) __syncthreads();  // row_store's shared sums read by all first
        row_store(acc[j], row, n_rows, tpr, out + (size_t)j * n_rows, res + (size_t)j * n_rows, add_res);
    }
}

#define MATVEC_TOKENS_F(NAME, T)                                                                         \
    extern "C" __global__ void __launch_bounds__(128)                                                    \
        NAME(const uint8_t* w, const float* x, float* out, int n_rows, int n_cols, int tpr, int n_tok,  \
             const float* res, int add_res) {                                                            \
        wait_prior();                                                                                    \
        matvec_tokens_f<T>(w, x, out, n_rows, n_cols, tpr, n_tok, res, add_res);                         \
    }

MATVEC_TOKENS_F(matvec_tokens_f32, F32W)
MATVEC_TOKENS_F(matvec_tokens_f16, F16W)
MATVEC_TOKENS_F(matvec_tokens_bf16, BF16W)

#define MATVEC_TOKENS_N(NAME, T, N, OWN_ITEM)                                                            \
    extern "C" __global__ void __launch_bounds__(128)                                                    \
        NAME##_##N(const uint8_t* w, const int8_t* xq, const float2* xds, float* out, int n_rows, int nb, \
                   int tpr, int n_tok, const float* res, int add_res) {                                  \
        wait_prior();                                                                                    \
        matvec_tokens<T, N, OWN_ITEM>(w, xq, xds, out, n_rows, nb, tpr, n_tok, res, add_res, blockIdx.x); \
    }
// a type with its own Item (quant_dot.cuh): kernels for 4 tokens and 8; the others: 8
#define MATVEC_TOKENS_ITEMS(NAME, T) MATVEC_TOKENS_N(NAME, T, 4, true) MATVEC_TOKENS_N(NAME, T, 8, true)
#define MATVEC_TOKENS(NAME, T) MATVEC_TOKENS_N(NAME, T, 8, false)

MATVEC_TOKENS(matvec_tokens_q4_0, Q4_0)
MATVEC_TOKENS(matvec_tokens_q4_1, Q4_1)
MATVEC_TOKENS(matvec_tokens_q5_0, Q5_0)
MATVEC_TOKENS(matvec_tokens_q5_1, Q5_1)
MATVEC_TOKENS_ITEMS(matvec_tokens_q8_0, Q8_0)
MATVEC_TOKENS(matvec_tokens_q2_k, Q2_K)
MATVEC_TOKENS(matvec_tokens_q3_k, Q3_K)
MATVEC_TOKENS_ITEMS(matvec_tokens_q4_k, Q4_K)
MATVEC_TOKENS_ITEMS(matvec_tokens_q5_k, Q5_K)
MATVEC_TOKENS_ITEMS(matvec_tokens_q6_k, Q6_K)
MATVEC_TOKENS(matvec_tokens_mxfp4, MXFP4)
MATVEC_TOKENS(matvec_tokens_iq4_nl, IQ4_NL)
MATVEC_TOKENS(matvec_tokens_iq4_xs, IQ4_XS)
MATVEC_TOKENS(matvec_tokens_iq2_xxs, IQ2_XXS)
MATVEC_TOKENS(matvec_tokens_iq2_xs, IQ2_XS)
MATVEC_TOKENS(matvec_tokens_iq2_s, IQ2_S)
MATVEC_TOKENS(matvec_tokens_iq3_xxs, IQ3_XXS)
MATVEC_TOKENS(matvec_tokens_iq3_s, IQ3_S)
MATVEC_TOKENS(matvec_tokens_iq1_s, IQ1_S)
MATVEC_TOKENS(matvec_tokens_iq1_m, IQ1_M)

