"""The GPU's share of the CPU layers' one-token matmuls, its rows streamed over PCIe.

With layers on the CPU, a decode step waits on the host's memory: the cores read those layers' weights at
~60 GB/s (the H100 machine's 16-core Xeon), and with both at once, PCIe reads of host memory at ~51-55 GB/s left
the cores 61 of their 67 GB/s (BENCHMARKS.md, session 3): two readers instead of one. So at load the first rows
of each CPU-layer matrix are copied into pinned host memory in the GPU kernels' layout. Every token, the copy
engine streams them into a ring buffer in VRAM (share_ring.py) ahead of their call, through the whole token:
while the cores run earlier calls, attention and norms, and while the GPU runs its own layers. A call then runs
its rows on the GPU from VRAM (x up, quantized, a matvec per row group, y back: one captured graph) while the
numba kernels run the other rows; the host joins both. The weights stay out of VRAM but for the ring, which the
placement counts (placement.share_ring_bytes).
Session 4 had the matvec read the pinned rows itself (zero-copy): the share measured ~0.33 and took 16 GPU layers
of llama3-8b from 18.8 to 27.4-28.6 tok/s, level with llama.cpp; the share implied the matvec read the rows more
slowly than a plain read kernel (51 GB/s), and PCIe idled outside the calls (inference/NOTES_gpu.md).
The share is a fraction given at load (placement.DEFAULT_GPU_SHARE unless the user sets one). Choosing it from
rates measured at load failed: see DEFAULT_GPU_SHARE.
"""
import cupy as cp
import cupyx
import numpy as np

from inference.backend_cuda import row_groups
from inference.placement import MAX_GPU_SHARE, cap_gpu_share, host_memory_available, share_ring_bytes
from inference.share_ring import RingSchedule, aligned
from inference.weights import ModelWeights, QuantMatrix
from kernels.cpu.quant import quantized_matmuls
from kernels.cuda.host import copy_down, copy_up
from kernels.cuda.layout import META_SPLIT
from kernels.cuda.quant import DeviceWeight, Q8Vector, matvec, quantize_q8_1, to_pinned

ROW_ALIGN = 16  # the GPU takes a multiple of this many rows of a matrix, its first ones


class _Call:
    """One matmuls call of a CPU layer (q/k/v, o, gate/up or down) split between the GPU and the CPU."""

    def __init__(self, ws: tuple[QuantMatrix, ...], share: float):
        self.n_cols = ws[0].n_cols
        self.split = [_gpu_rows(w, share) for w in ws]
        gpu_ws = [QuantMatrix(w.data[:r], w.qtype, r, w.n_cols) for w, r in zip(ws, self.split) if r]
        self.pinned = row_groups(tuple(gpu_ws), None, place=to_pinned) if gpu_ws else []  # the copies' sources
        self.n_gpu_rows = sum(self.split)
        self.cpu = [(w.data[r:], w.qtype) for w, r in zip(ws, self.split)]
        # where each matrix's GPU rows land in the call's y: groups in order, members in order within each
        at, self.starts = 0, [0] * len(ws)
        members = [i for i, r in enumerate(self.split) if r]
        for g in self.pinned:
            for j, first, _ in g.parts:
                self.starts[members[j]] = at + first
            at += g.weight.n_rows
        self.nbytes = sum(g.weight.data.nbytes for g in self.pinned)
        self.ring_span = sum(aligned(g.weight.data.nbytes) for g in self.pinned)  # its place in the ring
        self.index = -1  # in GpuShare's order of calls; it sets this and the row groups' places in its ring
        self.ring: list[DeviceWeight] = []
        self.graph = None
        self.copied = cp.cuda.Event(block=False, disable_timing=True)  # on the copy stream: the rows are in the ring
        self.done = cp.cuda.Event(block=False, disable_timing=True)  # on the stream: the call no longer reads them

    def place(self, ring: cp.ndarray, offset: int) -> None:
        for g in self.pinned:
            w = g.weight
            self.ring.append(DeviceWeight(ring[offset:offset + w.data.nbytes], w.qtype, w.n_rows, w.n_cols))
            offset += aligned(w.data.nbytes)


def _gpu_rows(w: QuantMatrix, share: float) -> int:
    if w.qtype.name not in META_SPLIT or w.n_cols % 32:
        return 0  # no CUDA matvec for it: all its rows stay on the CPU
    return max(0, min(int(share * w.n_rows) // ROW_ALIGN * ROW_ALIGN, w.n_rows - 1))


def _layer_calls(lw):
    """The matrices of each matmuls / matmul call forward() makes in a layer, in its order (of a mixture of experts,
    the router's and the shared expert's: which experts run changes every token, and they stay on the CPU; gemma4's
    dense FFN beside its experts and its per-layer input's gate and projection)."""
    dn = lw.delta_net
    calls = [dn.projections, (dn.out,)] if dn is not None else [lw.qkv, (lw.attn_output,)]
    if lw.ffn_gate is not None:
        calls += [lw.gate_up, (lw.ffn_down,)]
    if lw.experts is not None:
        sh = lw.experts.shared
        calls += [(lw.experts.router,)] + ([(sh.gate, sh.up), (sh.down,), (sh.gate_inp,)] if sh is not None else [])
    if lw.per_layer is not None:
        calls += [(lw.per_layer.inp_gate,), (lw.per_layer.proj,)]
    return tuple(calls)


class GpuShare:
    """For CPUBackend: matmuls of one token whose first rows the GPU multiplies (see the module's docstring).

    share: the fraction of each matrix's rows the GPU takes. ring_bytes: the most VRAM the ring may take (it
    must hold two of the largest call's GPU rows). use_graph=False launches each call's kernels eagerly (the
    decode step's --no-graph).

    The copy engine runs ahead of the calls on its own stream, as far as the ring and share_ring.RingSchedule
    allow."""

    def __init__(self, stream: cp.cuda.Stream, weights: ModelWeights, layers: range, share: float,
                 ring_bytes: int, use_graph: bool = True):
        self.stream = stream
        self.copy_stream = cp.cuda.Stream(non_blocking=True)
        self.share = share
        self.use_graph = use_graph
        self._calls = {}  # ids of a call's matrices -> _Call
        with stream:
            for i in layers:
                for ws in _layer_calls(weights.layers[i]):
                    self._calls[tuple(map(id, ws))] = _Call(ws, share)
        self._order = [c for c in self._calls.values() if c.pinned]
        self.nbytes = sum(c.nbytes for c in self._order)
        sizes = [c.ring_span for c in self._order]
        ring_bytes = min(ring_bytes, sum(sizes))
        self._schedule = RingSchedule(sizes, ring_bytes)
        with self.copy_stream:  # its blocks, once freed, serve only this stream: no copy still under way can
            self.ring = cp.empty(ring_bytes, cp.uint8)  # write into memory handed out again (cudaFree syncs)
        with stream:
            cols = -(-max(c.n_cols for c in self._calls.values()) // 32) * 32  # whole q8_1 blocks
            rows = max(c.n_gpu_rows for c in self._calls.values())
            self._x = cp.empty(cols, cp.float32)
            self._xq = Q8Vector.empty(cols)
            self._y = cp.empty(rows, cp.float32)
        for k, (c, offset) in enumerate(zip(self._order, self._schedule.offsets)):
            c.index = k
            c.place(self.ring, offset)
        self._x_host = cupyx.empty_pinned(cols, np.float32)
        self._y_host = cupyx.empty_pinned(rows, np.float32)

    def describe(self) -> str:
        return (f"the GPU multiplies {self.share:.0%} of the CPU layers' matrix rows each token "
                f"({self.nbytes / 2**30:.2f} GiB of pinned host memory, streamed through a "
                f"{self.ring.nbytes / 2**20:.0f} MiB ring in VRAM)")

    def matmuls(self, ws: tuple[QuantMatrix, ...], x: np.ndarray) -> tuple[np.ndarray, ...]:
        """x [1, n_cols] @ W.T for each of ws: the GPU's rows and the CPU's at once, joined [1, n_rows] each."""
        call = self._calls.get(tuple(map(id, ws)))
        if call is None:  # not a layer's (gemma4's per_layer_model_proj, of the embedding): the CPU's alone
            return tuple(quantized_matmuls([w.data for w in ws], [w.qtype for w in ws], x))
        if not call.pinned:  # no row of these matrices has a CUDA kernel
            return tuple(quantized_matmuls([w for w, _ in call.cpu], [t for _, t in call.cpu], x))
        schedule = self._schedule
        if not schedule.in_order(call.index):
            self.copy_stream.synchronize()
            self.stream.synchronize()
            schedule.restart(call.index)
        self._copy(schedule.copies_due())  # this call's rows, if not yet on their way
        np.copyto(self._x_host[:call.n_cols], x[0])  # the last call's copy up ended before its y came back
        self.stream.wait_event(call.copied)
        self._launch(call)
        call.done.record(self.stream)
        schedule.launched()
        self._copy(schedule.copies_due())  # ahead: the rows of the calls whose place is free once queued work ends
        cpu_ys = quantized_matmuls([w for w, _ in call.cpu], [t for _, t in call.cpu], x)
        self.stream.synchronize()
        return tuple(np.concatenate((self._y_host[s:s + r], y[0]))[None] if r else y
                     for s, r, y in zip(call.starts, call.split, cpu_ys))

    def _copy(self, due: list[tuple[int, int | None]]) -> None:
        """Queue copies of calls' rows into their places in the ring, each after the kernels it waits for."""
        for index, after in due:
            call = self._order[index]
            if after is not None:
                self.copy_stream.wait_event(self._order[after].done)
            for src, dst in zip(call.pinned, call.ring):
                cp.cuda.runtime.memcpyAsync(dst.data.data.ptr, src.weight.data.data.ptr, src.weight.data.nbytes,
                                            cp.cuda.runtime.memcpyHostToDevice, self.copy_stream.ptr)
            call.copied.record(self.copy_stream)

    def _launch(self, call: _Call) -> None:
        """The call's kernels: from the captured graph, else eagerly (the first time, kernels load outside the
        capture, then it is captured)."""
        if call.graph is not None:
            call.graph.launch(self.stream)
            return
        self._kernels(call)
        if self.use_graph:
            self.stream.begin_capture()
            try:
                self._kernels(call)
            finally:
                call.graph = self.stream.end_capture()

    def _kernels(self, call: _Call) -> None:
        """x from pinned memory to the GPU, quantized, each row group's matvec from the ring, y back to pinned
        memory."""
        n, stream = call.n_cols, self.stream
        copy_up(self._x[:n], self._x_host[:n], stream)
        x, xq = self._x[:n], Q8Vector(self._xq.qs[:n], self._xq.ds[:n // 32])
        if any(w.takes_q8 for w in call.ring):
            quantize_q8_1(x, xq, stream=stream)
        at = 0
        for w in call.ring:
            matvec(w, xq if w.takes_q8 else x, self._y[at:at + w.n_rows], stream=stream)
            at += w.n_rows
        copy_down(self._y_host[:at], self._y[:at], stream)


def build_share(stream: cp.cuda.Stream, weights: ModelWeights, layers: range, share: float, use_graph: bool,
                notify) -> GpuShare | None:
    """The GpuShare of the CPU layers for share (a fraction of their rows, lowered to what the ring and the host's
    memory allow), or None: share 0, no CUDA matvec for their types, or no pinned host memory to be had (said
    through notify)."""
    calls = [ws for i in layers for ws in _layer_calls(weights.layers[i])]
    ring = share_ring_bytes(max(w.data.nbytes for lw in weights.layers for ws in _layer_calls(lw) for w in ws))
    largest_call = max(sum(w.data.nbytes for w in ws if _gpu_rows(w, 1.0)) for ws in calls)
    if largest_call == 0:
        return None  # no CUDA matvec for any of their matrices
    try:
        share = min(share, MAX_GPU_SHARE, ring / 2 / largest_call)  # two calls in the ring at least
        matrices = sum(w.data.nbytes for ws in calls for w in ws if _gpu_rows(w, 1.0))
        available = host_memory_available()
        capped = cap_gpu_share(share, matrices, available)
        if capped < share:
            notify(f"the GPU's share of the CPU layers lowered to {capped:.0%}: {share:.0%} would pin "
                   f"{share * matrices / 2**30:.1f} GiB of the {available / 2**30:.1f} GiB of host memory available")
        if capped <= 0:
            return None
        return GpuShare(stream, weights, layers, capped, ring, use_graph)
    except cp.cuda.runtime.CUDARuntimeError as e:  # cudaHostAlloc refused: no more lockable host memory
        notify(f"could not pin host memory for the GPU's share of the CPU layers ({e}): the CPU runs all of it")
        return None
