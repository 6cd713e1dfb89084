// The Gated DeltaNet mixer of qwen35 / qwen35moe: the causal depthwise conv + SiLU, and the gated delta rule
// fused with the gated norm that follows it, token by token (the decode step, and a prompt baseline) and in
// chunks of 64 tokens on the tensor cores (prompts). Layouts as tests/kernels/deltanet_reference.py:
//   conv state [K - 1, C], delta state [Hv, S(j), S(i)] (M[j][i] = S[i][j]), y [n, C] = q heads, k heads,
//   v heads (C = 2 * Hk * S + Hv * S), z and out [n, Hv * S]. Value head h reads key head h % Hk.
// The blocks of one value head form a cluster (sm_90) and add up the gated norm's sum of squares over the
// head through distributed shared memory, so the norm needs no kernel of its own.
#include "ops_common.cuh"

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }  // as ggml

// ---- causal conv + SiLU ----
// y[t][c] = silu(sum_k w[c][k] * x[t - 3 + k][c]) with x[-3..-1] the conv state; the state becomes the last
// 3 inputs. A thread takes one channel for CONV_TOKENS tokens, keeping the window in registers. The blocks of
// the first tokens alone read the old state, so they alone write the new one (after reading it).
// snaps (null: none): the state after each token, [n, K - 1, C] (a verify step's rewind rows).
// Launch: grid (ceil(C / 256), ceil(n / CONV_TOKENS)), block 256.
#define CONV_K 4
#define CONV_TOKENS 32
extern "C" __global__ void __launch_bounds__(256)
    conv_silu(const float* __restrict__ x, float* __restrict__ state, const float* __restrict__ w,
              float* __restrict__ out, int n, int C, float* __restrict__ snaps) {
    wait_prior();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int t0 = blockIdx.y * CONV_TOKENS, t1 = min(t0 + CONV_TOKENS, n);
    const float w0 = w[c * CONV_K], w1 = w[c * CONV_K + 1], w2 = w[c * CONV_K + 2], w3 = w[c * CONV_K + 3];
    float old[CONV_K - 1], p0, p1, p2;  // p: x[t - 3], x[t - 2], x[t - 1]
    if (t0 == 0) {
        for (int r = 0; r < CONV_K - 1; ++r) old[r] = state[(size_t)r * C + c];
        p0 = old[0], p1 = old[1], p2 = old[2];
    } else {
        p0 = x[(size_t)(t0 - 3) * C + c], p1 = x[(size_t)(t0 - 2) * C + c], p2 = x[(size_t)(t0 - 1) * C + c];
    }
    for (int t = t0; t < t1; ++t) {
        const float xt = x[(size_t)t * C + c];
        out[(size_t)t * C + c] = silu(w0 * p0 + w1 * p1 + w2 * p2 + w3 * xt);
        p0 = p1, p1 = p2, p2 = xt;
        if (snaps) {
            float* snap = snaps + (size_t)t * (CONV_K - 1) * C + c;
            snap[0] = p0, snap[C] = p1, snap[2 * C] = p2;
        }
    }
    if (t0 == 0) {
        for (int r = 0; r < CONV_K - 1; ++r) {  // row r of the new state is row n + r of [old state; x]
            const int m = n + r;
            // old[m] by selects: an index known only at run time would put old in local memory
            state[(size_t)r * C + c] = m == 1 ? old[1] : m == 2 ? old[2] : x[(size_t)(m - (CONV_K - 1)) * C + c];
        }
    }
}

// ---- cluster helpers (sm_90) ----
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

// Every thread of every block of the cluster arrives (release) and waits (acquire): a __syncthreads for the
// whole cluster, after which the shared memory the others wrote before it is readable.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive;\n\tbarrier.cluster.wait;" ::: "memory");
}

// The float at p (in this block's shared memory) as block `rank` of the cluster holds it.
__device__ __forceinline__ float cluster_load(const float* p, unsigned rank) {
    unsigned local = (unsigned)__cvta_generic_to_shared(p), remote;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
    return v;
}

// E consecutive floats (E = 2 or 4, aligned to E floats)
template <int E>
__device__ __forceinline__ void load_vec(const float* p, float (&v)[E]) {
    if constexpr (E == 4) {
        float4 a = *(const float4*)p;
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    } else {
        float2 a = *(const float2*)p;
        v[0] = a.x, v[1] = a.y;
    }
}

template <int E>
__device__ __forceinline__ void store_vec(float* p, const float (&v)[E]) {
    if constexpr (E == 4) *(float4*)p = make_float4(v[0], v[1], v[2], v[3]);
    else *(float2*)p = make_float2(v[0], v[1]);
}

// ---- the delta rule token by token (decode; the prompt baseline) ----
// A cluster of REC_CLUSTER blocks a value head h; a warp owns REC_ROWS rows j of M[h] (columns of S), lane l
// elements l * E .. l * E + E - 1 of each, in registers for all n tokens (read once, written once). Per token:
// q, k L2-normed, M *= exp(g), d = b * (v - M k), M += d k^T, o = M q / sqrt(S), then the gated norm: the
// cluster's warps add up o^2 over the head (partial sums double-buffered by token parity, so one cluster
// barrier a token suffices: a slot is rewritten two tokens later, after every block passed the barrier between).
// snaps (null: none): the state after each token, [n, Hv, S, S] (a verify step's rewind rows).
// Launch: grid Hv * REC_CLUSTER, block 32 * WARPS, cluster (REC_CLUSTER, 1, 1).
#define REC_CLUSTER 4
#define REC_ROWS 4
// One token's inputs to a warp of gdn_recurrent: its lane's part of q and k, and (lanes < REC_ROWS) v and z of
// row j0 + lane.
template <int E>
struct TokenIn {
    float q[E], k[E], v, z, alpha, beta;

    __device__ __forceinline__ void load(const float* __restrict__ y, const float* __restrict__ alpha_,
                                         const float* __restrict__ beta_, const float* __restrict__ z_, int t,
                                         int lane, int kh, int h, int j0, int Hk, int Hv, int S, int C) {
        const float* yt = y + (size_t)t * C;
        load_vec<E>(yt + kh * S + lane * E, q);
        load_vec<E>(yt + (Hk + kh) * S + lane * E, k);
        v = lane < REC_ROWS ? yt[(2 * Hk + h) * S + j0 + lane] : 0.0f;
        z = lane < REC_ROWS ? z_[((size_t)t * Hv + h) * S + j0 + lane] : 0.0f;
        alpha = alpha_[(size_t)t * Hv + h];
        beta = beta_[(size_t)t * Hv + h];
    }
};

template <int S>
__device__ __forceinline__ void gdn_recurrent(const float* __restrict__ y, const float* __restrict__ alpha,
                                              const float* __restrict__ beta, const float* __restrict__ dt_bias,
                                              const float* __restrict__ a, const float* __restrict__ z,
                                              const float* __restrict__ norm_w, float* __restrict__ state,
                                              float* __restrict__ out, int n, int Hk, int Hv, float eps,
                                              float* __restrict__ snaps) {
    constexpr int E = S / 32, WARPS = S / (REC_CLUSTER * REC_ROWS);
    static_assert(REC_CLUSTER * WARPS <= 32, "a warp adds up the cluster's partial sums");
    __shared__ float part[2][WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = blockIdx.x / REC_CLUSTER, kh = h % Hk, C = (2 * Hk + Hv) * S;
    const int j0 = (cluster_rank() * WARPS + warp) * REC_ROWS;  // this warp's first row
    float* M = state + ((size_t)h * S + j0) * S + lane * E;
    float s[REC_ROWS][E];
#pragma unroll
    for (int r = 0; r < REC_ROWS; ++r) load_vec<E>(M + r * S, s[r]);
    const float dtb = dt_bias[h], ah = a[h], wj = lane < REC_ROWS ? norm_w[j0 + lane] : 0.0f;
    TokenIn<E> next;
    next.load(y, alpha, beta, z, 0, lane, kh, h, j0, Hk, Hv, S, C);
    for (int t = 0; t < n; ++t) {
        TokenIn<E> in = next;  // token t + 1's inputs load while token t is computed
        next.load(y, alpha, beta, z, min(t + 1, n - 1), lane, kh, h, j0, Hk, Hv, S, C);
        float(&q)[E] = in.q;
        float(&k)[E] = in.k;
        float qq = 0.0f, kk = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) qq += q[e] * q[e], kk += k[e] * k[e];
        const float rq = rsqrtf(warp_sum_f(qq) + eps) * rsqrtf((float)S), rk = rsqrtf(warp_sum_f(kk) + eps);
#pragma unroll
        for (int e = 0; e < E; ++e) q[e] *= rq, k[e] *= rk;  // q carries the output's 1 / sqrt(S)
        const float decay = expf(softplus(in.alpha + dtb) * ah), b = 1.0f / (1.0f + expf(-in.beta));
        float o[REC_ROWS], ss = 0.0f;
#pragma unroll
        for (int r = 0; r < REC_ROWS; ++r) {
            float mk = 0.0f;
#pragma unroll
            for (int e = 0; e < E; ++e) mk += s[r][e] * k[e];
            const float d = b * (__shfl_sync(0xffffffffu, in.v, r) - decay * warp_sum_f(mk));
            float mq = 0.0f;
#pragma unroll
            for (int e = 0; e < E; ++e) {
                s[r][e] = decay * s[r][e] + d * k[e];
                mq += s[r][e] * q[e];
            }
            o[r] = warp_sum_f(mq);
            ss += o[r] * o[r];
        }
        if (lane == 0) part[t & 1][warp] = ss;
        cluster_sync();
        const float p = lane < REC_CLUSTER * WARPS ? cluster_load(&part[t & 1][lane % WARPS], lane / WARPS) : 0.0f;
        const float inv = rsqrtf(warp_sum_f(p) / (float)S + eps);
        float mine = o[0];
#pragma unroll
        for (int r = 1; r < REC_ROWS; ++r) mine = lane == r ? o[r] : mine;
        if (lane < REC_ROWS) out[((size_t)t * Hv + h) * S + j0 + lane] = mine * inv * wj * silu(in.z);
        if (snaps) {
#pragma unroll
            for (int r = 0; r < REC_ROWS; ++r) store_vec<E>(snaps + (size_t)t * Hv * S * S + (M - state) + r * S, s[r]);
        }
    }
    cluster_sync();  // no block leaves while another may still read its partial sums
#pragma unroll
    for (int r = 0; r < REC_ROWS; ++r) store_vec<E>(M + r * S, s[r]);
}

// ---- the delta rule in chunks of CH tokens (prompts) ----
// Per chunk, with the state S0 (S[i][j]) it starts from, G the inclusive cumsum of g over the chunk, b = beta
// and rows of Q, K, V the chunk's normed q, k and v (the WY / UT form, as llama.cpp's build_delta_net_chunking):
//   A[s][p] = b_s exp(G_s - G_p) k_s.k_p (p < s)    T = (I + A)^-1 (unit lower triangular, f32 on CUDA cores)
//   D = T diag(b) V - T diag(b exp(G)) K S0         the delta rule's d of each token, all at once
//   O = (diag(exp(G)) Q S0 + P D) / sqrt(S)         P[r][s] = exp(G_r - G_s) q_r.k_s (s <= r)
//   S1 = exp(G_last) S0 + (diag(exp(G_last - G)) K)^T D
// Every exponent is <= 0 (g < 0), so nothing overflows however strong the decay. The value columns of S are
// independent given K, b and g: a block takes CJ of them (S0 [S x CJ] in shared memory for the whole prompt),
// a cluster of S / CJ blocks a head, each recomputing T (CJ 64: a head's clusters of 2 all fit the GPU at once
// at Hv 48, where clusters of 4 of CJ 32 ran in two waves and no faster). The products run on the tensor cores in tf32 with
// each float32 split in two tf32 parts (3 products, float32 accuracy: see mma_tile).
#define CH 64
#define CJ 64
#define CHUNK_THREADS 256
#define INV_ROWS 4

__device__ __forceinline__ uint32_t tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ void mma_1688(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// x = hi + lo with hi, lo tf32 (x to ~2^-22 relative)
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
    hi = tf32(x);
    lo = tf32(x - __uint_as_float(hi));
}

// C [M x N] (row stride LDC) = c_scale * C + A [M x K] B [K x N] in shared memory. A(r, c) = A[r * ARS + c * ACS],
// B(r, c) = B[r * BRS + c * BCS]: a transposed operand is a swap of strides, all compile-time so that every
// fragment load is one instruction with a constant offset. A warp takes strips of 16 rows x 8 * NT columns in
// turn (the same strips for the same M, N, NT), loading and splitting its A fragments once for the NT tiles.
// c_scale 0: C is not read.
// mma.m16n8k8 tf32 fragments (PTX ISA), lane = 4 * g + t: A (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4);
// B (t, g), (t + 4, g); C (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1). Each operand is split into
// hi + lo tf32 parts and lo * hi + hi * lo + hi * hi accumulated (lo * lo is below float32's rounding).
template <int M, int N, int K, int NT, int ARS, int ACS, int BRS, int BCS, int LDC>
__device__ __forceinline__ void mma_tile(const float* A, const float* B, float* C, float c_scale) {
    static_assert(M % 16 == 0 && N % (8 * NT) == 0 && K % 8 == 0, "whole tiles");
    constexpr int STRIPS_N = N / (8 * NT);
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    for (int strip = threadIdx.x >> 5; strip < (M / 16) * STRIPS_N; strip += CHUNK_THREADS / 32) {
        const int m0 = strip / STRIPS_N * 16, n0 = strip % STRIPS_N * 8 * NT;
        float acc[NT][4];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            float* c = C + (m0 + g) * LDC + n0 + j * 8 + 2 * t;
            const bool read = c_scale != 0.0f;
            acc[j][0] = read ? c_scale * c[0] : 0.0f, acc[j][1] = read ? c_scale * c[1] : 0.0f;
            acc[j][2] = read ? c_scale * c[8 * LDC] : 0.0f, acc[j][3] = read ? c_scale * c[8 * LDC + 1] : 0.0f;
        }
        const float* a = A + (m0 + g) * ARS + t * ACS;
        const float* b = B + t * BRS + (n0 + g) * BCS;
#pragma unroll
        for (int k0 = 0; k0 < K; k0 += 8) {
            uint32_t ah[4], al[4];
            split_tf32(a[k0 * ACS], ah[0], al[0]);
            split_tf32(a[8 * ARS + k0 * ACS], ah[1], al[1]);
            split_tf32(a[(k0 + 4) * ACS], ah[2], al[2]);
            split_tf32(a[8 * ARS + (k0 + 4) * ACS], ah[3], al[3]);
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                uint32_t bh[2], bl[2];
                split_tf32(b[k0 * BRS + j * 8 * BCS], bh[0], bl[0]);
                split_tf32(b[(k0 + 4) * BRS + j * 8 * BCS], bh[1], bl[1]);
                mma_1688(acc[j], al[0], al[1], al[2], al[3], bh[0], bh[1]);
                mma_1688(acc[j], ah[0], ah[1], ah[2], ah[3], bl[0], bl[1]);
                mma_1688(acc[j], ah[0], ah[1], ah[2], ah[3], bh[0], bh[1]);
            }
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            float* c = C + (m0 + g) * LDC + n0 + j * 8 + 2 * t;
            c[0] = acc[j][0], c[1] = acc[j][1], c[8 * LDC] = acc[j][2], c[8 * LDC + 1] = acc[j][3];
        }
    }
}

// Shared memory of gdn_chunked<S>, in floats: rows padded so that the fragment loads above mostly hit
// distinct banks (a row stride of 4 mod 32 for row-major A operands, 8 mod 32 for row-major B operands).
template <int S>
struct ChunkSmem {
    static constexpr int LDK = S + 4, LDC = CH + 4, LDV = CJ + 8;
    static constexpr int Q = 0, K = Q + CH * LDK, W = K + CH * LDK, M = W + CH * LDK, KK = M + CJ * LDK,
                         P = KK + CH * LDC, T = P + CH * LDC, V = T + CH * LDC, D = V + CH * LDV,
                         G = D + CH * LDV, B = G + CH, EG = B + CH, EL = EG + CH, PART = EL + CH,
                         FLOATS = PART + 2 * CH;
    static_assert(FLOATS * 4 <= 227 * 1024, "a multiprocessor's shared memory");
};

// Launch: grid Hv * (S / CJ), block CHUNK_THREADS, cluster (S / CJ, 1, 1), ChunkSmem<S>::FLOATS * 4 bytes of
// dynamic shared memory.
template <int S>
__device__ __forceinline__ void gdn_chunked(const float* __restrict__ y, const float* __restrict__ alpha,
                                            const float* __restrict__ beta, const float* __restrict__ dt_bias,
                                            const float* __restrict__ a, const float* __restrict__ z,
                                            const float* __restrict__ norm_w, float* __restrict__ state,
                                            float* __restrict__ out, int n, int Hk, int Hv, float eps) {
    using L = ChunkSmem<S>;
    constexpr int E = S / 32, LDK = L::LDK, LDC = L::LDC, LDV = L::LDV, CLUSTER = S / CJ;
    constexpr int WARPS = CHUNK_THREADS / 32, ROWS = CH / WARPS;
    extern __shared__ float sm[];
    float *Qs = sm + L::Q, *Ks = sm + L::K, *Ws = sm + L::W, *Ms = sm + L::M, *KK = sm + L::KK, *P = sm + L::P,
          *T = sm + L::T, *Vs = sm + L::V, *Ds = sm + L::D, *G = sm + L::G, *Bs = sm + L::B, *EG = sm + L::EG,
          *EL = sm + L::EL, *part = sm + L::PART;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int h = blockIdx.x / CLUSTER, kh = h % Hk, C = (2 * Hk + Hv) * S;
    const int j0 = cluster_rank() * CJ;  // this block's value columns j0 .. j0 + CJ - 1
    const float dtb = dt_bias[h], ah = a[h], inv_sqrt_s = rsqrtf((float)S);
    float* Mg = state + ((size_t)h * S + j0) * S;
    for (int idx = tid; idx < CJ * S; idx += CHUNK_THREADS) Ms[idx / S * LDK + idx % S] = Mg[idx];

    for (int t0 = 0, chunk = 0; t0 < n; t0 += CH, ++chunk) {
        const int nt = min(CH, n - t0);  // tokens past the end: q = k = v = 0, b = 0, g = 0 (no effect)
        // 1. the chunk's normed q and k rows (a warp ROWS of them, every load in flight at once; rows past the end
        //    read the last token and are zeroed), v columns, b, G, EG = exp(G), EL = exp(G_last - G) (warp 0: two
        //    tokens a lane, a warp scan)
        {
            float q[ROWS][E], k[ROWS][E], v[CH * CJ / CHUNK_THREADS];
#pragma unroll
            for (int m = 0; m < ROWS; ++m) {
                const float* yr = y + (size_t)(t0 + min(warp + m * WARPS, nt - 1)) * C + lane * E;
                load_vec<E>(yr + kh * S, q[m]);
                load_vec<E>(yr + (Hk + kh) * S, k[m]);
            }
#pragma unroll
            for (int u = 0; u < CH * CJ / CHUNK_THREADS; ++u) {
                const int idx = tid + u * CHUNK_THREADS, r = idx / CJ;
                v[u] = y[(size_t)(t0 + min(r, nt - 1)) * C + (2 * Hk + h) * S + j0 + idx % CJ];
            }
#pragma unroll
            for (int m = 0; m < ROWS; ++m) {
                const int r = warp + m * WARPS;
                float qq = 0.0f, kk = 0.0f;
#pragma unroll
                for (int e = 0; e < E; ++e) qq += q[m][e] * q[m][e], kk += k[m][e] * k[m][e];
                qq = warp_sum_f(qq), kk = warp_sum_f(kk);
                const float rq = r < nt ? rsqrtf(qq + eps) : 0.0f, rk = r < nt ? rsqrtf(kk + eps) : 0.0f;
#pragma unroll
                for (int e = 0; e < E; ++e) {
                    Qs[r * LDK + lane * E + e] = q[m][e] * rq;
                    Ks[r * LDK + lane * E + e] = k[m][e] * rk;
                }
            }
#pragma unroll
            for (int u = 0; u < CH * CJ / CHUNK_THREADS; ++u) {
                const int idx = tid + u * CHUNK_THREADS, r = idx / CJ;
                Vs[r * LDV + idx % CJ] = r < nt ? v[u] : 0.0f;
            }
        }
        if (warp == 0) {
            float g2[2], sum = 0.0f;
            for (int u = 0; u < 2; ++u) {
                const int r = 2 * lane + u;
                g2[u] = r < nt ? softplus(alpha[(size_t)(t0 + r) * Hv + h] + dtb) * ah : 0.0f;
                Bs[r] = r < nt ? 1.0f / (1.0f + expf(-beta[(size_t)(t0 + r) * Hv + h])) : 0.0f;
                sum += g2[u];
            }
            float incl = sum;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const float up = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += up;
            }
            const float last = __shfl_sync(0xffffffffu, incl, 31);
            G[2 * lane] = incl - sum + g2[0];
            G[2 * lane + 1] = incl;
            EG[2 * lane] = expf(incl - sum + g2[0]), EG[2 * lane + 1] = expf(incl);
            EL[2 * lane] = expf(last - incl + sum - g2[0]), EL[2 * lane + 1] = expf(last - incl);
        }
        __syncthreads();
        // 2. K K^T and Q K^T
        mma_tile<CH, CH, S, 4, LDK, 1, 1, LDK, LDC>(Ks, Ks, KK, 0.0f);
        mma_tile<CH, CH, S, 4, LDK, 1, 1, LDK, LDC>(Qs, Ks, P, 0.0f);
        __syncthreads();
        // 3. A (in KK) and P with their decays; Q rows times exp(G) / sqrt(S)
        for (int idx = tid; idx < CH * CH; idx += CHUNK_THREADS) {
            const int r = idx / CH, p = idx % CH;
            KK[r * LDC + p] = p < r ? Bs[r] * expf(G[r] - G[p]) * KK[r * LDC + p] : 0.0f;
            P[r * LDC + p] = p <= r ? expf(G[r] - G[p]) * inv_sqrt_s * P[r * LDC + p] : 0.0f;
        }
        for (int idx = tid; idx < CH * S; idx += CHUNK_THREADS) {
            const int r = idx / S;
            Qs[r * LDK + idx % S] *= EG[r] * inv_sqrt_s;
        }
        __syncthreads();
        // 4. T = (I + A)^-1 by forward substitution, column c by 4 lanes of one warp (no block barrier a row),
        //    INV_ROWS rows a step (the later rows' sums take the step's new values last):
        //    T[r][c] = -A[r][c] - sum_{c < p < r} A[r][p] T[p][c]
        {
            const int c = tid >> 2, part4 = tid & 3;
            for (int s = 0; s < CH; s += INV_ROWS) {
                float acc[INV_ROWS] = {};
                for (int p = c + 1 + part4; p < s; p += 4) {
                    const float tp = T[p * LDC + c];
#pragma unroll
                    for (int u = 0; u < INV_ROWS; ++u) acc[u] += KK[(s + u) * LDC + p] * tp;
                }
                float tv[INV_ROWS];
#pragma unroll
                for (int u = 0; u < INV_ROWS; ++u) {
                    const int r = s + u;
                    acc[u] += __shfl_xor_sync(0xffffffffu, acc[u], 1);
                    acc[u] += __shfl_xor_sync(0xffffffffu, acc[u], 2);
                    float x = -KK[r * LDC + c] - acc[u];
#pragma unroll
                    for (int v = 0; v < u; ++v) x -= s + v > c ? KK[r * LDC + s + v] * tv[v] : 0.0f;
                    tv[u] = r < c ? 0.0f : r == c ? 1.0f : x;
                }
                if (part4 == 0) {
#pragma unroll
                    for (int u = 0; u < INV_ROWS; ++u) T[(s + u) * LDC + c] = tv[u];
                }
                __syncwarp();
            }
        }
        __syncthreads();
        //    -T diag(b exp(G)) into KK (A is done with), T diag(b) in place
        for (int idx = tid; idx < CH * CH; idx += CHUNK_THREADS) {
            const int r = idx / CH, p = idx % CH;
            const float tb = T[r * LDC + p] * Bs[p];
            KK[r * LDC + p] = -tb * EG[p];
            T[r * LDC + p] = tb;
        }
        __syncthreads();
        // 5. W = -T diag(b exp(G)) K, U = T diag(b) V (into Ds)
        mma_tile<CH, S, CH, 4, LDC, 1, LDK, 1, LDK>(KK, Ks, Ws, 0.0f);
        mma_tile<CH, CJ, CH, 2, LDC, 1, LDV, 1, LDV>(T, Vs, Ds, 0.0f);
        __syncthreads();
        // 6. D = U + W S0 (S0(i, jj) = Ms[jj][i])
        mma_tile<CH, CJ, S, 2, LDK, 1, 1, LDK, LDV>(Ws, Ms, Ds, 1.0f);
        __syncthreads();
        // 7. O = Q' S0 + P D (into Vs: the same tiles of the same warps, so no barrier between the two);
        //    K rows times exp(G_last - G) for the state's update
        mma_tile<CH, CJ, S, 2, LDK, 1, 1, LDK, LDV>(Qs, Ms, Vs, 0.0f);
        mma_tile<CH, CJ, CH, 2, LDC, 1, LDV, 1, LDV>(P, Ds, Vs, 1.0f);
        for (int idx = tid; idx < CH * S; idx += CHUNK_THREADS) {
            const int r = idx / S;
            Ks[r * LDK + idx % S] *= EL[r];
        }
        __syncthreads();
        // 8. the gated norm's sums of squares of this block's columns (double-buffered by chunk parity, as in
        //    gdn_recurrent); M = exp(G_last) M + D^T K' (M [CJ x S] = S1^T)
        float* sums = part + (chunk & 1) * CH;
        if (tid < CH) {
            float ss = 0.0f;
            for (int jj = 0; jj < CJ; ++jj) ss += Vs[tid * LDV + jj] * Vs[tid * LDV + jj];
            sums[tid] = ss;
        }
        mma_tile<CJ, S, CH, 4, 1, LDV, LDK, 1, LDK>(Ds, Ks, Ms, EG[CH - 1]);
        cluster_sync();
        // 9. out = rms_norm(o) * norm_w * silu(z): a thread takes a token's CJ / 4 consecutive columns
        {
            const int r = tid >> 2, jq = (tid & 3) * (CJ / 4);
            if (r < nt) {
                float ss = 0.0f;
                for (int rank = 0; rank < CLUSTER; ++rank) ss += cluster_load(sums + r, rank);
                const float inv = rsqrtf(ss / (float)S + eps);
                const size_t row = ((size_t)(t0 + r) * Hv + h) * S + j0;
#pragma unroll
                for (int e = 0; e < CJ / 4; ++e) {
                    const int jj = jq + e;
                    out[row + jj] = Vs[r * LDV + jj] * inv * norm_w[j0 + jj] * silu(z[row + jj]);
                }
            }
        }
        __syncthreads();  // Vs is the next chunk's v
    }
    cluster_sync();  // no block leaves while another may still read its sums
    for (int idx = tid; idx < CJ * S; idx += CHUNK_THREADS) Mg[idx] = Ms[idx / S * LDK + idx % S];
}

#define GDN_KERNELS(S)                                                                                          \
    extern "C" __global__ void __cluster_dims__(REC_CLUSTER, 1, 1) __launch_bounds__(S / REC_ROWS / REC_CLUSTER * 32) \
        gdn_recurrent_##S(const float* y, const float* alpha, const float* beta, const float* dt_bias,          \
                          const float* a, const float* z, const float* norm_w, float* state, float* out, int n,  \
                          int Hk, int Hv, float eps, float* snaps) {                                            \
        wait_prior();                                                                                            \
        gdn_recurrent<S>(y, alpha, beta, dt_bias, a, z, norm_w, state, out, n, Hk, Hv, eps, snaps);              \
    }                                                                                                            \
    extern "C" __global__ void __cluster_dims__(S / CJ, 1, 1) __launch_bounds__(CHUNK_THREADS, 1)                \
        gdn_chunked_##S(const float* y, const float* alpha, const float* beta, const float* dt_bias,            \
                        const float* a, const float* z, const float* norm_w, float* state, float* out, int n,    \
                        int Hk, int Hv, float eps) {                                                            \
        wait_prior();                                                                                            \
        gdn_chunked<S>(y, alpha, beta, dt_bias, a, z, norm_w, state, out, n, Hk, Hv, eps);                       \
    }

GDN_KERNELS(64)
GDN_KERNELS(128)
