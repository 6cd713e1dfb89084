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
    wait_prior();
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
    wait_prior();
    u64 best = 0;
    for (int i = threadIdx.x; i < n_part; i += blockDim.x) best = part[i] > best ? part[i] : best;
    best = block_max_u64(best);
    if (threadIdx.x == 0) emit(best ? key_id(best) : 0, token, history, n_hist, pos);
}

// Each row's argmax of x [rows, n] into ids [rows] (a verify step's, so that only the ids go to the host): a block a
// row, its threads striding the row. Launch: grid rows, block ARGMAX_THREADS.
extern "C" __global__ void argmax_rows(const float* __restrict__ x, int n, int* __restrict__ ids) {
    wait_prior();
    const float* row = x + (size_t)blockIdx.x * n;
    u64 best = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        u64 k = logit_key(row[i], i);
        best = k > best ? k : best;
    }
    best = block_max_u64(best);
    if (threadIdx.x == 0) ids[blockIdx.x] = best ? key_id(best) : 0;
}

// Constrained decoding: x [n] of the tokens allowed leaves out to -inf (token i: bit i % 32 of word i / 32, set
// where the grammar allows it), before either sampler. Launch: grid ceil(n / 256), block 256.
extern "C" __global__ void mask_logits(float* __restrict__ x, int n, const uint32_t* __restrict__ allowed) {
    wait_prior();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && !((allowed[i >> 5] >> (i & 31)) & 1u)) x[i] = NEG_INF;
}

// ---- sampling ----
#define CHUNK 4096  // logits a block of sample takes; also the most candidates its last block merges
#define K_MAX 64    // candidates kept: top_k is capped here (top_k <= 0 means K_MAX)
#define SAMPLE_THREADS 1024
#define PER (CHUNK / SAMPLE_THREADS)  // keys a thread holds

// The K_MAX largest keys of the block (thread i holds v[e] = keys[e * SAMPLE_THREADS + i]) -> top [K_MAX],
// in no order. Radix select, a byte at a time from the top: find the byte value of the K_MAX-th largest key
// among the keys that share the bytes found so far, stop as soon as that value's keys are all needed
// (2-4 rounds on real logits). Two barriers a round: the histogram and the scan's results alternate
// between two buffers. Keys are unique but for the padding 0, so at most K_MAX keys qualify; extra zeros
// are dropped.
__device__ __forceinline__ void select_top(const u64 (&v)[PER], u64* top) {
    __shared__ unsigned hist[2][256];
    __shared__ int s_digit[2], s_above[2], s_count[2], s_n_above, s_n_equal;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x < 512) hist[threadIdx.x >> 8][threadIdx.x & 255] = 0;
    if (threadIdx.x == 0) s_n_above = s_n_equal = 0;
    __syncthreads();
    u64 prefix = 0, mask = 0;
    int need = K_MAX;  // keys still to take among those matching prefix under mask
    for (int shift = 56, b = 0; shift >= 0; shift -= 8, b ^= 1) {
#pragma unroll
        for (int e = 0; e < PER; ++e) {
            bool in = (v[e] & mask) == prefix;
            unsigned d = (unsigned)(v[e] >> shift) & 255u;
            unsigned active = __ballot_sync(0xffffffffu, in);
            if (in) {  // one atomic per distinct byte value in the warp: the top bytes of logits are few
                unsigned peers = __match_any_sync(active, d);
                if (lane == __ffs(peers) - 1) atomicAdd(&hist[b][d], __popc(peers));
            }
        }
        __syncthreads();
        if (warp == 0) {  // lane l scans byte values 255 - 8l down to 248 - 8l
            unsigned c[8], sum = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                c[j] = hist[b][255 - lane * 8 - j];
                sum += c[j];
                hist[b ^ 1][lane * 8 + j] = 0;  // for the next round
            }
            unsigned incl = sum;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                unsigned t = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += t;
            }
            unsigned above = incl - sum;  // keys with a larger byte than this lane's first value
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                if (above < (unsigned)need && (unsigned)need <= above + c[j]) {
                    s_digit[b] = 255 - lane * 8 - j;
                    s_above[b] = above;
                    s_count[b] = c[j];
                }
                above += c[j];
            }
        }
        __syncthreads();
        need -= s_above[b];
        prefix |= (u64)s_digit[b] << shift;
        mask |= (u64)255 << shift;
        if (s_count[b] == need) break;  // every key of that byte value is taken
    }
    // (key & mask) > prefix: taken; == prefix: the first `need` of them taken (all alike if more)
#pragma unroll
    for (int e = 0; e < PER; ++e) {
        u64 m = v[e] & mask;
        if (m > prefix) top[atomicAdd(&s_n_above, 1)] = v[e];
        else if (m == prefix) {
            int slot = K_MAX - need + atomicAdd(&s_n_equal, 1);
            if (slot < K_MAX) top[slot] = v[e];
        }
    }
    __syncthreads();
}

// The repetition penalty of llama.cpp: positive logits divided by it, negative ones multiplied.
__device__ __forceinline__ float penalize(float x, float penalty) { return x > 0.0f ? x / penalty : x * penalty; }

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

// Inclusive prefix sum over the warp of lane values, lane i holding element i.
__device__ __forceinline__ float warp_cumsum(float v) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        float t = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += t;
    }
    return v;
}

// Index of the first of the K_MAX candidates (lane l holds l and l + 32) where flag holds, else K_MAX.
__device__ __forceinline__ int warp_first(bool lo, bool hi) {
    unsigned a = __ballot_sync(0xffffffffu, lo), b = __ballot_sync(0xffffffffu, hi);
    return a ? __ffs(a) - 1 : b ? 32 + __ffs(b) - 1 : K_MAX;
}

// The sampler, one launch: each block takes CHUNK logits (penalised: each distinct token of the history
// once) and writes its K_MAX best keys, in no order, to cand [n_blocks, K_MAX]; the last block to finish
// (counted in cand[n_blocks][0], which it sets back to 0) merges them (n_blocks * K_MAX <= CHUNK), keeps
// top_k, then top_p and min_p (on probabilities at temperature 1), then draws from
// softmax(logit / temperature) with a uniform number from Philox keyed by the seed and counted by the
// position. temperature <= 0: the best candidate. Launch: grid ceil(n / CHUNK), block SAMPLE_THREADS.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample(const float* __restrict__ x, int n_vocab, const float* __restrict__ fparams, const int* __restrict__ iparams,
           u64* cand, int* token, int* history, int n_hist, int* pos) {
    wait_prior();
    __shared__ u64 keys[CHUNK];
    __shared__ u64 top[K_MAX];
    __shared__ bool s_last;
    int base = blockIdx.x * CHUNK;
    for (int i = threadIdx.x; i < CHUNK; i += SAMPLE_THREADS)
        keys[i] = base + i < n_vocab ? logit_key(x[base + i], base + i) : 0;
    __syncthreads();
    float penalty = fparams[3];
    int p = pos[0], n_recent = min(n_hist, p + 1);
    if (penalty != 1.0f && threadIdx.x < n_recent) {
        int age = threadIdx.x, id = history[(p - age) % n_hist];
        if (id >= base && id < base + CHUNK && id < n_vocab) {
            bool first = true;  // a token seen several times is penalised once, by its most recent entry
            for (int a = 0; a < age; ++a) first &= history[(p - a) % n_hist] != id;
            if (first) keys[id - base] = logit_key(penalize(x[id], penalty), id);
        }
    }
    __syncthreads();
    u64 v[PER];
#pragma unroll
    for (int e = 0; e < PER; ++e) v[e] = keys[e * SAMPLE_THREADS + threadIdx.x];
    select_top(v, top);
    if (threadIdx.x < K_MAX) cand[blockIdx.x * K_MAX + threadIdx.x] = top[threadIdx.x];
    __threadfence();  // the candidates are visible before the count says so
    __syncthreads();
    u64* counter = cand + gridDim.x * K_MAX;
    if (threadIdx.x == 0) s_last = atomicAdd(counter, 1ull) == gridDim.x - 1;
    __syncthreads();
    if (!s_last) return;

    // the last block: merge
    __threadfence();
    int n_cand = gridDim.x * K_MAX;
#pragma unroll
    for (int e = 0; e < PER; ++e) {
        int i = e * SAMPLE_THREADS + threadIdx.x;
        v[e] = i < n_cand ? __ldcg(cand + i) : 0;
    }
    if (threadIdx.x == 0) *counter = 0;
    select_top(v, top);
    if (threadIdx.x < K_MAX) {  // sort by rank: larger keys first, equal ones (padding) by slot
        u64 mine = top[threadIdx.x];
        int rank = 0;
        for (int j = 0; j < K_MAX; ++j) rank += top[j] > mine || (top[j] == mine && j < (int)threadIdx.x);
        keys[rank] = mine;
    }
    __syncthreads();
    if (threadIdx.x >= 32) return;
    // warp 0: lane l holds candidates l (lo) and l + 32 (hi)
    int lane = threadIdx.x;
    float temperature = fparams[0], top_p = fparams[1], min_p = fparams[2];
    int top_k = iparams[0];
    int k = (top_k <= 0 || top_k > K_MAX) ? K_MAX : top_k;
    u64 key_lo = keys[lane], key_hi = keys[lane + 32];
    // candidates that are real tokens (a vocabulary may be smaller than k); keys are sorted, 0 last
    int n = min(k, warp_first(key_lo == 0, key_hi == 0));
    int pick = 0;
    if (temperature > 0.0f && n > 1) {
        float best = key_logit(keys[0]);
        float x_lo = key_logit(key_lo), x_hi = key_logit(key_hi);
        // weights relative to the best candidate, at temperature 1
        float w_lo = lane < n ? expf(x_lo - best) : 0.0f, w_hi = lane + 32 < n ? expf(x_hi - best) : 0.0f;
        if (top_p < 1.0f) {  // smallest prefix whose mass reaches top_p
            float c_lo = warp_cumsum(w_lo), c_hi = warp_cumsum(w_hi);
            float sum_lo = __shfl_sync(0xffffffffu, c_lo, 31);
            c_hi += sum_lo;
            float target = top_p * __shfl_sync(0xffffffffu, c_hi, 31);
            n = min(n, warp_first(lane < n && c_lo >= target, lane + 32 < n && c_hi >= target) + 1);
        }
        if (min_p > 0.0f) {  // w is relative to the best candidate, whose w is 1; w falls with the index
            int keep = __popc(__ballot_sync(0xffffffffu, lane < n && w_lo >= min_p)) +
                       __popc(__ballot_sync(0xffffffffu, lane + 32 < n && w_hi >= min_p));
            n = max(1, keep);
        }
        w_lo = lane < n ? expf((x_lo - best) / temperature) : 0.0f;
        w_hi = lane + 32 < n ? expf((x_hi - best) / temperature) : 0.0f;
        float c_lo = warp_cumsum(w_lo), c_hi = warp_cumsum(w_hi);
        c_hi += __shfl_sync(0xffffffffu, c_lo, 31);
        float total = __shfl_sync(0xffffffffu, c_hi, 31);
        uint32_t seed = (uint32_t)iparams[1];
        float u = (float)(philox((uint32_t)pos[0], 0u, seed, 0x5EED5EEDu) >> 8) * (1.0f / 16777216.0f);
        float target = u * total;
        pick = min(n - 1, warp_first(lane < n && c_lo > target, lane + 32 < n && c_hi > target));
    }
    if (lane == 0) emit(key_id(keys[pick]), token, history, n_hist, pos);
}
