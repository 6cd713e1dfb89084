// Choosing the next token on the device: greedy argmax and a temperature / top-k / top-p / min-p /
// repetition-penalty sampler with a counter-based RNG. Both write the token into token[0], record it in
// the history ring and advance pos[0] by one, so a captured decode step feeds the next one by itself.
//
// Conventions: pos[0] is the position of the token whose logits these are; the chosen token goes to
// position pos[0] + 1. history [n_hist] is a ring: history[p % n_hist] is the token at position p, valid
// for the last min(n_hist, pos[0] + 1) positions (the caller fills it with the prompt).
// Sampling parameters live in device memory (fparams = temperature, top_p, min_p, repeat_penalty;
// iparams = top_k, seed) so they can change between replays of a graph.
#include "ops_common.cuh"

typedef unsigned long long u64;  // not uint64_t: NVRTC and glibc may spell that one differently

#define ARGMAX_THREADS 1024

// Larger key = larger logit, ties to the smaller token id; NaN ranks below -inf; key 0 means "none".
__device__ __forceinline__ u64 logit_key(float x, int id) {
    uint32_t u = __float_as_uint(x);
    u = (x != x) ? 0u : ((u & 0x80000000u) ? ~u : (u | 0x80000000u));
    return ((u64)u << 32) | (uint32_t)(0x7FFFFFFF - id);
}
__device__ __forceinline__ int key_id(u64 k) { return 0x7FFFFFFF - (int)(uint32_t)k; }
__device__ __forceinline__ float key_logit(u64 k) {
    uint32_t u = (uint32_t)(k >> 32);
    return __uint_as_float((u & 0x80000000u) ? (u & 0x7FFFFFFFu) : ~u);
}

__device__ __forceinline__ u64 warp_max_u64(u64 v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        u64 w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

// Largest key of the block (blockDim.x = ARGMAX_THREADS); every thread gets it.
__device__ __forceinline__ u64 block_max_u64(u64 v) {
    __shared__ u64 part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max_u64(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? part[lane] : 0;
    return warp_max_u64(v);
}

// Write the chosen token: token[0], the history ring, pos[0] + 1. One thread.
__device__ __forceinline__ void emit(int tok, int* token, int* history, int n_hist, int* pos) {
    int p = pos[0] + 1;
    token[0] = tok;
    if (n_hist > 0) history[p % n_hist] = tok;
    pos[0] = p;
}

// Greedy, pass 1: part [n_blocks] = the largest key of each block's grid-stride share of x [n].
// Launch: grid n_blocks, block ARGMAX_THREADS.
extern "C" __global__ void argmax_blocks(const float* __restrict__ x, int n, u64* __restrict__ part) {
    u64 best = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        u64 k = logit_key(x[i], i);
        best = k > best ? k : best;
    }
    best = block_max_u64(best);
    if (threadIdx.x == 0) part[blockIdx.x] = best;
}

// Greedy, pass 2: the largest of part [n_part] is the token. Launch: grid 1, block ARGMAX_THREADS.
extern "C" __global__ void argmax_final(const u64* __restrict__ part, int n_part, int* token, int* history,
                                        int n_hist, int* pos) {
    u64 best = 0;
    for (int i = threadIdx.x; i < n_part; i += blockDim.x) best = part[i] > best ? part[i] : best;
    best = block_max_u64(best);
    if (threadIdx.x == 0) emit(best ? key_id(best) : 0, token, history, n_hist, pos);
}

// ---- sampling ----
#define CHUNK 4096  // logits a block of sample_topk sorts
#define K_MAX 64    // candidates kept: top_k is capped here (top_k <= 0 means K_MAX)
#define SORT_THREADS 1024

// Sort keys [CHUNK] in shared memory, largest first (bitonic); all SORT_THREADS threads call it.
__device__ __forceinline__ void sort_desc(u64* keys) {
    for (int k = 2; k <= CHUNK; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < CHUNK; i += SORT_THREADS) {
                int ixj = i ^ j;
                if (ixj > i) {
                    u64 a = keys[i], b = keys[ixj];
                    if (((i & k) == 0) ? (a < b) : (a > b)) {
                        keys[i] = b;
                        keys[ixj] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
}

// The repetition penalty of llama.cpp: positive logits divided by it, negative ones multiplied.
__device__ __forceinline__ float penalize(float x, float penalty) { return x > 0.0f ? x / penalty : x * penalty; }

// Sampling, pass 1: each block sorts CHUNK logits (penalised: each distinct token of the history once)
// and writes its K_MAX best keys to cand [n_blocks, K_MAX]. Launch: grid ceil(n / CHUNK), block 1024.
extern "C" __global__ void sample_topk(const float* __restrict__ x, int n, const float* __restrict__ fparams,
                                       const int* __restrict__ history, int n_hist, const int* __restrict__ pos,
                                       u64* __restrict__ cand) {
    __shared__ u64 keys[CHUNK];
    int base = blockIdx.x * CHUNK;
    for (int i = threadIdx.x; i < CHUNK; i += SORT_THREADS)
        keys[i] = base + i < n ? logit_key(x[base + i], base + i) : 0;
    __syncthreads();
    float penalty = fparams[3];
    int p = pos[0], n_recent = min(n_hist, p + 1);
    if (penalty != 1.0f && threadIdx.x < n_recent) {
        int age = threadIdx.x, id = history[(p - age) % n_hist];
        bool first = true;  // a token seen several times is penalised once, by its most recent entry
        for (int a = 0; a < age; ++a) first &= history[(p - a) % n_hist] != id;
        if (first && id >= base && id < base + CHUNK && id < n)
            keys[id - base] = logit_key(penalize(x[id], penalty), id);
    }
    __syncthreads();
    sort_desc(keys);
    for (int i = threadIdx.x; i < K_MAX; i += SORT_THREADS) cand[blockIdx.x * K_MAX + i] = keys[i];
}

// Philox4x32-10 (Salmon et al. 2011): first output word for counter (c0, c1, 0, 0) and key (k0, k1)
__device__ __forceinline__ uint32_t philox(uint32_t c0, uint32_t c1, uint32_t k0, uint32_t k1) {
    uint32_t c2 = 0, c3 = 0;
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return c0;
}

// Sampling, pass 2: merge the blocks' candidates (n_part * K_MAX <= CHUNK), keep top_k, then top_p and
// min_p (on probabilities at temperature 1), then draw from softmax(logit / temperature) with a uniform
// number from Philox keyed by the seed and counted by the position. temperature <= 0: the best candidate.
// Launch: grid 1, block 1024.
extern "C" __global__ void sample_final(const u64* __restrict__ cand, int n_part,
                                        const float* __restrict__ fparams, const int* __restrict__ iparams,
                                        int* token, int* history, int n_hist, int* pos) {
    __shared__ u64 keys[CHUNK];
    __shared__ float w[K_MAX];
    for (int i = threadIdx.x; i < CHUNK; i += SORT_THREADS) keys[i] = i < n_part * K_MAX ? cand[i] : 0;
    __syncthreads();
    sort_desc(keys);
    float temperature = fparams[0], top_p = fparams[1], min_p = fparams[2];
    int top_k = iparams[0];
    int k = (top_k <= 0 || top_k > K_MAX) ? K_MAX : top_k;
    float top = key_logit(keys[0]);
    int c = threadIdx.x;  // candidate c's weight relative to the best
    if (c < K_MAX) w[c] = c < k && keys[c] ? expf(key_logit(keys[c]) - top) : 0.0f;
    __syncthreads();
    if (threadIdx.x != 0) return;
    int n = 0;  // candidates that are real tokens (a vocabulary may be smaller than k)
    while (n < k && keys[n]) ++n;
    if (temperature > 0.0f && n > 1) {
        float total = 0.0f;
        for (int i = 0; i < n; ++i) total += w[i];
        if (top_p < 1.0f) {  // smallest prefix whose mass reaches top_p
            float cum = 0.0f;
            int keep = n;
            for (int i = 0; i < n; ++i) {
                cum += w[i];
                if (cum >= top_p * total) {
                    keep = i + 1;
                    break;
                }
            }
            n = keep;
        }
        if (min_p > 0.0f) {  // w is relative to the best candidate, whose w is 1
            int keep = 1;
            while (keep < n && w[keep] >= min_p) ++keep;
            n = keep;
        }
        total = 0.0f;
        for (int i = 0; i < n; ++i) {
            w[i] = expf((key_logit(keys[i]) - top) / temperature);
            total += w[i];
        }
        uint32_t seed = (uint32_t)iparams[1];
        float u = (float)(philox((uint32_t)pos[0], 0u, seed, 0x5EED5EEDu) >> 8) * (1.0f / 16777216.0f);
        float target = u * total, cum = 0.0f;
        int pick = n - 1;
        for (int i = 0; i < n; ++i) {
            cum += w[i];
            if (cum > target) {
                pick = i;
                break;
            }
        }
        emit(key_id(keys[pick]), token, history, n_hist, pos);
    } else {
        emit(key_id(keys[0]), token, history, n_hist, pos);
    }
}
