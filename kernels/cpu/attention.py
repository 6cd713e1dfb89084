"""Causal grouped-query attention of a forward's queries over the KV cache on the CPU (float32 numpy arrays).

Three kernels by size: up to ATTENTION_LOOP_MAX_TOKENS queries (decode, a verify step) a loop over (query, head),
on all cores from ATTENTION_PARALLEL_WORK; a prompt's queries in blocks of ATTENTION_QUERY_BLOCK in one numba region
up to ATTENTION_BLOCKS_MAX_PAIRS query-key pairs a head; beyond, numpy BLAS. Windows (sliding layers), sinks
(gpt-oss) and ring caches (kv_ring.py: position j at row j % rows) in all three.
"""
import numba as nb
import numpy as np

import kernels.cpu.types  # noqa: F401  (numba's cache saves serialized: kernels/cpu/cache.py)
from kernels.cpu.ops import exp_f32

# numba's cache keys these kernels on this file alone: kernels/cpu/cache.py says how edits to the modules they
# inline reach them (INLINED, INLINED_DIGEST, checked by tests/kernels/test_cpu_cache.py)
INLINED = ("types", "ops")
INLINED_DIGEST = "1d71873eabac9fbf"

ATTENTION_LOOP_MAX_TOKENS = 4  # up to this many queries the loop kernel beats BLAS
# Up to this many query-key pairs a head (queries x keys from the first any of them sees) a prompt's attention runs
# in one numba region (_attention_blocks), beyond it in BLAS. 2-core AVX-512 VM, BLAS path / blocks, ms: 128 x 128
# (16 heads, hd 64) 1.64 / 0.73; 256 x 256 (32 heads, hd 128) 12.8 / 8.8; 128 queries after 128 cached 1.22 / 1.93;
# 512 x 512 6.7 / 9.8. In the engine BLAS does worse than alone: its threads wait on numba's spinning ones.
ATTENTION_BLOCKS_MAX_PAIRS = 1 << 16
ATTENTION_QUERY_BLOCK = 16  # queries of a block: they share one copy of their keys, transposed
# From this many multiply-adds (queries x heads x keys x head dim) the loop runs on all cores. Measured on 2
# cores: 32 heads x 64 keys x 128 dims 0.065 -> 0.042 ms, SmolLM2's 9 heads x 128 keys x 64 0.024 -> 0.017 ms;
# below ~64k the wake-up of the threads is most of it (SmolLM2 lost 15% a token with every step parallel).
ATTENTION_PARALLEL_WORK = 1 << 16


@nb.njit(inline="always")
def _softmax_in_place(scores, sinks, h):
    """scores (a query's over the keys it sees, a 1-d array or a slice from 0, so its loops vectorize) -> their
    exp(s - max) in place; returns 1 / their sum, which counts head h's sink logit where sinks (empty: none) has
    one (gpt-oss: a logit with no value)."""
    best = sinks[h] if sinks.size else np.float32(-np.inf)
    for j in range(scores.shape[0]):
        best = max(best, scores[j])
    total = exp_f32(sinks[h] - best) if sinks.size else np.float32(0.0)
    for j in range(scores.shape[0]):
        scores[j] = exp_f32(scores[j] - best)
        total += scores[j]
    return np.float32(1.0) / total


@nb.njit(cache=True, nogil=True, fastmath=True)
def _attend(q, k, v, i, h, pos0, start, window, scale, sinks, ring, out):
    """out[i, h] for query i, head h: softmax(q . keys) . values over the keys it sees; sinks (empty: none) [n_heads]
    a logit per head that joins the softmax with no value (gpt-oss); ring > 0: key j in row j % ring (a sliding
    window's ring). Rows are taken as 1-d views of C-contiguous arrays so the dot and the value sum vectorize
    (strided 3-d indexing did not: 32 heads x 640 keys took 2.6 ms on one core)."""
    kv = h // (q.shape[1] // k.shape[0])
    p = pos0 + i
    lo = max(start, p - window + 1) if window > 0 else start
    qh, kh, vh = q[i, h], k[kv], v[kv]
    scores = np.empty(p + 1 - lo, np.float32)
    for j in range(lo, p + 1):
        kj = kh[j % ring if ring else j]
        s = np.float32(0.0)
        for d in range(qh.shape[0]):
            s += qh[d] * kj[d]
        scores[j - lo] = s * scale
    inv = _softmax_in_place(scores, sinks, h)
    acc = np.zeros(vh.shape[1], np.float32)
    for j in range(scores.shape[0]):
        w, vj = scores[j] * inv, vh[(lo + j) % ring if ring else lo + j]
        for d in range(acc.shape[0]):
            acc[d] += w * vj[d]
    for d in range(acc.shape[0]):  # a loop: a slice assignment compiles numba's shape-mismatch message (~5 s)
        out[i, h, d] = acc[d]


@nb.njit(cache=True, nogil=True)
def _attention_loop(q, k, v, pos0, start, window, scale, sinks, ring, out):  # q [n, H, hd], out [n, H, vd]
    for hh in range(q.shape[0] * q.shape[1]):
        _attend(q, k, v, hh // q.shape[1], hh % q.shape[1], pos0, start, window, scale, sinks, ring, out)


@nb.njit(cache=True, nogil=True, parallel=True)
def _attention_loop_parallel(q, k, v, pos0, start, window, scale, sinks, ring, out):
    for hh in nb.prange(q.shape[0] * q.shape[1]):
        _attend(q, k, v, hh // q.shape[1], hh % q.shape[1], pos0, start, window, scale, sinks, ring, out)


@nb.njit(cache=True, nogil=True, parallel=True, fastmath=True)
def _causal_softmax(scores, n, pos0, start, window, scale, sinks):
    """scores [rows, T'] in place: row r is query r % n of head r // n at position pos0 + r % n over keys start..;
    each row scaled, masked (future keys, and keys window or more behind) and softmaxed, with the head's sink logit
    in the sum where sinks (empty: none) [n_heads] has one. One pass a row on all cores: numpy's mask, max, exp, sum
    and divide were five single-threaded passes, most of a prompt chunk's time (llama3-8b's 32 heads x 256 queries
    x 512 keys: 141 ms a layer on 2 cores)."""
    for r in nb.prange(scores.shape[0]):
        p = pos0 + r % n
        lo = max(start, p - window + 1) if window > 0 else start
        row = scores[r]
        seen = row[lo - start:p + 1 - start]  # loops from 0: numba's wraparound of negative indices kept them scalar
        for j in range(seen.shape[0]):
            seen[j] *= scale
        inv = _softmax_in_place(seen, sinks, r // n)
        for j in range(row.shape[0]):
            row[j] = row[j] * inv if lo - start <= j <= p - start else np.float32(0.0)


@nb.njit(cache=True, nogil=True, parallel=True, fastmath=True)
def _attention_blocks(q, k, v, pos0, start, window, scale, sinks, ring, out):
    """out [n, n_heads, vd] of a prompt's queries q [n, n_heads, hd] at positions pos0.. (see attention): a task a
    KV head and block of ATTENTION_QUERY_BLOCK queries, on all cores. A task copies the keys its queries see,
    transposed (a query's scores then add one row of K^T a dimension: vector loops over the keys, where a dot a key
    ends in a horizontal sum), then runs each query of each head of its group: scores, softmax, values (V's rows
    read in place)."""
    n, n_heads, hd = q.shape
    n_kv, vd = k.shape[0], v.shape[2]
    group, n_blocks = n_heads // n_kv, (n + ATTENTION_QUERY_BLOCK - 1) // ATTENTION_QUERY_BLOCK
    for task in nb.prange(n_kv * n_blocks):
        kv, i0 = task // n_blocks, task % n_blocks * ATTENTION_QUERY_BLOCK
        i1 = min(n, i0 + ATTENTION_QUERY_BLOCK)
        lo = max(start, pos0 + i0 - window + 1) if window > 0 else start  # the first key a query here sees
        n_keys = pos0 + i1 - lo
        kt = np.empty((hd, n_keys), np.float32)
        for j in range(n_keys):
            row = (lo + j) % ring if ring else lo + j
            for d in range(hd):
                kt[d, j] = k[kv, row, d]
        scores, acc = np.empty(n_keys, np.float32), np.empty(vd, np.float32)
        for h in range(kv * group, (kv + 1) * group):
            for i in range(i0, i1):
                p = pos0 + i
                first = (max(start, p - window + 1) if window > 0 else start) - lo
                # slices, so the loops count from 0: numba's wraparound of a maybe-negative index kept them scalar
                seen = scores[first:p + 1 - lo]
                for j in range(seen.shape[0]):  # loops, not slice assignments (numba compiles those ~5 s longer)
                    seen[j] = 0.0
                for d in range(hd):
                    qd, keys = q[i, h, d] * scale, kt[d, first:p + 1 - lo]
                    for j in range(seen.shape[0]):
                        seen[j] += qd * keys[j]
                inv = _softmax_in_place(seen, sinks, h)
                for d in range(vd):
                    acc[d] = 0.0
                for j in range(seen.shape[0]):
                    w, value = seen[j], v[kv, (lo + first + j) % ring if ring else lo + first + j]
                    for d in range(vd):
                        acc[d] += w * value[d]
                for d in range(vd):
                    out[i, h, d] = acc[d] * inv


NO_SINKS = np.zeros(0, np.float32)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, pos0: int, window: int, scale: float,
              sinks: np.ndarray | None = None, ring: bool = False) -> np.ndarray:
    """Causal grouped-query attention of n new queries against the cache.

    q [n, n_heads, hd] at positions pos0..pos0+n-1; k [n_kv, >= T, hd] and v [n_kv, >= T, vd] hold positions
    0..T-1 with T = pos0 + n: pass the whole cache (C-contiguous), not a slice, so the decode loop vectorizes.
    window > 0: a query at p sees only keys j with p - j < window. sinks: float32 [n_heads], a logit per head in
    each softmax's sum (not scaled, no value: it only takes weight from the keys), as llama.cpp's
    ggml_soft_max_add_sinks. ring: k and v are rings of the window (rope_kv_store's: position j in row j % their
    length), which hold the window behind the first query and the n new positions. Returns [n, n_heads * vd].
    """
    n, n_heads, hd = q.shape
    n_kv, vd, T = v.shape[0], v.shape[2], pos0 + n
    start = max(0, pos0 + 1 - window) if window > 0 else 0  # keys no query of this batch can see
    if sinks is None:
        sinks = NO_SINKS
    elif sinks.shape != (n_heads,) or sinks.dtype != np.float32:
        raise ValueError(f"sinks must be float32 [{n_heads}], got {sinks.dtype} {sinks.shape}")
    if n <= ATTENTION_LOOP_MAX_TOKENS or n * (T - start) <= ATTENTION_BLOCKS_MAX_PAIRS:
        out = np.empty((n, n_heads, vd), np.float32)
        work = n * n_heads * (T - start) * hd
        kernel = (_attention_blocks if n > ATTENTION_LOOP_MAX_TOKENS else
                  _attention_loop_parallel if work >= ATTENTION_PARALLEL_WORK else _attention_loop)
        kernel(np.ascontiguousarray(q, np.float32), k, v, pos0, start, window, np.float32(scale), sinks,
               k.shape[1] if ring else 0, out)
        return out.reshape(n, n_heads * vd)
    group = n_heads // n_kv
    if ring:  # the keys start..T-1 in order, gathered from the ring's rows
        rows = np.arange(start, T) % k.shape[1]
        k, v = k[:, rows], v[:, rows]
    else:
        k, v = k[:, start:T], v[:, start:T]
    qg = q.reshape(n, n_kv, group, hd).transpose(1, 2, 0, 3).reshape(n_kv, group * n, hd)
    scores = qg @ k.transpose(0, 2, 1)  # [n_kv, group * n, T - start]: row r of the flat rows is head r // n
    _causal_softmax(scores.reshape(-1, T - start), n, pos0, start, window, np.float32(scale), sinks)
    out = scores @ v  # [n_kv, group * n, vd]
    return out.reshape(n_kv, group, n, vd).transpose(2, 0, 1, 3).reshape(n, n_heads * vd)
