// Attention over the fp16 KV cache: decode (one query token, split over the keys, flash-decoding) and
// prefill (n query tokens, key tiles in shared memory). Both use online softmax and GQA: the q heads
// h * G .. h * G + G - 1 (G = n_head / n_head_kv) read kv head h.
//
// Caches: k_cache, v_cache [n_head_kv, max_ctx, HD] fp16 (one pair per layer), written by kv_write.
// Masks: a query at position p sees keys j <= p, and with window > 0 only those with p - j < window.
// Decode: a warp owns up to MAXG query rows (q heads); lane l holds dims l*E .. l*E+E-1 (E = HD/32) of each
// row's q and output accumulator, so the q.k dot is a warp sum and the p*v update needs no communication.
// Prefill: on the tensor cores (below).
#include "ops_common.cuh"
#include "q8_1.cuh"

#define WARPS 4        // a block is 128 threads
#define MIN_SPLIT_KEYS 32  // decode: fewest keys worth a split of their own
#define PART_EXTRA 4       // decode: a split's row holds HD sums, max, sum p and 2 unused (16-byte rows)

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

// Copy 16 bytes global -> shared without holding registers (cp.async); ok false: write zeros instead.
__device__ __forceinline__ void copy16(void* dst, const void* src, bool ok) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void copy_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void copy_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Decode streams K and V through shared memory in tiles of DT keys, DSTAGES tiles deep (cp.async), so
// that many bytes are in flight however few registers are free. A sub-warp of HD/8 lanes takes one key:
// each lane holds 8 dims (one 16-byte load of k and of v), so a score is a sum over HD/8 lanes only.
#define DSTAGES 5
template <int HD> struct Dec {
    static constexpr int LK = HD / 8;            // lanes a key
    static constexpr int SUBS = 32 / LK;         // keys a warp takes at once
    static constexpr int DT = 2 * WARPS * SUBS;  // keys a tile: two per sub-warp (4 KB of k)
    static constexpr int STAGE = 2 * DT * HD;    // halves a stage: k then v
};

// Decode, pass 1. q [n_head, HD] float32 at position pos[0] (its k and v already in the cache).
// Block (kv head h = blockIdx.x, split s = blockIdx.y, row chunk c = blockIdx.z): q heads
// h*group + c*G .. (G of them, group = n_head / n_head_kv), keys lo + s*chunk .. (at most chunk). Writes
// part [n_head, n_splits, HD + PART_EXTRA] = (sum p*v, max, sum p, 2 unused), unnormalised; a split past
// the active ones writes nothing (the combine reads only active ones). Every thread computes all G rows,
// so G is MAXG only for groups larger than 4: a group of 4 (llama3) in G = 8 did twice the math a tile.
// Launch: grid (n_head_kv, n_splits, ceil(group / G)), block 128.
template <int HD, int G>
__device__ __forceinline__ void decode_split(const float* __restrict__ q, const __half* __restrict__ k_cache,
                                             const __half* __restrict__ v_cache, float* __restrict__ part,
                                             const int* __restrict__ pos, int n_head, int n_head_kv,
                                             int max_ctx, int window, float scale, int n_splits) {
    using D = Dec<HD>;
    constexpr int LK = D::LK, DT = D::DT;
    __shared__ __align__(16) __half smem[DSTAGES * D::STAGE];  // the tiles, then the warps' merge
    __shared__ float s_m[WARPS][G], s_l[WARPS][G];
    int p = min(pos[0], max_ctx - 1);  // past the cache is the caller's bug: wrong output, not a fault
    Splits sp(p, window, n_splits);
    int s = blockIdx.y;
    if (s >= sp.active) return;
    int h = blockIdx.x, group = n_head / n_head_kv, g0 = blockIdx.z * G;
    int ng = min(G, group - g0);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int sub = lane / LK, dim0 = (lane % LK) * 8;  // this lane's key of the sub-warp's pair, its dims
    int unit = warp * D::SUBS + sub;              // sub-warp index in the block
    int kb = sp.lo + s * sp.chunk, ke = min(p + 1, kb + sp.chunk);
    int n_tiles = (ke - kb + DT - 1) / DT;

    const __half* kh = k_cache + (size_t)h * max_ctx * HD;
    const __half* vh = v_cache + (size_t)h * max_ctx * HD;
    auto load_tile = [&](int t) {  // tile t -> stage t % DSTAGES; keys past ke read as zeros
        __half* st = smem + (t % DSTAGES) * D::STAGE;
        constexpr int CH = DT * HD / 8;  // 16-byte chunks of k (and of v) a tile
        for (int c = threadIdx.x; c < 2 * CH; c += 32 * WARPS) {
            int kv = c / CH, cc = c % CH, j = kb + t * DT + cc / (HD / 8);
            size_t at = (size_t)min(j, ke - 1) * HD + (cc % (HD / 8)) * 8;
            copy16(st + kv * DT * HD + cc * 8, (kv ? vh : kh) + at, j < ke);
        }
    };
#pragma unroll
    for (int t = 0; t < DSTAGES - 1; ++t) {
        if (t < n_tiles) load_tile(t);
        copy_commit();
    }

    float qr[G][8], acc[G][8], m[G], l[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        m[g] = NEG_INF;
        l[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            acc[g][e] = 0.0f;
            qr[g][e] = g < ng ? q[(size_t)(h * group + g0 + g) * HD + dim0 + e] * scale : 0.0f;
        }
    }

    for (int t = 0; t < n_tiles; ++t) {
        copy_wait<DSTAGES - 2>();  // this thread's copies of tile t have landed
        __syncthreads();           // everyone's have, and nobody still reads the stage refilled next
        if (t + DSTAGES - 1 < n_tiles) load_tile(t + DSTAGES - 1);
        copy_commit();
        const __half* st = smem + (t % DSTAGES) * D::STAGE;
        float kf[2][8], vf[2][8], sc[2][G];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            int key = i * WARPS * D::SUBS + unit;
            load_halves<8>(st + key * HD + dim0, kf[i]);
            load_halves<8>(st + DT * HD + key * HD + dim0, vf[i]);
            bool seen = kb + t * DT + key < ke;
#pragma unroll
            for (int g = 0; g < G; ++g) {
                float dot = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; ++e) dot += qr[g][e] * kf[i][e];
#pragma unroll
                for (int o = LK / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
                sc[i][g] = seen ? dot : NEG_INF;
            }
        }
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float mt = fmaxf(m[g], fmaxf(sc[0][g], sc[1][g]));
            if (mt == NEG_INF) continue;  // nothing seen yet: keep the empty state (avoids inf - inf)
            float alpha = __expf(m[g] - mt), p0 = __expf(sc[0][g] - mt), p1 = __expf(sc[1][g] - mt);
            l[g] = l[g] * alpha + p0 + p1;
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[g][e] = acc[g][e] * alpha + p0 * vf[0][e] + p1 * vf[1][e];
            m[g] = mt;
        }
    }
    copy_wait<0>();
    __syncthreads();  // the tiles are no longer read: smem becomes the merge buffer

    // merge the sub-warps of each warp (lanes LK, 2LK.. apart), then the warps through shared memory
#pragma unroll
    for (int o = LK; o < 32; o <<= 1) {
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float m2 = __shfl_xor_sync(0xffffffffu, m[g], o), l2 = __shfl_xor_sync(0xffffffffu, l[g], o);
            float mx = fmaxf(m[g], m2);
            float fa = l[g] > 0.0f ? __expf(m[g] - mx) : 0.0f, fb = l2 > 0.0f ? __expf(m2 - mx) : 0.0f;
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[g][e] = acc[g][e] * fa + __shfl_xor_sync(0xffffffffu, acc[g][e], o) * fb;
            l[g] = l[g] * fa + l2 * fb;
            m[g] = mx;
        }
    }
    float* s_acc = reinterpret_cast<float*>(smem);  // [WARPS][G][HD]
#pragma unroll
    for (int g = 0; g < G; ++g) {
        if (lane == 0) {
            s_m[warp][g] = m[g];
            s_l[warp][g] = l[g];
        }
        if (lane < LK) {
#pragma unroll
            for (int e = 0; e < 8; ++e) s_acc[(warp * G + g) * HD + dim0 + e] = acc[g][e];
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < ng * HD; i += blockDim.x) {
        int g = i / HD, d = i % HD;
        float mx = NEG_INF;
        for (int w = 0; w < WARPS; ++w) mx = fmaxf(mx, s_m[w][g]);
        float a = 0.0f, lsum = 0.0f;
        if (mx != NEG_INF) {
            for (int w = 0; w < WARPS; ++w) {
                float f = s_l[w][g] > 0.0f ? __expf(s_m[w][g] - mx) : 0.0f;
                a += s_acc[(w * G + g) * HD + d] * f;
                lsum += s_l[w][g] * f;
            }
        }
        float* out = part + ((size_t)(h * group + g0 + g) * n_splits + s) * (HD + PART_EXTRA);
        out[d] = a;
        if (d == 0) {
            out[HD] = mx;
            out[HD + 1] = lsum;
        }
    }
}

// Decode, pass 2: out [n_head, HD] = combination of the active splits of part. A thread takes 4 dims of
// every (COMBINE_THREADS * 4 / HD)-th split, so the loads of all splits are in flight together.
// quantize: out also as q8_1 (xq [n_head * HD], xds [n_head * HD / 32]) for the output projection.
// Launch: grid n_head, block COMBINE_THREADS. One block an SM is enough (n_head blocks): without the 1, ptxas
// aims at 4 blocks an SM (32 registers) and spills.
#define COMBINE_THREADS 512
extern "C" __global__ void __launch_bounds__(COMBINE_THREADS, 1)
    attn_decode_combine(const float* __restrict__ part, float* __restrict__ out, const int* __restrict__ pos,
                        int head_dim, int window, int n_splits, int max_ctx, int8_t* __restrict__ xq,
                        float2* __restrict__ xds, int quantize) {
    wait_prior();
    __shared__ float s_f[64], s_wm[2], s_wl[2];  // n_splits <= 64
    __shared__ __align__(16) float s_acc[COMBINE_THREADS * 4];
    Splits sp(min(pos[0], max_ctx - 1), window, n_splits);
    int row = head_dim + PART_EXTRA;
    const float* ph = part + (size_t)blockIdx.x * n_splits * row;
    int tid = threadIdx.x;
    float ms = NEG_INF, ls = 0.0f;
    if (tid < sp.active) {
        ms = ph[tid * row + head_dim];
        ls = ph[tid * row + head_dim + 1];
    }
    if (tid < 64) {  // the splits' weights exp(m_s - max m), and the total of p
        float wm = warp_max_f(ms);
        if ((tid & 31) == 0) s_wm[tid >> 5] = wm;
    }
    __syncthreads();
    float mx = fmaxf(s_wm[0], s_wm[1]);
    if (tid < 64) {
        float f = ls > 0.0f ? __expf(ms - mx) : 0.0f;
        s_f[tid] = f;
        float wl = warp_sum_f(ls * f);
        if ((tid & 31) == 0) s_wl[tid >> 5] = wl;
    }
    __syncthreads();
    int per = head_dim / 4, groups = COMBINE_THREADS / per, g = tid / per, d = (tid % per) * 4;
    float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
    for (int s = g; s < sp.active; s += groups) {
        float f = s_f[s];
        float4 v = *reinterpret_cast<const float4*>(ph + s * row + d);
        a.x += v.x * f;
        a.y += v.y * f;
        a.z += v.z * f;
        a.w += v.w * f;
    }
    *reinterpret_cast<float4*>(s_acc + g * head_dim + d) = a;
    __syncthreads();
    if (tid < head_dim) {  // whole warps: head_dim is a multiple of 32
        float sum = 0.0f;
        for (int i = 0; i < groups; ++i) sum += s_acc[i * head_dim + tid];
        int at = blockIdx.x * head_dim + tid;
        float v = sum / (s_wl[0] + s_wl[1]);
        out[at] = v;
        if (quantize) store_q8_1(v, at, xq, xds);
    }
}

// ---- prefill on the tensor cores ----
// Prefill: q [n_tok, n_head, HD] float32, token t at position pos[0] + t, its k and v (and all earlier ones)
// already in the cache; out [n_tok, n_head, HD].
// Flash-attention-2 with mma.sync m16n8k16 (fp16 in, fp32 accumulate). A warp owns 16 query rows (rows
// r = t * G + g of kv head h = blockIdx.y, G = n_head / n_head_kv), a block PF_ROWS; key tiles of k and v are
// staged in shared memory. Float32 q and p do not fit fp16: each is split into hi + lo fp16 parts
// (x = hi + lo to ~2^-22) and multiplied twice, so the result keeps float32 accuracy on the fp16 cache.
// Fragment layouts (PTX ISA, mma.m16n8k16): lane = 4 * gi + ci; A regs: (row gi, cols 2ci..+1),
// (row gi+8, same), (row gi, cols 2ci+8..+9), (row gi+8, same); B regs: (k 2ci..+1, col gi), (k 2ci+8..+9,
// col gi); C: (row gi, cols 2ci, 2ci+1), (row gi+8, same).
// Launch: grid (ceil(n_tok * G / PF_ROWS), n_head_kv), block 128, PfShape<HD>::BYTES of dynamic shared memory.
#define PF_ROWS 64

// At HD 256 a lane's output accumulator takes 128 registers, so q's fragments (hi and lo) wait in shared
// memory instead of registers, and a key tile is 32 keys, so that q and a tile of k and v fit two blocks an SM.
template <int HD>
struct PfShape {
    static constexpr bool Q_SHARED = HD > 128;
    static constexpr int KEYS = HD > 128 ? 32 : 64;  // keys a tile
    static constexpr int ST = HD + 8;                // padded shared row (halves): conflict-free fragment loads
    static constexpr int BYTES = 2 * (2 * KEYS * ST + (Q_SHARED ? 2 * PF_ROWS * ST : 0));
};

__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_half2(__half lo, __half hi) {
    return (uint32_t)__half_as_ushort(lo) | ((uint32_t)__half_as_ushort(hi) << 16);
}

// (x, y) -> fp16 pairs hi and lo with x = hi.x + lo.x (to ~2^-22 relative), same for y
__device__ __forceinline__ void split_pair(float x, float y, uint32_t& hi, uint32_t& lo) {
    __half hx = __float2half_rn(x), hy = __float2half_rn(y);
    hi = pack_half2(hx, hy);
    lo = pack_half2(__float2half_rn(x - __half2float(hx)), __float2half_rn(y - __half2float(hy)));
}

template <int HD>
__device__ __forceinline__ void prefill_mma(const float* __restrict__ q, const __half* __restrict__ k_cache,
                                            const __half* __restrict__ v_cache, float* __restrict__ out,
                                            const int* __restrict__ pos, int n_tok, int n_head, int n_head_kv,
                                            int max_ctx, int window, float scale) {
    using Shape = PfShape<HD>;
    constexpr int KS = HD / 16;    // k-steps of q.k over the head dims
    constexpr int NT = HD / 8;     // n-tiles of the output
    constexpr int ST = Shape::ST, KEYS = Shape::KEYS, NK = KEYS / 8;
    constexpr bool Q_SHARED = Shape::Q_SHARED;
    extern __shared__ __align__(16) __half pf_smem[];
    __half *s_k = pf_smem, *s_v = s_k + KEYS * ST;
    int p0 = pos[0];
    int h = blockIdx.y, group = n_head / n_head_kv, n_rows = n_tok * group;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gi = lane >> 2, ci = lane & 3;
    int r_block = blockIdx.x * PF_ROWS, r_warp = r_block + warp * 16;
    float scale2 = scale * 1.4426950408889634f;  // scores in base 2

    constexpr int QR = Q_SHARED ? 1 : KS;  // k-steps of q's A fragments held in registers
    uint32_t qh[QR][4], ql[QR][4];           // (hi, lo), or in shared memory: this warp's 16 rows of each
    __half *s_qh = s_v + KEYS * ST + warp * 16 * ST, *s_ql = s_qh + PF_ROWS * ST;
    int qpos[2];                              // positions of rows gi and gi + 8 (-1: no row)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        int r = r_warp + gi + half * 8;
        bool ok = r < n_rows;
        int t = ok ? r / group : 0, hq = h * group + (ok ? r % group : 0);
        qpos[half] = ok ? p0 + t : -1;
        const float* qr = q + ((size_t)t * n_head + hq) * HD;
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) {
#pragma unroll
            for (int part = 0; part < 2; ++part) {
                float2 v = ok ? *reinterpret_cast<const float2*>(qr + kk * 16 + part * 8 + 2 * ci)
                              : make_float2(0.0f, 0.0f);
                uint32_t hi, lo;
                split_pair(v.x, v.y, hi, lo);
                if constexpr (Q_SHARED) {
                    int at = (gi + half * 8) * ST + kk * 16 + part * 8 + 2 * ci;
                    *reinterpret_cast<uint32_t*>(s_qh + at) = hi;
                    *reinterpret_cast<uint32_t*>(s_ql + at) = lo;
                } else {
                    qh[kk][half + 2 * part] = hi;
                    ql[kk][half + 2 * part] = lo;
                }
            }
        }
    }
    float o[NT][4], m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    // keys any row of the block sees, and those this warp's rows see
    int t_first = r_block / group, t_last = min(n_rows - 1, r_block + PF_ROWS - 1) / group;
    int k_lo = window > 0 ? max(0, p0 + t_first - window + 1) : 0;
    int k_end = min(max_ctx, p0 + t_last + 1);  // past the cache is the caller's bug: wrong output, not a fault
    int w_rows = max(0, min(16, n_rows - r_warp));
    int w_last = w_rows ? p0 + (r_warp + w_rows - 1) / group : -1;
    int w_lo = window > 0 ? p0 + r_warp / group - window + 1 : 0;

    const __half* kh = k_cache + (size_t)h * max_ctx * HD;
    const __half* vh = v_cache + (size_t)h * max_ctx * HD;
    for (int kt = k_lo; kt < k_end; kt += KEYS) {
        __syncthreads();  // the previous tile is no longer read (and this warp's q rows are written)
        for (int c = threadIdx.x; c < KEYS * HD / 8; c += 32 * WARPS) {
            int key = c / (HD / 8), d = (c % (HD / 8)) * 8, j = kt + key;
            size_t at = (size_t)min(j, k_end - 1) * HD + d;  // keys past k_end: zeros
            copy16(s_k + key * ST + d, kh + at, j < k_end);
            copy16(s_v + key * ST + d, vh + at, j < k_end);
        }
        copy_commit();
        copy_wait<0>();
        __syncthreads();
        if (kt > w_last || kt + KEYS - 1 < w_lo) continue;  // no row of this warp sees the tile

        float sc[NK][4];  // scores: keys kt + 8n + 2ci (+1), rows gi and gi + 8
#pragma unroll
        for (int n = 0; n < NK; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) {
            uint32_t ah[4], al[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                if constexpr (Q_SHARED) {
                    int at = (gi + (i & 1) * 8) * ST + kk * 16 + (i >> 1) * 8 + 2 * ci;
                    ah[i] = *reinterpret_cast<const uint32_t*>(s_qh + at);
                    al[i] = *reinterpret_cast<const uint32_t*>(s_ql + at);
                } else {
                    ah[i] = qh[Q_SHARED ? 0 : kk][i];
                    al[i] = ql[Q_SHARED ? 0 : kk][i];
                }
            }
#pragma unroll
            for (int n = 0; n < NK; ++n) {
                const __half* kr = s_k + (n * 8 + gi) * ST + kk * 16 + 2 * ci;
                uint32_t b0 = *reinterpret_cast<const uint32_t*>(kr);
                uint32_t b1 = *reinterpret_cast<const uint32_t*>(kr + 8);
                mma16816(sc[n], ah, b0, b1);
                mma16816(sc[n], al, b0, b1);
            }
        }
        float mt[2] = {m[0], m[1]};
#pragma unroll
        for (int n = 0; n < NK; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int j = kt + n * 8 + 2 * ci + (e & 1), qp = qpos[e >> 1];
                bool seen = j < k_end && j <= qp && (window <= 0 || qp - j < window);
                sc[n][e] = seen ? sc[n][e] * scale2 : NEG_INF;
                mt[e >> 1] = fmaxf(mt[e >> 1], sc[n][e]);
            }
        }
        float alpha[2];
#pragma unroll
        for (int half = 0; half < 2; ++half) {  // the 4 lanes of a row hold its scores of the tile
            mt[half] = fmaxf(mt[half], __shfl_xor_sync(0xffffffffu, mt[half], 1));
            mt[half] = fmaxf(mt[half], __shfl_xor_sync(0xffffffffu, mt[half], 2));
            alpha[half] = mt[half] == NEG_INF ? 1.0f : exp2f(m[half] - mt[half]);
            l[half] *= alpha[half];
            m[half] = mt[half];
        }
#pragma unroll
        for (int n = 0; n < NK; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float pe = sc[n][e] == NEG_INF ? 0.0f : exp2f(sc[n][e] - mt[e >> 1]);
                sc[n][e] = pe;
                l[e >> 1] += pe;  // this lane's part of the row sum; the 4 lanes add up at the end
            }
        }
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            o[n][0] *= alpha[0];
            o[n][1] *= alpha[0];
            o[n][2] *= alpha[1];
            o[n][3] *= alpha[1];
        }
        // o += p v: p's C fragments of key n-tiles 2kk, 2kk+1 are the A fragment of k-step kk
#pragma unroll
        for (int kk = 0; kk < KEYS / 16; ++kk) {
            uint32_t ph[4], pl[4];
            split_pair(sc[2 * kk][0], sc[2 * kk][1], ph[0], pl[0]);
            split_pair(sc[2 * kk][2], sc[2 * kk][3], ph[1], pl[1]);
            split_pair(sc[2 * kk + 1][0], sc[2 * kk + 1][1], ph[2], pl[2]);
            split_pair(sc[2 * kk + 1][2], sc[2 * kk + 1][3], ph[3], pl[3]);
            int mat = lane >> 3;  // ldmatrix: lanes 8i..8i+7 address the rows (keys) of matrix i
            const __half* vr = s_v + (kk * 16 + (mat & 1) * 8 + (lane & 7)) * ST + (mat >> 1) * 8;
#pragma unroll
            for (int n = 0; n < NT; n += 2) {
                uint32_t b[4];  // transposed: B fragments of dims 8n.. (b[0], b[1]) and 8n+8.. (b[2], b[3])
                unsigned addr = (unsigned)__cvta_generic_to_shared(vr + n * 8);
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                             : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                             : "r"(addr));
                mma16816(o[n], ph, b[0], b[1]);
                mma16816(o[n], pl, b[0], b[1]);
                mma16816(o[n + 1], ph, b[2], b[3]);
                mma16816(o[n + 1], pl, b[2], b[3]);
            }
        }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        l[half] += __shfl_xor_sync(0xffffffffu, l[half], 1);
        l[half] += __shfl_xor_sync(0xffffffffu, l[half], 2);
        int r = r_warp + gi + half * 8;
        if (r >= n_rows) continue;
        int t = r / group, hq = h * group + r % group;
        float inv = 1.0f / l[half];
        float* orow = out + ((size_t)t * n_head + hq) * HD + 2 * ci;
#pragma unroll
        for (int n = 0; n < NT; ++n)
            *reinterpret_cast<float2*>(orow + n * 8) = make_float2(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
    }
}

// (128, 1): with the plain bound ptxas aims at 3 blocks an SM and spills at HD 256
#define ATTN_DECODE(NAME, HD, G)                                                                        \
    extern "C" __global__ void __launch_bounds__(128, 1)                                                 \
        NAME(const float* q, const __half* k_cache, const __half* v_cache, float* part, const int* pos, \
             int n_head, int n_head_kv, int max_ctx, int window, float scale, int n_splits) {           \
        wait_prior();                                                                                   \
        decode_split<HD, G>(q, k_cache, v_cache, part, pos, n_head, n_head_kv, max_ctx, window, scale, \
                            n_splits);                                                                 \
    }
#define ATTN(HD)                                                                                        \
    ATTN_DECODE(attn_decode_##HD, HD, Rows<HD>::MAXG)                                                   \
    extern "C" __global__ void __launch_bounds__(128, 1)                                                 \
        attn_prefill_##HD(const float* q, const __half* k_cache, const __half* v_cache, float* out,   \
                          const int* pos, int n_tok, int n_head, int n_head_kv, int max_ctx, int window, \
                          float scale) {                                                                \
        wait_prior();                                                                                   \
        prefill_mma<HD>(q, k_cache, v_cache, out, pos, n_tok, n_head, n_head_kv, max_ctx, window, scale); \
    }

ATTN(64)
ATTN(128)
ATTN(256)
ATTN_DECODE(attn_decode_64_g4, 64, 4)  // groups of up to 4 (MAXG is 4 at HD 256 already)
ATTN_DECODE(attn_decode_128_g4, 128, 4)
