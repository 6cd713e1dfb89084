// Quantizing an activation to q8_1 inside the kernel that produces it (a graph node less than a separate
// quantize_q8_1 launch): the format matvec.cu's quantized kernels read. Include after quant_dot.cuh or
// ops_common.cuh (int8_t, float2).
#pragma once

// The 32 lanes of a warp hold x[i] for 32 consecutive i (lane j holds i = 32 * block + j): store them as
// xq[i] = round(x[i] / d) and, from lane 0, xds[i / 32] = (d, d * sum of the 32 qs), d = max|x| / 127.
// Every lane of the warp must call it.
__device__ __forceinline__ void store_q8_1(float v, int i, int8_t* __restrict__ xq, float2* __restrict__ xds) {
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float d = amax / 127.0f;
    int q = amax == 0.0f ? 0 : __float2int_rn(v / d);
    xq[i] = (int8_t)q;
    int s = q;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((i & 31) == 0) xds[i / 32] = make_float2(d, d * (float)s);
}

// The same for 4 values a lane: 8 consecutive lanes hold x[4c .. 4c+3] for 8 consecutive chunks c (32
// values); stores xq4[c] (the 4 qs as one int) and, from the first of the 8, xds[c / 8]. store: whether
// this lane's chunk exists; every lane of the warp must call it (the shuffles), stored or not.
__device__ __forceinline__ void store_q8_1_x4(float4 v, int c, bool store, int* __restrict__ xq4,
                                              float2* __restrict__ xds) {
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float d = amax / 127.0f;
    int q0 = 0, q1 = 0, q2 = 0, q3 = 0;
    if (amax != 0.0f) {
        q0 = __float2int_rn(v.x / d);
        q1 = __float2int_rn(v.y / d);
        q2 = __float2int_rn(v.z / d);
        q3 = __float2int_rn(v.w / d);
    }
    int s = q0 + q1 + q2 + q3;
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (!store) return;
    xq4[c] = (q0 & 0xff) | (q1 & 0xff) << 8 | (q2 & 0xff) << 16 | (q3 & 0xff) << 24;
    if ((c & 7) == 0) xds[c / 8] = make_float2(d, d * (float)s);
}
