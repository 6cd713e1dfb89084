// RMS norm (plain, fused with the residual add, per head), rotary embedding and the KV-cache write.
// Kernels that depend on the position read it from pos[0] (device memory), so a captured graph stays valid
// for every step.
#include "ops_common.cuh"
#include "q8_1.cuh"

// out[row] = x[row] / sqrt(mean(x[row]^2) + eps) * w over rows of d values; one block a row.
// add_residual: first x[row] += r[row] (written back to x: the residual stream), then normalise the sum.
// Per-head norm (q/k norms) is the same with rows = tokens * heads and d = head_dim.
// out may be x (in place): each thread reads only the elements it writes.
// Launch: grid n_rows, block a multiple of 32 (<= 1024).
extern "C" __global__ void rms_norm(float* x, const float* r, const float* __restrict__ w, float* out, int d,
                                    float eps, int add_residual) {
    wait_prior();
    float* xr = x + (size_t)blockIdx.x * d;
    float* o = out + (size_t)blockIdx.x * d;
    float ss = 0.0f;
    if (add_residual) {
        const float* rr = r + (size_t)blockIdx.x * d;
        for (int i = threadIdx.x; i < d; i += blockDim.x) {
            float v = xr[i] + rr[i];
            xr[i] = v;
            ss += v * v;
        }
    } else {
        for (int i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
    }
    float inv = rsqrtf(block_sum_f(ss) / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) o[i] = xr[i] * inv * w[i];
}

// Rows of d values (a step's hidden states, a block a row): out = x / sqrt(mean(x^2) + eps) * w, and the same
// values quantized to q8_1 (xq [rows, d], xds [rows, d / 32]) for the matvecs that read out next. A thread loads its
// float4 chunks c = threadIdx.x + j * blockDim.x of x and w once, all in flight together, and keeps them for
// the second pass (rms_norm's two passes of dependent loads took ~4 us). d a multiple of 32, at most
// NORM_CHUNKS * 4 * blockDim.x; x, w, out 16-byte aligned. Launch: grid rows, block d / 4 rounded up to 32,
// at most 1024: one chunk a thread where it fits, since each chunk's arithmetic is a serial chain (4 chunks
// a thread measured 3.5 us at d 4096; 1b, d 2048, lost 5 % of its tok/s with them).
#define NORM_CHUNKS 4
extern "C" __global__ void __launch_bounds__(1024)
    rms_norm_q8_1(const float4* __restrict__ x, const float4* __restrict__ w, float4* __restrict__ out,
                  int* __restrict__ xq4, float2* __restrict__ xds, int d, float eps) {
    wait_prior();
    int n4 = d / 4;
    x += (size_t)blockIdx.x * n4, out += (size_t)blockIdx.x * n4;
    xq4 += (size_t)blockIdx.x * n4, xds += (size_t)blockIdx.x * (d / 32);
    float4 v[NORM_CHUNKS], g[NORM_CHUNKS];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < NORM_CHUNKS; ++j) {
        int c = threadIdx.x + j * blockDim.x;
        v[j] = c < n4 ? x[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        g[j] = c < n4 ? w[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        ss += dot4(v[j], v[j]);
    }
    float inv = rsqrtf(block_sum_f(ss) / (float)d + eps);
#pragma unroll
    for (int j = 0; j < NORM_CHUNKS; ++j) {
        if (j * (int)blockDim.x >= n4) break;  // the same for the whole block, so whole warps shuffle below
        int c = threadIdx.x + j * blockDim.x;
        float4 o = scaled4(v[j], inv, g[j]);
        if (c < n4) out[c] = o;
        store_q8_1_x4(o, c, c < n4, xq4, xds);  // chunks 8k .. 8k+7 are 8 consecutive lanes
    }
}

// (x0, x1) turned by the angle whose cosine and sine are c, s; fmaf spelled out so that rope and
// rope_kv_write round the same way whatever the compiler contracts.
__device__ __forceinline__ void rotate(float& x0, float& x1, float c, float s) {
    float r0 = fmaf(x0, c, -(x1 * s)), r1 = fmaf(x0, s, x1 * c);
    x0 = r0;
    x1 = r1;
}

// Rotate q [n_tok, n_head, head_dim] and k [n_tok, n_head_kv, head_dim] in place; token t is at position
// pos[0] + t. Pair i (< n_pairs = rope_dim / 2) turns by (pos[0] + t) * inv_freq[i]: "normal" style
// (llama) pairs dims (2i, 2i+1), neox style (qwen2/qwen3/gemma3) pairs (i, i + n_pairs); dims from rope_dim
// on are left alone. The angle and its sine and cosine are computed in float64: at position 1e5 a float32
// angle would be off by ~1e-2 radian.
// n_head_kv may be 0 (k is then not read). CuPy passes None as an invalid pointer, not NULL: hence counts
// and flags here, never null pointers.
// Launch: grid (n_tok, ceil((n_head + n_head_kv) / ROPE_HEADS)), block n_pairs rounded up to 32.
#define ROPE_HEADS 8
extern "C" __global__ void rope(float* __restrict__ q, float* __restrict__ k, const double* __restrict__ inv_freq,
                                const int* __restrict__ pos, int n_head, int n_head_kv, int head_dim,
                                int n_pairs, int neox) {
    wait_prior();
    int i = threadIdx.x, t = blockIdx.x;
    if (i >= n_pairs) return;
    double s, c;
    sincos((double)(pos[0] + t) * inv_freq[i], &s, &c);
    float sf = (float)s, cf = (float)c;
    int a = neox ? i : 2 * i, b = neox ? i + n_pairs : 2 * i + 1;
    int h_end = min(n_head + n_head_kv, (int)(blockIdx.y + 1) * ROPE_HEADS);
    for (int h = blockIdx.y * ROPE_HEADS; h < h_end; ++h) {
        float* p = h < n_head ? q + ((size_t)t * n_head + h) * head_dim
                              : k + ((size_t)t * n_head_kv + (h - n_head)) * head_dim;
        float x0 = p[a], x1 = p[b];
        rotate(x0, x1, cf, sf);
        p[a] = x0;
        p[b] = x1;
    }
}

// The q/k head norms (qwen3, gemma3), rope and kv_write in one launch (three graph nodes less a layer): with
// head_norm, each head of q and k is first normalized as rms_norm does per head (x / sqrt(mean(x^2) + eps) * w,
// w = q_norm or k_norm [head_dim]); then q, k rotated in place as rope() does, with cos and sin times mscale (YaRN's
// attention factor, gpt-oss; 1 elsewhere: the rotation of rope() exactly), and the rotated k and v
// [n_tok, n_head_kv, head_dim] stored as fp16 at positions pos[0] + t of the caches (row p % max_ctx: attention.cu).
// Thread i < head_dim / 2 takes pair i when i < n_pairs, else the unrotated dims 2i and 2i+1 (normalized
// and copied). head_norm needs head_dim a multiple of 64 (block_sum_f's whole warps).
// v_norm (gemma4): each head of v normalized too before it is stored, with its weight v_norm_w (ones: gemma4's
// unweighted norm). v may be k itself (gemma4's global layers without attn_v: v is k's projection before its norm
// and rope): the thread that rewrites k's dims a, b reads v's first. n_head_kv 0: q alone (gemma4's KV-shared
// layers), no cache written. Not restrict: k and v may be one buffer.
// Launch: grid (n_tok, ceil((n_head + n_head_kv) / heads)), block head_dim / 2: `heads` heads a block, one
// after the other (ROPE_HEADS for a prompt; a decode step's few heads go one a block, all at once).
extern "C" __global__ void rope_kv_write(float* __restrict__ q, float* k, const float* v,
                                         __half* __restrict__ k_cache, __half* __restrict__ v_cache,
                                         const double* __restrict__ inv_freq, const int* __restrict__ pos,
                                         int n_head, int n_head_kv, int head_dim, int n_pairs, int neox,
                                         float mscale, int max_ctx, const float* __restrict__ q_norm,
                                         const float* __restrict__ k_norm, int head_norm, float eps, int heads,
                                         const float* __restrict__ v_norm_w, int v_norm) {
    wait_prior();
    int i = threadIdx.x, t = blockIdx.x, p = pos[0] + t;
    bool rotated = i < n_pairs;
    float sf = 0.0f, cf = 1.0f;
    if (rotated) {
        double s, c;
        sincos((double)p * inv_freq[i], &s, &c);
        sf = (float)s * mscale;  // as the CPU's float32 cos and sin times mscale
        cf = (float)c * mscale;
    }
    int a = rotated && neox ? i : 2 * i, b = rotated && neox ? i + n_pairs : 2 * i + 1;
    int h_end = min(n_head + n_head_kv, (int)(blockIdx.y + 1) * heads);
    for (int h = blockIdx.y * heads; h < h_end; ++h) {  // the same heads for the whole block
        bool is_q = h < n_head;
        int hk = h - n_head;
        size_t row = is_q ? ((size_t)t * n_head + h) * head_dim : ((size_t)t * n_head_kv + hk) * head_dim;
        float* x = (is_q ? q : k) + row;
        float v0 = 0.0f, v1 = 0.0f;
        if (!is_q) {  // before k's dims are rewritten: v may be k
            v0 = v[row + a];
            v1 = v[row + b];
        }
        float x0 = x[a], x1 = x[b];
        if (head_norm) {
            float inv = rsqrtf(block_sum_f(x0 * x0 + x1 * x1) / (float)head_dim + eps);
            const float* w = is_q ? q_norm : k_norm;
            x0 = x0 * inv * w[a];
            x1 = x1 * inv * w[b];
        }
        if (rotated) rotate(x0, x1, cf, sf);
        if (rotated || head_norm) {
            x[a] = x0;
            x[b] = x1;
        }
        if (is_q) continue;
        if (v_norm) {  // every thread of the block is here: they take one head at a time
            float inv = rsqrtf(block_sum_f(v0 * v0 + v1 * v1) / (float)head_dim + eps);
            v0 = v0 * inv * v_norm_w[a];
            v1 = v1 * inv * v_norm_w[b];
        }
        if (p < 0) continue;
        size_t at = ((size_t)hk * max_ctx + p % max_ctx) * head_dim;
        k_cache[at + a] = __float2half_rn(x0);
        k_cache[at + b] = __float2half_rn(x1);
        v_cache[at + a] = __float2half_rn(v0);
        v_cache[at + b] = __float2half_rn(v1);
    }
}

// k, v [n_tok, n_head_kv, head_dim] float32 -> caches [n_head_kv, max_ctx, head_dim] fp16 at positions
// pos[0] + t, position p at row p % max_ctx (attention.cu).
// Launch: grid ceil(n_tok * n_head_kv * head_dim / 256), block 256.
extern "C" __global__ void kv_write(const float* __restrict__ k, const float* __restrict__ v,
                                    __half* __restrict__ k_cache, __half* __restrict__ v_cache,
                                    const int* __restrict__ pos, int n_tok, int n_head_kv, int head_dim,
                                    int max_ctx) {
    wait_prior();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int per_tok = n_head_kv * head_dim;
    if (i >= n_tok * per_tok) return;
    int t = i / per_tok, h = (i / head_dim) % n_head_kv, d = i % head_dim;
    int p = pos[0] + t;
    if (p < 0) return;
    size_t at = ((size_t)h * max_ctx + p % max_ctx) * head_dim + d;
    k_cache[at] = __float2half_rn(k[i]);
    v_cache[at] = __float2half_rn(v[i]);
}
