// Shared helpers of the kernels: every .cu file includes this.
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

// Programmatic dependent launch (Hopper). Inside a captured decode step every kernel is launched so that it may
// start before the kernel ahead of it in the stream has finished (cuda_module.programmatic_launches): its blocks
// get on the multiprocessors while that kernel runs, and wait_prior() holds them until it has finished and its
// writes are visible. So every kernel calls wait_prior() before it reads or writes anything but constant inputs
// (weights, which it may ask L2 for first: prefetch_l2), and tests/kernels/test_cuda_compile.py checks that it does.
// wait_prior() then lets the next kernel launch. Both are no-ops in a plain launch.
__device__ __forceinline__ void wait_prior() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// Ask L2 for the n bytes from p (rounded in to 16-byte bounds): weights a kernel reads after wait_prior(), so
// that their DRAM latency passes while the kernel ahead still runs. A hint: nothing waits for it.
__device__ __forceinline__ void prefetch_l2(const void* p, size_t n) {
#if __CUDA_ARCH__ >= 900
    size_t a = ((size_t)p + 15) & ~(size_t)15, e = ((size_t)p + n) & ~(size_t)15;
    if (e > a) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"((unsigned)(e - a)) : "memory");
#endif
}

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

__device__ __forceinline__ float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

// x * inv * w for a chunk of 4 (an rms norm's output: inv = 1 / sqrt(mean(x^2) + eps), w the norm's weights)
__device__ __forceinline__ float4 scaled4(float4 x, float inv, float4 w) {
    return make_float4(x.x * inv * w.x, x.y * inv * w.y, x.z * inv * w.z, x.w * inv * w.w);
}

// A gated FFN's output from its gate g and up u (ops.py GLU_ACTIVATIONS). act 0: silu(g) * u; 1: gelu(g) * u with
// the tanh approximation (gemma); 2: swiglu_oai (gpt-oss, ggml's with the alpha 1.702 and limit 7 llama.cpp passes):
// g clamped above at the limit, u to +-limit, g * sigmoid(alpha g) * (u + 1).
__device__ __forceinline__ float glu_value(float g, float u, int act) {
    if (act == 0) return g / (1.0f + expf(-g)) * u;
    if (act == 1) return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u;
    g = fminf(g, 7.0f);
    u = fminf(fmaxf(u, -7.0f), 7.0f);
    return g / (1.0f + expf(-1.702f * g)) * (u + 1.0f);
}

#define NEG_INF __int_as_float(0xff800000)
#define QUIET_NAN __int_as_float(0x7fc00000)
