"""Launchers for the batch-1 matrix-vector kernels of kernels/cuda/matvec.cu.

Rows x cols: a weight of ggml shape (n_cols, n_rows) (ne0 = the contiguous row) is W[n_rows, n_cols];
matvec computes out[n_rows] = W . x[n_cols] in float32.

Quantized weights multiply activations quantized to q8_1 (int8 + one float scale per 32 values, as
llama.cpp does): the int8 dot products run on dp4a, four multiply-adds an instruction, which keeps the
kernels memory-bound. Quantize an activation once with quantize_q8_1 and reuse it for every weight that
reads it (q, k and v; gate and up). F32 / F16 / BF16 weights take the float32 activation itself.

Nothing here allocates or syncs after setup (to_device, Q8Vector.empty): matvec and quantize_q8_1 only
launch on the given stream, so they can be captured into a CUDA graph.
"""
import functools
from dataclasses import dataclass

import cupy as cp
import cupyx
import numpy as np

from kernels.cuda.layout import ELEMS_PER_ITEM, META_SPLIT, repack
from kernels.cuda.module import kernel
from models.ggml_types import GGMLType

FLOAT_TYPES = ("F32", "F16", "BF16")
THREADS = 128  # a block; threads_per_row of them share a row
MATVEC_PAIRS = {("Q4_K", "Q6_K"), ("Q5_K", "Q6_K"), ("Q3_K", "Q5_K")}  # matvec.cu: MATVEC_PAIR


@dataclass(frozen=True)
class DeviceWeight:
    data: cp.ndarray  # uint8 [n_rows * row_bytes], the layout of cuda_layout.repack
    qtype: GGMLType
    n_rows: int
    n_cols: int

    @property
    def takes_q8(self) -> bool:
        """True: matvec wants a Q8Vector; False: a float32 activation."""
        return self.qtype.name not in FLOAT_TYPES


@dataclass(frozen=True)
class Q8Vector:
    """An activation quantized to q8_1: qs int8 [n], ds float32 [n // 32, 2] = (d, d * sum of 32 qs)."""

    qs: cp.ndarray
    ds: cp.ndarray

    @classmethod
    def empty(cls, n: int) -> "Q8Vector":
        if n % 32:
            raise ValueError(f"q8_1 needs a multiple of 32 values, got {n}")
        return cls(cp.empty(n, dtype=cp.int8), cp.empty((n // 32, 2), dtype=cp.float32))


def matrix_shape(raw: np.ndarray, qtype: GGMLType) -> tuple[int, int]:
    """(n_rows, n_cols) of raw uint8 [n_rows, row_bytes], checked against what the kernels take."""
    if raw.dtype != np.uint8 or raw.ndim != 2:
        raise ValueError(f"expected uint8 [n_rows, row_bytes], got {raw.dtype} {raw.shape}")
    n_rows, row_bytes = raw.shape
    if row_bytes % qtype.block_bytes:
        raise ValueError(f"{qtype.name}: row of {row_bytes} bytes is not whole blocks")
    n_cols = row_bytes // qtype.block_bytes * qtype.block_elems
    if n_cols % 32:
        raise ValueError(f"{qtype.name}: the kernels need a multiple of 32 columns, got {n_cols}")
    if qtype.name not in META_SPLIT:
        raise ValueError(f"no CUDA matvec kernel for {qtype.name}")
    return n_rows, n_cols


def to_device(raw: np.ndarray, qtype: GGMLType) -> DeviceWeight:
    """raw uint8 [n_rows, row_bytes] (a tensor's bytes from the file) -> a weight in VRAM, repacked."""
    n_rows, n_cols = matrix_shape(raw, qtype)
    return DeviceWeight(cp.asarray(repack(raw, qtype)), qtype, n_rows, n_cols)


def to_pinned(raw: np.ndarray, qtype: GGMLType) -> DeviceWeight:
    """raw -> a weight in pinned host memory, repacked as to_device does, that takes no VRAM: the copy engine
    copies it into VRAM asynchronously (gpu_share.py's ring); under unified addressing a kernel could also read
    it over PCIe directly."""
    n_rows, n_cols = matrix_shape(raw, qtype)
    host = cupyx.empty_pinned(raw.size, np.uint8)
    host[:] = repack(raw, qtype)
    memory = cp.cuda.UnownedMemory(host.ctypes.data, host.nbytes, host)  # holds host, and so its pages
    return DeviceWeight(cp.ndarray(host.shape, cp.uint8, cp.cuda.MemoryPointer(memory, 0)), qtype, n_rows, n_cols)


def quantize_q8_1(x: cp.ndarray, xq: Q8Vector, stream: cp.cuda.Stream | None = None) -> None:
    """x float32 [n] -> xq."""
    n = x.shape[0]
    if x.dtype != cp.float32 or x.shape != xq.qs.shape or not x.flags.c_contiguous:
        raise ValueError(f"quantize_q8_1: x must be contiguous float32 {xq.qs.shape}, got {x.dtype} {x.shape}")
    with stream or cp.cuda.get_current_stream():
        kernel("matvec.cu", "quantize_q8_1")(((n + 255) // 256,), (256,), (x, xq.qs, xq.ds, np.int32(n)))


def default_threads_per_row(n_rows: int, n_items: int) -> int:
    """Threads sharing a row of n_items work items: enough warps to cover memory latency (~32 a multiprocessor
    of an H100), and at least 4 items a thread (bench_cuda.py's sweep on the H100). The H200 reads faster and
    wants more threads in flight: up to 2^19 in all while a thread keeps more than 2 items (its sweep, 2026-11-28:
    Q6_K 5376x21504 at 128 threads a row 36.9 us, at 64 46.7; IQ4_XS 4096x14336 16.2 against 19.4 at 32; Q4_K
    8192x5376 12.7 at 64 against 15.1 at 32; matrices of 28672 rows or more stay fastest at 32)."""
    tpr = 32
    while tpr < 128 and (n_items // (2 * tpr) >= 4 or n_rows * tpr < 32 * 4096
                         or (n_rows * tpr < 1 << 19 and n_items > 2 * tpr)):
        tpr *= 2
    return tpr


def matvec(
    w: DeviceWeight,
    x: "cp.ndarray | Q8Vector",
    out: cp.ndarray,
    stream: cp.cuda.Stream | None = None,
    threads_per_row: int | None = None,
    residual: cp.ndarray | None = None,
) -> None:
    """out float32 [w.n_rows] = W . x (+ residual [w.n_rows], added in the same launch; out may be residual);
    x is a Q8Vector when w.takes_q8, else float32 [w.n_cols]."""
    for name, a in (("out", out), ("residual", out if residual is None else residual)):
        _check_out(name, a, w.n_rows)
    tpr = threads_per_row or default_threads_per_row(w.n_rows, w.n_cols // ELEMS_PER_ITEM[w.qtype.name])
    if tpr not in (32, 64, 128):
        raise ValueError(f"threads_per_row must be 32, 64 or 128, got {tpr}")
    grid = (_blocks(w.n_rows, tpr, matvec_rows_per_group(w)),)
    name = "matvec_" + w.qtype.name.lower()
    if w.takes_q8:
        _check_q8_input(w, x)
        nb = w.n_cols // w.qtype.block_elems
        args = (w.data, x.qs, x.ds, out, np.int32(w.n_rows), np.int32(nb), np.int32(tpr))
    else:
        if (isinstance(x, Q8Vector) or x.dtype != cp.float32 or x.shape != (w.n_cols,)
                or not x.flags.c_contiguous or x.data.ptr % 16):  # read as float4
            raise ValueError(f"matvec: {w.qtype.name} weights take a contiguous, 16-byte-aligned float32 x "
                             f"of ({w.n_cols},)")
        args = (w.data, x, out, np.int32(w.n_rows), np.int32(w.n_cols), np.int32(tpr))
    args += (out if residual is None else residual, np.int32(residual is not None))
    if w.takes_q8:
        args += (np.int32(w.data.nbytes <= matvec_prefetch_max_bytes()),)
    with stream or cp.cuda.get_current_stream():
        kernel("matvec.cu", name)(grid, (THREADS,), args)


MATVEC_MAX_TOKENS = 8  # matvec_tokens.cu's MAX_TOKENS
# quant_mma.cuh: the types whose matvec_tokens runs on the tensor cores, and the most tokens of each of their kernels
# (a step takes the smallest that fits; Q6_K's 5-8 tokens go the Items' way)
MMA_TOKENS = {"Q4_K": (4, 8), "Q5_K": (4, 8), "Q6_K": (4,), "Q8_0": (8,)}


def matvec_tokens(w: DeviceWeight, x: "cp.ndarray | Q8Vector", n_tokens: int, out: cp.ndarray,
                  stream: cp.cuda.Stream | None = None, residual: cp.ndarray | None = None,
                  parts: tuple[int, ...] = ()) -> None:
    """out float32 [n_tokens, w.n_rows] = W . x_j for each token j (+ residual [n_tokens, w.n_rows]; out may be
    residual) in one pass over W: a verify step's matmuls. x: q8_1 of [n_tokens, w.n_cols] when w.takes_q8, else
    float32 [n_tokens, w.n_cols]; at most MATVEC_MAX_TOKENS tokens. The tensor cores' kernel (16-row tiles) where the
    type has one for this many tokens, else matvec's threads and rows (matvec_tokens.cu). parts: the first rows of up
    to 3 parts after the first (a row group's members): out's memory then holds each part's [n_tokens, its rows]
    contiguous, one after the other, and residual likewise."""
    if not 1 <= n_tokens <= MATVEC_MAX_TOKENS:
        raise ValueError(f"matvec_tokens: 1 to {MATVEC_MAX_TOKENS} tokens, not {n_tokens}")
    if w.takes_q8:
        if not isinstance(x, Q8Vector) or x.qs.shape != (n_tokens * w.n_cols,):
            raise ValueError(f"matvec_tokens: x must be a Q8Vector of {n_tokens} x {w.n_cols}")
    elif (isinstance(x, Q8Vector) or x.dtype != cp.float32 or x.shape != (n_tokens, w.n_cols)
            or not x.flags.c_contiguous or x.data.ptr % 16):  # read as float4
        raise ValueError(f"matvec_tokens: {w.qtype.name} weights take a contiguous, 16-byte-aligned float32 x of "
                         f"({n_tokens}, {w.n_cols})")
    for name, a in (("out", out), ("residual", out if residual is None else residual)):
        if a.dtype != cp.float32 or a.shape != (n_tokens, w.n_rows) or not a.flags.c_contiguous:
            raise ValueError(f"matvec_tokens: {name} must be contiguous float32 ({n_tokens}, {w.n_rows}), "
                             f"got {a.dtype} {a.shape}")
    if len(parts) > 3 or list(parts) != sorted(parts) or any(not 0 < p < w.n_rows for p in parts):
        raise ValueError(f"matvec_tokens: parts must be up to 3 ascending rows inside 0..{w.n_rows}, got {parts}")
    splits = tuple(np.int32(p) for p in tuple(parts) + (w.n_rows,) * (3 - len(parts)))
    nt = next((nt for nt in MMA_TOKENS.get(w.qtype.name, ()) if n_tokens <= nt), None)
    if nt is not None:
        nb = w.n_cols // w.qtype.block_elems
        tiles = (w.n_rows + 15) // 16
        with stream or cp.cuda.get_current_stream():
            kernel("matvec_tokens.cu", f"matvec_tokens_mma_{w.qtype.name.lower()}_{nt}")(
                (tiles,), (32 * mma_warps(tiles, nb),),
                (w.data, x.qs, x.ds, out, np.int32(w.n_rows), np.int32(nb), np.int32(n_tokens),
                 out if residual is None else residual, np.int32(residual is not None)) + splits)
        return
    tpr = default_threads_per_row(w.n_rows, w.n_cols // ELEMS_PER_ITEM[w.qtype.name])
    name = "matvec_tokens_" + w.qtype.name.lower()
    if w.takes_q8:
        args = (w.data, x.qs, x.ds, out, np.int32(w.n_rows), np.int32(w.n_cols // w.qtype.block_elems))
    else:
        args = (w.data, x, out, np.int32(w.n_rows), np.int32(w.n_cols))
    args += (np.int32(tpr), np.int32(n_tokens), out if residual is None else residual, np.int32(residual is not None))
    args += splits
    with stream or cp.cuda.get_current_stream():
        kernel("matvec_tokens.cu", name)((_blocks(w.n_rows, tpr, matvec_rows_per_group(w)),), (THREADS,), args)


def mma_warps(tiles: int, n_blocks: int) -> int:
    """Warps a block of matvec_tokens_mma (one 16-row tile, its ggml blocks split over them): 4, or more up to 16
    while the grid has fewer than ~2048 warps in all (an H200's 132 multiprocessors at ~16 each keep DRAM busy), and
    no more than the row has blocks."""
    warps = 4
    while warps < 16 and tiles * warps < 2048 and 2 * warps <= n_blocks:
        warps *= 2
    return warps


def matvec_rows_per_group(w: DeviceWeight) -> int:
    """Rows a group of threads_per_row threads does in matvec: 4 for Q6_K, 2 for the other quantized types of
    256-value blocks, else 1 (matvec.cu's matvec_rows_per_group, the same rule, says why)."""
    if not w.takes_q8 or w.qtype.block_elems != 256:
        return 1
    return 4 if w.qtype.name == "Q6_K" else 2


@functools.cache
def matvec_prefetch_max_bytes() -> int:
    """The largest matrix whose rows matvec asks L2 for before it reads them: half the device's L2 (matvec.cu's
    MATVEC_Q says why)."""
    return cp.cuda.Device().attributes["L2CacheSize"] // 2


def pairs_in_one_launch(w0: DeviceWeight, w1: DeviceWeight) -> bool:
    """Whether matvec_pair takes w0 and w1: a pair of types matvec.cu compiles, of the same width."""
    kinds = {(w0.qtype.name, w1.qtype.name), (w1.qtype.name, w0.qtype.name)}
    return bool(kinds & MATVEC_PAIRS) and w0.n_cols == w1.n_cols


def matvec_pair(w0: DeviceWeight, w1: DeviceWeight, x: Q8Vector, out0: cp.ndarray, out1: cp.ndarray,
                stream: cp.cuda.Stream | None = None) -> None:
    """out0 = W0 . x and out1 = W1 . x in one launch, for two matrices of different types that read the same x
    (pairs_in_one_launch); each with matvec's default threads per row."""
    if not pairs_in_one_launch(w0, w1):
        raise ValueError(f"matvec_pair: no kernel for {w0.qtype.name} x {w0.n_cols} with {w1.qtype.name} x {w1.n_cols}")
    if (w0.qtype.name, w1.qtype.name) not in MATVEC_PAIRS:
        w0, w1, out0, out1 = w1, w0, out1, out0
    for w, out in ((w0, out0), (w1, out1)):
        _check_out("out", out, w.n_rows)
        _check_q8_input(w, x)
    tpr = [default_threads_per_row(w.n_rows, w.n_cols // ELEMS_PER_ITEM[w.qtype.name]) for w in (w0, w1)]
    blocks0 = _blocks(w0.n_rows, tpr[0])
    name = f"matvec_{w0.qtype.name.lower()}_{w1.qtype.name.lower()}"
    with stream or cp.cuda.get_current_stream():
        kernel("matvec.cu", name)(
            (blocks0 + _blocks(w1.n_rows, tpr[1]),), (THREADS,),
            (w0.data, w1.data, x.qs, x.ds, out0, out1, np.int32(w0.n_rows), np.int32(w1.n_rows),
             np.int32(w0.n_cols // w0.qtype.block_elems), np.int32(w1.n_cols // w1.qtype.block_elems),
             np.int32(tpr[0]), np.int32(tpr[1]), np.int32(blocks0)))


def _blocks(n_rows: int, tpr: int, rows_per_group: int = 1) -> int:
    per_block = THREADS // tpr * rows_per_group
    return (n_rows + per_block - 1) // per_block


def _check_out(name: str, a: cp.ndarray, n_rows: int) -> None:
    if a.dtype != cp.float32 or a.shape != (n_rows,) or not a.flags.c_contiguous:
        raise ValueError(f"matvec: {name} must be contiguous float32 ({n_rows},), got {a.dtype} {a.shape}")


def _check_q8_input(w: DeviceWeight, x) -> None:
    if not isinstance(x, Q8Vector) or x.qs.shape != (w.n_cols,):
        raise ValueError(f"matvec: {w.qtype.name} weights take a Q8Vector of {w.n_cols} (see quantize_q8_1)")
