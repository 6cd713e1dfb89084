// What the matvec kernels share (matvec.cu, one token; matvec_tokens.cu, a few): a row's threads' sum stored, the
// rows a group of threads does, and the float weights' loads.
#pragma once
#include "quant_dot.cuh"

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum acc over the tpr threads of each row and store it, plus res[row] when add_res (the residual add of a
// layer's output projections, fused: out = W . x + res; out may be res).
__device__ __forceinline__ void row_store(float acc, int row, int n_rows, int tpr, float* out, const float* res,
                                          int add_res) {
    __shared__ float warp_part[4];
    acc = warp_sum(acc);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (tpr == 32) {
        if (lane == 0 && row < n_rows) out[row] = add_res ? acc + res[row] : acc;
        return;
    }
    if (lane == 0) warp_part[warp] = acc;
    __syncthreads();
    if (threadIdx.x % tpr == 0 && row < n_rows) {
        float s = 0.0f;
        for (int w = warp; w < warp + tpr / 32; ++w) s += warp_part[w];
        out[row] = add_res ? s + res[row] : s;
    }
}

// Rows a group of tpr threads does in matvec (rows_dot: x loaded once for them): 4 for Q6_K, 2 for the other types
// of 256-value blocks (K-quants, the IQ super-blocks), 1 for those of 32 (Q4_0 .. Q8_0, MXFP4, IQ4_NL), which lost
// with 2; the launcher gives it n_rows / (blockDim.x / tpr * rows) blocks (kernels/cuda/quant.py's
// matvec_rows_per_group, the same rule).
// Graph-replayed matvecs on the H200 (BENCHMARKS.md, session 26), GB/s at 28672x4096: Q4_K 2384 -> 2866, Q6_K 2628
// -> 3133, IQ4_XS 2299 -> 2397; Q8_0 3516 -> 3288, Q4_0 2877 -> 2725, MXFP4 2391 -> 2285 (kept at 1). 4 rows lost
// on most types (registers), not on Q6_K (session 27, launched programmatically without the prefetch: 4096x14336
// 2569 -> 3060, 4096x4096 1746 -> 2098).
template <class T>
__host__ __device__ constexpr int matvec_rows_per_group() { return T::QK == 256 ? 2 : 1; }
template <>
__host__ __device__ constexpr int matvec_rows_per_group<Q6_K>() { return 4; }

// Float weights, 8 values a 16- or 32-byte item; x float32. n_cols is a multiple of 8.
struct F32W {
    static __device__ __forceinline__ void load8(const uint8_t* p, float* v) {
        float4 a = __ldg(reinterpret_cast<const float4*>(p)), b = __ldg(reinterpret_cast<const float4*>(p) + 1);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    }
    static constexpr int BYTES = 4;
};
struct F16W {
    static __device__ __forceinline__ void load8(const uint8_t* p, float* v) {
        uint4 q = load16(p);
        const __half2* h = reinterpret_cast<const __half2*>(&q);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float2 f = __half22float2(h[j]);
            v[2 * j] = f.x; v[2 * j + 1] = f.y;
        }
    }
    static constexpr int BYTES = 2;
};
struct BF16W {
    static __device__ __forceinline__ void load8(const uint8_t* p, float* v) {
        uint4 q = load16(p);
        uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            v[2 * j] = __uint_as_float(u[j] << 16);
            v[2 * j + 1] = __uint_as_float(u[j] & 0xFFFF0000u);
        }
    }
    static constexpr int BYTES = 2;
};
