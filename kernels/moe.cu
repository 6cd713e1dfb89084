// Routing of a mixture of experts on the device: the chosen experts' ids and weights stay in device memory,
// where the expert matvecs (matvec.cu) read them, so a captured decode graph serves any choice of experts.
#include "ops_common.cuh"

// logits [n_tok, n_expert] -> ids [n_tok, k], weights [n_tok, k]: softmax gating as llama.cpp's (softmax over
// all experts, the k most probable, their probabilities renormalized to sum 1), most probable first, ties to
// the lower id (as kernels/cpu_ops.route). One warp a token; the probabilities in shared memory (n_expert
// floats, dynamic). k <= 32.
extern "C" __global__ void moe_route(const float* __restrict__ logits, int n_expert, int k, int* __restrict__ ids,
                                     float* __restrict__ weights) {
    extern __shared__ float p[];
    const float* l = logits + (size_t)blockIdx.x * n_expert;
    int lane = threadIdx.x;
    float m = NEG_INF;
    for (int e = lane; e < n_expert; e += 32) m = fmaxf(m, l[e]);
    m = warp_max_f(m);
    float s = 0.0f;
    for (int e = lane; e < n_expert; e += 32) {
        p[e] = expf(l[e] - m);
        s += p[e];
    }
    s = warp_sum_f(s);
    __syncwarp();
    float chosen = 0.0f, my_w = 0.0f;  // lane j keeps the j-th choice
    int my_id = 0;
    for (int j = 0; j < k; ++j) {
        float best = -1.0f;
        int arg = n_expert;
        for (int e = lane; e < n_expert; e += 32)
            if (p[e] > best) best = p[e], arg = e;  // a lane's experts ascend: ties keep the lower id
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float b = __shfl_xor_sync(0xffffffffu, best, o);
            int a = __shfl_xor_sync(0xffffffffu, arg, o);
            if (b > best || (b == best && a < arg)) best = b, arg = a;
        }
        float w = best / s;
        chosen += w;
        if (lane == j) my_w = w, my_id = arg;
        if (lane == (arg & 31)) p[arg] = -1.0f;  // probabilities are >= 0: never chosen again
        __syncwarp();
    }
    if (lane < k) {
        ids[(size_t)blockIdx.x * k + lane] = my_id;
        weights[(size_t)blockIdx.x * k + lane] = my_w / chosen;
    }
}
