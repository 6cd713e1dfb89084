// Routing of a mixture of experts on the device: the chosen experts' ids and weights stay in device memory,
// where the expert matvecs (matvec.cu) read them, so a captured decode graph serves any choice of experts.
#include "ops_common.cuh"
#include "q8_1.cuh"

// One token's routing by one warp: logits [n_expert] -> ids [k], weights [k], softmax gating as llama.cpp's
// (softmax over all experts, the k most probable, their probabilities renormalized to sum 1), most probable
// first, ties to the lower id (as kernels/cpu/ops.route). p: n_expert floats of shared memory. k <= 32.
__device__ __forceinline__ void route_token(const float* l, int n_expert, int k, float* p, int* ids, float* weights) {
    int lane = threadIdx.x & 31;
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
        // the warp's best: probabilities are >= 0, so their bits order as they do (a lane with none left: 0);
        // two reductions in hardware instead of 5 rounds of shuffles, ties to the lower id
        unsigned bits = best < 0.0f ? 0u : __float_as_uint(best);
        unsigned top = __reduce_max_sync(0xffffffffu, bits);
        arg = __reduce_min_sync(0xffffffffu, bits == top ? arg : n_expert);
        best = __uint_as_float(top);
        float w = best / s;
        chosen += w;
        if (lane == j) my_w = w, my_id = arg;
        if (lane == (arg & 31)) p[arg] = -1.0f;  // probabilities are >= 0: never chosen again
        __syncwarp();
    }
    if (lane < k) {
        ids[lane] = my_id;
        weights[lane] = my_w / chosen;
    }
}

// logits [n_tok, n_expert] -> ids [n_tok, k], weights [n_tok, k] (route_token). One warp a token (grid n_tok,
// block 32); dynamic shared memory: n_expert floats.
extern "C" __global__ void moe_route(const float* __restrict__ logits, int n_expert, int k, int* __restrict__ ids,
                                     float* __restrict__ weights) {
    wait_prior();
    extern __shared__ float p[];
    size_t t = blockIdx.x;
    route_token(logits + t * n_expert, n_expert, k, p, ids + t * k, weights + t * k);
}

// weights [n] *= scales[ids[n]]: each chosen expert's output scale folded into its weight (gemma4's
// ffn_down_exps.scale). Launch: grid ceil(n / 256), block 256.
extern "C" __global__ void moe_scale_weights(const int* __restrict__ ids, float* __restrict__ weights,
                                             const float* __restrict__ scales, int n) {
    wait_prior();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) weights[i] *= scales[ids[i]];
}

// One token's FFN norm, router and routing in one launch: each block normalizes its own copy of x [n_embd]
// (h = x / sqrt(mean(x^2) + eps) * norm, as norm_rope.cu's rms_norm_q8_1: x is 8 KB from L2) and dots h with
// router row blockIdx.x (float32 [n_expert, n_embd]: every multiprocessor reads a share of it), plus the router's
// bias [n_expert] where it has one (gpt-oss; NULL: none); block 0 also
// stores h and its q8_1 copy (hq4, hds) for the experts' matvecs; the block that finishes last routes the
// logits (route_token) and sets *done back to 0 for the next launch. n_embd a multiple of 32, at most
// ROUTER_CHUNKS * 4 * blockDim.x; x, norm, router rows, h 16-byte aligned.
// Launch: grid n_expert, block n_embd / 16 rounded up to 32 (at most 1024); dynamic shared memory n_expert floats.
#define ROUTER_CHUNKS 4
extern "C" __global__ void __launch_bounds__(1024)
    moe_norm_router_route(const float4* __restrict__ x, const float4* __restrict__ norm, float eps,
                          const float* __restrict__ router, const float* __restrict__ bias, int n_embd, int n_expert,
                          int k, float4* __restrict__ h,
                          int* __restrict__ hq4, float2* __restrict__ hds, float* logits, int* __restrict__ ids,
                          float* __restrict__ weights, unsigned int* done) {
    if (threadIdx.x == 0) prefetch_l2(router + (size_t)blockIdx.x * n_embd, 4 * (size_t)n_embd);
    wait_prior();
    extern __shared__ float p[];
    __shared__ bool last;
    const float4* r = reinterpret_cast<const float4*>(router + (size_t)blockIdx.x * n_embd);
    int n4 = n_embd / 4;
    float4 v[ROUTER_CHUNKS], g[ROUTER_CHUNKS], w[ROUTER_CHUNKS];
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < ROUTER_CHUNKS; ++j) {  // all loads in flight together
        int c = threadIdx.x + j * blockDim.x;
        v[j] = c < n4 ? x[c] : zero;
        g[j] = c < n4 ? norm[c] : zero;
        w[j] = c < n4 ? __ldg(r + c) : zero;
        ss += dot4(v[j], v[j]);
    }
    float inv = rsqrtf(block_sum_f(ss) / (float)n_embd + eps);
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < ROUTER_CHUNKS; ++j) {
        if (j * (int)blockDim.x >= n4) break;  // the same for the whole block, so whole warps shuffle below
        int c = threadIdx.x + j * blockDim.x;
        float4 o = scaled4(v[j], inv, g[j]);
        acc += dot4(o, w[j]);
        if (blockIdx.x == 0) {
            if (c < n4) h[c] = o;
            store_q8_1_x4(o, c, c < n4, hq4, hds);  // chunks 8k .. 8k+7 are 8 consecutive lanes
        }
    }
    acc = block_sum_f(acc);
    if (threadIdx.x == 0) {
        logits[blockIdx.x] = bias ? acc + bias[blockIdx.x] : acc;
        __threadfence();  // the logit is visible before this block counts itself done
        last = atomicAdd(done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last || threadIdx.x >= 32) return;
    __threadfence();
    for (int i = threadIdx.x; i < n_expert; i += 32) p[i] = __ldcg(logits + i);  // past L1: other blocks wrote them
    __syncwarp();
    route_token(p, n_expert, k, p, ids, weights);
    if (threadIdx.x == 0) *done = 0;
}
