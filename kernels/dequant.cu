// Dequantize a tile of weight rows to fp16, for prefill matmuls (kernels/cuda_prefill.py multiplies the
// tile with cuBLAS).
//
// W is in the repacked VRAM layout of kernels/cuda_layout.py: bulk [n_rows, nb, T::BULK] then meta
// [n_rows, nb, T::META]. Each thread makes one chunk (dequant_chunk.cuh): 32 consecutive weights of a row,
// formed in float32 bit-identically to models/dequant.py, rounded once to fp16 and written as four 16-byte
// stores.
#include "dequant_chunk.cuh"

// out[r, :] (fp16, row-major [n_tile, nb * QK]) = W[row0 + r, :] for r < n_tile; one thread a chunk.
template <class T>
__device__ __forceinline__ void dequant_rows(const uint8_t* __restrict__ w, __half* __restrict__ out,
                                             int n_rows, int nb, int row0, int n_tile) {
    constexpr int CPB = T::QK / 32;  // chunks a block
    int cpr = nb * CPB;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n_tile * cpr) return;
    int r = (int)(i / cpr), c = (int)(i % cpr);
    size_t blk = (size_t)(row0 + r) * nb + c / CPB;
    const uint8_t* bulk = w + blk * T::BULK;
    const uint8_t* meta = w + (size_t)n_rows * nb * T::BULK + blk * T::META;
    float v[32];
    chunk(T{}, bulk, meta, c % CPB, v);
    uint4* o = reinterpret_cast<uint4*>(out + i * 32);  // chunk i of the tile is values 32i .. 32i + 31
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        __half2 h[4];
#pragma unroll
        for (int p = 0; p < 4; ++p) h[p] = __floats2half2_rn(v[8 * k + 2 * p], v[8 * k + 2 * p + 1]);
        o[k] = *reinterpret_cast<uint4*>(h);
    }
}

#define DEQUANT(NAME, T)                                                                              \
    extern "C" __global__ void __launch_bounds__(256)                                                 \
        NAME(const uint8_t* w, __half* out, int n_rows, int nb, int row0, int n_tile) {               \
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
DEQUANT(dequant_f32, F32B)
DEQUANT(dequant_bf16, BF16B)
