"""The GPU's share of the CPU layers' one-token matmuls, read over PCIe.

With layers on the CPU, a decode step waits on the host's memory: the cores read those layers' weights at
~60 GB/s (the H100 machine's 16-core Xeon). A GPU kernel reads pinned host memory over PCIe at ~51 GB/s, and
with both at once the cores kept 61 of their 67 GB/s (BENCHMARKS.md, session 3): two readers instead of one.
So at load the first rows of each CPU-layer matrix are copied into pinned host memory in the GPU kernels'
layout, and a one-token matmuls call runs them on the GPU (x up, quantized, the matvec reading the weights over
PCIe, y back: one captured graph a call) while the numba kernels run the other rows; then the host joins both.
These weights take no VRAM, which is why their layers are on the CPU. The share comes from the two rates,
measured at load on the model's own matrices: 0.32-0.35 on the H100 machine for llama3-8b, where it took 16 GPU
layers from 18.8 to 27.4-28.6 tok/s (BENCHMARKS.md, session 4; inference/NOTES_gpu.md says what is next).
"""
import time

import cupy as cp
import cupyx
import numpy as np

from inference.backend_cuda import row_groups
from inference.placement import MAX_GPU_SHARE, cap_gpu_share, host_memory_available
from inference.weights import ModelWeights, QuantMatrix
from kernels.cpu_quant import quantized_matmuls
from kernels.cuda_layout import META_SPLIT
from kernels.cuda_quant import Q8Vector, matvec, quantize_q8_1, to_pinned

ROW_ALIGN = 16  # the GPU takes a multiple of this many rows of a matrix, its first ones
MIN_SHARE = 0.05  # below this the launches and joins cost more than the GPU's rows save
CALIBRATION_BYTES = 64 << 20  # of a matrix's rows the GPU reads to time its rate (~1.3 ms at 51 GB/s)
CALIBRATION_CPU_BYTES = 1 << 30  # of CPU layers' matrices timed for the cores' rate (more than any L3)


class _Call:
    """One matmuls call of a CPU layer (q/k/v, o, gate/up or down) split between the GPU and the CPU."""

    def __init__(self, ws: tuple[QuantMatrix, ...], share: float):
        self.n_cols = ws[0].n_cols
        self.split = [_gpu_rows(w, share) for w in ws]
        gpu_ws = [QuantMatrix(w.data[:r], w.qtype, r, w.n_cols) for w, r in zip(ws, self.split) if r]
        self.groups = row_groups(tuple(gpu_ws), None, place=to_pinned) if gpu_ws else []
        self.n_gpu_rows = sum(self.split)
        self.cpu = [(w.data[r:], w.qtype) for w, r in zip(ws, self.split)]
        # where each matrix's GPU rows land in the call's y: groups in order, members in order within each
        at, self.starts = 0, [0] * len(ws)
        members = [i for i, r in enumerate(self.split) if r]
        for g in self.groups:
            for j, first, _ in g.parts:
                self.starts[members[j]] = at + first
            at += g.weight.n_rows
        self.graph = None
        self.nbytes = sum(g.weight.data.nbytes for g in self.groups)


def _gpu_rows(w: QuantMatrix, share: float) -> int:
    if w.qtype.name not in META_SPLIT or w.n_cols % 32:
        return 0  # no CUDA matvec for it: all its rows stay on the CPU
    return max(0, min(int(share * w.n_rows) // ROW_ALIGN * ROW_ALIGN, w.n_rows - 1))


def _layer_calls(lw):
    """The matrices of each matmuls / matmul call forward() makes in a layer."""
    return lw.qkv, (lw.attn_output,), lw.gate_up, (lw.ffn_down,)


class GpuShare:
    """For CPUBackend: matmuls of one token whose first rows the GPU multiplies (see the module's docstring).

    share: the fraction of each matrix's rows the GPU takes. use_graph=False launches each call's kernels
    eagerly (the decode step's --no-graph). rates: the (GPU, CPU) bytes a second it was chosen from, if measured."""

    def __init__(self, stream: cp.cuda.Stream, weights: ModelWeights, layers: range, share: float,
                 use_graph: bool = True, rates: tuple[float, float] | None = None):
        self.stream = stream
        self.share = share
        self.use_graph = use_graph
        self.rates = rates
        self._calls = {}  # ids of a call's matrices -> _Call
        with stream:
            for i in layers:
                for ws in _layer_calls(weights.layers[i]):
                    self._calls[tuple(map(id, ws))] = _Call(ws, share)
        self.nbytes = sum(c.nbytes for c in self._calls.values())
        cols = -(-max(c.n_cols for c in self._calls.values()) // 32) * 32  # whole q8_1 blocks
        rows = max(c.n_gpu_rows for c in self._calls.values())
        self._x_host = cupyx.empty_pinned(cols, np.float32)
        self._y_host = cupyx.empty_pinned(rows, np.float32)
        with stream:
            self._x = cp.empty(cols, cp.float32)
            self._xq = Q8Vector.empty(cols)
            self._y = cp.empty(rows, cp.float32)

    def describe(self) -> str:
        measured = (f"; measured at load: the GPU's matvec {self.rates[0] / 1e9:.1f} GB/s over PCIe, the CPU's "
                    f"{self.rates[1] / 1e9:.1f} GB/s") if self.rates else ""
        return (f"the GPU reads {self.share:.0%} of the CPU layers' matrix rows over PCIe each token "
                f"({self.nbytes / 2**30:.2f} GiB of pinned host memory{measured})")

    def matmuls(self, ws: tuple[QuantMatrix, ...], x: np.ndarray) -> tuple[np.ndarray, ...]:
        """x [1, n_cols] @ W.T for each of ws: the GPU's rows and the CPU's at once, joined [1, n_rows] each."""
        call = self._calls[tuple(map(id, ws))]
        if not call.groups:  # no row of these matrices has a CUDA kernel
            return tuple(quantized_matmuls([w for w, _ in call.cpu], [t for _, t in call.cpu], x))
        np.copyto(self._x_host[:call.n_cols], x[0])  # the last call's copy up ended before its y came back
        if call.graph is not None:
            call.graph.launch(self.stream)
        elif self.use_graph:
            self._launch(call)  # eagerly first: kernels load outside the capture
            self.stream.begin_capture()
            try:
                self._launch(call)
            finally:
                call.graph = self.stream.end_capture()
        else:
            self._launch(call)
        cpu_ys = quantized_matmuls([w for w, _ in call.cpu], [t for _, t in call.cpu], x)
        self.stream.synchronize()
        return tuple(np.concatenate((self._y_host[s:s + r], y[0]))[None] if r else y
                     for s, r, y in zip(call.starts, call.split, cpu_ys))

    def _launch(self, call: _Call) -> None:
        """x from pinned memory to the GPU, quantized, each row group's matvec, y back to pinned memory."""
        n, stream = call.n_cols, self.stream
        cp.cuda.runtime.memcpyAsync(self._x.data.ptr, self._x_host.ctypes.data, 4 * n,
                                    cp.cuda.runtime.memcpyHostToDevice, stream.ptr)
        x, xq = self._x[:n], Q8Vector(self._xq.qs[:n], self._xq.ds[:n // 32])
        if any(g.weight.takes_q8 for g in call.groups):
            quantize_q8_1(x, xq, stream=stream)
        at = 0
        for g in call.groups:
            w = g.weight
            matvec(w, xq if w.takes_q8 else x, self._y[at:at + w.n_rows], stream=stream)
            at += w.n_rows
        cp.cuda.runtime.memcpyAsync(self._y_host.ctypes.data, self._y.data.ptr, 4 * at,
                                    cp.cuda.runtime.memcpyDeviceToHost, stream.ptr)


def build_share(stream: cp.cuda.Stream, weights: ModelWeights, layers: range, share, use_graph: bool,
                notify) -> GpuShare | None:
    """The GpuShare of the CPU layers for share ("auto": measured, and none below MIN_SHARE; else a fraction),
    or None: share 0, too small, or no pinned host memory to be had (said through notify)."""
    try:
        rates = None
        if share == "auto":
            rates = measure_rates(stream, weights, layers)
            share = rates[0] / (rates[0] + rates[1]) if rates else 0.0
        share = min(share, MAX_GPU_SHARE)
        matrices = sum(w.data.nbytes for i in layers for ws in _layer_calls(weights.layers[i]) for w in ws
                       if _gpu_rows(w, 1.0))
        available = host_memory_available()
        capped = cap_gpu_share(share, matrices, available)
        if capped < share:
            notify(f"the GPU's share of the CPU layers lowered to {capped:.0%}: {share:.0%} would pin "
                   f"{share * matrices / 2**30:.1f} GiB of the {available / 2**30:.1f} GiB of host memory available")
        if capped <= 0 or (rates and capped < MIN_SHARE):
            return None
        return GpuShare(stream, weights, layers, capped, use_graph, rates)
    except cp.cuda.runtime.CUDARuntimeError as e:  # cudaHostAlloc refused: no more lockable host memory
        notify(f"could not pin host memory for the GPU's share of the CPU layers ({e}): the CPU runs all of it")
        return None


def measure_rates(stream: cp.cuda.Stream, weights: ModelWeights, layers: range) -> tuple[float, float] | None:
    """(g, c) bytes a second: g of the GPU's matvec reading pinned host memory (the first CPU layer's largest
    matrix), c of the cores over the CPU layers' matrices (one token's matmuls, from DRAM: ~1 GiB is more than
    any L3); None if no matrix has a CUDA kernel. The share g / (g + c) keeps both busy for as long."""
    calls = [ws for i in layers for ws in _layer_calls(weights.layers[i])]
    w = max((w for ws in calls[:4] for w in ws if _gpu_rows(w, 1.0)), key=lambda w: w.data.nbytes, default=None)
    if w is None:
        return None
    rows = max(1, min(w.n_rows, CALIBRATION_BYTES // w.data.shape[1]))
    with stream:
        pinned = to_pinned(w.data[:rows], w.qtype)
        x_dev = cp.random.standard_normal(w.n_cols, dtype=cp.float32)
        xq = Q8Vector.empty(w.n_cols)
        y = cp.empty(rows, cp.float32)
        quantize_q8_1(x_dev, xq, stream=stream)
        start, end = cp.cuda.Event(), cp.cuda.Event()
        times = []
        for _ in range(4):  # the first loads the kernel
            start.record(stream)
            matvec(pinned, xq if pinned.takes_q8 else x_dev, y, stream=stream)
            end.record(stream)
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
    gpu_rate = pinned.data.nbytes / min(times[1:])

    x = np.random.default_rng(0).standard_normal((1, max(w.n_cols for ws in calls for w in ws)), np.float32)

    def cpu_pass(calls):
        for ws in calls:
            quantized_matmuls([w.data for w in ws], [w.qtype for w in ws], x[:, :ws[0].n_cols])

    timed, nbytes = [], 0
    for ws in calls:
        if nbytes >= CALIBRATION_CPU_BYTES:
            break
        timed.append(ws)
        nbytes += sum(w.data.nbytes for w in ws)
    cpu_pass(timed)  # numba's compiled kernels load and the file's pages are mapped, as in any later token
    t = time.perf_counter()
    cpu_pass(timed)
    cpu_rate = nbytes / (time.perf_counter() - t)
    return gpu_rate, cpu_rate
