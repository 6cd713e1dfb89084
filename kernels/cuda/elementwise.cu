// Elementwise ops of a transformer layer: gated activation, residual add, bias add, scale, logit softcap.
// Launch: grid ceil(n / 256), block 256; thread = one element.
#include "ops_common.cuh"
#include "q8_1.cuh"

// out = glu_value(gate, up, act) (ops_common.cuh). out may be gate or up.
extern "C" __global__ void glu(const float* gate, const float* up, float* out, int n, int act) {
    wait_prior();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = glu_value(gate[i], up[i], act);
}

// glu, and its output quantized to q8_1 (xq [n], xds [n / 32]) for the down projection. n a multiple of 32.
extern "C" __global__ void glu_q8_1(const float* gate, const float* up, float* out, int8_t* __restrict__ xq,
                                    float2* __restrict__ xds, int n, int act) {
    wait_prior();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;  // whole warps leave together
    float v = glu_value(gate[i], up[i], act);
    out[i] = v;
    store_q8_1(v, i, xq, xds);
}

// out = a + b; out may be a or b.
extern "C" __global__ void add(const float* a, const float* b, float* out, int n) {
    wait_prior();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

// out [n / d, d] = x + bias [d] on every row; out may be x.
extern "C" __global__ void add_bias(const float* x, const float* __restrict__ bias, float* out, int n, int d) {
    wait_prior();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + bias[i % d];
}

// out = x * s (gemma4's per-layer inputs and layer output scale); out may be x.
extern "C" __global__ void scale(const float* x, float* out, int n, float s) {
    wait_prior();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * s;
}

// x = cap * tanh(x / cap) in place (gemma2-style final logit softcap).
extern "C" __global__ void softcap(float* __restrict__ x, int n, float cap) {
    wait_prior();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

// out = a * sigmoid(gate): the attention output's gate (qwen35). out may be a.
extern "C" __global__ void sigmoid_mul(const float* a, const float* gate, float* out, int n) {
    wait_prior();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] / (1.0f + __expf(-gate[i]));
}

// sigmoid_mul, and its output quantized to q8_1 (xq [n], xds [n / 32]) for the output projection. n a multiple of 32.
extern "C" __global__ void sigmoid_mul_q8_1(const float* a, const float* gate, float* out, int8_t* __restrict__ xq,
                                            float2* __restrict__ xds, int n) {
    wait_prior();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;  // whole warps leave together
    float v = a[i] / (1.0f + __expf(-gate[i]));
    out[i] = v;
    store_q8_1(v, i, xq, xds);
}

// out [n / d, d] = x + sigmoid(s[row]) * y: a shared expert's output y added to the residual x, gated per token by
// s (qwen35moe). out may be x or y.
extern "C" __global__ void add_sigmoid_scaled(const float* x, const float* y, const float* __restrict__ s, float* out,
                                              int n, int d) {
    wait_prior();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + y[i] / (1.0f + __expf(-s[i / d]));
}
