// Matrix-vector products for batch-1 decode: out[n_rows] = W[n_rows, n_cols] . x[n_cols].
//
// Quantized W: x is first quantized to q8_1 (quantize_q8_1), then each weight item is dotted with dp4a
// (quant_dot.cuh). Float W (F32, F16, BF16): x stays float32.
// Launch: blockDim.x = 128; `tpr` threads (32, 64 or 128) work on one row, so a block does 128/tpr rows.
#include "matvec_rows.cuh"
#include "ops_common.cuh"
#include "q8_1.cuh"

// x: float32 [n] -> xq int8 [n], xds float2 [n/32] = (d, d*sum(q)), d = max|x|/127 per 32 values.
// One warp per 32 values.
extern "C" __global__ void quantize_q8_1(const float* __restrict__ x, int8_t* __restrict__ xq,
                                         float2* __restrict__ xds, int n) {
    wait_prior();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;  // n is a multiple of 32: whole warps leave together
    store_q8_1(x[i], i, xq, xds);
}

// The bytes of block `block`'s rows (blockDim.x / tpr of them: bulk, then meta, as cuda_layout.py lays a matrix
// out, nb items of `bulk` and `meta` bytes a row) asked of L2 before wait_prior(): a matvec's weights do not
// depend on the kernel ahead, so their DRAM latency passes while it runs.
__device__ __forceinline__ void prefetch_rows(const uint8_t* w, int n_rows, int nb, int tpr, int bulk, int meta,
                                              int block) {
    int rows = blockDim.x / tpr, row0 = block * rows;
    rows = min(rows, n_rows - row0);
    size_t row_bulk = (size_t)nb * bulk, row_meta = (size_t)nb * meta;
    if (threadIdx.x == 0 && rows > 0) prefetch_l2(w + row0 * row_bulk, rows * row_bulk);
    if (threadIdx.x == 32 && rows > 0 && meta) prefetch_l2(w + n_rows * row_bulk + row0 * row_meta, rows * row_meta);
}

template <class T>
__device__ __forceinline__ void matvec_q(const uint8_t* __restrict__ w, const int8_t* __restrict__ xq,
                                         const float2* __restrict__ xds, float* out, int n_rows, int nb,
                                         int tpr, const float* res, int add_res, int block) {
    int row = block * (blockDim.x / tpr) + threadIdx.x / tpr;
    float acc = row < n_rows ? row_dot<T>(w, row, n_rows, nb, threadIdx.x % tpr, tpr, xq, xds) : 0.0f;
    row_store(acc, row, n_rows, tpr, out, res, add_res);
}

template <class T>
__device__ __forceinline__ void matvec_rows(const uint8_t* __restrict__ w, const int8_t* __restrict__ xq,
                                            const float2* __restrict__ xds, float* out, int n_rows, int nb,
                                            int tpr, const float* res, int add_res, int block) {
    constexpr int R = matvec_rows_per_group<T>();
    int row0 = (block * (blockDim.x / tpr) + threadIdx.x / tpr) * R;
    float acc[R];
    rows_dot<T, R>(w, row0, n_rows, nb, threadIdx.x % tpr, tpr, xq, xds, acc);
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (r > 0 && tpr > 32) __syncthreads();  // row_store's shared sums of the row before read by all
        row_store(acc[r], row0 + r, n_rows, tpr, out, res, add_res);
    }
}

// res / add_res: see row_store. CuPy passes None as an invalid pointer, hence the flag. prefetch: ask L2 for the
// block's rows first (the launcher sets it for matrices of at most half the L2: a larger one's prefetches only
// queue ahead of the loads, e.g. Q4_K 28672x4096 2957 GB/s with them, 3373 without; 4096x4096 IQ4_XS 1682 with,
// 1525 without, launched programmatically as in the decode step; BENCHMARKS.md, session 27).
#define MATVEC_Q(NAME, T)                                                                               \
    extern "C" __global__ void __launch_bounds__(128)                                                   \
        NAME(const uint8_t* w, const int8_t* xq, const float2* xds, float* out, int n_rows, int nb,    \
             int tpr, const float* res, int add_res, int prefetch) {                                    \
        if (prefetch)                                                                                   \
            prefetch_rows(w, n_rows, nb, tpr / matvec_rows_per_group<T>(), T::BULK, T::META, blockIdx.x); \
        wait_prior();                                                                                   \
        matvec_rows<T>(w, xq, xds, out, n_rows, nb, tpr, res, add_res, blockIdx.x);                     \
    }

MATVEC_Q(matvec_q4_0, Q4_0)
MATVEC_Q(matvec_q4_1, Q4_1)
MATVEC_Q(matvec_q5_0, Q5_0)
MATVEC_Q(matvec_q5_1, Q5_1)
MATVEC_Q(matvec_q8_0, Q8_0)
MATVEC_Q(matvec_q2_k, Q2_K)
MATVEC_Q(matvec_q3_k, Q3_K)
MATVEC_Q(matvec_q4_k, Q4_K)
MATVEC_Q(matvec_q5_k, Q5_K)
MATVEC_Q(matvec_q6_k, Q6_K)
MATVEC_Q(matvec_mxfp4, MXFP4)
MATVEC_Q(matvec_iq4_nl, IQ4_NL)
MATVEC_Q(matvec_iq4_xs, IQ4_XS)
MATVEC_Q(matvec_iq2_xxs, IQ2_XXS)
MATVEC_Q(matvec_iq2_xs, IQ2_XS)
MATVEC_Q(matvec_iq2_s, IQ2_S)
MATVEC_Q(matvec_iq3_xxs, IQ3_XXS)
MATVEC_Q(matvec_iq3_s, IQ3_S)
MATVEC_Q(matvec_iq1_s, IQ1_S)
MATVEC_Q(matvec_iq1_m, IQ1_M)

// Two matrices of different types that read the same x, in one launch (a K-quant mix keeps a layer's attn_v in
// another type than its q and k: a launch and a wait less a layer). Blocks [0, blocks0) run w0's rows into
// out0, the rest w1's into out1, each matrix with its own nb and threads per row.
#define MATVEC_PAIR(S0, T0, S1, T1)                                                                      \
    extern "C" __global__ void __launch_bounds__(128)                                                   \
        matvec_##S0##_##S1(const uint8_t* w0, const uint8_t* w1, const int8_t* xq, const float2* xds,  \
                           float* out0, float* out1, int n_rows0, int n_rows1, int nb0, int nb1,       \
                           int tpr0, int tpr1, int blocks0) {                                           \
        if (blockIdx.x < blocks0) {                                                                     \
            prefetch_rows(w0, n_rows0, nb0, tpr0, T0::BULK, T0::META, blockIdx.x);                      \
            wait_prior();                                                                               \
            matvec_q<T0>(w0, xq, xds, out0, n_rows0, nb0, tpr0, out0, 0, blockIdx.x);                   \
        } else {                                                                                        \
            prefetch_rows(w1, n_rows1, nb1, tpr1, T1::BULK, T1::META, blockIdx.x - blocks0);            \
            wait_prior();                                                                               \
            matvec_q<T1>(w1, xq, xds, out1, n_rows1, nb1, tpr1, out1, 0, blockIdx.x - blocks0);         \
        }                                                                                               \
    }

MATVEC_PAIR(q4_k, Q4_K, q6_k, Q6_K)  // Q4_K_M
MATVEC_PAIR(q5_k, Q5_K, q6_k, Q6_K)  // Q5_K_M
MATVEC_PAIR(q3_k, Q3_K, q5_k, Q5_K)  // Q3_K_M, Q3_K_L

template <class T>
__device__ __forceinline__ void matvec_f(const uint8_t* __restrict__ w, const float* __restrict__ x,
                                         float* out, int n_rows, int n_cols, int tpr, const float* res,
                                         int add_res) {
    int row = blockIdx.x * (blockDim.x / tpr) + threadIdx.x / tpr;
    int t = threadIdx.x % tpr;
    float acc = 0.0f;
    if (row < n_rows) {
        const uint8_t* wr = w + (size_t)row * n_cols * T::BYTES;
        int n_items = n_cols / 8;
#pragma unroll 4
        for (int i = t; i < n_items; i += tpr) {
            float v[8];
            T::load8(wr + (size_t)i * 8 * T::BYTES, v);
            float4 xa = __ldg(reinterpret_cast<const float4*>(x + 8 * i));
            float4 xb = __ldg(reinterpret_cast<const float4*>(x + 8 * i) + 1);
            acc += v[0] * xa.x + v[1] * xa.y + v[2] * xa.z + v[3] * xa.w + v[4] * xb.x + v[5] * xb.y +
                   v[6] * xb.z + v[7] * xb.w;
        }
    }
    row_store(acc, row, n_rows, tpr, out, res, add_res);
}

#define MATVEC_F(NAME, T)                                                                                \
    extern "C" __global__ void __launch_bounds__(128)                                                    \
        NAME(const uint8_t* w, const float* x, float* out, int n_rows, int n_cols, int tpr,             \
             const float* res, int add_res) {                                                            \
        prefetch_rows(w, n_rows, n_cols / 8, tpr, 8 * T::BYTES, 0, blockIdx.x);                          \
        wait_prior();                                                                                    \
        matvec_f<T>(w, x, out, n_rows, n_cols, tpr, res, add_res);                                       \
    }

MATVEC_F(matvec_f32, F32W)
MATVEC_F(matvec_f16, F16W)
MATVEC_F(matvec_bf16, BF16W)

// ---- Mixture of experts: matvecs over the experts the router chose, their ids read from device memory (a
// captured graph serves any choice). An expert stack is one matrix of n_expert * n_rows rows in cuda_layout.py's
// layout (expert e's rows are e * n_rows ..), n_total rows in all. A pair p = (token p / k, its slot p % k)
// runs expert ids[p].

// out[z][p][row] = W_z[ids[p]] . x[p / k] (+ b_z[ids[p]][row]), z = 0 .. gridDim.z - 1 the stacks w0, w1 (gate
// and up, which read the same x) and their biases b0, b1 (float32 [n_expert, n_rows], NULL: none; gpt-oss): grid
// (row blocks, pairs, stacks). x: q8_1 of [n_tok, n_cols]; out float32 [gridDim.z, pairs, n_rows].
template <class T>
__device__ __forceinline__ void moe_matvec_q(const uint8_t* w0, const uint8_t* w1, const float* b0, const float* b1,
                                             const int* __restrict__ ids, int k, const int8_t* __restrict__ xq,
                                             const float2* __restrict__ xds, float* out, int n_rows, int n_total,
                                             int nb, int tpr) {
    int pair = blockIdx.y;
    size_t x0 = (size_t)(pair / k) * nb * T::QK;
    int row = blockIdx.x * (blockDim.x / tpr) + threadIdx.x / tpr;
    float acc = row < n_rows ? row_dot<T>(blockIdx.z ? w1 : w0, ids[pair] * n_rows + row, n_total, nb,
                                          threadIdx.x % tpr, tpr, xq + x0, xds + x0 / 32)
                             : 0.0f;
    const float* bias = blockIdx.z ? b1 : b0;
    float* o = out + ((size_t)blockIdx.z * gridDim.y + pair) * n_rows;
    row_store(acc, row, n_rows, tpr, o, bias ? bias + (size_t)ids[pair] * n_rows : o, bias != nullptr);
}

// The same for gate and up at once, and glu: out[p][row] = glu_value(Wg[ids[p]] . x + bg, Wu[ids[p]] . x + bu, act)
// (the biases bg, bu of the expert's row where gate_bias, up_bias are given), also as q8_1 (oq, ods) for the down
// projection, in one launch. Block 256: 32 rows of 8 threads, so one warp can quantize the block's 32 outputs;
// grid (n_rows / 32, pairs). n_rows a multiple of 32. Expert e's rows begin at row e * expert_rows: n_rows for a
// stack of its own; 2 n_ff for gemma4's gate and up read in place from the file's ffn_gate_up_exps (wu then points
// n_ff rows past wg), in host memory, whose kernels' types keep no meta apart (META 0): n_total, where a VRAM stack's
// meta begins, is not read for them.
template <class T>
__device__ __forceinline__ void moe_gate_up_glu_q(const uint8_t* wg, const uint8_t* wu, const float* gate_bias,
                                                  const float* up_bias, const int* __restrict__ ids,
                                                  int k, const int8_t* __restrict__ xq, const float2* __restrict__ xds,
                                                  float* __restrict__ out, int8_t* __restrict__ oq,
                                                  float2* __restrict__ ods, int n_rows, int expert_rows, int n_total,
                                                  int nb, int act) {
    __shared__ float gs[32], us[32];
    int pair = blockIdx.y, r = threadIdx.x >> 3, t = threadIdx.x & 7;
    int row = ids[pair] * expert_rows + blockIdx.x * 32 + r;
    size_t x0 = (size_t)(pair / k) * nb * T::QK;
    float g = 0.0f, u = 0.0f;
    size_t bulk = (size_t)row * nb * T::BULK, meta = (size_t)n_total * nb * T::BULK + (size_t)row * nb * T::META;
#pragma unroll 4
    for (int i = t; i < nb * T::ITEMS; i += 8) {  // gate and up in one loop: their loads in flight together
        int blk = i / T::ITEMS, c = i % T::ITEMS;
        const int8_t* x = xq + x0 + blk * T::QK;
        const float2* d = xds + x0 / 32 + blk * (T::QK / 32);
        g += T::dot(wg + bulk + blk * T::BULK, wg + meta + blk * T::META, c, x, d);
        u += T::dot(wu + bulk + blk * T::BULK, wu + meta + blk * T::META, c, x, d);
    }
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) {
        g += __shfl_xor_sync(0xffffffffu, g, o);
        u += __shfl_xor_sync(0xffffffffu, u, o);
    }
    if (t == 0) gs[r] = g, us[r] = u;
    __syncthreads();
    if (threadIdx.x < 32) {  // the biases and the glu here, where the loop's registers are free
        size_t b = (size_t)ids[pair] * n_rows + blockIdx.x * 32 + threadIdx.x;  // [n_expert, n_rows]
        float v = glu_value(gs[threadIdx.x] + (gate_bias ? gate_bias[b] : 0.0f),
                            us[threadIdx.x] + (up_bias ? up_bias[b] : 0.0f), act);
        size_t i = (size_t)pair * n_rows + blockIdx.x * 32 + threadIdx.x;
        out[i] = v;
        store_q8_1(v, i, oq, ods);
    }
}

// This block's rows of token blockIdx.y's k chosen experts asked of L2 before wait_prior() (thread j < k: slot
// j's bulk, 32 + j its meta). ids must come from a kernel at least two launches back (the router, before the
// gate and up): those have finished when this kernel starts, though the one ahead may still run. Read past L1
// (ld.cg), which may hold an earlier step's ids.
__device__ __forceinline__ void prefetch_expert_rows(const uint8_t* w, const int* ids, int k, int n_rows, int n_total,
                                                     int nb, int tpr, int bulk, int meta) {
    int slot = threadIdx.x & 31, rows = blockDim.x / tpr, row0 = blockIdx.x * rows;
    rows = min(rows, n_rows - row0);
    bool is_meta = threadIdx.x >= 32;
    if (slot >= k || threadIdx.x >= 64 || (is_meta && !meta) || rows <= 0) return;
    size_t first = (size_t)__ldcg(ids + blockIdx.y * k + slot) * n_rows + row0;
    if (is_meta) prefetch_l2(w + (size_t)n_total * nb * bulk + first * nb * meta, (size_t)rows * nb * meta);
    else prefetch_l2(w + first * nb * bulk, (size_t)rows * nb * bulk);
}

// out[t][row] = res[t][row] + sum over j < k of weights[p] * (W[ids[p]] . x[p] + bias[ids[p]][row]), p = t * k + j:
// the chosen experts' down projections (bias float32 [n_expert, n_rows], NULL: none), weighted, summed and added
// to the residual in one launch (out may be res).
// grid (row blocks, tokens); a row's items of all k experts are shared out among its tpr threads.
// x: q8_1 of [n_tok * k, n_cols].
template <class T>
__device__ __forceinline__ void moe_down_q(const uint8_t* w, const float* bias, const int* __restrict__ ids,
                                           const float* __restrict__ weights, int k, const int8_t* __restrict__ xq,
                                           const float2* __restrict__ xds, float* out, const float* res,
                                           int n_rows, int n_total, int nb, int tpr) {
    int t = blockIdx.y;
    int row = blockIdx.x * (blockDim.x / tpr) + threadIdx.x / tpr;
    float acc = 0.0f;
    if (row < n_rows) {
        int per_expert = nb * T::ITEMS;
        for (int i = threadIdx.x % tpr; i < k * per_expert; i += tpr) {
            int p = t * k + i / per_expert, item = i % per_expert, blk = item / T::ITEMS;
            size_t b = (size_t)(ids[p] * n_rows + row) * nb + blk;  // the block's index in the stack
            size_t x0 = ((size_t)p * nb + blk) * T::QK;
            acc += weights[p] * T::dot(w + b * T::BULK, w + (size_t)n_total * nb * T::BULK + b * T::META,
                                       item % T::ITEMS, xq + x0, xds + x0 / 32);
        }
        if (bias && threadIdx.x % tpr == 0)  // once a row: row_store sums the row's threads
            for (int j = 0; j < k; ++j) acc += weights[t * k + j] * bias[(size_t)ids[t * k + j] * n_rows + row];
    }
    row_store(acc, row, n_rows, tpr, out + (size_t)t * n_rows, res + (size_t)t * n_rows, 1);
}

// prefetch (moe_down): 0 for stacks in host memory, which the L2 bulk prefetch is not for.
// MIN_BLOCKS: blocks of moe_gate_up_glu a multiprocessor must hold (2 caps registers at 128 a thread, so that
// Qwen3-30B-A3B's 192 blocks run in one wave on an H100; Q3_K spills at 128 and keeps 1).
#define MOE_Q(SUFFIX, T, MIN_BLOCKS)                                                                          \
    extern "C" __global__ void __launch_bounds__(128)                                                         \
        moe_matvec_##SUFFIX(const uint8_t* w0, const uint8_t* w1, const float* b0, const float* b1,           \
                            const int* ids, int k, const int8_t* xq, const float2* xds, float* out,           \
                            int n_rows, int n_total, int nb, int tpr) {                                       \
        wait_prior();                                                                                         \
        moe_matvec_q<T>(w0, w1, b0, b1, ids, k, xq, xds, out, n_rows, n_total, nb, tpr);                      \
    }                                                                                                         \
    extern "C" __global__ void __launch_bounds__(256, MIN_BLOCKS)                                             \
        moe_gate_up_glu_##SUFFIX(const uint8_t* wg, const uint8_t* wu, const float* gate_bias,                \
                                 const float* up_bias, const int* ids, int k, const int8_t* xq,               \
                                 const float2* xds, float* out, int8_t* oq, float2* ods, int n_rows,          \
                                 int expert_rows, int n_total, int nb, int act) {                             \
        wait_prior();                                                                                         \
        moe_gate_up_glu_q<T>(wg, wu, gate_bias, up_bias, ids, k, xq, xds, out, oq, ods, n_rows, expert_rows,  \
                             n_total, nb, act);                                                               \
    }                                                                                                         \
    extern "C" __global__ void __launch_bounds__(128)                                                         \
        moe_down_##SUFFIX(const uint8_t* w, const float* bias, const int* ids, const float* weights, int k,   \
                          const int8_t* xq, const float2* xds, float* out, const float* res, int n_rows,      \
                          int n_total, int nb, int tpr, int prefetch) {                                       \
        if (prefetch) prefetch_expert_rows(w, ids, k, n_rows, n_total, nb, tpr, T::BULK, T::META);            \
        wait_prior();                                                                                         \
        moe_down_q<T>(w, bias, ids, weights, k, xq, xds, out, res, n_rows, n_total, nb, tpr);                 \
    }

MOE_Q(q4_0, Q4_0, 2)
MOE_Q(q4_1, Q4_1, 2)
MOE_Q(q5_0, Q5_0, 2)
MOE_Q(q5_1, Q5_1, 2)
MOE_Q(q8_0, Q8_0, 2)
MOE_Q(q2_k, Q2_K, 2)
MOE_Q(q3_k, Q3_K, 1)
MOE_Q(q4_k, Q4_K, 2)
MOE_Q(q5_k, Q5_K, 2)
MOE_Q(q6_k, Q6_K, 2)
MOE_Q(mxfp4, MXFP4, 2)
MOE_Q(iq4_nl, IQ4_NL, 2)
MOE_Q(iq4_xs, IQ4_XS, 2)
MOE_Q(iq2_xxs, IQ2_XXS, 2)
MOE_Q(iq2_xs, IQ2_XS, 2)
MOE_Q(iq2_s, IQ2_S, 2)
MOE_Q(iq3_xxs, IQ3_XXS, 2)
MOE_Q(iq3_s, IQ3_S, 2)
MOE_Q(iq1_s, IQ1_S, 2)
MOE_Q(iq1_m, IQ1_M, 2)
MOE_Q(q6_k_file, Q6_K_FILE, 2)  // experts read in place from the file's pages in host memory
MOE_Q(mxfp4_file, MXFP4_FILE, 2)
