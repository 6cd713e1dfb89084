"""CPU matmul and row lookup straight from quantized ggml blocks (numba).

A weight W [n_rows, n_cols] arrives as its raw bytes w: uint8 [n_rows, row_bytes] (a ggml tensor of
shape (n_cols, n_rows)), or for Q4_0, Q4_1, Q5_0, Q5_1 repacked eight rows at a time (repack.Repacked, made
once at load: the same bytes reordered so a vector dots 8 rows at once, ~2x faster a core). Nothing here
dequantizes a whole matrix:
- few tokens (generation): a matrix-vector kernel reads each row's blocks once and dots them with every
  token's x, chunks of rows claimed by all cores in turn. The INT8_IDS types (Q4_K, Q6_K, IQ4_XS, the grid types
  IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M; Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4 in blocks of 32) dot
  integers: x is quantized once per call to int8 with one float scale per block of 256 (the former) or 32 (the
  others), as llama.cpp does on the CPU, so the result is x8 @ dequantize(W).T, x8 the dequantized int8 x, to
  float32 rounding; |x8 - x| <= amax/254 per element (amax of its block of x). MXFP4's x scales are rounded to fp16
  as llama.cpp's q8_0 blocks store them (MXFP4_INT8_X). The 4-bit codebook types (MXFP4, IQ4_NL, IQ4_XS) look their
  values up by a byte shuffle, the grid types gather theirs from their grid. Other types dot float32 x: Q5_K fused,
  the rest (Q2_K, Q3_K, F16, BF16) decoded to a float32 row first.
- many tokens (prompt): the INT8_IDS types go through an int8 GEMM (gemm: x quantized per 32 values, the IQ
  types' per 256 as llama.cpp's q8_K, so the result is x8 @ dequantize(W).T too); for the others tiles of rows are
  dequantized to float32 and multiplied with numpy BLAS; these and the float32 matvecs match x @ dequantize(W).T
  to float32 rounding.

Kernels compile once per argument layout and are cached on disk (numba cache=True); w is meant to be a
read-only view of the file's mmap: a writable w is a second signature, compiled (and cached) apart.

This module is the entry (checks, dispatch, the prompt path); the kernels live by what they do:
types (type ids, shared values), dequant (bit-exact decoders), dot_float (float32-x dots: Q5_K's, IQ4's),
ir + dot_int8 (int8-x dots as LLVM IR intrinsics), repack + dot_x8 (the layout of 8 rows and its
dots), matvec (the parallel drivers), gemm_int8 + gemm (the prompt's int8 GEMM); cache says how an
edit to one reaches the cached kernels of the others.
"""
import numpy as np

from kernels.cpu.dequant import decode_rows
from kernels.cpu.dot_int8 import quantize_q8
from kernels.cpu.gemm import gemm_int8, padded_tokens, quantize_biased
from kernels.cpu.gemm_int8 import x_bias
from kernels.cpu.matvec import (MATVEC_CHUNKS, N_WORKERS, expert_ffn_int8, expert_matvecs_int8, glu_matvecs_int8,
                                matvec_add_int8, matvec_decoded, matvec_fused, matvecs_int8)
from kernels.cpu.ops import ACTIVATIONS, GELU_TABLE
from kernels.cpu.repack import ROWS, Repacked
from kernels.cpu.types import DECODED_IDS, F16_TO_F32, F32, FUSED_IDS, INT8_IDS, IQ_IDS, K256_IDS, MXFP4, N16
from models.ggml_types import GGMLType, UnsupportedTypeError

# their GEMM's x per 256, as llama.cpp's q8_K (per 32 cost parity)
IQ_K256_IDS = tuple(t for t in K256_IDS if t in IQ_IDS)
MATVEC_MAX_TOKENS = 4  # up to this many tokens the matvec kernel beats dequantize + BLAS
# MXFP4's matmuls round x to int8 blocks of 32 (as llama.cpp's CPU does); the GPU tests' float32 reference
# (gpu_compare.float_activations) turns this off, and MXFP4 then dequantizes rows as the other decoded types do
MXFP4_INT8_X = True


def takes_int8(tid: int) -> bool:
    """Whether matrices of type tid take the int8 kernels now (INT8_IDS, which the GPU tests' float32 reference
    empties; MXFP4 only while MXFP4_INT8_X)."""
    return tid in INT8_IDS and (tid != MXFP4 or MXFP4_INT8_X)
TILE_BYTES = 1 << 23  # float32 bytes of one dequantized tile of rows in the prompt path (few, big BLAS calls)


def _check(w: np.ndarray, qtype: GGMLType) -> None:
    if qtype.id not in DECODED_IDS and qtype.id != F32:
        raise UnsupportedTypeError(f"no CPU kernel for ggml type {qtype.name}")
    if w.dtype != np.uint8 or w.ndim != 2 or w.shape[1] % qtype.block_bytes:
        raise ValueError(f"{qtype.name} weight must be uint8 [n_rows, k * {qtype.block_bytes}], got "
                         f"{w.dtype} {w.shape}")
    if not w.flags.c_contiguous:
        raise ValueError("weight bytes must be C-contiguous")


def _read_only(w: np.ndarray) -> np.ndarray:
    """w, or a read-only view of it: a kernel compiles once for read-only weights (the file's mmap) where a writable
    array would compile it again, and a tuple of weights compiles as one type only if all are alike."""
    if w.flags.writeable:
        w = w.view()
        w.flags.writeable = False
    return w


# matvecs_int8 compiles once for each length of its tuples (~25 s on 2 cores: every quant type's dots are in it), so
# the calls pad theirs to one of these lengths with empty matrices, which get no rows to do
MATVEC_ARITIES = (4, 16)
_NO_ROWS = _read_only(np.empty((0, 0), np.uint8))
_NO_OUT = np.empty((0, 0), np.float32)


def padded_matvecs_args(tids: tuple, ws: tuple, outs: tuple) -> tuple[tuple, tuple, tuple]:
    """(tids, ws, outs) padded to the next length of MATVEC_ARITIES (kept as they are past the last): the padding's
    type is tids[0]'s, so x is quantized for no other block size."""
    pad = next((n for n in MATVEC_ARITIES if n >= len(ws)), len(ws)) - len(ws)
    return tids + tids[:1] * pad, ws + (_NO_ROWS,) * pad, outs + (_NO_OUT,) * pad


def matvecs(tids: tuple, ws: tuple, x: np.ndarray, outs: tuple, own_row: bool = False, n_chunks: int = MATVEC_CHUNKS,
            n_workers: int = N_WORKERS) -> None:
    """matvecs_int8 on these matrices (read-only, checked by the caller), their tuples padded."""
    tids, ws, outs = padded_matvecs_args(tids, tuple(_read_only(w) for w in ws), outs)
    matvecs_int8(tids, ws, x, outs, F16_TO_F32, n_chunks, n_workers, own_row)


def n_cols_of(w: np.ndarray, qtype: GGMLType) -> int:
    return w.shape[1] // qtype.block_bytes * qtype.block_elems


def dequantize_rows(w: np.ndarray, qtype: GGMLType, rows: np.ndarray) -> np.ndarray:
    """Rows of the dequantized weight (an embedding lookup): float32 [len(rows), n_cols].

    w: uint8 [n_rows, row_bytes]; rows: int [n]."""
    _check(w, qtype)
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    if rows.size and (rows.min() < 0 or rows.max() >= w.shape[0]):
        raise IndexError(f"row index out of range [0, {w.shape[0]})")
    if qtype.id == F32:
        return w.view(np.float32)[rows]
    out = np.empty((rows.size, n_cols_of(w, qtype)), np.float32)
    decode_rows(qtype.id, _read_only(w), rows, out, F16_TO_F32, N16)
    return out


def _shape(w: np.ndarray | Repacked, qtype: GGMLType) -> tuple[int, int]:
    """(n_rows, n_cols) of W given as its bytes (checked) or repacked."""
    if isinstance(w, Repacked):
        return w.n_rows, n_cols_of(w.data, qtype) // ROWS
    _check(w, qtype)
    return w.shape[0], n_cols_of(w, qtype)


def _kernel_args(w: np.ndarray | Repacked, qtype: GGMLType) -> tuple[int, np.ndarray]:
    """(type id, read-only bytes) of an int8 kernel's weight."""
    return (w.tid, w.data) if isinstance(w, Repacked) else (qtype.id, _read_only(w))


def _matmul_args(w: np.ndarray | Repacked, qtype: GGMLType, x: np.ndarray, out: np.ndarray | None):
    """(x, out) of y = x @ W.T checked: x C-contiguous, out allocated when None."""
    n_rows, n_cols = _shape(w, qtype)
    if x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != n_cols:
        raise ValueError(f"x must be float32 [n_tokens, {n_cols}], got {x.dtype} {x.shape}")
    x = np.ascontiguousarray(x)
    n_tokens = x.shape[0]
    if out is None:
        out = np.empty((n_tokens, n_rows), np.float32)
    elif out.shape != (n_tokens, n_rows) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous float32 [{n_tokens}, {n_rows}], got {out.dtype} {out.shape}")
    return x, out


def quantized_matmul(w: np.ndarray | Repacked, qtype: GGMLType, x: np.ndarray,
                     out: np.ndarray | None = None) -> np.ndarray:
    """y = x @ W.T for W [n_rows, n_cols] given as its quantized bytes w: uint8 [n_rows, row_bytes], or repacked
    (repack) from bytes of type qtype.

    x: float32 [n_tokens, n_cols] -> float32 [n_tokens, n_rows] (written into out when given)."""
    x, out = _matmul_args(w, qtype, x, out)
    n_tokens, n_rows, n_cols = x.shape[0], out.shape[1], x.shape[1]
    w = w if isinstance(w, Repacked) else _read_only(w)
    if isinstance(w, Repacked):
        if n_tokens <= MATVEC_MAX_TOKENS:
            matvecs((w.tid,), (w.data,), x, (out,))
        else:
            _gemms([w], [qtype], x, [out])
    elif qtype.id == F32:
        np.matmul(x, w.view(np.float32).T, out=out)
    elif n_tokens <= MATVEC_MAX_TOKENS:
        if takes_int8(qtype.id):
            matvecs((qtype.id,), (w,), x, (out,))
        elif qtype.id in FUSED_IDS:
            matvec_fused(qtype.id, w, x, out, F16_TO_F32, N16, min(n_rows, MATVEC_CHUNKS))
        else:
            matvec_decoded(qtype.id, w, x, out, F16_TO_F32, N16, min(n_rows, MATVEC_CHUNKS))
    elif takes_int8(qtype.id):
        _gemms([w], [qtype], x, [out])
    else:
        tile_rows = max(1, TILE_BYTES // (4 * n_cols))
        tile = np.empty((min(tile_rows, n_rows), n_cols), np.float32)  # dequantized rows r0:r1
        for r0 in range(0, n_rows, tile_rows):
            r1 = min(r0 + tile_rows, n_rows)
            decode_rows(qtype.id, w, np.arange(r0, r1), tile[:r1 - r0], F16_TO_F32, N16)
            np.matmul(x, tile[:r1 - r0].T, out=out[:, r0:r1])
    return out


def q8_0_blocks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [n_tokens, n_cols] (C-contiguous float32) as llama.cpp's q8_0 blocks: (xq int8 [n_tokens, n_cols], xd
    float32 [n_tokens, n_cols // 32]), x ~ xq times its block's xd, xd rounded to fp16 as a q8_0 block stores it:
    x as the MXFP4 kernels see it (they round xd to fp16 themselves; the tests' reference)."""
    xq = np.empty(x.shape, np.int8)
    xd = np.empty((x.shape[0], x.shape[1] // 32), np.float32)
    quantize_q8(x, xq, xd, np.empty((x.shape[0], x.shape[1] // 16), np.int16))
    return xq, xd.astype(np.float16).astype(np.float32)


def _gemms(ws: list, qtypes: list[GGMLType], x: np.ndarray, outs: list[np.ndarray]) -> None:
    """outs[m] = x8 @ W_m.T for INT8_IDS matrices (bytes or repacked) sharing x (C-contiguous, checked): x
    quantized once per kind in use, in blocks of 32 (IQ4_XS: of 256, as llama.cpp's q8_K), its bytes biased or
    signed (x_bias); MXFP4's scales rounded to fp16, as its q8_0."""
    n_padded, n_cols = padded_tokens(len(x)), x.shape[1]
    xs = {}  # (block, bias, fp16 scales) -> (xu, xd, xds)
    for w, qtype, out in zip(ws, qtypes, outs):
        kind = (256 if qtype.id in IQ_K256_IDS else 32, x_bias(qtype.id), qtype.id == MXFP4)
        if kind not in xs:
            if (*kind[:2], False) not in xs:
                xu = np.empty((n_padded, n_cols), np.uint8)
                xd, xds = np.empty((n_padded, n_cols // 32), np.float32), np.empty((n_padded, n_cols // 32), np.float32)
                quantize_biased(x, xu, xd, xds, *kind[:2])
                xs[*kind[:2], False] = xu, xd, xds
            xu, xd, xds = xs[*kind[:2], False]
            xs[kind] = xu, xd.astype(np.float16).astype(np.float32) if kind[2] else xd, xds  # MXFP4 reads no xds
        gemm_int8(*_kernel_args(w, qtype), *xs[kind], out, F16_TO_F32, N_WORKERS)


def quantized_matvecs_own_rows(ws: list[np.ndarray], qtypes: list[GGMLType], x: np.ndarray) -> list[np.ndarray]:
    """[quantized_matmul(w, qtype, x[m:m + 1]) for the m-th w]: each matrix by its own row of x, in one parallel
    region when all are INT8_IDS types (a token's chosen experts' down projections), else one call each."""
    if len(ws) != len(x) or not all(takes_int8(q.id) for q in qtypes):
        return [quantized_matmul(w, q, x[m:m + 1]) for m, (w, q) in enumerate(zip(ws, qtypes))]
    x = _matmul_args(ws[0], qtypes[0], np.ascontiguousarray(x, np.float32), None)[0]
    outs = tuple(np.empty((1, w.shape[0]), np.float32) for w in ws)
    for w, q in zip(ws, qtypes):
        _check(w, q)
    matvecs(tuple(q.id for q in qtypes), tuple(ws), x, outs, own_row=True)
    return list(outs)


def _check_stacks(stacks: tuple[np.ndarray, ...], qtypes: tuple[GGMLType, ...]) -> tuple[int, int, int]:
    """(n_expert, n_rows, n_cols) of expert stacks that share them, checked: C-contiguous uint8 of INT8_IDS types."""
    lead = stacks[0].shape[:2]  # (n_expert, n_rows)
    n_cols = stacks[0].shape[-1] // qtypes[0].block_bytes * qtypes[0].block_elems
    for w, q in zip(stacks, qtypes):
        shape = w.shape  # read once: each read builds a new tuple (~0.2 us)
        if (q.id not in INT8_IDS or w.dtype != np.uint8 or len(shape) != 3 or not w.flags.c_contiguous
                or shape[:2] != lead or shape[2] % q.block_bytes
                or shape[2] // q.block_bytes * q.block_elems != n_cols):
            raise ValueError(f"expert stacks must be C-contiguous uint8 {stacks[0].shape[:2]} + (row_bytes,) of "
                             f"INT8_IDS types, {n_cols} columns; got {q.name} {w.dtype} {w.shape} strides {w.strides}")
    return lead[0], lead[1], n_cols


def _expert_args(stacks: tuple[np.ndarray, ...], qtypes: tuple[GGMLType, ...], ids: np.ndarray, x: np.ndarray,
                 own_rows: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """(ids int32, x C-contiguous, n_rows) of an expert kernel's call, checked: INT8_IDS stacks of one token's x."""
    _, n_rows, n_cols = _check_stacks(stacks, qtypes)
    ids = np.ascontiguousarray(ids, np.int32)
    if x.dtype != np.float32 or x.shape != ((len(ids) if own_rows else 1), n_cols):
        raise ValueError(f"x must be float32 [{len(ids) if own_rows else 1}, {n_cols}], got {x.dtype} {x.shape}")
    return ids, np.ascontiguousarray(x), n_rows


def expert_matvecs(stacks: tuple[np.ndarray, ...], qtypes: tuple[GGMLType, ...], ids: np.ndarray, x: np.ndarray,
                   own_rows: bool = False) -> np.ndarray:
    """One token's chosen experts of stacks of INT8_IDS matrices sharing n_rows (a mixture of experts' gate and up;
    its downs): float32 [len(stacks), k, n_rows], [m, s] = x[0] @ W.T (own_rows: x[s] @ W.T) for W expert ids[s]
    of stacks[m], what quantized_matmuls (quantized_matvecs_own_rows) gives those k matrices, in one kernel call.

    stacks: uint8 [n_expert, n_rows, row_bytes_m] (a GGUF file's stack: C-contiguous), ids: int [k],
    x: float32 [1 or k, n_cols]. Checked once a call, not per expert: the decode step calls this twice a layer."""
    ids, x, n_rows = _expert_args(stacks, qtypes, ids, x, own_rows)
    out = np.empty((len(stacks), len(ids), n_rows), np.float32)
    expert_matvecs_int8(tuple(q.id for q in qtypes), tuple(_read_only(w) for w in stacks), ids, x, out, F16_TO_F32,
                        MATVEC_CHUNKS, N_WORKERS, own_rows)
    return out


NO_NORM = _read_only(np.zeros(0, np.float32))  # read-only as a norm weight: one signature of matvec_add_int8
NO_BIAS = np.zeros((0, 0), np.float32)


class OneTokenExperts:
    """A mixture-of-experts layer's stacks (gate, up, down) for ONE token's chosen experts, checked and their kernels'
    arguments built once, as OneToken does for a dense layer's matrices: expert_matvecs checks the stacks every call
    (~5 us on the 2-core VM), and a decode step runs a layer's experts 48 times a token on Qwen3-30B-A3B. ffn runs
    the experts in one kernel call (parallel region): gate and up with the GLU, the downs and their weighted sum
    (expert_ffn_int8).

    stacks: gate, up uint8 [n_expert, n_ff, row_bytes_m], down uint8 [n_expert, n_embd, row_bytes] (a GGUF file's
    stacks: C-contiguous) of INT8_IDS types qtypes; or gate_up, down with gate_up uint8 [n_expert, 2 n_ff,
    row_bytes_m], each expert's gate rows then its up rows (gemma4's ffn_gate_up_exps), read in place: seen as
    [2 n_expert, n_ff, row_bytes_m], expert e's gate is matrix 2e and its up 2e + 1 (no copy, and no view the kernel
    would be compiled anew for). biases: None, or the experts' (gate, up, down) output biases (gpt-oss) [n_expert,
    n_ff] x 2, [n_expert, n_embd]."""

    def __init__(self, stacks: tuple[np.ndarray, ...], qtypes: tuple[GGMLType, ...],
                 biases: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None):
        self.step = 1  # expert e's gate and up are matrices step e and step e + step - 1 of the gate_up stacks
        if len(stacks) == 2:
            gate_up, down = stacks
            if gate_up.ndim != 3 or gate_up.shape[1] % 2 or not gate_up.flags.c_contiguous:
                raise ValueError(f"a gate_up stack must be C-contiguous [n_expert, 2 n_ff, row_bytes], got "
                                 f"{gate_up.shape} strides {gate_up.strides}")
            halves = gate_up.reshape(2 * gate_up.shape[0], gate_up.shape[1] // 2, gate_up.shape[2])
            stacks, qtypes, self.step = (halves, halves, down), (qtypes[0], qtypes[0], qtypes[1]), 2
        n_stacked, self.n_ff, self.n_embd = _check_stacks(stacks[:2], qtypes[:2])
        n_expert = n_stacked // self.step
        if _check_stacks(stacks[2:], qtypes[2:]) != (n_expert, self.n_embd, self.n_ff):
            raise ValueError(f"the down stack must be {n_expert} experts [{self.n_embd}, {self.n_ff}] as gate and up "
                             f"are [{self.n_ff}, {self.n_embd}], got {qtypes[2].name} {stacks[2].shape}")
        if biases is None:
            self.biases = (NO_BIAS,) * 3
        else:
            self.biases = tuple(np.ascontiguousarray(b, np.float32) for b in biases)
            if [b.shape for b in self.biases] != [(n_expert, self.n_ff)] * 2 + [(n_expert, self.n_embd)]:
                raise ValueError(f"expert biases must be [{n_expert}, {self.n_ff}] x 2, [{n_expert}, {self.n_embd}], "
                                 f"got {[b.shape for b in self.biases]}")
        # read-only views of their own: the kernels get the shapes checked here, whatever is done to the arrays given
        gate, up, down = (w.view() for w in stacks)
        for v in (gate, up, down):
            v.flags.writeable = False
        self.gate_up_tids, self.gate_up = (qtypes[0].id, qtypes[1].id), (gate, up)
        self.down_tid, self.down = qtypes[2].id, down

    def ffn(self, h: np.ndarray, ids: np.ndarray, weights: np.ndarray, activation: str,
            out: np.ndarray | None = None) -> np.ndarray:
        """The sum over slots s of weights[s] * down(ops.glu(gate h, up h, activation)) of expert ids[s] (each output
        plus its bias, if any): float32 [1, n_embd], written into out when given. What weights @ expert_matvecs of the
        downs on ops.glu of expert_matvecs' gate and up gives, to float32 rounding (the same dots, summed in slot
        order).

        h: float32 [1, n_embd], ids: int [k], weights: float [k], out: C-contiguous float32 [1, n_embd] or None."""
        ids, weights = np.ascontiguousarray(ids, np.int32), np.ascontiguousarray(weights, np.float32)
        if h.dtype != np.float32 or h.shape != (1, self.n_embd):
            raise ValueError(f"h must be float32 [1, {self.n_embd}], got {h.dtype} {h.shape}")
        if ids.ndim != 1 or weights.shape != ids.shape or not len(ids):
            raise ValueError(f"ids and weights must be [k] alike, k >= 1, got {ids.shape} and {weights.shape}")
        if out is None:
            out = np.empty((1, self.n_embd), np.float32)
        elif out.dtype != np.float32 or out.shape != (1, self.n_embd) or not out.flags.c_contiguous:
            raise ValueError(f"out must be C-contiguous float32 [1, {self.n_embd}], got {out.dtype} {out.shape}")
        expert_ffn_int8(self.gate_up_tids, self.gate_up, self.step, self.down_tid, self.down, ids, weights,
                        np.ascontiguousarray(h), ACTIVATIONS[activation], self.biases, GELU_TABLE, out, F16_TO_F32,
                        MATVEC_CHUNKS, N_WORKERS)
        return out


def quantized_matmuls(ws: list[np.ndarray | Repacked], qtypes: list[GGMLType], x: np.ndarray) -> list[np.ndarray]:
    """[quantized_matmul(w, qtype, x) for each w], bit for bit, for matrices that multiply the same x (a layer's
    q, k, v; gate, up). Up to MATVEC_MAX_TOKENS tokens, the INT8_IDS matrices go in one kernel call: x is
    quantized once and all their rows run in one parallel region; more tokens, the INT8_IDS matrices' GEMMs
    share one quantization of x; the other matrices go one call each."""
    few = x.ndim == 2 and len(x) <= MATVEC_MAX_TOKENS
    fused = [i for i, qtype in enumerate(qtypes) if few and takes_int8(qtype.id)]
    gemm = [i for i, qtype in enumerate(qtypes) if x.ndim == 2 and not few and takes_int8(qtype.id)]
    outs = [None if i in fused or i in gemm else quantized_matmul(w, qtype, x)
            for i, (w, qtype) in enumerate(zip(ws, qtypes))]
    for i in fused + gemm:
        x, outs[i] = _matmul_args(ws[i], qtypes[i], x, None)
    if fused:
        tids, datas = zip(*[_kernel_args(ws[i], qtypes[i]) for i in fused])
        matvecs(tids, datas, x, tuple(outs[i] for i in fused))
    if gemm:
        _gemms([ws[i] for i in gemm], [qtypes[i] for i in gemm], x, [outs[i] for i in gemm])
    return outs




class OneToken:
    """Matrices that multiply the same x of ONE token (a layer's q, k, v; its gate, up; its attention output; its
    down projection) in a decode step, their types and shapes checked and the kernel's arguments built once, here:
    the checks, lists and tuples of a quantized_matmuls call cost ~20 us a call on the 2-core machine, 4 calls a
    layer, ~2.5 ms of SmolLM2's ~14 ms token. The results are those of quantized_matmuls (the same kernel).

    ws: INT8_IDS matrices' bytes or repacked ones (int8 says whether all are; callers take quantized_matmuls
    otherwise), sharing n_cols."""

    def __init__(self, ws: list, qtypes: list[GGMLType]):
        self.int8 = all(isinstance(w, Repacked) or takes_int8(q.id) for w, q in zip(ws, qtypes))
        shapes = [_shape(w, q) for w, q in zip(ws, qtypes)]
        if len({c for _, c in shapes}) != 1:
            raise ValueError(f"matrices of one x must share n_cols, got {shapes}")
        self.n_rows, self.n_cols = tuple(r for r, _ in shapes), shapes[0][1]
        self.tids, self.datas = (tuple(a) for a in zip(*[_kernel_args(w, q) for w, q in zip(ws, qtypes)]))
        self.padded_tids, self.padded_datas, self.padding_outs = padded_matvecs_args(self.tids, self.datas, ())

    def _x(self, x: np.ndarray) -> np.ndarray:
        if x.dtype != np.float32 or x.shape != (1, self.n_cols) or not x.flags.c_contiguous:
            raise ValueError(f"x must be C-contiguous float32 [1, {self.n_cols}], got {x.dtype} {x.shape}")
        return x

    def matmuls(self, x: np.ndarray) -> tuple[np.ndarray, ...]:
        """(x @ W_m.T for each matrix): float32 [1, n_rows_m] each, in one parallel region (matvecs_int8)."""
        outs = tuple([np.empty((1, n), np.float32) for n in self.n_rows])
        matvecs_int8(self.padded_tids, self.padded_datas, self._x(x), outs + self.padding_outs, F16_TO_F32,
                     MATVEC_CHUNKS, N_WORKERS, False)
        return outs

    def glu(self, x: np.ndarray, activation: str) -> np.ndarray | None:
        """activation(x @ W_0.T) * (x @ W_1.T) for two matrices of one type and shape (a layer's gate and up), float32
        [1, n_rows], in their matvecs' parallel region (glu_matvecs_int8): ops.glu of matmuls' two results, bit
        for bit. None where the two differ in type or shape (the caller then takes matmuls and ops.glu)."""
        if len(self.tids) != 2 or self.tids[0] != self.tids[1] or self.datas[0].shape != self.datas[1].shape \
                or self.n_rows[0] != self.n_rows[1]:
            return None
        out = np.empty((1, self.n_rows[0]), np.float32)
        glu_matvecs_int8(self.tids, self.datas, self._x(x), activation == "gelu", GELU_TABLE, out, F16_TO_F32,
                         MATVEC_CHUNKS, N_WORKERS)
        return out

    def add_matmul(self, x: np.ndarray, resid: np.ndarray, norm: np.ndarray | None = None,
                   eps: float = 0.0) -> np.ndarray:
        """resid + x @ W.T (one matrix; norm: resid + rms_norm(x @ W.T) * norm), float32 [1, n_rows], the add (and
        the norm) in the matvec's call (matvec_add_int8)."""
        if len(self.n_rows) != 1 or resid.dtype != np.float32 or resid.shape != (1, self.n_rows[0]):
            raise ValueError(f"one matrix and resid float32 [1, {self.n_rows[0]}], got {resid.dtype} {resid.shape}")
        out = np.empty((1, self.n_rows[0]), np.float32)
        matvec_add_int8(self.tids, self.datas, self._x(x), np.ascontiguousarray(resid),
                        NO_NORM if norm is None else _read_only(norm), eps, out, F16_TO_F32, MATVEC_CHUNKS, N_WORKERS)
        return out
