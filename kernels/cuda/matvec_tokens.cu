// A few tokens' matvecs in one pass over W: speculative decoding's verify step (inference/cuda_graph.VerifyStep),
// compiled apart from matvec.cu so that a model that never speculates does not wait for these.
#define QUANT_DOT_PLAIN_X  // a token's x loads merge across a group's rows (quant_dot.cuh's xload16)
#include "matvec_rows.cuh"
#include "ops_common.cuh"
#include "quant_mma.cuh"

// out[j][row] = W[row] . x_j (+ res[j][row] when add_res) for j < n_tok <= 8, x q8_1 of [n_tok, n_cols]. Two ways:
// - Q4_K, Q5_K (up to 4 tokens or 8), Q6_K (up to 4) and Q8_0 (8): matvec_tokens_mma, the int8 tensor cores. A
//   weight is unpacked once for all the tokens; H200, session 32, 4 tokens: Q4_K 34816x5120 62.3 -> 41.8 us (one
//   token's matvec 30.3), Q6_K 5120x17408 59.5 -> 49.7 (28.1).
// - The others (Q6_K's 5 to 8 tokens too): matvec's threads, rows and order of items, each item dotted with every
//   token's x, so W comes from DRAM once. Q6_K loads an item's weights once (its T::Item); the types with no Item
//   of their own load them again for each token's dot, from L1 (session 30's loop).
#define MAX_TOKENS 8

// Where token t's value of row `row` goes in out. The rows may be split into up to 4 parts at p1 <= p2 <= p3 (n_rows
// for the parts a matrix does not have): the members of a row group (backend_cuda._matmul_parts), each [n_tok, its
// rows] contiguous after the parts before it, so that the ops after read them without a copy. One part: [t][row].
struct Parts {
    int p1, p2, p3;
    __device__ __forceinline__ size_t at(int t, int row, int n_tok, int n_rows) const {
        int first = row >= p3 ? p3 : row >= p2 ? p2 : row >= p1 ? p1 : 0;
        int end = row >= p3 ? n_rows : row >= p2 ? p3 : row >= p1 ? p2 : p1;
        return (size_t)n_tok * first + (size_t)t * (end - first) + (row - first);
    }
};
template <class T, bool OWN_ITEM>
__device__ __forceinline__ void matvec_tokens(const uint8_t* __restrict__ w, const int8_t* __restrict__ xq,
                                              const float2* __restrict__ xds, float* out, int n_rows, int nb,
                                              int tpr, int n_tok, const float* res, int add_res, Parts parts,
                                              int block) {
    constexpr int R = matvec_rows_per_group<T>();
    int row0 = (block * (blockDim.x / tpr) + threadIdx.x / tpr) * R, t = threadIdx.x % tpr;
    size_t n_cols = (size_t)nb * T::QK;
    const uint8_t *bulk[R], *meta[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        int row = min(row0 + r, n_rows - 1);  // past n_rows: the last row again, not stored
        bulk[r] = w + (size_t)row * nb * T::BULK;
        meta[r] = w + (size_t)n_rows * nb * T::BULK + (size_t)row * nb * T::META;
    }
    float acc[MAX_TOKENS][R] = {};
    if constexpr (OWN_ITEM) {
        for (int i = t; i < nb * T::ITEMS; i += tpr) {
            int blk = i / T::ITEMS, k = i % T::ITEMS;
            typename T::Item item[R];
#pragma unroll
            for (int r = 0; r < R; ++r)
                item[r] = typename T::Item(bulk[r] + blk * T::BULK, meta[r] + blk * T::META, k);
#pragma unroll
            for (int j = 0; j < MAX_TOKENS; ++j) {
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
            for (int j = 0; j < MAX_TOKENS; ++j) {
                if (j >= n_tok) break;
                size_t x0 = j * n_cols + (size_t)blk * T::QK;
#pragma unroll
                for (int r = 0; r < R; ++r)
                    acc[j][r] += T::dot(bulk[r] + blk * T::BULK, meta[r] + blk * T::META, k, xq + x0, xds + x0 / 32);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < MAX_TOKENS; ++j) {
        if (j >= n_tok) break;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if ((j > 0 || r > 0) && tpr > 32) __syncthreads();  // row_store's shared sums read by all first
            size_t o = parts.at(j, row0 + r, n_tok, n_rows) - (row0 + r);  // row_store adds the row back
            row_store(acc[j][r], row0 + r, n_rows, tpr, out + o, res + o, add_res);
        }
    }
}

// matvec_tokens on the tensor cores, for the types with an Mma (quant_mma.cuh), for up to NT = 4 or 8 tokens: a
// block's warps take the same 16 rows and split their ggml blocks, then sum their parts. Tokens past n_tok read the
// last token's x (in bounds, not stored). Warps a block (blockDim.x / 32, up to MMA_MAX_WARPS) from the launcher:
// enough in all to keep DRAM busy when a matrix has few rows.
#define MMA_MAX_WARPS 16
template <class T, int NT>
__device__ __forceinline__ void matvec_tokens_mma(const uint8_t* __restrict__ w, const int8_t* __restrict__ xq,
                                                  const float2* __restrict__ xds, float* out, int n_rows, int nb,
                                                  int n_tok, const float* res, int add_res, Parts parts) {
    __shared__ float part[MMA_MAX_WARPS][32][4];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    int g = lane >> 2, q = lane & 3, row0 = blockIdx.x * 16;
    size_t n_cols = (size_t)nb * T::QK;
    const uint8_t *bulk[2], *meta[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        int row = min(row0 + g + 8 * r, n_rows - 1);  // past n_rows: the last row again, not stored
        bulk[r] = w + (size_t)row * nb * T::BULK;
        meta[r] = w + (size_t)n_rows * nb * T::BULK + (size_t)row * nb * T::META;
    }
    // B's token, and the tokens of the lane's C columns (quant_mma.cuh)
    int tb = NT == 8 ? g : g >> 1, t0 = NT == 8 ? 2 * q : q, t1 = NT == 8 ? 2 * q + 1 : q;
    const int8_t* xb = xq + min(tb, n_tok - 1) * n_cols;
    const float2* ds0 = xds + min(t0, n_tok - 1) * n_cols / 32;
    const float2* ds1 = xds + min(t1, n_tok - 1) * n_cols / 32;
    float acc[4] = {};
    for (int blk = warp; blk < nb; blk += n_warps)
        Mma<T>::template block<NT>(bulk[0] + blk * T::BULK, meta[0] + blk * T::META, bulk[1] + blk * T::BULK,
                                   meta[1] + blk * T::META, xb + (size_t)blk * T::QK, ds0 + blk * T::QK / 32,
                                   ds1 + blk * T::QK / 32, g, q, acc);
#pragma unroll
    for (int e = 0; e < 4; ++e) part[warp][lane][e] = acc[e];
    __syncthreads();
    if (warp > 0) return;
    float sum[4] = {};
    for (int v = 0; v < n_warps; ++v)
#pragma unroll
        for (int e = 0; e < 4; ++e) sum[e] += part[v][lane][e];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        int row = row0 + g + 8 * r;
#pragma unroll
        for (int j = 0; j < (NT == 8 ? 2 : 1); ++j) {
            // NT = 4: both columns are token q (two sub-blocks' parts)
            float v = NT == 8 ? sum[2 * r + j] : sum[2 * r] + sum[2 * r + 1];
            int t = NT == 8 ? 2 * q + j : q;
            if (row < n_rows && t < n_tok) {
                size_t o = parts.at(t, row, n_tok, n_rows);
                out[o] = add_res ? v + res[o] : v;
            }
        }
    }
}

#define MATVEC_TOKENS_MMA_N(NAME, T, NT)                                                                 \
    extern "C" __global__ void __launch_bounds__(32 * MMA_MAX_WARPS)                                     \
        NAME##_##NT(const uint8_t* w, const int8_t* xq, const float2* xds, float* out, int n_rows, int nb, \
                    int n_tok, const float* res, int add_res, int p1, int p2, int p3) {                  \
        wait_prior();                                                                                    \
        matvec_tokens_mma<T, NT>(w, xq, xds, out, n_rows, nb, n_tok, res, add_res, Parts{p1, p2, p3});   \
    }
#define MATVEC_TOKENS_MMA(NAME, T) MATVEC_TOKENS_MMA_N(NAME, T, 4) MATVEC_TOKENS_MMA_N(NAME, T, 8)

MATVEC_TOKENS_MMA(matvec_tokens_mma_q4_k, Q4_K)
MATVEC_TOKENS_MMA(matvec_tokens_mma_q5_k, Q5_K)
MATVEC_TOKENS_MMA_N(matvec_tokens_mma_q6_k, Q6_K, 4)
MATVEC_TOKENS_MMA_N(matvec_tokens_mma_q8_0, Q8_0, 8)

// matvec_tokens of float W (an F32 router, qwen35's alpha and beta projections), x float32 [n_tok, n_cols]:
// matvec.cu's matvec_f, each 8 weights dotted with every token's x.
template <class T>
__device__ __forceinline__ void matvec_tokens_f(const uint8_t* __restrict__ w, const float* __restrict__ x,
                                                float* out, int n_rows, int n_cols, int tpr, int n_tok,
                                                const float* res, int add_res, Parts parts) {
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
        size_t o = parts.at(j, row, n_tok, n_rows) - row;  // row_store adds the row back
        row_store(acc[j], row, n_rows, tpr, out + o, res + o, add_res);
    }
}

#define MATVEC_TOKENS_F(NAME, T)                                                                         \
    extern "C" __global__ void __launch_bounds__(128)                                                    \
        NAME(const uint8_t* w, const float* x, float* out, int n_rows, int n_cols, int tpr, int n_tok,  \
             const float* res, int add_res, int p1, int p2, int p3) {                                    \
        wait_prior();                                                                                    \
        matvec_tokens_f<T>(w, x, out, n_rows, n_cols, tpr, n_tok, res, add_res, Parts{p1, p2, p3});      \
    }

MATVEC_TOKENS_F(matvec_tokens_f32, F32W)
MATVEC_TOKENS_F(matvec_tokens_f16, F16W)
MATVEC_TOKENS_F(matvec_tokens_bf16, BF16W)

#define MATVEC_TOKENS_OF(NAME, T, OWN_ITEM)                                                             \
    extern "C" __global__ void __launch_bounds__(128)                                                    \
        NAME(const uint8_t* w, const int8_t* xq, const float2* xds, float* out, int n_rows, int nb,      \
             int tpr, int n_tok, const float* res, int add_res, int p1, int p2, int p3) {                \
        wait_prior();                                                                                    \
        matvec_tokens<T, OWN_ITEM>(w, xq, xds, out, n_rows, nb, tpr, n_tok, res, add_res,               \
                                   Parts{p1, p2, p3}, blockIdx.x);                                       \
    }
#define MATVEC_TOKENS(NAME, T) MATVEC_TOKENS_OF(NAME, T, false)

MATVEC_TOKENS(matvec_tokens_q4_0, Q4_0)
MATVEC_TOKENS(matvec_tokens_q4_1, Q4_1)
MATVEC_TOKENS(matvec_tokens_q5_0, Q5_0)
MATVEC_TOKENS(matvec_tokens_q5_1, Q5_1)
MATVEC_TOKENS(matvec_tokens_q2_k, Q2_K)
MATVEC_TOKENS(matvec_tokens_q3_k, Q3_K)
MATVEC_TOKENS_OF(matvec_tokens_q6_k, Q6_K, true)  // 5 to 8 tokens; up to 4: matvec_tokens_mma_q6_k_4
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

