// Attention over the fp16 KV cache: decode (a few query tokens, split over the keys, flash-decoding: a decode step's
// one, a verify step's few) and prefill (n query tokens, key tiles in shared memory). Both use online softmax and
// GQA: the q heads h * G .. h * G + G - 1 (G = n_head / n_head_kv) read kv head h.
//
// Caches: k_cache, v_cache [n_head_kv, max_ctx, HD] fp16 (one pair per layer), written by kv_write, position j at
// row j % max_ctx: a cache as long as the context holds position j at row j; a sliding-window layer's may be a ring
// of fewer rows (inference/kv_ring.py), holding the last max_ctx positions written.
// Masks: a query at position p sees keys j <= p, and with window > 0 only those with p - j < window.
// Sinks (gpt-oss; null: none): a learned logit a q head adds to its softmax's denominator and nothing to its
// output, as if one more key scored sinks[h] (not scaled) with a zero value.
// Both run on the tensor cores (mma.sync, fp16 in, float32 accumulate; float32 q and p split into two fp16
// halves, so the result keeps float32 accuracy on the fp16 cache). Decode: a block's 16 mma rows are (token, q head)
// pairs of one kv head, so GQA groups and tokens share each key tile.
// Heads of 512 (gemma4's global layers): a lane's output accumulator of 512 dims would not fit its registers.
// Prefill: a block makes a slice of VD of the output's dims (the kernel's VD < HD: v's dims voff .. voff + VD), each
// slice computing the scores over all HD dims again; a block's slice is its blockIdx.x modulo HD / VD. Decode
// (decode_wide_mma): a block's warps split the dims instead of the keys, each a quarter of q . k and of the output, and
// add their scores up through shared memory, so each key is read once.
#include "ops_common.cuh"
#include "q8_1.cuh"

#define WARPS 4        // a block is 128 threads
#define MIN_SPLIT_KEYS 32  // decode: fewest keys worth a split of their own
#define PART_EXTRA 4       // decode: a split's row holds HD sums, max, sum p and 2 unused (16-byte rows)
#define DECODE_STAGES 3    // decode: key tiles a warp's ring holds (one being read, two in flight)

// Decode splits: the keys any of n_tok tokens at p .. p + n_tok - 1 sees (from the first one's lo to the last
// one's position), and how a fixed grid of n_splits splits them at run time (few keys: one split, so short contexts
// cost one pass; many: up to n_splits to fill the GPU).
struct Splits {
    int lo, n, active, chunk;
    __device__ __forceinline__ Splits(int p, int n_tok, int window, int n_splits) {
        lo = window > 0 ? max(0, p - window + 1) : 0;
        n = p + n_tok - lo;
        active = min(n_splits, (n + MIN_SPLIT_KEYS - 1) / MIN_SPLIT_KEYS);
        chunk = (n + active - 1) / active;
    }
};

// The cache row of key k0 + i, where row0 is k0's (k0 % rows) and i < rows: a ring wraps at most once in a tile.
__device__ __forceinline__ size_t ring_row(int row0, int i, int rows) {
    int r = row0 + i;
    return (size_t)(r >= rows ? r - rows : r);
}

// Copy 16 bytes global -> shared without holding registers (cp.async); ok false: write zeros instead.
__device__ __forceinline__ void copy16(void* dst, const void* src, bool ok) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void copy_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void copy_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// A decode tile: keys k0 .. k0 + 15 of one kv head (kh, vh: its k and v cache, position p at row p % max_ctx) into
// st (16 rows of k, then 16 of v, rows ST halves apart), copied by `threads` threads of which this is thread t;
// keys at or past ke read as zeros.
template <int HD, int ST>
__device__ __forceinline__ void load_kv_tile(__half* st, const __half* kh, const __half* vh, int k0, int ke,
                                             int max_ctx, int t, int threads) {
    int row0 = k0 % max_ctx;
    for (int c = t; c < 16 * HD / 8; c += threads) {
        int key = c / (HD / 8), d = (c % (HD / 8)) * 8, j = k0 + key;
        size_t at = ring_row(row0, min(j, ke - 1) - k0, max_ctx) * HD + d;
        copy16(st + key * ST + d, kh + at, j < ke);
        copy16(st + 16 * ST + key * ST + d, vh + at, j < ke);
    }
}

// Decode, pass 2: out [n_tok, n_head, HD] = combination of the active splits of part, a block a (token, head) row.
// A thread takes 4 dims of every (COMBINE_THREADS * 4 / HD)-th split, so the loads of all splits are in flight
// together. A split in which the row saw no key (a later token's keys only) wrote sum p = 0 and weighs nothing.
// quantize: out also as q8_1 (xq [n_tok * n_head * HD], xds [n_tok * n_head * HD / 32]) for the output projection.
// The sink, if any, joins here: the splits see only keys.
// Launch: grid n_tok * n_head, block COMBINE_THREADS. One block an SM is enough (n_tok * n_head blocks): without
// the 1, ptxas aims at 4 blocks an SM (32 registers) and spills.
#define COMBINE_THREADS 512
extern "C" __global__ void __launch_bounds__(COMBINE_THREADS, 1)
    attn_decode_combine(const float* __restrict__ part, float* __restrict__ out, const int* __restrict__ pos,
                        int n_tok, int n_head, int head_dim, int window, int n_splits, int8_t* __restrict__ xq,
                        float2* __restrict__ xds, int quantize, const float* __restrict__ sinks) {
    wait_prior();
    __shared__ float s_f[64], s_wm[2], s_wl[2];  // n_splits <= 64
    __shared__ __align__(16) float s_acc[COMBINE_THREADS * 4];
    Splits sp(pos[0], n_tok, window, n_splits);
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
    float sink = sinks ? sinks[blockIdx.x % n_head] : NEG_INF;
    float mx = fmaxf(fmaxf(s_wm[0], s_wm[1]), sink);
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
        float v = sum / (s_wl[0] + s_wl[1] + (sinks ? __expf(sink - mx) : 0.0f));
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
// Launch: grid (ceil(n_tok * G / PF_ROWS) * HD / VD, n_head_kv), block 128, PfShape<HD, VD>::BYTES of dynamic
// shared memory.
#define PF_ROWS 64

// At HD 256 a lane's output accumulator takes 128 registers, so q's fragments (hi and lo) wait in shared
// memory instead of registers, and a key tile is 32 keys, so that q and a tile of k and v fit two blocks an SM.
// VD: the output's dims a block makes (a slice of them at HD 512, see the top).
template <int HD, int VD>
struct PfShape {
    static constexpr bool Q_SHARED = HD > 128;
    static constexpr int KEYS = HD > 128 ? 32 : 64;  // keys a tile
    static constexpr int ST = HD + 8;                // padded shared row (halves): conflict-free fragment loads
    static constexpr int SV = VD + 8;                // the same for a tile's v rows (its slice of them)
    static constexpr int BYTES = 2 * (KEYS * ST + KEYS * SV + (Q_SHARED ? 2 * PF_ROWS * ST : 0));
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

// The steps prefill and decode share. Lane = 4 * gi + ci (fragment layouts above); shared rows are ST halves.
// A fragments (hi, lo) of k-step kk of the 16 q rows at s_qh, s_ql (shared, [16][ST] each)
__device__ __forceinline__ void q_fragments(const __half* s_qh, const __half* s_ql, int st, int kk, int gi, int ci,
                                            uint32_t (&ah)[4], uint32_t (&al)[4]) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        int at = (gi + (e & 1) * 8) * st + kk * 16 + (e >> 1) * 8 + 2 * ci;
        ah[e] = *reinterpret_cast<const uint32_t*>(s_qh + at);
        al[e] = *reinterpret_cast<const uint32_t*>(s_ql + at);
    }
}

// sc += q . k over k-step kk for the 8 keys of n-tile n (their rows at s_k), with both halves of q
__device__ __forceinline__ void qk_mma(float (&sc)[4], const __half* s_k, int st, int n, int kk, int gi, int ci,
                                       const uint32_t (&ah)[4], const uint32_t (&al)[4]) {
    const __half* kr = s_k + (n * 8 + gi) * st + kk * 16 + 2 * ci;
    uint32_t b0 = *reinterpret_cast<const uint32_t*>(kr);
    uint32_t b1 = *reinterpret_cast<const uint32_t*>(kr + 8);
    mma16816(sc, ah, b0, b1);
    mma16816(sc, al, b0, b1);
}

// Online softmax over a tile's scores sc (base 2, already masked: NEG_INF where unseen) for rows gi and gi + 8, whose
// 4 lanes each hold part of a row: m and l move to the tile, sc becomes p = 2^(s - m), and o (the rows' output
// accumulators) is rescaled to the new max.
template <int NK, int NT>
__device__ __forceinline__ void softmax_tile(float (&sc)[NK][4], float (&m)[2], float (&l)[2], float (&o)[NT][4]) {
    float mt[2] = {m[0], m[1]}, alpha[2];
#pragma unroll
    for (int n = 0; n < NK; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) mt[e >> 1] = fmaxf(mt[e >> 1], sc[n][e]);
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
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
}

// o += p v over one 16-key k-step: p's C fragments of its two key n-tiles (s0, s1) are its A fragment, split hi +
// lo; v's 16 key rows start at s_v16 (shared), read transposed by ldmatrix.
template <int NT>
__device__ __forceinline__ void pv_mma(float (&o)[NT][4], const float (&s0)[4], const float (&s1)[4],
                                       const __half* s_v16, int st, int lane) {
    uint32_t ph[4], pl[4];
    split_pair(s0[0], s0[1], ph[0], pl[0]);
    split_pair(s0[2], s0[3], ph[1], pl[1]);
    split_pair(s1[0], s1[1], ph[2], pl[2]);
    split_pair(s1[2], s1[3], ph[3], pl[3]);
    int mat = lane >> 3;  // ldmatrix: lanes 8i..8i+7 address the rows (keys) of matrix i
    const __half* vr = s_v16 + ((mat & 1) * 8 + (lane & 7)) * st + (mat >> 1) * 8;
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

template <int HD, int VD>
__device__ __forceinline__ void prefill_mma(const float* __restrict__ q, const __half* __restrict__ k_cache,
                                            const __half* __restrict__ v_cache, float* __restrict__ out,
                                            const int* __restrict__ pos, int n_tok, int n_head, int n_head_kv,
                                            int max_ctx, int window, float scale, const float* __restrict__ sinks) {
    using Shape = PfShape<HD, VD>;
    constexpr int KS = HD / 16;    // k-steps of q.k over the head dims
    constexpr int NT = VD / 8;     // n-tiles of the output (its slice)
    constexpr int ST = Shape::ST, SV = Shape::SV, KEYS = Shape::KEYS, NK = KEYS / 8;
    constexpr bool Q_SHARED = Shape::Q_SHARED;
    extern __shared__ __align__(16) __half pf_smem[];
    __half *s_k = pf_smem, *s_v = s_k + KEYS * ST;
    constexpr int SLICES = HD / VD;  // blockIdx.x: row block * SLICES + the output's slice
    int p0 = pos[0], voff = blockIdx.x % SLICES * VD;
    int h = blockIdx.y, group = n_head / n_head_kv, n_rows = n_tok * group;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gi = lane >> 2, ci = lane & 3;
    int r_block = blockIdx.x / SLICES * PF_ROWS, r_warp = r_block + warp * 16;
    float scale2 = scale * 1.4426950408889634f;  // scores in base 2

    constexpr int QR = Q_SHARED ? 1 : KS;  // k-steps of q's A fragments held in registers
    uint32_t qh[QR][4], ql[QR][4];           // (hi, lo), or in shared memory: this warp's 16 rows of each
    __half *s_qh = s_v + KEYS * SV + warp * 16 * ST, *s_ql = s_qh + PF_ROWS * ST;
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
    int k_end = p0 + t_last + 1;
    int w_rows = max(0, min(16, n_rows - r_warp));
    int w_last = w_rows ? p0 + (r_warp + w_rows - 1) / group : -1;
    int w_lo = window > 0 ? p0 + r_warp / group - window + 1 : 0;

    const __half* kh = k_cache + (size_t)h * max_ctx * HD;
    const __half* vh = v_cache + (size_t)h * max_ctx * HD;
    for (int kt = k_lo; kt < k_end; kt += KEYS) {
        __syncthreads();  // the previous tile is no longer read (and this warp's q rows are written)
        // a key's row by a modulo of its own (j % max_ctx is a row for any j: no clamp to k_end): ring_row's two
        // values live across the loop spilled 24 bytes a thread at HD 256
        for (int c = threadIdx.x; c < KEYS * HD / 8; c += 32 * WARPS) {
            int key = c / (HD / 8), d = (c % (HD / 8)) * 8, j = kt + key;
            copy16(s_k + key * ST + d, kh + (size_t)(j % max_ctx) * HD + d, j < k_end);  // past k_end: zeros
        }
        for (int c = threadIdx.x; c < KEYS * VD / 8; c += 32 * WARPS) {
            int key = c / (VD / 8), d = (c % (VD / 8)) * 8, j = kt + key;
            copy16(s_v + key * SV + d, vh + (size_t)(j % max_ctx) * HD + voff + d, j < k_end);
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
            if constexpr (Q_SHARED) {
                q_fragments(s_qh, s_ql, ST, kk, gi, ci, ah, al);
            } else {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    ah[i] = qh[Q_SHARED ? 0 : kk][i];
                    al[i] = ql[Q_SHARED ? 0 : kk][i];
                }
            }
#pragma unroll
            for (int n = 0; n < NK; ++n) qk_mma(sc[n], s_k, ST, n, kk, gi, ci, ah, al);
        }
#pragma unroll
        for (int n = 0; n < NK; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int j = kt + n * 8 + 2 * ci + (e & 1), qp = qpos[e >> 1];
                bool seen = j < k_end && j <= qp && (window <= 0 || qp - j < window);
                sc[n][e] = seen ? sc[n][e] * scale2 : NEG_INF;
            }
        }
        softmax_tile(sc, m, l, o);
        // o += p v: p's C fragments of key n-tiles 2kk, 2kk+1 are the A fragment of k-step kk
#pragma unroll
        for (int kk = 0; kk < KEYS / 16; ++kk) pv_mma(o, sc[2 * kk], sc[2 * kk + 1], s_v + kk * 16 * SV, SV, lane);
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        l[half] += __shfl_xor_sync(0xffffffffu, l[half], 1);
        l[half] += __shfl_xor_sync(0xffffffffu, l[half], 2);
        int r = r_warp + gi + half * 8;
        if (r >= n_rows) continue;
        int t = r / group, hq = h * group + r % group;
        float sink = sinks ? exp2f(sinks[hq] * 1.4426950408889634f - m[half]) : 0.0f;  // m: base 2, as scale2
        float inv = 1.0f / (l[half] + sink);
        float* orow = out + ((size_t)t * n_head + hq) * HD + voff + 2 * ci;
#pragma unroll
        for (int n = 0; n < NT; ++n)
            *reinterpret_cast<float2*>(orow + n * 8) = make_float2(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
    }
}

// Decode, pass 1. q [n_tok, n_head, HD] float32, token t at position pos[0] + t (its k and v, and all earlier ones,
// already in the cache). Block (kv head h = blockIdx.x, split s = blockIdx.y, row chunk c = blockIdx.z): rows
// 16c .. 16c + 15 of kv head h's n_tok * G, row r = t * G + g being token t's q head h * G + g (padded: one token
// of a group of 6 uses 6 of the mma's 16 rows), keys lo + s*chunk .. (at most chunk), each row masked to the keys
// its token sees (a row may see none of a split's). Writes part [n_tok * n_head, n_splits, HD + PART_EXTRA] =
// (sum p*v, max, sum p, 2 unused), unnormalised, row t * n_head + q head; a split past the active ones writes
// nothing (the combine reads only active ones). Each warp streams its own 16-key tiles
// (tiles w, w + WARPS, ...) through its own cp.async ring, so no barrier waits on a slower warp; q (hi + lo
// fp16, as prefill) sits in shared memory for all four warps; the warps' (o, m, l) merge at the end through
// shared memory. Scores are in base 2 inside; part's max is written in natural units, as the combine reads
// it. (The CUDA-core kernel before this one, one key a warp, spent its time in the warp sums of q.k: it was
// 2.1x slower at HD 256 and 1.3x at 128 over 16384 keys.)
// Launch: grid (n_head_kv, n_splits, ceil(n_tok * group / 16)), block 128, DmShape<HD>::BYTES of dynamic shared
// memory (214 KiB at HD 256: one block an SM).
template <int HD>
struct DmShape {
    static constexpr int ST = HD + 8;         // padded shared row (halves): conflict-free fragment loads
    static constexpr int TILE = 2 * 16 * ST;  // halves of a 16-key tile of k and v
    static constexpr int BYTES = 2 * (2 * 16 * ST + WARPS * DECODE_STAGES * TILE);  // q (hi, lo), then the rings
};

template <int HD>
__device__ __forceinline__ void decode_mma(const float* __restrict__ q, const __half* __restrict__ k_cache,
                                           const __half* __restrict__ v_cache, float* __restrict__ part,
                                           const int* __restrict__ pos, int n_tok, int n_head, int n_head_kv,
                                           int max_ctx, int window, float scale, int n_splits) {
    using Shape = DmShape<HD>;
    constexpr int KS = HD / 16, NT = HD / 8, ST = Shape::ST, TILE = Shape::TILE, STAGES = DECODE_STAGES;
    extern __shared__ __align__(16) __half dm_smem[];
    __shared__ float s_m[WARPS][16], s_l[WARPS][16];
    __half *s_qh = dm_smem, *s_ql = s_qh + 16 * ST;
    int p = pos[0];
    Splits sp(p, n_tok, window, n_splits);
    int s = blockIdx.y;
    if (s >= sp.active) return;
    int h = blockIdx.x, group = n_head / n_head_kv, r0 = blockIdx.z * 16, nr = min(16, n_tok * group - r0);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gi = lane >> 2, ci = lane & 3;
    int kb = sp.lo + s * sp.chunk, ke = min(p + n_tok, kb + sp.chunk);
    int k_lo[2], k_hi[2];  // the keys rows gi and gi + 8 see in this split: k_lo .. k_hi - 1 (none: a padding row)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        int r = gi + half * 8, qp = p + (r0 + r) / group;
        k_lo[half] = window > 0 ? qp - window + 1 : 0;
        k_hi[half] = r < nr ? min(ke, qp + 1) : 0;
    }
    int n_tiles = (ke - kb + 15) / 16, mine = (n_tiles - warp + WARPS - 1) / WARPS;  // tiles of this warp
    float scale2 = scale * 1.4426950408889634f;

    __half* ring = s_ql + 16 * ST + warp * STAGES * TILE;
    const __half* kh = k_cache + (size_t)h * max_ctx * HD;
    const __half* vh = v_cache + (size_t)h * max_ctx * HD;
    auto load_tile = [&](int i) {  // this warp's i-th tile -> stage i % STAGES
        load_kv_tile<HD, ST>(ring + (i % STAGES) * TILE, kh, vh, kb + (warp + i * WARPS) * 16, ke, max_ctx, lane, 32);
    };
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) {
        if (i < mine) load_tile(i);
        copy_commit();
    }
    for (int i = threadIdx.x; i < 16 * HD / 2; i += 32 * WARPS) {  // q's rows as fp16 hi + lo; padding rows 0
        int r = i / (HD / 2), d = (i % (HD / 2)) * 2, t = (r0 + r) / group;
        const float* qr = q + ((size_t)t * n_head + h * group + (r0 + r) % group) * HD;
        float2 v = r < nr ? *reinterpret_cast<const float2*>(qr + d) : make_float2(0.0f, 0.0f);
        uint32_t hi, lo;
        split_pair(v.x, v.y, hi, lo);
        *reinterpret_cast<uint32_t*>(s_qh + r * ST + d) = hi;
        *reinterpret_cast<uint32_t*>(s_ql + r * ST + d) = lo;
    }
    __syncthreads();

    float o[NT][4], m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    for (int i = 0; i < mine; ++i) {
        copy_wait<STAGES - 2>();  // this lane's copies of tile i have landed
        __syncwarp();             // and every lane's; nobody still reads the stage refilled next
        if (i + STAGES - 1 < mine) load_tile(i + STAGES - 1);
        copy_commit();
        const __half* s_k = ring + (i % STAGES) * TILE;
        const __half* s_v = s_k + 16 * ST;
        int k0 = kb + (warp + i * WARPS) * 16;

        float sc[2][4];  // scores: keys k0 + 8n + 2ci (+1), rows gi and gi + 8
#pragma unroll
        for (int n = 0; n < 2; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) {
            uint32_t ah[4], al[4];
            q_fragments(s_qh, s_ql, ST, kk, gi, ci, ah, al);
            qk_mma(sc[0], s_k, ST, 0, kk, gi, ci, ah, al);
            qk_mma(sc[1], s_k, ST, 1, kk, gi, ci, ah, al);
        }
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int j = k0 + n * 8 + 2 * ci + (e & 1);
                sc[n][e] = j >= k_lo[e >> 1] && j < k_hi[e >> 1] ? sc[n][e] * scale2 : NEG_INF;
            }
        }
        softmax_tile(sc, m, l, o);
        pv_mma(o, sc[0], sc[1], s_v, ST, lane);  // the tile's 16 keys are one k-step
    }
    copy_wait<0>();
    __syncthreads();  // every warp is done with its ring: the rings become the merge buffer

    float* s_o = reinterpret_cast<float*>(s_ql + 16 * ST);  // [WARPS][16][HD]
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        l[half] += __shfl_xor_sync(0xffffffffu, l[half], 1);
        l[half] += __shfl_xor_sync(0xffffffffu, l[half], 2);
        int r = gi + half * 8;
        if (ci == 0) {
            s_m[warp][r] = m[half];
            s_l[warp][r] = l[half];
        }
#pragma unroll
        for (int n = 0; n < NT; ++n)
            *reinterpret_cast<float2*>(s_o + (warp * 16 + r) * HD + n * 8 + 2 * ci) =
                make_float2(o[n][2 * half], o[n][2 * half + 1]);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nr * HD; i += blockDim.x) {  // a row no warp saw a key of: zeros, max -inf, sum 0
        int g = i / HD, d = i % HD, r = r0 + g;
        float mx = NEG_INF;
        for (int w = 0; w < WARPS; ++w) mx = fmaxf(mx, s_l[w][g] > 0.0f ? s_m[w][g] : NEG_INF);
        float a = 0.0f, lsum = 0.0f;
        for (int w = 0; w < WARPS; ++w) {
            float f = s_l[w][g] > 0.0f ? exp2f(s_m[w][g] - mx) : 0.0f;
            a += s_o[(w * 16 + g) * HD + d] * f;
            lsum += s_l[w][g] * f;
        }
        size_t row = (size_t)(r / group) * n_head + h * group + r % group;
        float* out = part + (row * n_splits + s) * (HD + PART_EXTRA);
        out[d] = a;
        if (d == 0) {
            out[HD] = mx * 0.6931471805599453f;  // base 2 -> natural units, as the combine reads it
            out[HD + 1] = lsum;
        }
    }
}

// Decode at HD 512, pass 1: decode_mma's blocks, rows, splits and part, but a block's warps split the head's dims, not
// the keys. The block streams 16-key tiles of k and v through one cp.async ring; warp w takes dims 128w .. 128w + 127:
// its part of q . k over them (q's fragments in its registers), then the 4 warps' partial scores add up in shared
// memory (in one order, so every warp gets the same scores, max and sum), and it makes those dims of p v. Each key
// is read once (slices of the output, each scoring every key, read k 4 times: 1.9 ms more a token over 16384 keys).
// Launch: grid (n_head_kv, n_splits, ceil(n_tok * group / 16)), block 128, WideShape<HD>::BYTES of dynamic shared
// memory (~98 KiB at HD 512: two blocks an SM).
#define WIDE_STAGES 3  // decode_wide_mma: key tiles the block's ring holds
template <int HD>
struct WideShape {
    static constexpr int ST = HD + 8;         // padded shared row (halves)
    static constexpr int TILE = 2 * 16 * ST;  // halves of a 16-key tile of k and v
    static constexpr int BYTES = 2 * WIDE_STAGES * TILE;
};

template <int HD>
__device__ __forceinline__ void decode_wide_mma(const float* __restrict__ q, const __half* __restrict__ k_cache,
                                                const __half* __restrict__ v_cache, float* __restrict__ part,
                                                const int* __restrict__ pos, int n_tok, int n_head, int n_head_kv,
                                                int max_ctx, int window, float scale, int n_splits) {
    constexpr int DW = HD / WARPS, KW = DW / 16, NT = DW / 8, ST = WideShape<HD>::ST, TILE = WideShape<HD>::TILE;
    constexpr int STAGES = WIDE_STAGES;
    extern __shared__ __align__(16) __half dm_smem[];
    __shared__ float s_sc[WARPS][8][32];  // each warp's partial scores, in its lanes' fragment order
    int p = pos[0];
    Splits sp(p, n_tok, window, n_splits);
    int s = blockIdx.y;
    if (s >= sp.active) return;
    int h = blockIdx.x, group = n_head / n_head_kv, r0 = blockIdx.z * 16, nr = min(16, n_tok * group - r0);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gi = lane >> 2, ci = lane & 3, d0 = warp * DW;
    int kb = sp.lo + s * sp.chunk, ke = min(p + n_tok, kb + sp.chunk);
    int k_lo[2], k_hi[2];  // the keys rows gi and gi + 8 see in this split: k_lo .. k_hi - 1 (none: a padding row)
    size_t qrow[2];        // their rows of q and of part: t * n_head + q head
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        int r = r0 + gi + half * 8, qp = p + r / group;
        k_lo[half] = window > 0 ? qp - window + 1 : 0;
        k_hi[half] = r - r0 < nr ? min(ke, qp + 1) : 0;
        qrow[half] = (size_t)(r / group) * n_head + h * group + r % group;
    }
    int n_tiles = (ke - kb + 15) / 16;
    float scale2 = scale * 1.4426950408889634f;

    const __half* kh = k_cache + (size_t)h * max_ctx * HD;
    const __half* vh = v_cache + (size_t)h * max_ctx * HD;
    auto load_tile = [&](int i) {  // the block's i-th tile -> stage i % STAGES
        load_kv_tile<HD, ST>(dm_smem + (i % STAGES) * TILE, kh, vh, kb + i * 16, ke, max_ctx, threadIdx.x, 32 * WARPS);
    };
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) {
        if (i < n_tiles) load_tile(i);
        copy_commit();
    }
    uint32_t ah[KW][4], al[KW][4];  // q's A fragments (hi, lo) over this warp's dims; padding rows 0
#pragma unroll
    for (int kk = 0; kk < KW; ++kk) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            int d = d0 + kk * 16 + (e >> 1) * 8 + 2 * ci;
            float2 v = gi + (e & 1) * 8 < nr ? *reinterpret_cast<const float2*>(q + qrow[e & 1] * HD + d)
                                             : make_float2(0.0f, 0.0f);
            split_pair(v.x, v.y, ah[kk][e], al[kk][e]);
        }
    }

    float o[NT][4], m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    for (int i = 0; i < n_tiles; ++i) {
        copy_wait<STAGES - 2>();  // this thread's copies of tile i have landed
        __syncthreads();          // and every thread's; every warp is done with tile i - 1 and with s_sc
        if (i + STAGES - 1 < n_tiles) load_tile(i + STAGES - 1);
        copy_commit();
        const __half* s_k = dm_smem + (i % STAGES) * TILE;
        const __half* s_v = s_k + 16 * ST;
        int k0 = kb + i * 16;

        float sc[2][4];  // scores: keys k0 + 8n + 2ci (+1), rows gi and gi + 8
#pragma unroll
        for (int n = 0; n < 2; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KW; ++kk) {
            qk_mma(sc[0], s_k + d0, ST, 0, kk, gi, ci, ah[kk], al[kk]);
            qk_mma(sc[1], s_k + d0, ST, 1, kk, gi, ci, ah[kk], al[kk]);
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) s_sc[warp][e][lane] = sc[e >> 2][e & 3];
        __syncthreads();
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            float t = s_sc[0][e][lane] + s_sc[1][e][lane] + s_sc[2][e][lane] + s_sc[3][e][lane];
            int j = k0 + (e >> 2) * 8 + 2 * ci + (e & 1), half = (e >> 1) & 1;
            sc[e >> 2][e & 3] = j >= k_lo[half] && j < k_hi[half] ? t * scale2 : NEG_INF;
        }
        softmax_tile(sc, m, l, o);
        pv_mma(o, sc[0], sc[1], s_v + d0, ST, lane);  // the tile's 16 keys are one k-step
    }
    copy_wait<0>();

#pragma unroll
    for (int half = 0; half < 2; ++half) {
        l[half] += __shfl_xor_sync(0xffffffffu, l[half], 1);
        l[half] += __shfl_xor_sync(0xffffffffu, l[half], 2);
        if (gi + half * 8 >= nr) continue;
        float* out = part + (qrow[half] * n_splits + s) * (HD + PART_EXTRA);
#pragma unroll
        for (int n = 0; n < NT; ++n)
            *reinterpret_cast<float2*>(out + d0 + n * 8 + 2 * ci) = make_float2(o[n][2 * half], o[n][2 * half + 1]);
        if (warp == 0 && ci == 0) {  // every warp has the same max and sum
            out[HD] = m[half] * 0.6931471805599453f;  // base 2 -> natural units, as the combine reads it
            out[HD + 1] = l[half];
        }
    }
}

// (128, 1): with the plain bound ptxas aims at more blocks an SM and spills at HD 256
// DECODE: decode_mma or decode_wide_mma; PREFILL_VD: the output's dims a prefill block makes (ops.py mirrors them)
#define ATTN(HD, DECODE, PREFILL_VD)                                                                   \
    extern "C" __global__ void __launch_bounds__(128, 1)                                                 \
        attn_decode_##HD(const float* q, const __half* k_cache, const __half* v_cache, float* part,     \
                         const int* pos, int n_tok, int n_head, int n_head_kv, int max_ctx, int window, \
                         float scale, int n_splits) {                                                   \
        wait_prior();                                                                                   \
        DECODE<HD>(q, k_cache, v_cache, part, pos, n_tok, n_head, n_head_kv, max_ctx, window, scale,   \
                   n_splits);                                                                           \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(128, 1)                                                 \
        attn_prefill_##HD(const float* q, const __half* k_cache, const __half* v_cache, float* out,   \
                          const int* pos, int n_tok, int n_head, int n_head_kv, int max_ctx, int window, \
                          float scale, const float* sinks) {                                            \
        wait_prior();                                                                                   \
        prefill_mma<HD, PREFILL_VD>(q, k_cache, v_cache, out, pos, n_tok, n_head, n_head_kv, max_ctx,  \
                                    window, scale, sinks);                                              \
    }

ATTN(64, decode_mma, 64)
ATTN(128, decode_mma, 128)
ATTN(256, decode_mma, 256)
// 512: a prefill block makes 128 of the output's dims (256 spilled); decode splits the dims over warps
ATTN(512, decode_wide_mma, 128)
