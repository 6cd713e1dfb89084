// Dequantize a tile of weight rows to fp16, for prefill matmuls (kernels/cuda/prefill.py multiplies the
// tile with cuBLAS).
//
// W is in the repacked VRAM layout of kernels/cuda/layout.py: bulk [n_rows, nb, T::BULK] then meta
// [n_rows, nb, T::META]. Each thread makes one chunk (dequant_chunk.cuh): 32 consecutive weights of a row,
// formed in float32 bit-identically to models/dequant.py, rounded once to fp16 and written as four 16-byte
// stores.
#include "dequant_chunk.cuh"
#include "ops_common.cuh"

constexpr int THREADS = 256;

// out[r, :] (fp16, row-major [n_tile, nb * QK]) = W[row0 + r, :] for r < n_tile; one thread a chunk. A
// warp's 32 chunks are 2 KB of consecutive output: staged in shared memory and stored as 16-byte pieces
// that are consecutive across the warp (each thread storing its own 64 bytes left every store instruction
// half-filling 32 sectors: 1.7 TB/s instead of the ~3 of a copy).
template <class T>
__device__ __forceinline__ void dequant_rows(const uint8_t* __restrict__ w, __half* __restrict__ out,
                                             int n_rows, int nb, int row0, int n_tile) {
    constexpr int CPB = T::QK / 32;  // chunks a block
    __shared__ uint4 stage[THREADS * 4];
    int cpr = nb * CPB;
    size_t n_chunks = (size_t)n_tile * cpr;
    size_t i = (size_t)blockIdx.x * THREADS + threadIdx.x;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    uint4* my = stage + 4 * threadIdx.x;
    if (i < n_chunks) {
        int r = (int)(i / cpr), c = (int)(i % cpr);
        size_t blk = (size_t)(row0 + r) * nb + c / CPB;
        const uint8_t* bulk = w + blk * T::BULK;
        const uint8_t* meta = w + (size_t)n_rows * nb * T::BULK + blk * T::META;
        float v[32];
        chunk(T{}, bulk, meta, c % CPB, v);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            __half2 h[4];
#pragma unroll
            for (int p = 0; p < 4; ++p) h[p] = __floats2half2_rn(v[8 * k + 2 * p], v[8 * k + 2 * p + 1]);
            my[k] = *reinterpret_cast<uint4*>(h);
        }
    }
    __syncwarp();
    // the warp's output: chunks i - lane .. i - lane + 31 = 128 uint4 from uint4 index 4 * (i - lane)
    size_t base = 4 * (i - lane), end = 4 * n_chunks;
    uint4* o = reinterpret_cast<uint4*>(out);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        size_t j = base + 32 * k + lane;
        if (j < end) o[j] = stage[128 * warp + 32 * k + lane];
    }
}

#define DEQUANT(NAME, T)                                                                              \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                 \
        NAME(const uint8_t* w, __half* out, int n_rows, int nb, int row0, int n_tile) {               \
        wait_prior();                                                                                 \
        dequant_rows<T>(w, out, n_rows, nb, row0, n_tile);                                            \
    }

DEQUANT(dequant_q4_0, Q4_0)
DEQUANT(dequant_q4_1, Q4_1)
DEQUANT(dequant_q5_0, Q5_0)
DEQUANT(dequant_q5_1, Q5_1)
DEQUANT(dequant_q8_0, Q8_0)
DEQUANT(dequant_q2_k, Q2_K)
DEQUANT(dequant_q3_k, Q3_K)
DEQUANT(dequant_q4_k, Q4_K)
DEQUANT(dequant_q5_k, Q5_K)
DEQUANT(dequant_q6_k, Q6_K)
DEQUANT(dequant_mxfp4, MXFP4)
DEQUANT(dequant_iq4_nl, IQ4_NL)
DEQUANT(dequant_iq4_xs, IQ4_XS)
DEQUANT(dequant_iq2_xxs, IQ2_XXS)
DEQUANT(dequant_iq2_xs, IQ2_XS)
DEQUANT(dequant_iq2_s, IQ2_S)
DEQUANT(dequant_iq3_xxs, IQ3_XXS)
DEQUANT(dequant_iq3_s, IQ3_S)
DEQUANT(dequant_iq1_s, IQ1_S)
DEQUANT(dequant_iq1_m, IQ1_M)
DEQUANT(dequant_f32, F32B)
DEQUANT(dequant_bf16, BF16B)
