"""Launchers for a mixture of experts on the GPU: routing (kernels/cuda/moe.cu) and matvecs over the chosen experts
(kernels/cuda/matvec.cu's moe_*), for one token (decode) or a prompt chunk alike.

The router's choice never leaves the device: moe_route writes each token's k expert ids and weights into
device buffers and the expert matvecs read them there, so a decode step with experts is one captured graph
whatever the experts chosen. A "pair" is a token and one of its k slots: pair p = (token p // k, slot p % k).
Activations are q8_1 (kernels/cuda/quant.py) as in the dense matvecs; expert stacks are quantized types only.
"""
from dataclasses import dataclass

import cupy as cp
import numpy as np

from kernels.cuda.layout import ELEMS_PER_ITEM, expert_rows
from kernels.cuda.module import Kernel, kernel
from kernels.cuda.ops import GLU_ACTIVATIONS, NULL
from kernels.cuda.quant import (FLOAT_TYPES, THREADS, DeviceWeight, Q8Vector, default_threads_per_row, matrix_shape,
                                to_device)
from models.ggml_types import GGMLType, UnsupportedTypeError

MAX_USED = 32  # moe_route keeps one choice a lane of a warp


@dataclass(frozen=True)
class DeviceExperts:
    """n_expert matrices [n_rows, n_cols] in VRAM as one weight of n_expert * n_rows rows (expert e's rows are
    e * n_rows ..), in cuda_layout's layout: the matvecs index it by expert, the prompt path dequantizes runs of
    experts at once. In host memory (in_host) gap_rows other rows may lie between one expert's rows and the next's:
    expert e's rows are then e * expert_rows ..; only gate_up_glu reads such a stack."""
    weight: DeviceWeight
    n_expert: int
    in_host: bool = False  # the file's bytes in pinned host memory, read in place (experts_in_host_memory)
    gap_rows: int = 0  # gemma4's gate or up read in place from ffn_gate_up_exps: the other's n_ff rows

    @property
    def n_rows(self) -> int:
        return self.weight.n_rows // self.n_expert

    @property
    def expert_rows(self) -> int:
        """Rows from one expert's first row to the next's."""
        return self.n_rows + self.gap_rows

    @property
    def n_cols(self) -> int:
        return self.weight.n_cols

    @property
    def qtype(self) -> GGMLType:
        return self.weight.qtype

    @property
    def kernels(self) -> str:
        """The suffix of the matvec.cu kernels that read this stack's layout."""
        return HOST_KERNELS[self.qtype.name] if self.in_host else self.qtype.name.lower()


# types whose stacks the decode kernels read in the file's own layout, and those kernels' suffix: Q4_K and Q5_K
# keep that layout in VRAM too; Q6_K's 210-byte and MXFP4's 17-byte blocks have kernels of their own
HOST_KERNELS = {"Q4_K": "q4_k", "Q5_K": "q5_k", "Q6_K": "q6_k_file", "MXFP4": "mxfp4_file"}


def experts_in_host_memory(raw: np.ndarray, qtype: GGMLType) -> DeviceExperts | None:
    """raw uint8 [n_expert, n_rows, row_bytes] in registered (pinned) host memory -> a stack the decode kernels
    read in place over PCIe (unified addressing: the host address is the device's), or None for a type without
    such kernels or a layout they do not read. raw may be a view of a stacked tensor with other rows between its
    experts (gemma4's gate or up of ffn_gate_up_exps), each expert's rows back to back (layout.expert_rows). Takes
    no VRAM; raw must stay registered while it is used."""
    step = expert_rows(raw)
    if qtype.name not in HOST_KERNELS or step is None:
        return None
    n_expert, n_rows, row_bytes = raw.shape
    _, n_cols = matrix_shape(raw[0], qtype)
    span = (n_expert - 1) * step * row_bytes + n_rows * row_bytes  # raw's first byte to its last
    memory = cp.cuda.UnownedMemory(raw.ctypes.data, span, raw)  # holds raw, so its mapping
    data = cp.ndarray((span,), cp.uint8, cp.cuda.MemoryPointer(memory, 0))
    return DeviceExperts(DeviceWeight(data, qtype, n_expert * n_rows, n_cols), n_expert, in_host=True,
                         gap_rows=step - n_rows)


def experts_to_device(raw: np.ndarray, qtype: GGMLType) -> DeviceExperts:
    """raw uint8 [n_expert, n_rows, row_bytes] (a stacked tensor's bytes from the file) -> VRAM."""
    if qtype.name in FLOAT_TYPES:
        raise UnsupportedTypeError(f"the GPU has no kernels for {qtype.name} experts yet: keep them on the CPU "
                                   "with --cpu-moe, or run with --device cpu")
    return DeviceExperts(to_device(raw.reshape(-1, raw.shape[2]), qtype), raw.shape[0])


def route(logits: cp.ndarray, ids: cp.ndarray, weights: cp.ndarray, stream=None) -> None:
    """logits float32 [n_tok, n_expert] -> ids int32 [n_tok, k] and weights float32 [n_tok, k] (kernels/cuda/moe.cu)."""
    n_tok, n_expert = logits.shape
    k = ids.shape[1]
    if not 0 < k <= min(n_expert, MAX_USED) or ids.shape != (n_tok, k) or weights.shape != (n_tok, k):
        raise ValueError(f"route: ids and weights must be [{n_tok}, k], 0 < k <= {min(n_expert, MAX_USED)}")
    if logits.dtype != cp.float32 or ids.dtype != cp.int32 or weights.dtype != cp.float32:
        raise ValueError("route: logits and weights are float32, ids int32")
    with stream or cp.cuda.get_current_stream():
        kernel("moe.cu", "moe_route")((n_tok,), (32,), (logits, np.int32(n_expert), np.int32(k), ids, weights),
                                      shared_mem=4 * n_expert)


def scale_weights(ids: cp.ndarray, weights: cp.ndarray, scales: cp.ndarray, stream=None) -> None:
    """weights [n_tok, k] *= scales[ids] in place: each chosen expert's output scale (float32 [n_expert], gemma4)."""
    if ids.shape != weights.shape or ids.dtype != cp.int32 or weights.dtype != cp.float32 or scales.dtype != cp.float32 \
            or scales.ndim != 1 or not (ids.flags.c_contiguous and weights.flags.c_contiguous):
        raise ValueError("scale_weights: contiguous ids int32 and weights float32 of one shape, scales float32 [n_expert]")
    with stream or cp.cuda.get_current_stream():
        kernel("moe.cu", "moe_scale_weights")((-(-ids.size // 256),), (256,), (ids, weights, scales, np.int32(ids.size)))


ROUTER_CHUNKS = 4  # moe.cu: float4 chunks of x a thread of moe_norm_router_route


def _check_bias(name: str, bias: cp.ndarray | None, shape: tuple) -> None:
    """An optional bias (gpt-oss's experts and router): None, or contiguous float32 of the shape."""
    if bias is not None and (not isinstance(bias, cp.ndarray) or bias.dtype != cp.float32 or bias.shape != shape
                             or not bias.flags.c_contiguous):
        raise ValueError(f"{name} must be None or a contiguous float32 CuPy array of shape {shape}")


def _ptr(bias: cp.ndarray | None):
    return NULL if bias is None else bias


def norm_router_route(x: cp.ndarray, norm: cp.ndarray, eps: float, router: DeviceWeight, h: cp.ndarray, hq: Q8Vector,
                      logits: cp.ndarray, ids: cp.ndarray, weights: cp.ndarray, done: cp.ndarray,
                      bias: cp.ndarray | None = None, stream=None) -> None:
    """One token's FFN norm and router in one launch: h = rms_norm(x [n_embd], norm, eps) (also as q8_1 into
    hq), logits [n_expert] = router (F32 [n_expert, n_embd]) . h (+ bias [n_expert]), then route's choice into
    ids [1, k] and weights [1, k]. done: uint32 [1], zero, and zero again after."""
    n_expert, n_embd, k = router.n_rows, router.n_cols, ids.shape[1]
    threads = -(-n_embd // (4 * ROUTER_CHUNKS * 32)) * 32
    if router.qtype.name != "F32" or n_embd % 32 or threads > 1024:
        raise ValueError(f"norm_router_route: an F32 router with a multiple of 32 columns, at most "
                         f"{ROUTER_CHUNKS * 4 * 1024}")
    for name, a in (("x", x), ("norm", norm), ("h", h)):
        if a.dtype != cp.float32 or a.shape != (n_embd,):
            raise ValueError(f"norm_router_route: {name} must be float32 [{n_embd}]")
    if logits.shape != (n_expert,) or hq.qs.size != n_embd:
        raise ValueError(f"norm_router_route: logits [{n_expert}], hq of {n_embd} values")
    if not 0 < k <= min(n_expert, MAX_USED) or ids.shape != (1, k) or weights.shape != (1, k):
        raise ValueError(f"norm_router_route: ids and weights must be [1, k], 0 < k <= {min(n_expert, MAX_USED)}")
    _check_bias("norm_router_route: bias", bias, (n_expert,))
    args = (x, norm, np.float32(eps), router.data, _ptr(bias), np.int32(n_embd), np.int32(n_expert), np.int32(k), h,
            hq.qs, hq.ds, logits, ids, weights, done)
    with stream or cp.cuda.get_current_stream():
        kernel("moe.cu", "moe_norm_router_route")((n_expert,), (threads,), args, shared_mem=4 * n_expert)


def _grid_args(w: DeviceExperts, n_items: int, n_matrices: int) -> tuple[int, int]:
    """(row blocks a matrix, threads a row) for n_matrices products of w's rows with n_items items a row."""
    tpr = default_threads_per_row(w.n_rows * n_matrices, n_items)
    return (w.n_rows + THREADS // tpr - 1) // (THREADS // tpr), tpr


def gate_up(ws: tuple[DeviceExperts, ...], ids: cp.ndarray, xq: Q8Vector, out: cp.ndarray, biases: tuple | None = None,
            stream=None) -> None:
    """out[z, p] = ws[z][ids[p]] . x[p // k] (+ biases[z][ids[p]]) for one or two stacks of one type and shape (gate
    and up).

    ids int32 [n_tok, k]; xq: q8_1 of x [n_tok, n_cols]; out float32 [len(ws), n_tok * k, n_rows]; biases: one a
    stack, each None or float32 [n_expert, n_rows] (gpt-oss)."""
    w = ws[0]
    n_tok, k = ids.shape
    biases = biases or (None,) * len(ws)
    if len(ws) not in (1, 2) or any((v.qtype, v.n_rows, v.n_cols) != (w.qtype, w.n_rows, w.n_cols) or v.gap_rows
                                    for v in ws) or len(biases) != len(ws):
        raise ValueError("gate_up: one or two expert stacks of one type and shape, no gap_rows, a bias (or None) each")
    if xq.qs.size != n_tok * w.n_cols or out.shape != (len(ws), n_tok * k, w.n_rows) or out.dtype != cp.float32:
        raise ValueError(f"gate_up: xq of {n_tok} x {w.n_cols}, out float32 [{len(ws)}, {n_tok * k}, {w.n_rows}]")
    for b in biases:
        _check_bias("gate_up: a bias", b, (w.n_expert, w.n_rows))
    blocks, tpr = _grid_args(w, w.n_cols // ELEMS_PER_ITEM[w.qtype.name], len(ws) * n_tok * k)
    args = (w.weight.data, ws[-1].weight.data, _ptr(biases[0]), _ptr(biases[-1]), ids, np.int32(k), xq.qs, xq.ds, out,
            np.int32(w.n_rows),
            np.int32(w.weight.n_rows), np.int32(w.n_cols // w.qtype.block_elems), np.int32(tpr))
    with stream or cp.cuda.get_current_stream():
        kernel("matvec.cu", "moe_matvec_" + w.kernels)((blocks, n_tok * k, len(ws)), (THREADS,), args)


def gate_up_glu(gate: DeviceExperts, up: DeviceExperts, ids: cp.ndarray, xq: Q8Vector, out: cp.ndarray,
                out_q: Q8Vector, activation: str, biases: tuple | None = None, stream=None) -> None:
    """out[p] = activation(gate[ids[p]] . x[p // k]) * (up[ids[p]] . x[p // k]) (ops.glu's activations), and out
    quantized into out_q, in one launch: the gate, up and glu of the chosen experts. Stacks of one type, shape and
    expert_rows (gemma4's gate and up read in place from one stack), n_rows a multiple of 32. ids int32 [n_tok, k];
    xq: q8_1 of x [n_tok, n_cols]; out float32 [n_tok * k, n_rows].
    biases (gate_bias, up_bias), each None or float32 [n_expert, n_rows]: added to the expert's gate and up rows
    before the glu (gpt-oss)."""
    n_tok, k = ids.shape
    if (gate.qtype, gate.n_rows, gate.n_cols, gate.expert_rows) != (up.qtype, up.n_rows, up.n_cols, up.expert_rows) \
            or gate.n_rows % 32:
        raise ValueError("gate_up_glu: gate and up stacks of one type, shape and expert_rows, rows a multiple of 32")
    if xq.qs.size != n_tok * gate.n_cols or out.shape != (n_tok * k, gate.n_rows) or out_q.qs.size != out.size:
        raise ValueError(f"gate_up_glu: xq of {n_tok} x {gate.n_cols}, out and out_q of {n_tok * k} x {gate.n_rows}")
    gate_bias, up_bias = biases or (None, None)
    for b in (gate_bias, up_bias):
        _check_bias("gate_up_glu: a bias", b, (gate.n_expert, gate.n_rows))
    args = (gate.weight.data, up.weight.data, _ptr(gate_bias), _ptr(up_bias), ids, np.int32(k), xq.qs, xq.ds, out,
            out_q.qs, out_q.ds,
            np.int32(gate.n_rows), np.int32(gate.expert_rows), np.int32(gate.weight.n_rows),
            np.int32(gate.n_cols // gate.qtype.block_elems), np.int32(GLU_ACTIVATIONS[activation]))
    with stream or cp.cuda.get_current_stream():
        kernel("matvec.cu", "moe_gate_up_glu_" + gate.kernels)((gate.n_rows // 32, n_tok * k), (256,), args)


def down(w: DeviceExperts, ids: cp.ndarray, weights: cp.ndarray, xq: Q8Vector, out: cp.ndarray,
         residual: cp.ndarray, bias: cp.ndarray | None = None, stream=None) -> None:
    """out[t] = residual[t] + sum over slots j of weights[t, j] * (w[ids[t, j]] . x[t * k + j] + bias[ids[t, j]])
    (out may be residual; bias None or float32 [n_expert, n_rows]: gpt-oss).

    ids int32 and weights float32 [n_tok, k]; xq: q8_1 of x [n_tok * k, n_cols]; out, residual float32
    [n_tok, n_rows]."""
    n_tok, k = ids.shape
    if xq.qs.size != n_tok * k * w.n_cols or weights.shape != (n_tok, k) or w.gap_rows:
        raise ValueError(f"down: xq of {n_tok * k} x {w.n_cols}, weights [{n_tok}, {k}], a stack without gap_rows")
    for name, a in (("out", out), ("residual", residual)):
        if a.dtype != cp.float32 or a.shape != (n_tok, w.n_rows) or not a.flags.c_contiguous:
            raise ValueError(f"down: {name} must be contiguous float32 ({n_tok}, {w.n_rows}), got {a.dtype} {a.shape}")
    _check_bias("down: bias", bias, (w.n_expert, w.n_rows))
    blocks, tpr = _grid_args(w, k * w.n_cols // ELEMS_PER_ITEM[w.qtype.name], n_tok)
    args = (w.weight.data, _ptr(bias), ids, weights, np.int32(k), xq.qs, xq.ds, out, residual, np.int32(w.n_rows),
            np.int32(w.weight.n_rows), np.int32(w.n_cols // w.qtype.block_elems), np.int32(tpr),
            np.int32(not w.in_host))  # rows in host memory are not asked of L2 ahead
    with stream or cp.cuda.get_current_stream():
        kernel("matvec.cu", "moe_down_" + w.kernels)((blocks, n_tok), (THREADS,), args)


@dataclass(frozen=True)
class SortedPairs:
    """A prompt chunk's (token, slot) pairs sorted by expert on the device (moe_mm.cu's moe_sort_pairs): order
    int32 [n_pairs] the pairs by expert, in pair order within one; tiles int32 [max_tiles, 4] (expert, begin,
    end, 0) runs of at most MM_TILE_PAIRS of one expert over order; n_tiles int32 [1] how many tiles are real."""
    order: cp.ndarray
    tiles: cp.ndarray
    n_tiles: cp.ndarray


MM_TILE_PAIRS = 64  # BM of moe_mm.cu
MM_COLS_STEP = 64  # BK of moe_mm.cu: the grouped matmuls take matrices of a multiple of this many columns
MM_ROWS = 64  # BN of moe_mm.cu


def _mm_kernel(name: str, n_weights: int) -> tuple[Kernel, int]:
    """moe_mm.cu's kernel `name` with its dynamic shared memory limit raised to what it takes (x double-buffered,
    n_weights weight tiles, fp16 rows of BK + 8), and that size."""
    smem = 2 * (2 * MM_TILE_PAIRS + n_weights * MM_ROWS) * (MM_COLS_STEP + 8)
    launch = kernel("moe_mm.cu", name)
    if launch.raw.max_dynamic_shared_size_bytes < smem:
        launch.raw.max_dynamic_shared_size_bytes = smem
        launch.raw.preferred_shared_memory_carveout = 100  # percent: room for 4 blocks a multiprocessor
    return launch, smem


def sort_pairs(ids: cp.ndarray, n_expert: int, stream=None) -> SortedPairs:
    """ids int32 [n_tok, k] -> their pairs sorted by expert, on the device in one launch (no host read)."""
    n_pairs = ids.size
    if ids.dtype != cp.int32 or not ids.flags.c_contiguous:
        raise ValueError("sort_pairs: ids must be contiguous int32")
    max_tiles = (n_pairs + MM_TILE_PAIRS - 1) // MM_TILE_PAIRS + min(n_expert, n_pairs)
    with stream or cp.cuda.get_current_stream():
        pairs = SortedPairs(cp.empty(n_pairs, cp.int32), cp.empty((max_tiles, 4), cp.int32), cp.empty(1, cp.int32))
        kernel("moe_mm.cu", "moe_sort_pairs")((n_expert,), (256,), (ids, np.int32(n_pairs), np.int32(n_expert),
                                              pairs.order, pairs.tiles, pairs.n_tiles), shared_mem=4 * n_expert)
    return pairs


def grouped_supported(gate: DeviceExperts, up: DeviceExperts, down: DeviceExperts) -> bool:
    """Whether moe_mm.cu's grouped kernels take these stacks (gate_up_glu_grouped, matmul_grouped)."""
    return ((gate.qtype, gate.n_rows, gate.n_cols) == (up.qtype, up.n_rows, up.n_cols)
            and all(w.n_cols % MM_COLS_STEP == 0 and w.n_rows % 2 == 0 for w in (gate, down)))


def _check_grouped(name: str, w: DeviceExperts, x16: cp.ndarray, n_pairs: int, out: cp.ndarray, dtype) -> None:
    if w.qtype.name in FLOAT_TYPES or w.n_cols % MM_COLS_STEP or w.n_rows % 2 or w.gap_rows:
        raise ValueError(f"{name}: a quantized stack with a multiple of {MM_COLS_STEP} columns, even rows, no gap_rows")
    if x16.dtype != cp.float16 or x16.ndim != 2 or x16.shape[1] != w.n_cols or not x16.flags.c_contiguous:
        raise ValueError(f"{name}: x16 must be contiguous float16 [*, {w.n_cols}]")
    if out.dtype != dtype or out.shape != (n_pairs, w.n_rows) or not out.flags.c_contiguous:
        raise ValueError(f"{name}: out must be contiguous {np.dtype(dtype).name} [{n_pairs}, {w.n_rows}]")


def _grouped_grid(w: DeviceExperts, pairs: SortedPairs) -> tuple[int, int]:
    return (w.n_rows + MM_ROWS - 1) // MM_ROWS, pairs.tiles.shape[0]  # the most tiles


def gate_up_glu_grouped(gate: DeviceExperts, up: DeviceExperts, x16: cp.ndarray, k: int, pairs: SortedPairs,
                        out16: cp.ndarray, activation: str, biases: tuple | None = None, stream=None) -> None:
    """out16[p] = activation(gate[e] . x16[p // k]) * (up[e] . x16[p // k]) for every pair p (expert e), float16
    [n_pairs, n_rows]: the prompt's gate, up and glu in one launch over the sorted pairs (tensor cores). biases as
    gate_up_glu's."""
    if (gate.qtype, gate.n_rows, gate.n_cols) != (up.qtype, up.n_rows, up.n_cols):
        raise ValueError("gate_up_glu_grouped: gate and up stacks of one type and shape")
    _check_grouped("gate_up_glu_grouped", gate, x16, pairs.order.size, out16, cp.float16)
    gate_bias, up_bias = biases or (None, None)
    for b in (gate_bias, up_bias):
        _check_bias("gate_up_glu_grouped: a bias", b, (gate.n_expert, gate.n_rows))
    args = (gate.weight.data, up.weight.data, _ptr(gate_bias), _ptr(up_bias), np.int32(gate.n_rows), np.int32(gate.weight.n_rows),
            np.int32(gate.n_cols // gate.qtype.block_elems), x16, np.int32(k), pairs.order, pairs.tiles,
            pairs.n_tiles, out16, np.int32(GLU_ACTIVATIONS[activation]))
    launch, smem = _mm_kernel("moe_mm_glu_" + gate.qtype.name.lower(), 2)
    with stream or cp.cuda.get_current_stream():
        launch(_grouped_grid(gate, pairs), (128,), args, shared_mem=smem)


def matmul_grouped(w: DeviceExperts, x16: cp.ndarray, x_div: int, pairs: SortedPairs, out: cp.ndarray,
                   bias: cp.ndarray | None = None, stream=None) -> None:
    """out[p] = w[e] . x16[p // x_div] (+ bias[e]) for every pair p (expert e), float32 [n_pairs, n_rows] (tensor
    cores). x_div: k when x16 holds the tokens' rows, 1 when it holds the pairs' own (the down projection); bias
    None or float32 [n_expert, n_rows] (gpt-oss)."""
    _check_grouped("matmul_grouped", w, x16, pairs.order.size, out, cp.float32)
    _check_bias("matmul_grouped: bias", bias, (w.n_expert, w.n_rows))
    args = (w.weight.data, _ptr(bias), np.int32(w.n_rows), np.int32(w.weight.n_rows), np.int32(w.n_cols // w.qtype.block_elems),
            x16, np.int32(x_div), pairs.order, pairs.tiles, pairs.n_tiles, out)
    launch, smem = _mm_kernel("moe_mm_" + w.qtype.name.lower(), 1)
    with stream or cp.cuda.get_current_stream():
        launch(_grouped_grid(w, pairs), (128,), args, shared_mem=smem)


def combine(x: cp.ndarray, y: cp.ndarray, weights: cp.ndarray, out: cp.ndarray, stream=None) -> None:
    """out[t] = x[t] + sum over slots j of weights[t, j] * y[t * k + j] (the grouped path's down rows onto the
    residual). x, out float32 [n_tok, n_embd]; y float32 [n_tok * k, n_embd]; weights float32 [n_tok, k]."""
    n_tok, k = weights.shape
    n_embd = x.shape[1]
    if any(a.dtype != cp.float32 or not a.flags.c_contiguous for a in (x, y, weights, out)) or \
            x.shape != out.shape or y.shape != (n_tok * k, n_embd) or x.shape[0] != n_tok:
        raise ValueError(f"combine: contiguous float32 x, out [{n_tok}, n_embd], y [{n_tok * k}, n_embd]")
    with stream or cp.cuda.get_current_stream():
        kernel("moe_mm.cu", "moe_combine")(((n_embd + 255) // 256, n_tok), (256,),
                                           (x, y, weights, np.int32(k), np.int32(n_embd), out))
