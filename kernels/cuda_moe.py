"""Launchers for a mixture of experts on the GPU: routing (kernels/moe.cu) and matvecs over the chosen experts
(kernels/matvec.cu's moe_*), for one token (decode) or a prompt chunk alike.

The router's choice never leaves the device: moe_route writes each token's k expert ids and weights into
device buffers and the expert matvecs read them there, so a decode step with experts is one captured graph
whatever the experts chosen. A "pair" is a token and one of its k slots: pair p = (token p // k, slot p % k).
Activations are q8_1 (kernels/cuda_quant.py) as in the dense matvecs; expert stacks are quantized types only.
"""
from dataclasses import dataclass

import cupy as cp
import numpy as np

from kernels.cuda_layout import ELEMS_PER_ITEM, META_SPLIT, repack
from kernels.cuda_module import kernel
from kernels.cuda_quant import FLOAT_TYPES, THREADS, Q8Vector, matrix_shape, default_threads_per_row
from models.ggml_types import GGMLType

MAX_USED = 32  # moe_route keeps one choice a lane of a warp


@dataclass(frozen=True)
class DeviceExperts:
    """n_expert matrices [n_rows, n_cols] in VRAM, each in cuda_layout's layout, one after another."""
    data: cp.ndarray  # uint8 [n_expert * expert_bytes]
    qtype: GGMLType
    n_expert: int
    n_rows: int
    n_cols: int

    @property
    def expert_bytes(self) -> int:
        return self.data.size // self.n_expert


def experts_to_device(raw: np.ndarray, qtype: GGMLType) -> DeviceExperts:
    """raw uint8 [n_expert, n_rows, row_bytes] (a stacked tensor's bytes from the file) -> VRAM, each expert
    repacked on its own (so that every expert's matrix is laid out as a DeviceWeight's)."""
    if qtype.name in FLOAT_TYPES:
        raise ValueError(f"no CUDA expert kernels for {qtype.name} experts")
    n_expert = raw.shape[0]
    n_rows, n_cols = matrix_shape(raw[0], qtype)
    if META_SPLIT[qtype.name] == (0, 0):  # blocks kept as in the file (Q4_K, Q5_K): the stack as it is
        return DeviceExperts(cp.asarray(raw.reshape(-1)), qtype, n_expert, n_rows, n_cols)
    data = cp.empty(raw.size, cp.uint8)
    step = raw[0].size
    for e in range(n_expert):  # one expert at a time: no second host copy of the whole stack
        data[e * step:(e + 1) * step].set(repack(raw[e], qtype))
    return DeviceExperts(data, qtype, n_expert, n_rows, n_cols)


def route(logits: cp.ndarray, ids: cp.ndarray, weights: cp.ndarray, stream=None) -> None:
    """logits float32 [n_tok, n_expert] -> ids int32 [n_tok, k] and weights float32 [n_tok, k] (kernels/moe.cu)."""
    n_tok, n_expert = logits.shape
    k = ids.shape[1]
    if not 0 < k <= min(n_expert, MAX_USED) or ids.shape != (n_tok, k) or weights.shape != (n_tok, k):
        raise ValueError(f"route: ids and weights must be [{n_tok}, k], 0 < k <= {min(n_expert, MAX_USED)}")
    if logits.dtype != cp.float32 or ids.dtype != cp.int32 or weights.dtype != cp.float32:
        raise ValueError("route: logits and weights are float32, ids int32")
    with stream or cp.cuda.get_current_stream():
        kernel("moe.cu", "moe_route")((n_tok,), (32,), (logits, np.int32(n_expert), np.int32(k), ids, weights),
                                      shared_mem=4 * n_expert)


def _grid_args(w: DeviceExperts, n_items: int, n_matrices: int) -> tuple[int, int]:
    """(row blocks a matrix, threads a row) for n_matrices products of w's rows with n_items items a row."""
    tpr = default_threads_per_row(w.n_rows * n_matrices, n_items)
    return (w.n_rows + THREADS // tpr - 1) // (THREADS // tpr), tpr


def gate_up(ws: tuple[DeviceExperts, ...], ids: cp.ndarray, xq: Q8Vector, out: cp.ndarray, stream=None) -> None:
    """out[z, p] = ws[z][ids[p]] . x[p // k] for one or two stacks of one type and shape (gate and up).

    ids int32 [n_tok, k]; xq: q8_1 of x [n_tok, n_cols]; out float32 [len(ws), n_tok * k, n_rows]."""
    w = ws[0]
    n_tok, k = ids.shape
    if len(ws) not in (1, 2) or any((v.qtype, v.n_rows, v.n_cols) != (w.qtype, w.n_rows, w.n_cols) for v in ws):
        raise ValueError("gate_up: one or two expert stacks of one type and shape")
    if xq.qs.size != n_tok * w.n_cols or out.shape != (len(ws), n_tok * k, w.n_rows) or out.dtype != cp.float32:
        raise ValueError(f"gate_up: xq of {n_tok} x {w.n_cols}, out float32 [{len(ws)}, {n_tok * k}, {w.n_rows}]")
    blocks, tpr = _grid_args(w, w.n_cols // ELEMS_PER_ITEM[w.qtype.name], len(ws) * n_tok * k)
    args = (w.data, ws[-1].data, np.int64(w.expert_bytes), ids, np.int32(k), xq.qs, xq.ds, out,
            np.int32(w.n_rows), np.int32(w.n_cols // w.qtype.block_elems), np.int32(tpr))
    with stream or cp.cuda.get_current_stream():
        kernel("matvec.cu", "moe_matvec_" + w.qtype.name.lower())((blocks, n_tok * k, len(ws)), (THREADS,), args)


def down(w: DeviceExperts, ids: cp.ndarray, weights: cp.ndarray, xq: Q8Vector, out: cp.ndarray,
         residual: cp.ndarray, stream=None) -> None:
    """out[t] = residual[t] + sum over slots j of weights[t, j] * w[ids[t, j]] . x[t * k + j] (out may be residual).

    ids int32 and weights float32 [n_tok, k]; xq: q8_1 of x [n_tok * k, n_cols]; out, residual float32
    [n_tok, n_rows]."""
    n_tok, k = ids.shape
    if xq.qs.size != n_tok * k * w.n_cols or weights.shape != (n_tok, k):
        raise ValueError(f"down: xq of {n_tok * k} x {w.n_cols}, weights [{n_tok}, {k}]")
    for name, a in (("out", out), ("residual", residual)):
        if a.dtype != cp.float32 or a.shape != (n_tok, w.n_rows) or not a.flags.c_contiguous:
            raise ValueError(f"down: {name} must be contiguous float32 ({n_tok}, {w.n_rows}), got {a.dtype} {a.shape}")
    blocks, tpr = _grid_args(w, k * w.n_cols // ELEMS_PER_ITEM[w.qtype.name], n_tok)
    args = (w.data, np.int64(w.expert_bytes), ids, weights, np.int32(k), xq.qs, xq.ds, out, residual,
            np.int32(w.n_rows), np.int32(w.n_cols // w.qtype.block_elems), np.int32(tpr))
    with stream or cp.cuda.get_current_stream():
        kernel("matvec.cu", "moe_down_" + w.qtype.name.lower())((blocks, n_tok), (THREADS,), args)
