// Elementwise ops of a transformer layer: gated activation, residual add, bias add, logit softcap.
// Launch: grid ceil(n / 256), block 256; thread = one element.
#include "ops_common.cuh"

// out = act(gate) * up; act 0: silu, 1: gelu with the tanh approximation (gemma). out may be gate or up.
extern "C" __global__ void glu(const float* gate, const float* up, float* out, int n, int act) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = gate[i], a;
    if (act == 0) {
        a = g / (1.0f + expf(-g));
    } else {
        a = 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
    }
    out[i] = a * up[i];
}

// out = a + b; out may be a or b.
extern "C" __global__ void add(const float* a, const float* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

// x [n / d, d] += bias [d] on every row.
extern "C" __global__ void add_bias(float* __restrict__ x, const float* __restrict__ bias, int n, int d) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += bias[i % d];
}

// x = cap * tanh(x / cap) in place (gemma2-style final logit softcap).
extern "C" __global__ void softcap(float* __restrict__ x, int n, float cap) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * tanhf(x[i] / cap);
}
