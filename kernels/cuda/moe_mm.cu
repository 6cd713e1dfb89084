// The prompt path of a mixture of experts: a chunk's (token, slot) pairs sorted by expert on the device, then
// the chosen experts' matrices multiplied with tensor cores straight from their quantized VRAM layout. No
// expert id reaches the host and no fp16 copy of a stack goes through DRAM: each block dequantizes the weight
// tile it needs into shared memory (dequant_chunk.cuh, bit-identical to models/dequant.py) and multiplies it
// with the fp16 activations of up to BM pairs of one expert (mma.sync m16n8k16, fp32 accumulate).
//
// A pair p is token p / k and slot p % k of ids [n_tok, k]. A "tile" is a run of at most BM sorted pairs of one
// expert; the grid has room for the most tiles any routing can make, and blocks past the real count leave.
#include "dequant_chunk.cuh"
#include "ops_common.cuh"

constexpr int BM = 64;          // pairs a tile
constexpr int BN = 64;          // output rows a block
constexpr int BK = 64;          // columns a step
constexpr int LD = BK + 8;      // halves a shared row: the padding puts a warp's fragment loads in 32 banks
constexpr int MM_THREADS = 128; // 4 warps, each 32 pairs x 32 rows of the block's 64 x 64
constexpr int MM_MIN_BLOCKS = 4; // blocks a multiprocessor: 16 warps to hide the weight loads' latency
                                 // (ncu: 2 blocks, 128+ registers, left 64% of issue slots empty)
constexpr int SORT_THREADS = 256;

// Block e of n_expert (SORT_THREADS threads; dynamic shared memory n_expert ints) writes expert e's pairs into
// order[first .. first + count) in pair order (first: the pairs of experts below e) and its tiles into
// tiles[t0 ..] as (expert, begin, end, 0) over order; the last block writes the number of tiles to *n_tiles.
// Every block histograms all ids itself, so the sort is one launch with no pass over global counts.
extern "C" __global__ void __launch_bounds__(SORT_THREADS)
    moe_sort_pairs(const int* __restrict__ ids, int n_pairs, int n_expert, int* __restrict__ order,
                   int4* __restrict__ tiles, int* __restrict__ n_tiles) {
    wait_prior();
    extern __shared__ int count[];
    __shared__ int warp_sum[SORT_THREADS / 32];
    __shared__ int start[2];  // first, t0
    int e = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int i = threadIdx.x; i < n_expert; i += SORT_THREADS) count[i] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < n_pairs; p += SORT_THREADS) atomicAdd(&count[ids[p]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int first = 0, t0 = 0;
        for (int i = 0; i < e; ++i) first += count[i], t0 += (count[i] + BM - 1) / BM;
        start[0] = first, start[1] = t0;
        if (e == n_expert - 1) *n_tiles = t0 + (count[e] + BM - 1) / BM;
    }
    __syncthreads();
    int first = start[0], t0 = start[1], n = count[e];
    for (int j = threadIdx.x; j * BM < n; j += SORT_THREADS)
        tiles[t0 + j] = make_int4(e, first + j * BM, first + min(n, (j + 1) * BM), 0);
    int done = 0;  // expert e's pairs placed so far, in pair order: a block-wide prefix sum of the flags
    for (int base = 0; base < n_pairs; base += SORT_THREADS) {
        int p = base + threadIdx.x;
        bool mine = p < n_pairs && ids[p] == e;
        unsigned ballot = __ballot_sync(0xffffffffu, mine);
        if (lane == 0) warp_sum[warp] = __popc(ballot);
        __syncthreads();
        int before = done;
        for (int w = 0; w < warp; ++w) before += warp_sum[w];
        if (mine) order[first + before + __popc(ballot & ((1u << lane) - 1))] = p;
        for (int w = 0; w < SORT_THREADS / 32; ++w) done += warp_sum[w];
        __syncthreads();
    }
}

__device__ __forceinline__ uint32_t lds32(const __half* p) { return *reinterpret_cast<const uint32_t*>(p); }

// 16 bytes global -> shared without a register on the way (zeros when !valid); cp_async_wait<n>: all but the
// n groups committed last have landed
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    unsigned a = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// d += a (16 x 16, row-major) * b (16 x 8, column-major), fp16 in, fp32 accumulate
__device__ __forceinline__ void mma16816(float* d, const uint32_t* a, const uint32_t* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Rows r0 .. r0 + BN of matrix `w` (expert e's rows begin at e * n_rows of a stack of n_all rows), columns
// k0 .. k0 + BK, dequantized into s [BN][LD] fp16; rows past n_rows are zeros.
template <class T>
__device__ __forceinline__ void load_weight_tile(const uint8_t* __restrict__ w, int e, int n_rows, int n_all,
                                                 int nb, int r0, int k0, __half* s) {
    constexpr int CPB = T::QK / 32, CPS = BK / 32;  // chunks a block, chunks a step
    for (int i = threadIdx.x; i < BN * CPS; i += MM_THREADS) {
        int r = i / CPS, c = k0 / 32 + i % CPS;
        float v[32];
        if (r0 + r < n_rows) {
            size_t blk = (size_t)(e * n_rows + r0 + r) * nb + c / CPB;
            chunk(T{}, w + blk * T::BULK, w + (size_t)n_all * nb * T::BULK + blk * T::META, c % CPB, v);
        } else {
#pragma unroll
            for (int l = 0; l < 32; ++l) v[l] = 0.0f;
        }
        uint4* dst = reinterpret_cast<uint4*>(s + r * LD + (i % CPS) * 32);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            __half2 h[4];
#pragma unroll
            for (int p = 0; p < 4; ++p) h[p] = __floats2half2_rn(v[8 * q + 2 * p], v[8 * q + 2 * p + 1]);
            dst[q] = *reinterpret_cast<uint4*>(h);
        }
    }
}

// Dynamic shared memory a block: moe_mm_smem_bytes(NW) (over 48 KB: the launcher raises the kernel's limit).
// One block: the pairs of tile blockIdx.y (<= BM, one expert e) times rows blockIdx.x * BN .. of e's matrix.
// NW = 1: out float32 [n_pairs, n_rows] = x[src] . W_e rows + b0[e]. NW = 2 (gate and up): out16 float16
// [n_pairs, n_rows] = glu_value(x . gate_e + b0[e], x . up_e + b1[e], act). b0, b1: w0's and w1's biases, float32
// [n_expert, n_rows] (NULL: none; gpt-oss). x float16 [*, n_cols]; the x row of sorted pair i is order[i] / x_div
// (x_div k: the token's hidden state; 1: the pair's own row). Rows are written at the pair.
template <class T, int NW>
__device__ __forceinline__ void moe_mm(const uint8_t* __restrict__ w0, const uint8_t* __restrict__ w1,
                                       const float* __restrict__ b0, const float* __restrict__ b1,
                                       int n_rows, int n_all, int nb, const __half* __restrict__ x, int x_div,
                                       const int* __restrict__ order, const int4* __restrict__ tiles,
                                       const int* __restrict__ n_tiles, float* __restrict__ out,
                                       __half* __restrict__ out16, int act) {
    if ((int)blockIdx.y >= *n_tiles) return;
    extern __shared__ __align__(16) unsigned char smem[];
    __half* sx = reinterpret_cast<__half*>(smem);  // [2][BM][LD]: x of this step and of the next, in flight
    __half* sw = sx + 2 * BM * LD;                  // [NW][BN][LD]
    __shared__ int src[BM], dst[BM];
    int4 tile = tiles[blockIdx.y];
    int e = tile.x, n_pairs = tile.z - tile.y, r0 = blockIdx.x * BN, n_cols = nb * T::QK;
    if (threadIdx.x < BM) {
        int p = threadIdx.x < n_pairs ? order[tile.y + threadIdx.x] : -1;
        src[threadIdx.x] = p < 0 ? -1 : p / x_div;
        dst[threadIdx.x] = p;
    }
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int g = lane / 4, t = lane % 4;                  // the mma fragments' row group and thread in group
    int wm = (warp / 2) * 32, wn = (warp % 2) * 32;  // this warp's pairs and rows within the block
    float acc[NW][2][4][4] = {};
    __syncthreads();
    auto load_x = [&](int k0, __half* to) {  // 8 halves a thread a pass, rows past the tile's pairs zero
        for (int i = threadIdx.x; i < BM * BK / 8; i += MM_THREADS) {
            int r = i / (BK / 8), c = (i % (BK / 8)) * 8;
            cp_async16(to + r * LD + c, x + (size_t)max(src[r], 0) * n_cols + k0 + c, src[r] >= 0);
        }
        cp_async_commit();
    };
    load_x(0, sx);
    for (int k0 = 0, step = 0; k0 < n_cols; k0 += BK, ++step) {
        load_weight_tile<T>(w0, e, n_rows, n_all, nb, r0, k0, sw);
        if (NW == 2) load_weight_tile<T>(w1, e, n_rows, n_all, nb, r0, k0, sw + (NW - 1) * BN * LD);
        if (k0 + BK < n_cols) {
            load_x(k0 + BK, sx + ((step + 1) & 1) * BM * LD);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const __half* xs = sx + (step & 1) * BM * LD;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            uint32_t a[2][4];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
                const __half* p = xs + (wm + 16 * mi + g) * LD + kk + 2 * t;
                a[mi][0] = lds32(p), a[mi][1] = lds32(p + 8 * LD), a[mi][2] = lds32(p + 8), a[mi][3] = lds32(p + 8 * LD + 8);
            }
#pragma unroll
            for (int z = 0; z < NW; ++z)
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) {
                    const __half* p = sw + z * BN * LD + (wn + 8 * ni + g) * LD + kk + 2 * t;
                    uint32_t b[2] = {lds32(p), lds32(p + 8)};
#pragma unroll
                    for (int mi = 0; mi < 2; ++mi) mma16816(acc[z][mi][ni], a[mi], b);
                }
        }
        __syncthreads();
    }
    // acc[z][mi][ni][j]: pair row wm + 16 mi + g (+ 8 for j >= 2), output row wn + 8 ni + 2 t (+ 1 for odd j)
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int half8 = 0; half8 < 2; ++half8) {
            int p = dst[wm + 16 * mi + 8 * half8 + g];
            if (p < 0) continue;
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                int row = r0 + wn + 8 * ni + 2 * t;
                if (row >= n_rows) continue;  // n_rows is even: row + 1 is in range with row
                float v0 = acc[0][mi][ni][2 * half8], v1 = acc[0][mi][ni][2 * half8 + 1];
                size_t at = (size_t)p * n_rows + row, b = (size_t)e * n_rows + row;
                if (b0) v0 += b0[b], v1 += b0[b + 1];
                if (NW == 1) {
                    *reinterpret_cast<float2*>(out + at) = make_float2(v0, v1);
                } else {
                    float u0 = acc[NW - 1][mi][ni][2 * half8], u1 = acc[NW - 1][mi][ni][2 * half8 + 1];
                    if (b1) u0 += b1[b], u1 += b1[b + 1];
                    *reinterpret_cast<__half2*>(out16 + at) = __floats2half2_rn(glu_value(v0, u0, act),
                                                                                glu_value(v1, u1, act));
                }
            }
        }
}

// GLU_MIN_BLOCKS: the glu kernel's blocks a multiprocessor (MM_MIN_BLOCKS, or 3 where 4's 128 registers a thread
// spill: MXFP4's tile loader beside gpt-oss's clamped GLU)
#define MOE_MM(SUFFIX, T, GLU_MIN_BLOCKS)                                                                       \
    extern "C" __global__ void __launch_bounds__(MM_THREADS, MM_MIN_BLOCKS)                                     \
        moe_mm_##SUFFIX(const uint8_t* w, const float* bias, int n_rows, int n_all, int nb, const __half* x,    \
                        int x_div, const int* order, const int4* tiles, const int* n_tiles, float* out) {       \
        wait_prior();                                                                                           \
        moe_mm<T, 1>(w, w, bias, nullptr, n_rows, n_all, nb, x, x_div, order, tiles, n_tiles, out, nullptr, 0); \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(MM_THREADS, GLU_MIN_BLOCKS)                                    \
        moe_mm_glu_##SUFFIX(const uint8_t* gate, const uint8_t* up, const float* gate_bias,                     \
                            const float* up_bias, int n_rows, int n_all, int nb, const __half* x, int x_div,    \
                            const int* order, const int4* tiles, const int* n_tiles, __half* out16, int act) {  \
        wait_prior();                                                                                           \
        moe_mm<T, 2>(gate, up, gate_bias, up_bias, n_rows, n_all, nb, x, x_div, order, tiles, n_tiles, nullptr, \
                     out16, act);                                                                               \
    }

MOE_MM(q4_0, Q4_0, MM_MIN_BLOCKS)
MOE_MM(q4_1, Q4_1, MM_MIN_BLOCKS)
MOE_MM(q5_0, Q5_0, MM_MIN_BLOCKS)
MOE_MM(q5_1, Q5_1, MM_MIN_BLOCKS)
MOE_MM(q8_0, Q8_0, MM_MIN_BLOCKS)
MOE_MM(q2_k, Q2_K, MM_MIN_BLOCKS)
MOE_MM(q3_k, Q3_K, MM_MIN_BLOCKS)
MOE_MM(q4_k, Q4_K, MM_MIN_BLOCKS)
MOE_MM(q5_k, Q5_K, MM_MIN_BLOCKS)
MOE_MM(q6_k, Q6_K, MM_MIN_BLOCKS)
MOE_MM(mxfp4, MXFP4, 3)
MOE_MM(iq4_nl, IQ4_NL, MM_MIN_BLOCKS)
MOE_MM(iq4_xs, IQ4_XS, MM_MIN_BLOCKS)
MOE_MM(iq2_xxs, IQ2_XXS, MM_MIN_BLOCKS)
MOE_MM(iq2_xs, IQ2_XS, MM_MIN_BLOCKS)
MOE_MM(iq2_s, IQ2_S, MM_MIN_BLOCKS)
MOE_MM(iq3_xxs, IQ3_XXS, MM_MIN_BLOCKS)
MOE_MM(iq3_s, IQ3_S, MM_MIN_BLOCKS)
MOE_MM(iq1_s, IQ1_S, MM_MIN_BLOCKS)
MOE_MM(iq1_m, IQ1_M, MM_MIN_BLOCKS)

// out[t, c] = x[t, c] + sum over slots j (in order) of weights[t, j] * y[t * k + j, c]: a token's k expert rows,
// weighted, onto the residual. Grid (ceil(n_embd / 256), n_tok), 256 threads.
extern "C" __global__ void moe_combine(const float* __restrict__ x, const float* __restrict__ y,
                                       const float* __restrict__ weights, int k, int n_embd, float* __restrict__ out) {
    wait_prior();
    int c = blockIdx.x * 256 + threadIdx.x;
    size_t t = blockIdx.y;
    if (c >= n_embd) return;
    float s = x[t * n_embd + c];
    for (int j = 0; j < k; ++j) s += weights[t * k + j] * y[(t * k + j) * n_embd + c];
    out[t * n_embd + c] = s;
}
