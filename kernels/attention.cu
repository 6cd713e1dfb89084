// Attention over the fp16 KV cache: decode (one query token, split over the keys, flash-decoding) and
// prefill (n query tokens, key tiles in shared memory). Both use online softmax and GQA: the q heads
// h * G .. h * G + G - 1 (G = n_head / n_head_kv) read kv head h.
//
// Caches: k_cache, v_cache [n_head_kv, max_ctx, HD] fp16 (one pair per layer), written by kv_write.
// Masks: a query at position p sees keys j <= p, and with window > 0 only those with p - j < window.
// A warp owns up to MAXG query rows (q heads, or (token, head) pairs in prefill); lane l holds dims
// l*E .. l*E+E-1 (E = HD/32) of each row's q and output accumulator, so the q.k dot is a warp sum and
// the p*v update needs no communication.
#include "ops_common.cuh"

#define WARPS 4        // a block is 128 threads
#define TK 4           // keys a warp takes per step: their loads are in flight together
#define MIN_SPLIT_KEYS 64  // decode: fewest keys worth a split of their own

template <int HD> struct Rows { static constexpr int MAXG = HD == 256 ? 4 : 8; };  // registers: no spills

__device__ __forceinline__ void unpack2(uint32_t u, float& a, float& b) {
    a = __half2float(__ushort_as_half((unsigned short)(u & 0xFFFF)));
    b = __half2float(__ushort_as_half((unsigned short)(u >> 16)));
}

// E consecutive fp16 values at p (aligned to 2E bytes) as floats
template <int E>
__device__ __forceinline__ void load_halves(const __half* p, float (&f)[E]) {
    if constexpr (E == 2) {
        unpack2(*reinterpret_cast<const uint32_t*>(p), f[0], f[1]);
    } else if constexpr (E == 4) {
        uint2 u = *reinterpret_cast<const uint2*>(p);
        unpack2(u.x, f[0], f[1]);
        unpack2(u.y, f[2], f[3]);
    } else {
        uint4 u = *reinterpret_cast<const uint4*>(p);
        unpack2(u.x, f[0], f[1]);
        unpack2(u.y, f[2], f[3]);
        unpack2(u.z, f[4], f[5]);
        unpack2(u.w, f[6], f[7]);
    }
}

// Online-softmax state of one warp's rows (each lane holds its E dims of acc).
template <int HD>
struct State {
    static constexpr int E = HD / 32, G = Rows<HD>::MAXG;
    float q[G][E];    // scaled queries
    float acc[G][E];  // sum of p * v
    float m[G], l[G]; // running max of scores, sum of p
    int qpos[G];      // position of each row's query (-1: no query, sees nothing)

    __device__ __forceinline__ void init() {
#pragma unroll
        for (int g = 0; g < G; ++g) {
            m[g] = NEG_INF;
            l[g] = 0.0f;
#pragma unroll
            for (int e = 0; e < E; ++e) acc[g][e] = 0.0f;
        }
    }

    // Keys j0 .. j0+nv-1 (nv <= TK): their rows at k0 + u*HD and v0 + u*HD. Rows g >= ng are skipped.
    __device__ __forceinline__ void attend(const __half* k0, const __half* v0, int j0, int nv, int ng,
                                           int window) {
        int lane = threadIdx.x & 31;
        float kf[TK][E], vf[TK][E];
#pragma unroll
        for (int u = 0; u < TK; ++u) {
            if (u < nv) {
                load_halves<E>(k0 + u * HD + lane * E, kf[u]);
                load_halves<E>(v0 + u * HD + lane * E, vf[u]);
            } else {
#pragma unroll
                for (int e = 0; e < E; ++e) kf[u][e] = vf[u][e] = 0.0f;
            }
        }
#pragma unroll
        for (int g = 0; g < G; ++g) {
            if (g >= ng) continue;  // ng is the same for the whole warp
            float s[TK];
            float mt = m[g];
#pragma unroll
            for (int u = 0; u < TK; ++u) {
                float dot = 0.0f;
#pragma unroll
                for (int e = 0; e < E; ++e) dot += q[g][e] * kf[u][e];
                dot = warp_sum_f(dot);
                int j = j0 + u;
                bool seen = u < nv && j <= qpos[g] && (window <= 0 || qpos[g] - j < window);
                s[u] = seen ? dot : NEG_INF;
                mt = fmaxf(mt, s[u]);
            }
            if (mt == NEG_INF) continue;  // nothing seen yet: keep the empty state (avoids inf - inf)
            float alpha = __expf(m[g] - mt);
            l[g] *= alpha;
#pragma unroll
            for (int e = 0; e < E; ++e) acc[g][e] *= alpha;
#pragma unroll
            for (int u = 0; u < TK; ++u) {
                float p = __expf(s[u] - mt);
                l[g] += p;
#pragma unroll
                for (int e = 0; e < E; ++e) acc[g][e] += p * vf[u][e];
            }
            m[g] = mt;
        }
    }
};

// Decode splits: the keys seen at position p, and how a fixed grid of n_splits splits them at run time
// (few keys: one split, so short contexts cost one pass; many: up to n_splits to fill the GPU).
struct Splits {
    int lo, n, active, chunk;
    __device__ __forceinline__ Splits(int p, int window, int n_splits) {
        lo = window > 0 ? max(0, p - window + 1) : 0;
        n = p + 1 - lo;
        active = min(n_splits, (n + MIN_SPLIT_KEYS - 1) / MIN_SPLIT_KEYS);
        chunk = (n + active - 1) / active;
    }
};

// Decode, pass 1. q [n_head, HD] float32 at position pos[0] (its k and v already in the cache).
// Block (kv head h = blockIdx.x, split s = blockIdx.y, row chunk c = blockIdx.z): q heads h*G + c*MAXG ..,
// keys lo + s*chunk .. (at most chunk). Writes part [n_head, n_splits, HD + 2] = (sum p*v, max, sum p),
// unnormalised; a split past the active ones writes nothing (the combine reads only active ones).
// Launch: grid (n_head_kv, n_splits, ceil(G / MAXG)), block 128.
template <int HD>
__device__ __forceinline__ void decode_split(const float* __restrict__ q, const __half* __restrict__ k_cache,
                                             const __half* __restrict__ v_cache, float* __restrict__ part,
                                             const int* __restrict__ pos, int n_head, int n_head_kv,
                                             int max_ctx, int window, float scale, int n_splits) {
    constexpr int E = HD / 32, G = Rows<HD>::MAXG;
    __shared__ float s_m[WARPS][G], s_l[WARPS][G], s_acc[WARPS][G][HD];
    int p = min(pos[0], max_ctx - 1);  // past the cache is the caller's bug: wrong output, not a fault
    Splits sp(p, window, n_splits);
    int s = blockIdx.y;
    if (s >= sp.active) return;
    int h = blockIdx.x, group = n_head / n_head_kv, g0 = blockIdx.z * G;
    int ng = min(G, group - g0);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int kb = sp.lo + s * sp.chunk, ke = min(p + 1, kb + sp.chunk);

    State<HD> st;
    st.init();
#pragma unroll
    for (int g = 0; g < G; ++g) {
        st.qpos[g] = p;
        if (g < ng) {
#pragma unroll
            for (int e = 0; e < E; ++e) st.q[g][e] = q[(size_t)(h * group + g0 + g) * HD + lane * E + e] * scale;
        }
    }
    const __half* kh = k_cache + (size_t)h * max_ctx * HD;
    const __half* vh = v_cache + (size_t)h * max_ctx * HD;
    for (int j0 = kb + warp * TK; j0 < ke; j0 += WARPS * TK)
        st.attend(kh + (size_t)j0 * HD, vh + (size_t)j0 * HD, j0, min(TK, ke - j0), ng, window);

    // merge the warps' states
#pragma unroll
    for (int g = 0; g < G; ++g) {
        if (lane == 0) {
            s_m[warp][g] = st.m[g];
            s_l[warp][g] = st.l[g];
        }
#pragma unroll
        for (int e = 0; e < E; ++e) s_acc[warp][g][lane * E + e] = st.acc[g][e];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < ng * HD; i += blockDim.x) {
        int g = i / HD, d = i % HD;
        float mx = NEG_INF;
        for (int w = 0; w < WARPS; ++w) mx = fmaxf(mx, s_m[w][g]);
        float a = 0.0f, l = 0.0f;
        if (mx != NEG_INF) {
            for (int w = 0; w < WARPS; ++w) {
                float f = s_l[w][g] > 0.0f ? __expf(s_m[w][g] - mx) : 0.0f;
                a += s_acc[w][g][d] * f;
                l += s_l[w][g] * f;
            }
        }
        float* out = part + ((size_t)(h * group + g0 + g) * n_splits + s) * (HD + 2);
        out[d] = a;
        if (d == 0) {
            out[HD] = mx;
            out[HD + 1] = l;
        }
    }
}

// Decode, pass 2: out [n_head, HD] = combination of the active splits of part.
// Launch: grid n_head, block HD.
extern "C" __global__ void attn_decode_combine(const float* __restrict__ part, float* __restrict__ out,
                                               const int* __restrict__ pos, int head_dim, int window,
                                               int n_splits, int max_ctx) {
    Splits sp(min(pos[0], max_ctx - 1), window, n_splits);
    const float* ph = part + (size_t)blockIdx.x * n_splits * (head_dim + 2);
    int d = threadIdx.x;
    float mx = NEG_INF;
    for (int s = 0; s < sp.active; ++s) mx = fmaxf(mx, ph[s * (head_dim + 2) + head_dim]);
    float a = 0.0f, l = 0.0f;
    for (int s = 0; s < sp.active; ++s) {
        const float* ps = ph + s * (head_dim + 2);
        float ls = ps[head_dim + 1];
        float f = ls > 0.0f ? __expf(ps[head_dim] - mx) : 0.0f;
        a += ps[d] * f;
        l += ls * f;
    }
    out[(size_t)blockIdx.x * head_dim + d] = a / l;
}

// Prefill: q [n_tok, n_head, HD] float32, token t at position pos[0] + t, its k and v (and all earlier
// ones) already in the cache; out [n_tok, n_head, HD]. Rows r = t * G + g (g < G) of kv head
// h = blockIdx.y; a block takes WARPS * MAXG consecutive rows, a warp MAXG of them. Key tiles of PF_TILE
// keys are staged in shared memory once for all the block's rows.
// Launch: grid (ceil(n_tok * G / (WARPS * MAXG)), n_head_kv), block 128.
#define PF_TILE 32
template <int HD>
__device__ __forceinline__ void prefill(const float* __restrict__ q, const __half* __restrict__ k_cache,
                                        const __half* __restrict__ v_cache, float* __restrict__ out,
                                        const int* __restrict__ pos, int n_tok, int n_head, int n_head_kv,
                                        int max_ctx, int window, float scale) {
    constexpr int E = HD / 32, G = Rows<HD>::MAXG, CHUNKS = HD / 8;  // 16-byte chunks a key row
    __shared__ __align__(16) __half s_k[PF_TILE * HD], s_v[PF_TILE * HD];
    int p0 = pos[0];
    int h = blockIdx.y, group = n_head / n_head_kv, n_rows = n_tok * group;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int r_block = blockIdx.x * WARPS * G, r_warp = r_block + warp * G;
    int ng = max(0, min(G, n_rows - r_warp));

    State<HD> st;
    st.init();
#pragma unroll
    for (int g = 0; g < G; ++g) {
        st.qpos[g] = -1;
        if (g < ng) {
            int r = r_warp + g, t = r / group, hq = h * group + r % group;
            st.qpos[g] = p0 + t;
#pragma unroll
            for (int e = 0; e < E; ++e) st.q[g][e] = q[((size_t)t * n_head + hq) * HD + lane * E + e] * scale;
        }
    }
    // keys any row of the block sees, and those this warp's rows see
    int t_first = r_block / group, t_last = min(n_rows - 1, r_block + WARPS * G - 1) / group;
    int k_lo = window > 0 ? max(0, p0 + t_first - window + 1) : 0;
    int k_end = min(max_ctx, p0 + t_last + 1);  // past the cache is the caller's bug: wrong output, not a fault
    int w_first = p0 + r_warp / group, w_last = p0 + (r_warp + max(ng, 1) - 1) / group;
    int w_lo = window > 0 ? w_first - window + 1 : 0;

    const __half* kh = k_cache + (size_t)h * max_ctx * HD;
    const __half* vh = v_cache + (size_t)h * max_ctx * HD;
    for (int kt = k_lo; kt < k_end; kt += PF_TILE) {
        int nt = min(PF_TILE, k_end - kt);
        __syncthreads();  // the previous tile is no longer read
        for (int c = threadIdx.x; c < nt * CHUNKS; c += blockDim.x) {
            size_t at = (size_t)kt * HD + (size_t)c * 8;
            reinterpret_cast<uint4*>(s_k)[c] = *reinterpret_cast<const uint4*>(kh + at);
            reinterpret_cast<uint4*>(s_v)[c] = *reinterpret_cast<const uint4*>(vh + at);
        }
        __syncthreads();
        if (ng == 0 || kt > w_last || kt + nt - 1 < w_lo) continue;  // no row of this warp sees the tile
        for (int u = 0; u < nt; u += TK)
            st.attend(s_k + u * HD, s_v + u * HD, kt + u, min(TK, nt - u), ng, window);
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
        if (g < ng) {
            int r = r_warp + g, t = r / group, hq = h * group + r % group;
            float inv = 1.0f / st.l[g];
#pragma unroll
            for (int e = 0; e < E; ++e) out[((size_t)t * n_head + hq) * HD + lane * E + e] = st.acc[g][e] * inv;
        }
    }
}

// (128, 1): with the plain bound ptxas aims at 3 blocks an SM and spills at HD 256
#define ATTN(HD)                                                                                        \
    extern "C" __global__ void __launch_bounds__(128, 1)                                                 \
        attn_decode_##HD(const float* q, const __half* k_cache, const __half* v_cache, float* part,   \
                         const int* pos, int n_head, int n_head_kv, int max_ctx, int window, float scale, \
                         int n_splits) {                                                                \
        decode_split<HD>(q, k_cache, v_cache, part, pos, n_head, n_head_kv, max_ctx, window, scale,    \
                         n_splits);                                                                    \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(128, 1)                                                 \
        attn_prefill_##HD(const float* q, const __half* k_cache, const __half* v_cache, float* out,   \
                          const int* pos, int n_tok, int n_head, int n_head_kv, int max_ctx, int window, \
                          float scale) {                                                                \
        prefill<HD>(q, k_cache, v_cache, out, pos, n_tok, n_head, n_head_kv, max_ctx, window, scale);  \
    }

ATTN(64)
ATTN(128)
ATTN(256)
