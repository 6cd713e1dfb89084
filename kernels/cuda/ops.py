"""Launchers for the non-matmul ops of the GPU decode step and prefill (kernels/cuda/embed.cu, norm_rope.cu,
elementwise.cu, attention.cu, sample.cu).

Every launcher checks dtypes and shapes, then only launches on the given stream (default: the current
one): nothing allocates, nothing syncs with the host, so a decode step of these launches can be captured
into one CUDA graph. What depends on the position reads it from `pos`, a device int32 [1], so the graph
stays valid for every token; the samplers write the next token into `token` (int32 [1]) and advance pos.
The *_scratch / set_sampling_params helpers allocate or copy from the host: call them before capture.

Layouts: activations float32, row-major, [n_tok, ...] for prefill and the same without n_tok for decode.
KV cache, one pair per layer: k_cache, v_cache [n_head_kv, max_ctx, head_dim] float16, position p at row p % max_ctx
(a sliding-window layer's cache may be a ring shorter than the context: inference/kv_ring.py). fp16 halves the
bytes that decode attention reads at long contexts (and the VRAM), as llama.cpp's default cache does;
it rounds k and v to 11 significant bits (relative error <= 2^-11).
"""
import functools
import math

import cupy as cp
import numpy as np

from kernels.cuda.module import kernel
from kernels.cuda.quant import DeviceWeight, Q8Vector
from kernels.cuda.shapes import ATTENTION_HEAD_DIMS as HEAD_DIMS

NULL = np.uint64(0)  # a null pointer argument (kernel arguments that may be absent)
ATTN_WARPS = 4  # attention.cu: WARPS
PREFILL_MMA_ROWS = 64  # attention.cu: PF_ROWS
ARGMAX_THREADS = 1024
ARGMAX_BLOCKS = 128
SAMPLE_CHUNK = 4096  # sample.cu: CHUNK, logits a block selects from
SAMPLE_K_MAX = 64  # sample.cu: K_MAX, candidates kept (top_k is capped here)
SAMPLE_THREADS = 1024  # sample.cu: SAMPLE_THREADS
MAX_HISTORY = 1024  # the penalty takes one thread per history entry
NORM_Q8_MAX = 4 * 4 * 1024  # norm_rope.cu: NORM_CHUNKS float4s a thread, 1024 threads
HEAD_NORM_MULTIPLE = 64  # rope_kv_write's head norms: a block of head_dim / 2 threads, whole warps
ROPE_MANY_TOKENS = 16  # from this many tokens rope_kv_write takes 8 heads a block


def _stream(stream):
    return stream or cp.cuda.get_current_stream()


def _check(name: str, a, dtype, shape: tuple) -> None:
    if not isinstance(a, cp.ndarray) or a.dtype != dtype or a.shape != shape or not a.flags.c_contiguous:
        got = f"{a.dtype} {a.shape}" if isinstance(a, cp.ndarray) else type(a).__name__
        raise ValueError(f"{name} must be a contiguous {np.dtype(dtype).name} CuPy array of shape {shape}, got {got}")


def _check_pos(pos) -> None:
    _check("pos", pos, cp.int32, (1,))


def _check_q8(xq, n: int) -> None:
    """xq: where a kernel also writes its output of n values quantized to q8_1 (see cuda_quant.Q8Vector)."""
    if not isinstance(xq, Q8Vector) or n % 32:
        raise ValueError(f"xq must be a Q8Vector and the output a multiple of 32 values, got {n}")
    _check("xq.qs", xq.qs, cp.int8, (n,))
    _check("xq.ds", xq.ds, cp.float32, (n // 32, 2))


def _blocks(n: int, threads: int = 256) -> tuple:
    return ((n + threads - 1) // threads,)


# ---- embedding ----

def embed(table: DeviceWeight, ids: cp.ndarray, out: cp.ndarray, scale: float = 1.0, stream=None) -> None:
    """out [n_tok, n_embd] float32 = rows ids [n_tok] int32 of the table, dequantized, times scale.

    table: the token-embedding weight as cuda_quant.to_device made it (the same copy a tied output head
    uses); n_embd = table.n_cols. An id outside the table gives a row of NaN."""
    n_tok = ids.shape[0] if isinstance(ids, cp.ndarray) and ids.ndim == 1 else -1
    _check("ids", ids, cp.int32, (n_tok,))
    _check("out", out, cp.float32, (n_tok, table.n_cols))
    name = "embed_" + table.qtype.name.lower()
    args = (table.data, ids, out, np.int32(table.n_rows), np.int32(table.n_cols), np.float32(scale))
    per_thread = 32 if table.takes_q8 else 1  # a quantized table's thread makes a chunk of 32 columns (embed.cu)
    with _stream(stream):
        kernel("embed.cu", name)((n_tok, math.ceil(table.n_cols / per_thread / 256)), (256,), args)


# ---- norms, rope, kv cache ----

def rms_norm(x: cp.ndarray, weight: cp.ndarray, out: cp.ndarray, eps: float, residual: cp.ndarray | None = None,
             xq: Q8Vector | None = None, stream=None) -> None:
    """out [..., d] = x / sqrt(mean(x^2) + eps) * weight [d], over the last axis of x.

    residual given: x += residual first (written back: the residual stream), then out = norm(x).
    xq given (rows [n, d], no residual): out also quantized to q8_1 into xq, in the same launch.
    Per-head q/k norm: x [n_tok, n_head, head_dim] with weight [head_dim]. out may be x."""
    d = weight.shape[0] if isinstance(weight, cp.ndarray) and weight.ndim == 1 else -1
    _check("weight", weight, cp.float32, (d,))
    if not isinstance(x, cp.ndarray) or x.ndim < 1 or x.shape[-1] != d:
        raise ValueError(f"rms_norm: x must end in the weight's length {d}")
    _check("x", x, cp.float32, x.shape)
    _check("out", out, cp.float32, x.shape)
    if residual is not None:
        _check("residual", residual, cp.float32, x.shape)
    rows = x.size // d
    threads = min(1024, (d + 31) // 32 * 32)
    if xq is not None:
        if x.ndim != 2 or residual is not None or d > NORM_Q8_MAX or d % 32:
            raise ValueError(f"rms_norm: xq takes rows [n, d] of whole q8_1 blocks (d a multiple of 32), at most "
                             f"{NORM_Q8_MAX} values, and no residual")
        if any(a.data.ptr % 16 for a in (x, weight, out)):
            raise ValueError("rms_norm: xq needs 16-byte-aligned x, weight and out (read as float4)")
        _check_q8(xq, rows * d)
        threads = min(1024, (d // 4 + 31) // 32 * 32)  # norm_rope.cu: a float4 chunk a thread where it fits
        with _stream(stream):
            kernel("norm_rope.cu", "rms_norm_q8_1")((rows,), (threads,), (x, weight, out, xq.qs, xq.ds, np.int32(d),
                                                                         np.float32(eps)))
        return
    has_residual = residual is not None
    args = (x, residual if has_residual else x, weight, out, np.int32(d), np.float32(eps), np.int32(has_residual))
    with _stream(stream):
        kernel("norm_rope.cu", "rms_norm")((rows,), (threads,), args)


def rope_inv_freq(rope_dim: int, base: float, freq_factors: np.ndarray | None = None) -> cp.ndarray:
    """Turning speed of each pair of dims for rope(): float64 [rope_dim // 2] = base^(-2i / rope_dim), divided
    by freq_factors [rope_dim // 2] where a model has them (llama3 rope scaling). An upload: before capture."""
    inv = base ** (-np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)
    return cp.asarray(inv / freq_factors if freq_factors is not None else inv)


def rope(q: cp.ndarray, k: cp.ndarray | None, inv_freq: cp.ndarray, pos: cp.ndarray, neox: bool,
         stream=None) -> None:
    """Rotate q [n_tok, n_head, head_dim] and k [n_tok, n_head_kv, head_dim] in place; token t is at position
    pos[0] + t and its pair i turns by that times inv_freq [rope_dim // 2] (float64, see rope_inv_freq).
    neox: pairs (i, i + rope_dim/2), else (2i, 2i+1). k may be None."""
    if not isinstance(q, cp.ndarray) or q.ndim != 3:
        raise ValueError("rope: q must be [n_tok, n_head, head_dim]")
    n_tok, n_head, head_dim = q.shape
    _check("q", q, cp.float32, q.shape)
    n_head_kv = 0
    if k is not None:
        n_head_kv = k.shape[1] if isinstance(k, cp.ndarray) and k.ndim == 3 else -1
        _check("k", k, cp.float32, (n_tok, n_head_kv, head_dim))
    n_pairs = inv_freq.shape[0] if isinstance(inv_freq, cp.ndarray) and inv_freq.ndim == 1 else -1
    _check("inv_freq", inv_freq, cp.float64, (n_pairs,))
    if not 0 < 2 * n_pairs <= head_dim:
        raise ValueError(f"rope: {n_pairs} pairs do not fit a head of {head_dim}")
    _check_pos(pos)
    grid = (n_tok, math.ceil((n_head + n_head_kv) / 8))  # norm_rope.cu: ROPE_HEADS
    args = (q, q if k is None else k, inv_freq, pos, np.int32(n_head), np.int32(n_head_kv), np.int32(head_dim),
            np.int32(n_pairs), np.int32(bool(neox)))
    with _stream(stream):
        kernel("norm_rope.cu", "rope")(grid, ((n_pairs + 31) // 32 * 32,), args)


def kv_cache(n_head_kv: int, max_ctx: int, head_dim: int) -> tuple[cp.ndarray, cp.ndarray]:
    """A zeroed (k_cache, v_cache) pair for one layer: [n_head_kv, max_ctx, head_dim] float16 each."""
    shape = (n_head_kv, max_ctx, head_dim)
    return cp.zeros(shape, dtype=cp.float16), cp.zeros(shape, dtype=cp.float16)


def _check_cache(k_cache, v_cache) -> tuple[int, int, int]:
    if not isinstance(k_cache, cp.ndarray) or k_cache.ndim != 3:
        raise ValueError("k_cache must be [n_head_kv, max_ctx, head_dim] float16")
    _check("k_cache", k_cache, cp.float16, k_cache.shape)
    _check("v_cache", v_cache, cp.float16, k_cache.shape)
    return k_cache.shape


def kv_write(k: cp.ndarray, v: cp.ndarray, k_cache: cp.ndarray, v_cache: cp.ndarray, pos: cp.ndarray,
             stream=None) -> None:
    """Store k, v [n_tok, n_head_kv, head_dim] float32 at positions pos[0].. of the caches (as fp16).
    Position p goes to row p % max_ctx: past the cache's rows it overwrites position p - max_ctx (a ring's oldest)."""
    n_head_kv, max_ctx, head_dim = _check_cache(k_cache, v_cache)
    n_tok = k.shape[0] if isinstance(k, cp.ndarray) and k.ndim == 3 else -1
    _check("k", k, cp.float32, (n_tok, n_head_kv, head_dim))
    _check("v", v, cp.float32, (n_tok, n_head_kv, head_dim))
    _check_pos(pos)
    args = (k, v, k_cache, v_cache, pos, np.int32(n_tok), np.int32(n_head_kv), np.int32(head_dim),
            np.int32(max_ctx))
    with _stream(stream):
        kernel("norm_rope.cu", "kv_write")(_blocks(k.size), (256,), args)


def rope_kv_write(q: cp.ndarray, k: cp.ndarray | None, v: cp.ndarray | None, inv_freq: cp.ndarray, pos: cp.ndarray,
                  neox: bool, k_cache: cp.ndarray | None, v_cache: cp.ndarray | None, head_norms: tuple | None = None,
                  eps: float = 0.0, mscale: float = 1.0, stream=None) -> None:
    """rope(q, k, ...) then kv_write(k, v, ...) in one launch (one graph node less a layer), same results.
    head_norms (q_norm, k_norm[, v_norm]), float32 [head_dim] each (k_norm None with q alone): q and k (and v: gemma4)
    normalized per head first, as rms_norm(q, q_norm, eps) and rms_norm(k, k_norm, eps) would (in the same launch: two
    nodes less); head_dim a multiple of HEAD_NORM_MULTIPLE. v may be k (the same array: gemma4's v from k's projection, before k's norm and
    rope). k, v and the caches None: q alone is normed and rotated (gemma4's KV-shared layers). mscale: the rotated
    pairs' cos and sin (float32) times it (YaRN's attention factor)."""
    n_tok, n_head, head_dim = q.shape if isinstance(q, cp.ndarray) and q.ndim == 3 else (-1, -1, -1)
    _check("q", q, cp.float32, (n_tok, n_head, head_dim))
    n_head_kv, max_ctx = 0, 0
    if k is not None:
        n_head_kv, max_ctx, _ = _check_cache(k_cache, v_cache)
        _check("k_cache", k_cache, cp.float16, (n_head_kv, max_ctx, head_dim))
        _check("k", k, cp.float32, (n_tok, n_head_kv, head_dim))
        _check("v", v, cp.float32, (n_tok, n_head_kv, head_dim))
    n_pairs = inv_freq.shape[0] if isinstance(inv_freq, cp.ndarray) and inv_freq.ndim == 1 else -1
    _check("inv_freq", inv_freq, cp.float64, (n_pairs,))
    if not 0 < 2 * n_pairs <= head_dim or head_dim % 2:
        raise ValueError(f"rope_kv_write: {n_pairs} pairs do not fit a head of {head_dim}")
    q_norm, k_norm, v_norm = (tuple(head_norms) + (None, None))[:3] if head_norms else (None, None, None)
    if head_norms is not None:
        if head_dim % HEAD_NORM_MULTIPLE or q_norm is None or (k is not None and k_norm is None):
            raise ValueError(f"rope_kv_write: head norms (q, k[, v]; k's with k) need a head_dim multiple of "
                             f"{HEAD_NORM_MULTIPLE}")
        for name, w in zip(("q_norm", "k_norm", "v_norm"), (q_norm, k_norm, v_norm)):
            if w is not None:
                _check(name, w, cp.float32, (head_dim,))
    v_norm = v_norm if k is not None else None
    _check_pos(pos)
    # heads a block: a prompt's tokens fill the GPU with 8 (norm_rope.cu's ROPE_HEADS: the sines computed once for
    # them); a decode step's token takes one a block, since a block's heads run one after the other
    heads = 8 if n_tok >= ROPE_MANY_TOKENS else 1
    grid = (n_tok, math.ceil((n_head + n_head_kv) / heads))
    k, v, k_cache, v_cache = (q, q, inv_freq, inv_freq) if k is None else (k, v, k_cache, v_cache)  # q alone: not read
    args = (q, k, v, k_cache, v_cache, inv_freq, pos, np.int32(n_head), np.int32(n_head_kv), np.int32(head_dim),
            np.int32(n_pairs), np.int32(bool(neox)), np.float32(mscale), np.int32(max_ctx),
            inv_freq if q_norm is None else q_norm, inv_freq if k_norm is None else k_norm,
            np.int32(head_norms is not None), np.float32(eps), np.int32(heads), inv_freq if v_norm is None else v_norm,
            np.int32(v_norm is not None))
    with _stream(stream):
        kernel("norm_rope.cu", "rope_kv_write")(grid, (head_dim // 2,), args)


# ---- attention ----

DECODE_ROWS = 16  # attention.cu: a decode block's mma rows ((token, q head) pairs of one kv head)
DECODE_STAGES = 3  # attention.cu: DECODE_STAGES
SHARED_BYTES_AN_SM = 228 * 1024  # Hopper; each block also holds 1 KiB


# attention.cu's ATTN(HD, DECODE, PREFILL_VD): the head sizes whose decode is decode_wide_mma (a block's warps split
# the dims: heads of 512, see attention.cu's top), and the prefill's slice of the output's dims a block makes
WIDE_DECODE = (512,)
WIDE_STAGES = 3  # attention.cu: WIDE_STAGES
PREFILL_SLICE = {512: 128}


def _decode_smem(head_dim: int) -> int:
    """attention.cu's DmShape<HD>::BYTES (q (hi, lo), then each warp's ring of 16-key tiles of k and v) or, for a
    wide head, WideShape<HD>::BYTES (the block's ring)."""
    tile = 2 * 16 * (head_dim + 8)
    if head_dim in WIDE_DECODE:
        return 2 * WIDE_STAGES * tile
    return 2 * (2 * 16 * (head_dim + 8) + ATTN_WARPS * DECODE_STAGES * tile)


def decode_scratch(n_head: int, n_head_kv: int, head_dim: int, n_tok: int = 1) -> cp.ndarray:
    """Scratch for attention_decode of up to n_tok tokens: float32 [n_tok * n_head, n_splits, head_dim + 4],
    n_splits picked so that a long context fills the multiprocessors with one wave of blocks for n_tok tokens (as
    many an SM as shared memory holds, at most 2: a second wave cost 8-20% in a measurement of 16384 keys; rounded
    down: gemma4 31B's sliding layers, 16 kv heads, took 17.2 us over 1024 keys in 9 splits, 11.4 in 8). One
    serves every layer of these heads (they run in turn)."""
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    blocks_an_sm = max(1, min(2, SHARED_BYTES_AN_SM // (_decode_smem(head_dim) + 1024)))
    row_chunks = math.ceil(n_tok * (n_head // n_head_kv) / DECODE_ROWS)
    n_splits = max(1, min(64, blocks_an_sm * sms // (n_head_kv * row_chunks)))
    return cp.empty((n_tok * n_head, n_splits, head_dim + 4), dtype=cp.float32)  # attention.cu: PART_EXTRA


def _decode_kernel(head_dim: int):
    launch = kernel("attention.cu", f"attn_decode_{head_dim}")
    launch.raw.max_dynamic_shared_size_bytes = _decode_smem(head_dim)  # 214 KiB at head_dim 256, 98 at 512
    return launch


def _check_attention(q_heads: tuple, k_cache, v_cache) -> tuple[int, int, int, int]:
    n_head_kv, max_ctx, head_dim = _check_cache(k_cache, v_cache)
    n_head = q_heads[0]
    if head_dim not in HEAD_DIMS or n_head % n_head_kv:
        raise ValueError(f"attention: head_dim {head_dim} (need one of {HEAD_DIMS}) and n_head {n_head} "
                         f"(need a multiple of n_head_kv {n_head_kv}) unsupported")
    return n_head, n_head_kv, max_ctx, head_dim


def attention_decode(q: cp.ndarray, k_cache: cp.ndarray, v_cache: cp.ndarray, out: cp.ndarray, pos: cp.ndarray,
                     scratch: cp.ndarray, scale: float, window: int = 0, xq: Q8Vector | None = None,
                     sinks: cp.ndarray | None = None, stream=None) -> None:
    """out [n_head, head_dim] = softmax(scale * q k^T) v for one query q [n_head, head_dim] at position pos[0]
    over cached keys 0..pos[0] (its own k and v already written); window > 0: only the last `window`.
    q [n_tok, n_head, head_dim] and out the same: a few queries (a verify step's), token t at position pos[0] + t
    over keys 0..pos[0] + t (causal, as attention_prefill; all their k and v already written).
    sinks [n_head] float32 (gpt-oss): each head's softmax also counts a key of logit sinks[h] and value 0.
    Flash-decoding: the keys are split over scratch.shape[1] blocks a kv head at long contexts; scratch
    (decode_scratch) has rows for n_tok tokens or more.
    xq given: out also quantized to q8_1 into xq (for the output projection), in the same launches."""
    if not isinstance(q, cp.ndarray) or q.ndim not in (2, 3) or q.size == 0:
        raise ValueError("attention_decode: q must be [n_head, head_dim] or [n_tok, n_head, head_dim]")
    n_head, n_head_kv, max_ctx, head_dim = _check_attention(q.shape[-2:], k_cache, v_cache)
    n_tok = q.shape[0] if q.ndim == 3 else 1
    _check("q", q, cp.float32, q.shape[:-2] + (n_head, head_dim))
    _check("out", out, cp.float32, q.shape)
    rows, n_splits = scratch.shape[:2] if isinstance(scratch, cp.ndarray) and scratch.ndim == 3 else (-1, -1)
    if rows < n_tok * n_head:
        raise ValueError(f"attention_decode: scratch must have rows for {n_tok} tokens of {n_head} heads, got {rows}")
    _check("scratch", scratch, cp.float32, (rows, n_splits, head_dim + 4))
    _check_pos(pos)
    if xq is not None:
        _check_q8(xq, n_tok * n_head * head_dim)
    if sinks is not None:
        _check("sinks", sinks, cp.float32, (n_head,))
    grid = (n_head_kv, n_splits, math.ceil(n_tok * (n_head // n_head_kv) / DECODE_ROWS))
    with _stream(stream):
        _decode_kernel(head_dim)(
            grid, (32 * ATTN_WARPS,),
            (q, k_cache, v_cache, scratch, pos, np.int32(n_tok), np.int32(n_head), np.int32(n_head_kv),
             np.int32(max_ctx), np.int32(window), np.float32(scale), np.int32(n_splits)),
            shared_mem=_decode_smem(head_dim))
        kernel("attention.cu", "attn_decode_combine")(
            (n_tok * n_head,), (512,),
            (scratch, out, pos, np.int32(n_tok), np.int32(n_head), np.int32(head_dim), np.int32(window),
             np.int32(n_splits), out if xq is None else xq.qs, out if xq is None else xq.ds, np.int32(xq is not None),
             NULL if sinks is None else sinks))


def attention_prefill(q: cp.ndarray, k_cache: cp.ndarray, v_cache: cp.ndarray, out: cp.ndarray, pos: cp.ndarray,
                      scale: float, window: int = 0, sinks: cp.ndarray | None = None, stream=None) -> None:
    """Causal attention of q [n_tok, n_head, head_dim] (token t at position pos[0] + t, all their k and v
    already in the cache) over keys 0..pos[0]+n_tok-1 -> out [n_tok, n_head, head_dim]; window > 0: only
    the last `window` keys of each query; sinks as attention_decode's. On the tensor cores (float32 accuracy:
    q and p are split into two fp16 halves)."""
    if not isinstance(q, cp.ndarray) or q.ndim != 3:
        raise ValueError("attention_prefill: q must be [n_tok, n_head, head_dim]")
    n_head, n_head_kv, max_ctx, head_dim = _check_attention(q.shape[1:], k_cache, v_cache)
    n_tok = q.shape[0]
    _check("q", q, cp.float32, (n_tok, n_head, head_dim))
    _check("out", out, cp.float32, (n_tok, n_head, head_dim))
    _check_pos(pos)
    if sinks is not None:
        _check("sinks", sinks, cp.float32, (n_head,))
    slices = head_dim // PREFILL_SLICE.get(head_dim, head_dim)  # blockIdx.x: row block * slices + slice
    grid = (math.ceil(n_tok * (n_head // n_head_kv) / PREFILL_MMA_ROWS) * slices, n_head_kv)
    smem = _prefill_smem(head_dim)
    with _stream(stream):
        _prefill_kernel(head_dim)(
            grid, (32 * ATTN_WARPS,),
            (q, k_cache, v_cache, out, pos, np.int32(n_tok), np.int32(n_head), np.int32(n_head_kv),
             np.int32(max_ctx), np.int32(window), np.float32(scale), NULL if sinks is None else sinks),
            shared_mem=smem)


def _prefill_smem(head_dim: int) -> int:
    """attention.cu PfShape<HD, VD>::BYTES: a key tile of k and of v's slice, and from head_dim 256 q's fragments."""
    keys, row, v_row = 32 if head_dim > 128 else 64, head_dim + 8, PREFILL_SLICE.get(head_dim, head_dim) + 8
    return 2 * (keys * row + keys * v_row + (2 * PREFILL_MMA_ROWS * row if head_dim > 128 else 0))


@functools.cache
def _prefill_kernel(head_dim: int):
    launch = kernel("attention.cu", f"attn_prefill_{head_dim}")
    launch.raw.max_dynamic_shared_size_bytes = _prefill_smem(head_dim)  # 99 KiB at head_dim 256, 171 at 512
    return launch


# ---- elementwise ----

def _check_same(names: str, *arrays) -> int:
    first = arrays[0]
    if not isinstance(first, cp.ndarray):
        raise ValueError(f"{names}: CuPy float32 arrays expected")
    for name, a in zip(names.split(", "), arrays):
        _check(name, a, cp.float32, first.shape)
    return first.size


GLU_ACTIVATIONS = {"silu": 0, "gelu": 1, "swiglu_oai": 2}  # ops_common.cuh glu_value (gelu: the tanh approximation)


def glu(gate: cp.ndarray, up: cp.ndarray, out: cp.ndarray, activation: str, xq: Q8Vector | None = None,
        stream=None) -> None:
    """out = activation(gate) * up, elementwise (same shapes; swiglu_oai: gpt-oss's, as kernels/cpu/ops.glu); out
    may be gate or up.
    xq given: out also quantized to q8_1 into xq (for the down projection), in the same launch."""
    if activation not in GLU_ACTIVATIONS:
        raise ValueError(f"glu: activation must be one of {list(GLU_ACTIVATIONS)}, got {activation!r}")
    n = _check_same("gate, up, out", gate, up, out)
    act = np.int32(GLU_ACTIVATIONS[activation])
    with _stream(stream):
        if xq is None:
            kernel("elementwise.cu", "glu")(_blocks(n), (256,), (gate, up, out, np.int32(n), act))
        else:
            _check_q8(xq, n)
            kernel("elementwise.cu", "glu_q8_1")(_blocks(n), (256,), (gate, up, out, xq.qs, xq.ds, np.int32(n), act))


def sigmoid_mul(a: cp.ndarray, gate: cp.ndarray, out: cp.ndarray, xq: Q8Vector | None = None, stream=None) -> None:
    """out = a * sigmoid(gate), elementwise (same shapes); out may be a. xq given: out also quantized to q8_1."""
    n = _check_same("a, gate, out", a, gate, out)
    with _stream(stream):
        if xq is None:
            kernel("elementwise.cu", "sigmoid_mul")(_blocks(n), (256,), (a, gate, out, np.int32(n)))
        else:
            _check_q8(xq, n)
            kernel("elementwise.cu", "sigmoid_mul_q8_1")(_blocks(n), (256,), (a, gate, out, xq.qs, xq.ds, np.int32(n)))


def add_sigmoid_scaled(x: cp.ndarray, y: cp.ndarray, s: cp.ndarray, out: cp.ndarray, stream=None) -> None:
    """out [n, d] = x + sigmoid(s [n, 1]) * y, a scale per row; out may be x or y."""
    n = _check_same("x, y, out", x, y, out)
    rows = x.shape[0] if x.ndim == 2 else -1
    _check("s", s, cp.float32, (rows, 1))
    with _stream(stream):
        kernel("elementwise.cu", "add_sigmoid_scaled")(_blocks(n), (256,), (x, y, s, out, np.int32(n),
                                                                          np.int32(x.shape[1])))


def add(a: cp.ndarray, b: cp.ndarray, out: cp.ndarray, stream=None) -> None:
    """out = a + b (same shapes); out may be a or b."""
    n = _check_same("a, b, out", a, b, out)
    with _stream(stream):
        kernel("elementwise.cu", "add")(_blocks(n), (256,), (a, b, out, np.int32(n)))


def add_bias(x: cp.ndarray, bias: cp.ndarray, out: cp.ndarray | None = None, stream=None) -> None:
    """out [..., d] = x + bias [d] on every row; out (default x: in place) may be x."""
    d = bias.shape[0] if isinstance(bias, cp.ndarray) and bias.ndim == 1 else -1
    _check("bias", bias, cp.float32, (d,))
    if not isinstance(x, cp.ndarray) or x.ndim < 1 or x.shape[-1] != d:
        raise ValueError(f"add_bias: x must end in the bias length {d}")
    _check("x", x, cp.float32, x.shape)
    out = x if out is None else out
    _check("out", out, cp.float32, x.shape)
    with _stream(stream):
        kernel("elementwise.cu", "add_bias")(_blocks(x.size), (256,), (x, bias, out, np.int32(x.size), np.int32(d)))


def scale(x: cp.ndarray, s: float, out: cp.ndarray, stream=None) -> None:
    """out = x * s (same shapes); out may be x."""
    n = _check_same("x, out", x, out)
    with _stream(stream):
        kernel("elementwise.cu", "scale")(_blocks(n), (256,), (x, out, np.int32(n), np.float32(s)))


def softcap(x: cp.ndarray, cap: float, stream=None) -> None:
    """x = cap * tanh(x / cap) in place (gemma2 final logits)."""
    _check("x", x, cp.float32, x.shape if isinstance(x, cp.ndarray) else ())
    with _stream(stream):
        kernel("elementwise.cu", "softcap")(_blocks(x.size), (256,), (x, np.int32(x.size), np.float32(cap)))


# ---- choosing the next token ----
# pos[0]: position of the token these logits follow; the chosen one goes to token[0], to history
# [pos[0] + 1 (mod n_hist)] and pos[0] becomes pos[0] + 1. history: int32 [n_hist] ring of the last tokens,
# history[p % n_hist] = the token at position p (the caller writes the prompt's).

def _check_sampler_io(logits, token, history, pos) -> int:
    n_vocab = logits.shape[0] if isinstance(logits, cp.ndarray) and logits.ndim == 1 else -1
    _check("logits", logits, cp.float32, (n_vocab,))
    _check("token", token, cp.int32, (1,))
    n_hist = history.shape[0] if isinstance(history, cp.ndarray) and history.ndim == 1 else -1
    _check("history", history, cp.int32, (n_hist,))
    if not 0 < n_hist <= MAX_HISTORY:
        raise ValueError(f"history must hold 1..{MAX_HISTORY} tokens, got {n_hist}")
    _check_pos(pos)
    return n_vocab


def argmax_scratch() -> cp.ndarray:
    return cp.empty(ARGMAX_BLOCKS, dtype=cp.uint64)


def argmax(logits: cp.ndarray, scratch: cp.ndarray, token: cp.ndarray, history: cp.ndarray, pos: cp.ndarray,
           stream=None) -> None:
    """Greedy: token[0] = argmax(logits [n_vocab]) (the smallest id on ties), then advance pos."""
    n_vocab = _check_sampler_io(logits, token, history, pos)
    _check("scratch", scratch, cp.uint64, (ARGMAX_BLOCKS,))
    with _stream(stream):
        kernel("sample.cu", "argmax_blocks")((ARGMAX_BLOCKS,), (ARGMAX_THREADS,), (logits, np.int32(n_vocab), scratch))
        kernel("sample.cu", "argmax_final")((1,), (ARGMAX_THREADS,),
                                            (scratch, np.int32(ARGMAX_BLOCKS), token, history,
                                             np.int32(history.size), pos))


def argmax_rows(logits: cp.ndarray, out: cp.ndarray, stream=None) -> None:
    """out int32 [n] = each row's argmax of logits [n, n_vocab] (the smallest id on ties; NaN ranks below -inf, as
    in argmax, where numpy's takes the first NaN)."""
    n = logits.shape[0] if isinstance(logits, cp.ndarray) and logits.ndim == 2 else -1
    _check("logits", logits, cp.float32, (n, logits.shape[-1]) if n >= 0 else ())
    _check("out", out, cp.int32, (n,))
    with _stream(stream):
        kernel("sample.cu", "argmax_rows")((n,), (ARGMAX_THREADS,), (logits, np.int32(logits.shape[1]), out))


def mask_logits(logits: cp.ndarray, allowed: cp.ndarray, stream=None) -> None:
    """logits [n_vocab] of the tokens allowed (uint32 [ceil(n_vocab / 32)], token i bit i % 32 of word i // 32)
    leaves out set to -inf, in place: a grammar's mask before argmax or sample."""
    n_vocab = logits.shape[0] if isinstance(logits, cp.ndarray) and logits.ndim == 1 else -1
    _check("logits", logits, cp.float32, (n_vocab,))
    _check("allowed", allowed, cp.uint32, ((n_vocab + 31) // 32,))
    with _stream(stream):
        kernel("sample.cu", "mask_logits")((-(-n_vocab // 256),), (256,), (logits, np.int32(n_vocab), allowed))


def sample_scratch(n_vocab: int) -> cp.ndarray:
    """Zeroed scratch of sample(): uint64 [ceil(n_vocab / 4096) + 1, 64], the blocks' candidates and, in the
    last row, the count of finished blocks (the sampler sets it back to 0 each call)."""
    n_blocks = math.ceil(n_vocab / SAMPLE_CHUNK)
    if n_blocks * SAMPLE_K_MAX > SAMPLE_CHUNK:
        raise ValueError(f"the sampler handles vocabularies up to {SAMPLE_CHUNK ** 2 // SAMPLE_K_MAX}, got {n_vocab}")
    return cp.zeros((n_blocks + 1, SAMPLE_K_MAX), dtype=cp.uint64)


def sampling_params() -> tuple[cp.ndarray, cp.ndarray]:
    """Device buffers (fparams float32 [4], iparams int32 [2]) for sample(); fill with set_sampling_params."""
    return cp.zeros(4, dtype=cp.float32), cp.zeros(2, dtype=cp.int32)


def set_sampling_params(fparams: cp.ndarray, iparams: cp.ndarray, *, temperature: float, top_k: int, top_p: float,
                        min_p: float, repeat_penalty: float, seed: int, stream=None) -> None:
    """Copy the sampling parameters to the device (an upload: not inside a capture).

    top_k <= 0 or > 64 means 64: the sampler keeps at most the 64 best tokens. temperature <= 0: greedy.
    The seed's low 32 bits key the RNG."""
    _check("fparams", fparams, cp.float32, (4,))
    _check("iparams", iparams, cp.int32, (2,))
    seed32 = np.array(seed & 0xFFFFFFFF, dtype=np.uint32).view(np.int32)
    fparams.set(np.array([temperature, top_p, min_p, repeat_penalty], dtype=np.float32), stream=stream)
    iparams.set(np.array([top_k, seed32], dtype=np.int32), stream=stream)


def sample(logits: cp.ndarray, scratch: cp.ndarray, fparams: cp.ndarray, iparams: cp.ndarray, token: cp.ndarray,
           history: cp.ndarray, pos: cp.ndarray, stream=None) -> None:
    """Draw token[0] from logits [n_vocab] as llama.cpp's sampler chain does: repetition penalty (each
    distinct token of the history once), top_k, top_p, min_p, temperature, then a draw with Philox keyed by
    the seed and counted by pos[0]; then advance pos."""
    n_vocab = _check_sampler_io(logits, token, history, pos)
    n_blocks = math.ceil(n_vocab / SAMPLE_CHUNK)
    _check("scratch", scratch, cp.uint64, (n_blocks + 1, SAMPLE_K_MAX))
    _check("fparams", fparams, cp.float32, (4,))
    _check("iparams", iparams, cp.int32, (2,))
    with _stream(stream):
        kernel("sample.cu", "sample")((n_blocks,), (SAMPLE_THREADS,),
                                      (logits, np.int32(n_vocab), fparams, iparams, scratch, token, history,
                                       np.int32(history.size), pos))
