// Shared helpers of the op kernels (embed.cu, norm_rope.cu, attention.cu, sample.cu, elementwise.cu, moe.cu,
// and matvec.cu's expert kernels).
#pragma once
#include <cuda_fp16.h>
#ifdef __CUDACC_RTC__  // NVRTC (CuPy) has no <stdint.h>; same typedefs as quant_dot.cuh, so a repeat is harmless
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
#else
#include <stdint.h>
#endif

__device__ __forceinline__ float warp_sum_f(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max_f(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// Starts with a barrier so that back-to-back calls do not race on the shared slots.
__device__ __forceinline__ float block_sum_f(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = warp_sum_f(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < n_warps ? part[lane] : 0.0f;
    return warp_sum_f(v);
}

// The gate's activation in a gated FFN. act 0: silu, 1: gelu with the tanh approximation (gemma).
__device__ __forceinline__ float activation(float g, int act) {
    if (act == 0) return g / (1.0f + expf(-g));
    return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
}

#define NEG_INF __int_as_float(0xff800000)
#define QUIET_NAN __int_as_float(0x7fc00000)
