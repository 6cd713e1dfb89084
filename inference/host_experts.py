"""The experts of a GPU backend's host layers (placement.py's cpu_moe: their stacks stay in host RAM) in a step.

The router and the choice run on the GPU. A decode step copies the hidden row, the chosen ids and their weights
down into pinned buffers, then a word that tells the host they are there; the cores run most of the chosen experts
(backend_cpu.moe_experts) as soon as the host sees it, while the GPU runs the last gpu_slots of them itself (a
count measured at load), queued on the stream after those copies, reading their stacks in place from the file's
pinned pages over PCIe: two readers of host memory instead of one. The cores' sum comes back up and is added to
the GPU's. Host work cannot be captured, so a captured step is pieces: graphs with the host's work between them
(host_point, step_pieces.py; cuda_graph.DecodeStep replays them). A prompt chunk the backend does not upload the
experts for reads h, ids and weights back and waits for the cores.
"""
import time
from dataclasses import dataclass

import cupy as cp
import cupyx
import numpy as np

from inference.backend_cpu import moe_experts
from inference.backend_cuda_moe import expert_biases
from inference.step_pieces import StepPieces
from inference.weights import ExpertFFN, ModelWeights
from kernels.cuda import moe as cuda_moe, ops as cuda_ops
from kernels.cuda.host import PinnedPages, copy_down, copy_up
from kernels.cuda.quant import Q8Vector, quantize_q8_1
from models.config import ModelConfig

# Of a token's chosen experts in a layer whose experts stay in host memory, how many the GPU runs itself, reading
# them in place over PCIe while the cores run the rest. None: measured at load (_fastest_gpu_slots), because the
# best count is the host's: the GPU's reads and the cores' share the host's memory, and on the H200 machine one
# lease's host ran a token's 8 experts on its cores alone faster than 5 beside the GPU's 3, the next lease's 3 ms
# slower (BENCHMARKS.md, session 14). A number fixes it (tests that compare two engines bit for bit).
HOST_EXPERTS_GPU_SLOTS = None
MEASURED_LAYERS = 16  # host layers a measuring pass runs (~0.3 ms each on the H200 machine's 16 cores)
HAND_OVER_SECONDS = 10  # a host piece waiting longer for its layer, with the stream idle, is an error
CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM = 91  # cudaDevAttrCanUseHostPointerForRegisteredMem


class HostExperts:
    """For a CUDABackend, the experts of its layers that stay in host memory (maybe none): add_moe runs a layer's
    chosen ones, host_point puts host work into a step.

    stream: the backend's, where its steps run and are captured; pinned: its pinned file pages (None: none),
    which hold the layers' stacks where they could be pinned."""

    def __init__(self, stream: cp.cuda.Stream, cfg: ModelConfig, weights: ModelWeights, layers: range,
                 pinned: PinnedPages | None, pieces: StepPieces):
        self.stream = stream
        self.pieces = pieces  # the backend's: a captured step's graphs and host work
        self.layers, self.k = layers, cfg.n_expert_used
        self.io = _HostExpertsIO.empty(cfg) if layers else None  # a step's experts on the host
        self._one = cp.ones(1, cp.int32)  # copied into io.handed after a layer's choice
        # id(experts) -> their stacks as the GPU reads them in place, for its share of a token's host experts; none
        # where the device cannot use host addresses as its own (asked once)
        self.in_place = {}
        if layers and pinned is not None and cp.cuda.runtime.deviceGetAttribute(
                CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, cp.cuda.Device().id):
            for i in layers:
                if share := _read_in_place(weights.layers[i].experts, pinned):
                    self.in_place[id(weights.layers[i].experts)] = share
        # how many of a token's chosen experts the GPU runs in a layer of in_place
        self.gpu_slots = 0
        if self.in_place:
            self.gpu_slots = (self._fastest_gpu_slots(cfg, weights) if HOST_EXPERTS_GPU_SLOTS is None
                              else min(HOST_EXPERTS_GPU_SLOTS, self.k - 1))

    def describe(self) -> str | None:
        """Who runs a token's host experts (run --verbose), or None without any."""
        if not self.layers:
            return None
        n, shared = len(self.layers), len(self.in_place)
        if not shared:
            return f"host experts: the CPU runs every chosen expert of the {n} layers (no GPU share for their types)"
        if not self.gpu_slots:
            return (f"host experts: the CPU runs every chosen expert of the {n} layers (on this host that measured "
                    "faster than the GPU reading some of them from host memory beside it)")
        return (f"host experts: the GPU runs {self.gpu_slots} of a token's {self.k} chosen experts itself in "
                f"{shared} of the {n} layers, reading them from host memory; the CPU the rest")

    def add_moe(self, be, x, experts: ExpertFFN, h, ids, weights) -> cp.ndarray:
        """x + the experts chosen on the device, run by the CPU (backend_cpu.moe_experts) from host memory; be: the
        backend whose arena and q8_1 copies the buffers come from (_empty, _empty_q8, _q8). A prompt chunk reads h,
        ids and weights back and waits; a decode step copies them into pinned buffers and leaves the host's work to
        host_point, so that a captured step is graphs with the host's work between. In a decode step the GPU runs
        the last gpu_slots of the k chosen experts itself, reading them from the pinned file pages, while the cores
        run the others (where _read_in_place allows)."""
        cfg, out = be.cfg, be._empty(x.shape)
        if h.shape[0] > 1:
            y = moe_experts(experts, be.to_host(h), be.to_host(ids), be.to_host(weights), cfg.activation)
            with self.stream:
                y_dev = cp.asarray(y)
            cuda_ops.add(x, y_dev, out, stream=self.stream)
            return out
        io = self.io
        for dst, src in ((io.h, h), (io.ids, ids), (io.weights, weights)):
            copy_down(dst, src, self.stream)
        copy_down(io.handed, self._one, self.stream)  # after them: once the host sees it, they are there
        k = ids.shape[1]
        share = self.in_place.get(id(experts))
        n_gpu = self.gpu_slots if share else 0  # the last n_gpu slots: the GPU's
        x_gpu = x  # x + the GPU's slots' sum
        if n_gpu:  # queued after the copies: the GPU runs them while the host runs the cores' slots
            hq, x_gpu = be._q8(h), be._empty(x.shape)
            act = be._empty((n_gpu, share[0].n_rows))
            _gpu_share(share, ids[:, k - n_gpu:], weights[:, k - n_gpu:], hq, act, be._empty_q8(act.size), x_gpu, x,
                       cfg.activation, self.stream, expert_biases(be, experts))

        def run() -> None:  # on the host, once the copies are done
            n_cpu = k - n_gpu
            moe_experts(experts, io.h, io.ids[:, :n_cpu], io.weights[:, :n_cpu], cfg.activation, out=io.y)

        self.host_point(run)
        y = be._empty(x.shape)
        copy_up(y, io.y, self.stream)
        cuda_ops.add(x_gpu, y, out, stream=self.stream)
        return out

    def _fastest_gpu_slots(self, cfg: ModelConfig, weights: ModelWeights) -> int:
        """Of a token's k chosen experts, the count the GPU should run itself: for each count from 0 to k // 2 + 1
        (at most k - 1), a pass over up to MEASURED_LAYERS host layers of in_place with the GPU's share queued
        before the cores' work, as a decode step runs them, on a random row; two rounds in opposite orders, each
        count's best pass. Each pass chooses its experts anew: the same ones again would come from the host's
        caches (~300 MB of L3 on the H200 machine), which a token's do not. ~0.1-0.2 s at load for Qwen3-30B-A3B."""
        k, rng, stream = self.k, np.random.default_rng(0), self.stream
        ffns = [f for f in (weights.layers[i].experts for i in self.layers) if id(f) in self.in_place]
        ffns = ffns[:MEASURED_LAYERS]
        h = rng.standard_normal((1, cfg.n_embd)).astype(np.float32)
        w = np.full((1, k), 1 / k, np.float32)
        with stream:
            w_dev, x = cp.asarray(w), cp.asarray(h)
            x_gpu, hq = cp.empty_like(x), Q8Vector.empty(cfg.n_embd)
            quantize_q8_1(x.reshape(-1), hq, stream=stream)

        def one_pass(n: int) -> float:
            ids = [rng.permutation(cfg.n_expert)[:k].astype(np.int32)[None] for _ in ffns]
            with stream:
                ids_dev = [cp.asarray(i) for i in ids]
                act = cp.empty((n, self.in_place[id(ffns[0])][0].n_rows), cp.float32)
                act_q = Q8Vector.empty(act.size)
            stream.synchronize()
            t = time.perf_counter()
            for f, i, i_dev in zip(ffns, ids, ids_dev):
                if n:
                    _gpu_share(self.in_place[id(f)], i_dev[:, k - n:], w_dev[:, k - n:], hq, act, act_q, x_gpu, x,
                               cfg.activation, stream)
                moe_experts(f, h, i[:, :k - n], w[:, :k - n], cfg.activation)
                stream.synchronize()
            return time.perf_counter() - t

        counts = list(range(min(k - 1, k // 2 + 1) + 1))
        one_pass(counts[-1])  # compiles the GPU's kernels: not timed
        best = {}
        for n in counts + counts[::-1]:
            best[n] = min(best.get(n, float("inf")), one_pass(n))
        return min(best, key=best.get)

    def host_point(self, work) -> None:
        """Host work in the middle of a decode step, once the stream has handed the host a layer's choice (the
        copy into io.handed; the host waits for that copy, not for the stream, so that kernels queued after it run
        on while the host works): done now, or, while a decode step is captured, kept as a piece of it that waits
        for the hand-over itself (step_pieces)."""
        self.pieces.host_point(lambda: (self._wait_handed(), work()))

    def _wait_handed(self) -> None:
        """Until the stream's copy into io.handed has landed (spinning: a layer's wait is tens of microseconds),
        then ready for the next layer's. A word, not an event as CUDABackend.read_sampled waits on: an event
        recorded while a step is captured becomes a node inside its graph, which the host cannot wait for."""
        handed, t = self.io.handed, time.monotonic()
        while not handed[0, 0]:
            if time.monotonic() - t > HAND_OVER_SECONDS and self.stream.done:
                raise RuntimeError("host experts: the GPU's step ended without handing a layer's choice over")
        handed[0, 0] = 0


def _read_in_place(experts: ExpertFFN, pinned: PinnedPages):
    """(gate, up, down) of a host layer's experts as stacks the decode kernels read where they lie (pinned file
    pages, over PCIe; gemma4's gate and up as views of its ffn_gate_up_exps), or None where they cannot: pages not
    pinned, a type without such kernels, or a gate/up pair gate_up_glu does not take."""
    # the stacks as the file holds them: a view's own bytes (nbytes from its first) stop short of its last expert
    if not all(pinned.holds(m.data) for m in experts.host_stacks):
        return None
    share = tuple(cuda_moe.experts_in_host_memory(m.data, m.qtype) for m in (experts.gate, experts.up, experts.down))
    if None in share or share[0].qtype != share[1].qtype or share[0].n_rows % 32:
        return None
    return share


@dataclass(frozen=True)
class _HostExpertsIO:
    """Pinned buffers a decode step's host experts read (the layer's hidden row, ids, weights) and write (their
    weighted sum), copied by the step's graphs; one set serves every layer, as the host runs them in turn.
    handed: 1 once the stream has copied a layer's h, ids and weights down (its copy comes last), 0 again once
    the host has seen it."""
    h: np.ndarray
    ids: np.ndarray
    weights: np.ndarray
    y: np.ndarray
    handed: np.ndarray

    @classmethod
    def empty(cls, cfg: ModelConfig) -> "_HostExpertsIO":
        k, d = cfg.n_expert_used, cfg.n_embd
        io = cls(*(cupyx.empty_pinned((1, n), dtype=t) for n, t in ((d, np.float32), (k, np.int32),
                                                                      (k, np.float32), (d, np.float32), (1, np.int32))))
        io.handed[0, 0] = 0
        return io


def _gpu_share(share, ids: cp.ndarray, weights: cp.ndarray, hq: Q8Vector, act: cp.ndarray, act_q: Q8Vector,
               out: cp.ndarray, x: cp.ndarray, activation: str, stream: cp.cuda.Stream,
               biases: tuple = (None, None, None)) -> None:
    """out = x + the experts ids [1, n] of a layer's in-place stacks (share: _read_in_place's) weighted by weights
    [1, n], on hq (q8_1 of the layer's hidden row), launched on stream; act [n, n_ff] and act_q their buffers;
    biases: the (gate, up, down) biases of the experts on the device (gpt-oss), or Nones."""
    cuda_moe.gate_up_glu(share[0], share[1], ids, hq, act, act_q, activation, biases[:2], stream=stream)
    cuda_moe.down(share[2], ids, weights, act_q, out, x, biases[2], stream=stream)
