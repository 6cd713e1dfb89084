"""The op set of the forward pass on the GPU: CuPy arrays, weights uploaded once, kernels from kernels/cuda/.

All work runs on one non-blocking stream (cuBLAS included), so the eager prompt chunks, the eager decode
step and the captured one are ordered without host syncs; the host waits only when it reads a result.
Every intermediate of a one-token step comes from a bump arena that set_input / begin_step reset: the same
sequence of ops gets the same addresses in the warm-up, under capture and at every replay, and nothing asks
CuPy's memory pool for memory during a capture. A verify step of speculative decoding (a few tokens, captured per
count: cuda_graph.VerifyStep) draws from an arena of its own (reserve_verify), with its own token ids and recurrent-
state snapshot rows, none of which a prompt may reallocate under its graphs; its matmuls read each weight once for
all its tokens (matvec_tokens), and its attention splits the keys over blocks as a decode's (attention_decode with
a scratch of its own). Prompt chunks (many tokens, eager) draw from the pool.
"""
from dataclasses import dataclass

import cupy as cp
import cupyx
import numpy as np

from inference import backend_cuda_moe
from inference.backend_cpu import rope_speeds
from inference.host_experts import HostExperts
from inference.kv_ring import cache_rows, ring_positions
from inference.placement import OFFLOAD_MIN_TOKENS, PREFILL_CHUNK, prefill_tile_elems
from inference.sampling import REPEAT_LAST_N, SamplingParams
from inference.step_pieces import StepPieces
from inference.weights import (DeltaNetWeights, ExpertFFN, LayerWeights, ModelWeights, PerLayerInput, QuantExperts,
                               QuantMatrix)
from kernels.cpu import ops as cpu_ops
from kernels.cuda import deltanet as cuda_deltanet, host as cuda_host, moe as cuda_moe, ops as cuda_ops, prefill as cuda_prefill
from kernels.cuda.quant import (DeviceWeight, Q8Vector, matvec, matvec_pair, matvec_tokens, pairs_in_one_launch,
                                 quantize_q8_1, to_device)
from models.config import ModelConfig

ALIGN = 256  # bytes: arena arrays start where CUDA allocations would (16-byte loads, coalescing)


class Arena:
    """One device buffer handed out front to back; reset() makes every address free again."""

    def __init__(self, nbytes: int):
        self.buf = cp.empty(nbytes, dtype=cp.uint8)
        self.top = 0

    def reset(self) -> None:
        self.top = 0

    def take(self, shape: tuple, dtype) -> cp.ndarray:
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if self.top + nbytes > self.buf.size:
            raise MemoryError(f"decode arena of {self.buf.size} bytes is full")
        a = self.buf[self.top:self.top + nbytes].view(dtype).reshape(shape)
        self.top += -(-nbytes // ALIGN) * ALIGN
        return a


def _step_arena_bytes(cfg: ModelConfig, n_layers: int) -> int:
    """An upper bound on what one token's forward of n_layers layers and sampling take from the arena."""
    e, f = cfg.n_embd, cfg.n_ff
    q, kv = cfg.n_heads * max(cfg.head_dim, cfg.v_head_dim), cfg.n_kv_heads * max(cfg.head_dim, cfg.v_head_dim)
    experts = cfg.n_expert + 2 * cfg.n_expert_used + 4 * cfg.n_expert_used * cfg.n_ff_exp  # logits, choice, ffn
    shared = 4 * cfg.n_ff_shexp + 2 * e if cfg.n_ff_shexp else 0
    deltanet = 4 * cfg.ssm_conv_dim + 4 * cfg.ssm_v_heads * (cfg.ssm_state + 2)  # qkv, conv out, z, out, alpha, beta
    # gemma4: the experts' sum beside the dense FFN (their norms, the zeros they add to, the outputs' norms), the
    # layer's per-layer input (its gate, glu, projection and norm)
    beside = 8 * e if cfg.dense_with_experts and cfg.n_expert else 0
    per_layer_input = 4 * cfg.n_embd_per_layer + 3 * e if cfg.n_embd_per_layer else 0
    floats = 12 * e + 5 * q + 3 * kv + 4 * f + experts + shared + deltanet + beside + per_layer_input  # q8_1 as floats
    per_layer = 4 * floats + 32 * ALIGN
    per_layer_inputs = 4 * 6 * cfg.n_layers * cfg.n_embd_per_layer  # forward.per_layer_inputs' arrays
    return n_layers * per_layer + per_layer_inputs + 4 * (4 * e + cfg.n_vocab) + 16 * ALIGN + (1 << 20)


@dataclass(frozen=True)
class VerifyBuffers:
    """What a captured verify step of up to n_max tokens reads and writes besides the weights, caches and states:
    fixed for the backend's life, so that every graph captured over them stays valid (begin_verify)."""
    n_max: int
    arena: Arena
    ids: cp.ndarray  # int32 [n_max]: the step's tokens (the last one kept and the drafts)
    attn_scratch: dict  # kind of heads (as CUDABackend._attn_scratch's) -> attention_decode's scratch for n_max tokens


@dataclass(frozen=True)
class RowGroup:
    """Matrices of one type and width that one matmuls call multiplies by the same x, uploaded as one weight:
    their rows concatenated before cuda_layout.repack (which lays out any number of rows), so one launch
    computes them all and VRAM holds each byte once, as the separate matrices would."""
    weight: DeviceWeight
    bias: cp.ndarray | None  # float32 [weight.n_rows]: the members' biases, zeros for a member without one
    parts: tuple[tuple[int, int, int], ...]  # (index in the call's matrices, first row, end row)


class CUDABackend:
    """Weights in VRAM, the fp16 KV cache, the input and sampler buffers, and the op set of forward().

    layers: the layers it runs (default all). Without the first layer the CPU runs the ones before (placement.py):
    token_embd stays on the host and each forward starts from the hidden state receive() brings over; the output
    head is always here. host_experts: layers whose experts stay in host memory, where the CPU's kernels run
    them for this backend (the router and the choice stay here: only the hidden row, the ids and the weights
    go down, the experts' sum comes back; host_experts.py).

    Lent layers: a prompt chunk of OFFLOAD_MIN_TOKENS or more runs the CPU backend's layers here too, as the
    layers before this backend's (the CPU only embeds). Each of their weights is uploaded for the op that reads
    it (from the file's pages pinned in place: ~50 GB/s) and its VRAM goes back to the pool; their KV cache is
    lent one layer at a time (lend): keys and values before the chunk up from the host cache, the chunk's back.
    The GPU's attention and the rest beat the cores' ~10x on a chunk, as the copies cost ~20 ms a GB.

    shares: the model's backend, where this one runs the MTP block's layer (weights.layers[n_layers]) alone for
    mtp.MTPDrafter: its stream (the model's states it copies in are ordered before the block reads them) and its
    device copies of the weights both read (the head where the block's is the model's, token_embd where every layer
    is here); no layers before this one's (the block embeds its own tokens)."""

    def __init__(self, cfg: ModelConfig, weights: ModelWeights, n_ctx: int, layers: range | None = None,
                 host_experts: range = range(0), prefill_chunk: int = PREFILL_CHUNK,
                 shares: "CUDABackend | None" = None):
        self.cfg = cfg
        self.prefill_chunk = prefill_chunk  # prompt tokens a forward (the placement counted their buffers)
        self.n_ctx = n_ctx
        self.layers = range(cfg.n_layers) if layers is None else layers
        self.stream = shares.stream if shares else cp.cuda.Stream(non_blocking=True)
        shared = shares._dev if shares else {}
        # the model's backend may have pinned the file's pages beside the block's weights (its CPU layers'): CuPy
        # copies from a pinned address without staging, past the registered range (_uploaded_from_host), so the
        # block's weights go up from a copy
        own = np.array if shares else (lambda a: a)
        with self.stream:
            self._groups: dict[tuple, list[RowGroup]] = {}  # _group_key of a matmuls call -> its row groups
            for i in self.layers:
                for ws, biases in _matmuls_calls(weights.layers[i]):
                    self._groups[_group_key(ws, biases)] = row_groups(ws, biases, lambda raw, t: to_device(own(raw), t))
            self._dev: dict[int, object] = {}  # id of a host weight -> its device copy
            for m in _host_tensors(weights, self.layers, host_experts):
                if id(m) in shared:
                    self._dev[id(m)] = shared[id(m)]
                elif id(m) not in self._dev:
                    self._dev[id(m)] = (to_device(own(m.data), m.qtype) if isinstance(m, QuantMatrix) else
                                        cuda_moe.experts_to_device(own(m.data), m.qtype)
                                        if isinstance(m, QuantExperts) else cp.asarray(own(m)))
            self._rope_freqs = weights.rope_freqs
            # the attention layers' caches, each of its layer's heads (gemma4's KV-shared layers have none: they read
            # their kv_source's, which must be here too); a sliding-window layer's a ring (kv_ring.py)
            rows = {i: cache_rows(cfg, n_ctx, i, prefill_chunk) for i in self.layers
                    if not cfg.is_recurrent(i) and cfg.has_kv(i)}
            self.caches = {i: cuda_ops.kv_cache(cfg.layer_heads(i)[1], r, cfg.layer_heads(i)[2])
                           for i, r in rows.items()}
            # the position each row of the rings holds, as the forwards and decode steps write them (None: no ring)
            self.rings = ring_positions(rows, n_ctx, cfg.sliding_window)
            if any(cfg.kv_source(i) not in self.caches for i in self.layers if not cfg.is_recurrent(i)):
                raise ValueError(f"{cfg.arch}'s KV-shared layers must run on the device of the layers whose K/V they "
                                 f"read (layers {self.layers.start}.. hold none of them)")
            # the recurrent layers' states (kernels/cuda/deltanet), updated in place by every step, in the graph too
            # all layers' in one array of each kind, so that a rewind is two copies, not two a layer (~10 us each
            # of the host's time, between a verify step and the next)
            recurrent = [i for i in self.layers if cfg.is_recurrent(i)]
            self._states = (cp.zeros((len(recurrent), cfg.ssm_conv_kernel - 1, cfg.ssm_conv_dim), cp.float32),
                            cp.zeros((len(recurrent), cfg.ssm_v_heads, cfg.ssm_state, cfg.ssm_state), cp.float32)
                            ) if recurrent else ()
            self.conv_state = {i: self._states[0][j] for j, i in enumerate(recurrent)}
            self.delta_state = {i: self._states[1][j] for j, i in enumerate(recurrent)}
            self.state_pos = 0  # tokens the recurrent states have taken in (set_input and DecodeStep keep it)
            self._snapshots = None  # set_input's or begin_verify's: the first token's position, where states are kept
            # (conv [layers, n, K - 1, C], delta [layers, n, Hv, S, S]): the states after each token of a verify
            # step, for rewind_states; grown to the longest (reserve_verify: to n_max at once, under captured steps)
            self._snapshot_rows = None
            self._verify = None  # VerifyBuffers (reserve_verify)
            self.token = cp.zeros(1, dtype=cp.int32)  # the decode step's input; the sampler writes the next
            self.pos = cp.zeros(1, dtype=cp.int32)  # position of tokens[0]
            self.history = cp.zeros(REPEAT_LAST_N, dtype=cp.int32)  # ring: history[p % n] = token at p
            self.fparams, self.iparams = cuda_ops.sampling_params()
            # a decode attention's scratch for each kind of heads (q heads, kv heads, head size) the layers have
            kinds = {cfg.layer_heads(i)[:3] for i in self.layers if not cfg.is_recurrent(i)}
            self._attn_scratch = {kind: cuda_ops.decode_scratch(*kind) for kind in kinds}
            self._argmax_scratch = cuda_ops.argmax_scratch()
            self._sample_scratch = cuda_ops.sample_scratch(cfg.n_vocab)
            # the MTP block's embedding, norms and projection take less than a layer's share
            self._arena_layers = len(self.layers) + 1 if shares else cfg.n_layers
            self._arena = Arena(_step_arena_bytes(cfg, self._arena_layers))
            self._taking = None  # the arena _empty takes from now (a step's), or None: CuPy's pool (a prompt chunk)
            self._route_done = cp.zeros(1, dtype=cp.uint32)  # cuda_moe.norm_router_route's count of finished blocks
        self._sampled = cp.cuda.Event(block=False, disable_timing=True)  # mark_sampled's point (spin-waited)
        self._read_stream = cp.cuda.Stream(non_blocking=True)
        # a one-token step's inputs from the CPU (its hidden state; gemma4's per-layer inputs), by shape: (pinned host
        # buffer that stage() fills, its device copy that staged() makes: a graph node)
        self._inbox: dict[tuple, tuple[np.ndarray, cp.ndarray]] = {}
        self._staged: list[tuple] = []  # the shapes stage() filled last
        self._staging = None  # pinned bytes of a host weight on its way up where its pages could not be pinned
        self._host_kv = None  # (k_cache, v_cache): the CPU layers' host KV caches by layer (lend)
        self._lent = None  # (layer, (k, v) in VRAM) of the lent layer the chunk is in
        self._shared_sources = {cfg.kv_source(i) for i in range(cfg.n_layers) if not cfg.has_kv(i)}  # gemma4
        self._pos = 0  # pos[0] of a prompt chunk, on the host
        # the file's pages a prompt chunk uploads, pinned where they lie so that it copies them up directly
        lent = range(0) if shares else range(self.layers.start)  # the layers a prompt chunk may run here (lend)
        uploaded = list(_uploaded_from_host(weights, lent, host_experts))
        self._pinned = cuda_host.pin_in_place(uploaded) if uploaded else None
        self.pieces = StepPieces(self.stream)  # a captured decode step's graphs and the host work between them
        self.host_experts = HostExperts(self.stream, cfg, weights, host_experts, self._pinned, self.pieces)
        # constrained decoding: the tokens the grammar allows next, one bit each (token i: bit i % 32 of word i // 32),
        # written by the host (pinned) and copied up by the step that samples (mask_logits)
        self.allowed_host = cupyx.zeros_pinned((cfg.n_vocab + 31) // 32, dtype=np.uint32)
        with self.stream:
            self.allowed = cp.zeros(self.allowed_host.shape, dtype=cp.uint32)
        self._inv_freq = {}  # (base, scale) -> float64 [rope_dim // 2]
        self._prefill_scratch = None  # cuda_prefill.Scratch, grown to the largest chunk seen
        self.ids = self.token  # [n] int32 the tokens of this forward
        self.n = 1
        self._q8_of = None  # (address of x, its Q8Vector): q, k and v (gate and up) share one quantization
        self._f16_of = None  # (x, x in fp16): the same for a prompt chunk's matmuls (_f16)
        self._set_cublas_stream()  # the handle and its workspace made now, at load: out of VRAM here, not in a prompt
        self.stream.synchronize()

    # ---- inputs ----

    def set_input(self, tokens: np.ndarray, pos: int, snapshots: bool = False) -> None:
        """The next forward runs tokens [n] at positions pos..pos+n-1 (eagerly). snapshots: its recurrent layers
        keep a copy of their states after each token (a verify step's, speculative.py), for rewind_states."""
        tokens = np.asarray(tokens, np.int32)
        self._advance_state(pos, len(tokens))
        if self.rings:
            self.rings.wrote(pos, len(tokens))
        if len(tokens) == 1:
            self.token.set(tokens, stream=self.stream)
            self.begin_step()
        else:
            with self.stream:
                self.ids = cp.empty(len(tokens), dtype=cp.int32)
            self.ids.set(tokens, stream=self.stream)
            self.n = len(tokens)
            self._q8_of = self._f16_of = self._taking = None
            self._pos, self._lent = pos, None
        self._snapshots = pos if snapshots else None
        self.pos.set(np.array([pos], np.int32), stream=self.stream)

    def reserve_verify(self, n_max: int) -> None:
        """The buffers of verify steps of up to n_max tokens (VerifyBuffers) and the recurrent layers' snapshot rows
        for as many: made here, or made again larger, which leaves graphs captured over the old ones invalid (a
        VerifyStep reserves them when it is made, and the engine drops the old step then)."""
        if self._verify is not None and self._verify.n_max >= n_max:
            return
        cfg = self.cfg
        # twice a token's share of the step arena a token: a verify step's ops take what a decode step's take a token
        # (its row groups' members apart, its outputs' q8_1 copies), the factor a margin; the arena raises when full
        with self.stream:
            scratch = {kind: cuda_ops.decode_scratch(*kind, n_tok=n_max) for kind in self._attn_scratch}
            self._verify = VerifyBuffers(n_max, Arena(2 * n_max * _step_arena_bytes(cfg, self._arena_layers)),
                                         cp.zeros(n_max, cp.int32), scratch)
        if self.conv_state:
            self._grow_snapshots(n_max)

    def set_verify_input(self, tokens: np.ndarray, pos: int) -> None:
        """The next verify step runs tokens [n] (n <= reserve_verify's n_max) at pos..: the states' and rings'
        bookkeeping, and the ids and position up into the step's own buffers (before its graph's launch)."""
        tokens = np.asarray(tokens, np.int32)
        self._advance_state(pos, len(tokens))
        if self.rings:
            self.rings.wrote(pos, len(tokens))
        self._verify.ids[:len(tokens)].set(tokens, stream=self.stream)
        self.pos.set(np.array([pos], np.int32), stream=self.stream)
        self._snapshots = pos

    def begin_verify(self, n: int) -> None:
        """The next forward runs the verify step's n tokens (set_verify_input's) from its own arena and buffers: the
        same ops get the same addresses in its warm-up, under capture and at every replay."""
        v = self._verify
        v.arena.reset()
        self._taking = v.arena
        self.ids = v.ids[:n]
        self.n = n
        self._q8_of = self._f16_of = None

    def _advance_state(self, pos: int, n: int) -> None:
        """The recurrent states take in n tokens at pos next: zeroed for a new context (pos 0); otherwise they
        must be at pos already (the engine restores a checkpoint before it rewinds)."""
        if not self.conv_state:
            return
        if pos == 0:
            with self.stream:
                for a in self._states:
                    a.fill(0)
        elif self.state_pos != pos:
            raise RuntimeError(f"the recurrent state is at token {self.state_pos}, not at {pos}")
        self.state_pos = pos + n

    def can_resume(self, keep: int) -> bool:
        """Whether a prompt can go on after the first keep cached tokens: the rings, if any, still hold the window
        before position keep."""
        return self.rings is None or self.rings.can_resume(keep)

    def rewind_states(self, n: int) -> None:
        """The recurrent states back to after the context's first n tokens, from the copies the last forward kept
        (set_input's snapshots; n inside that forward's tokens). The KV cache needs nothing: its rows past n are
        written again before anything reads them."""
        if not self.conv_state or self.state_pos == n:
            return
        row = n - self._snapshots - 1
        with self.stream:
            for state, rows in zip(self._states, self._snapshot_rows):
                state[...] = rows[:, row]
        self.state_pos = n

    def recurrent_state(self) -> dict:
        """A host copy of its recurrent layers' states, layer -> (position, conv, delta): a checkpoint. The
        copies are queued on the stream into pinned memory and not waited for (a 27B prompt's end waited ~126 ms
        for its 151 MB through fresh pageable memory; CuPy's pinned pool hands freed blocks back, 3 ms then):
        restore_recurrent_state's copies up queue behind them, and a host read of them must synchronize the
        stream first."""
        def down(a: cp.ndarray) -> np.ndarray:
            out = cupyx.empty_pinned(a.shape, a.dtype)
            a.get(stream=self.stream, out=out, blocking=False)
            return out
        return {i: (self.state_pos, down(self.conv_state[i]), down(self.delta_state[i])) for i in self.conv_state}

    def restore_recurrent_state(self, saved: dict) -> None:
        """Its layers' states from a checkpoint (recurrent_state's, merged with the other segments')."""
        for i in self.conv_state:
            self.state_pos, conv, delta = saved[i]
            self.conv_state[i].set(conv, stream=self.stream)
            self.delta_state[i].set(delta, stream=self.stream)

    def begin_step(self) -> None:
        """The next forward runs token[0] at pos[0], whatever the device buffers hold (the graph's input)."""
        self._arena.reset()
        self._taking = self._arena
        self.ids = self.token
        self.n = 1
        self._q8_of = self._snapshots = None

    @property
    def in_step(self) -> bool:
        """Whether the forward running is a step (a decode or verify step, captured into a graph): its arrays come
        from an arena, and no op may take CuPy's pool or cuBLAS."""
        return self._taking is not None

    def _empty(self, shape: tuple, dtype=cp.float32) -> cp.ndarray:
        if self._taking is not None:
            return self._taking.take(shape, dtype)
        with self.stream:
            return cp.empty(shape, dtype=dtype)

    def lend(self, k_cache: dict[int, np.ndarray], v_cache: dict[int, np.ndarray]) -> None:
        """Prompt chunks may run the layers of these host KV caches (the CPU backend's: float32 [n_kv_heads,
        n_ctx, head_dim] by layer) here, before this backend's own (see Lent layers above)."""
        self._host_kv = (k_cache, v_cache)

    def to_host(self, x: cp.ndarray) -> np.ndarray:
        """x in pinned host memory (CuPy's pool keeps it for the next copy of its size): a verify step's logits, 4 MB
        on Qwen3.5, came through pageable memory's staging copies ~1 ms slower."""
        return x.get(stream=self.stream, out=cupyx.empty_pinned(x.shape, x.dtype))

    def argmax_rows(self, logits: cp.ndarray) -> cp.ndarray:
        """Each row's argmax (the smallest id on ties) of logits [n, n_vocab], on the device: a verify step's, so that
        only n ints come to the host. Out of CuPy's pool, not a step's arena: it runs after the step (its graph)."""
        with self.stream:
            out = cp.empty(logits.shape[0], cp.int32)
        cuda_ops.argmax_rows(logits, out, stream=self.stream)
        return out

    def copy(self, x: cp.ndarray) -> cp.ndarray:
        """x copied on this backend's stream: after the ops that write x, before those that read the copy (CuPy
        copies on the null stream by default, which this non-blocking stream does not wait for, nor it for)."""
        with self.stream:
            return x.copy()

    def rows(self, width: int) -> cp.ndarray:
        """float32 [0, width] in VRAM, that put_rows grows to a row for each position of the context as it fills
        (the MTP drafter's record of the model's states): a row for every position at once would take Qwen3.5-27B's
        262144 x 5120 floats, 5.4 GB, at its full context."""
        with self.stream:
            return cp.empty((0, width), cp.float32)

    def put_rows(self, rows: cp.ndarray, pos: int, x: cp.ndarray) -> cp.ndarray:
        """rows (rows()') with x [n, width] (on this device) at positions pos..pos + n - 1, on the stream: rows
        itself, or a copy twice as long (at most n_ctx; zeros past rows, as the CPU's) where it ends before pos + n."""
        end = pos + len(x)
        with self.stream:
            if end > len(rows):
                grown = cp.zeros((min(self.n_ctx, max(end, 2 * len(rows))), rows.shape[1]), cp.float32)
                grown[:len(rows)] = rows
                rows = grown
            rows[pos:end] = x
        return rows

    # ---- the hidden state from the CPU layers before this segment ----

    def receive(self, x: np.ndarray) -> cp.ndarray:
        """x [n, ...] on the host (the hidden state [n, n_embd]; gemma4's per-layer inputs) -> the GPU, to run this
        backend's layers on."""
        if self.n == 1:
            self.stage(x)
            return self.staged()[0]
        out = self._empty(x.shape)
        out.set(np.ascontiguousarray(x, np.float32), stream=self.stream)
        return out

    def stage(self, *xs: np.ndarray) -> None:
        """One token's inputs from the CPU (its hidden state, and gemma4's per-layer inputs) into the pinned buffers
        that staged() copies from, one for each shape, made on first use (before a graph launch, or before its
        capture: the previous step has finished, as its token was read back)."""
        self._staged = [x.shape for x in xs]
        for x in xs:
            if x.shape not in self._inbox:
                with self.stream:
                    self._inbox[x.shape] = (cupyx.empty_pinned(x.shape, np.float32), cp.empty(x.shape, cp.float32))
            np.copyto(self._inbox[x.shape][0], x)

    def staged(self) -> tuple[cp.ndarray, ...]:
        """What stage() filled last, on the GPU: asynchronous copies from pinned memory, which a CUDA graph captures
        as nodes, so every replay copies what stage() wrote last."""
        for shape in self._staged:
            cuda_host.copy_up(self._inbox[shape][1], self._inbox[shape][0], self.stream)
        return tuple(self._inbox[shape][1] for shape in self._staged)

    # ---- the op set of forward() ----

    def embed(self, table: QuantMatrix, scale: float) -> cp.ndarray:
        w = self._dev[id(table)]
        out = self._empty((self.n, w.n_cols))
        cuda_ops.embed(w, self.ids, out, scale, stream=self.stream)
        return out

    def rms_norm(self, x: cp.ndarray, weight: np.ndarray) -> cp.ndarray:
        out = self._empty(x.shape)
        rows = (self._fuses_q8 and x.ndim == 2 and x.shape[1] <= cuda_ops.NORM_Q8_MAX  # a step's hidden states
                and x.shape[1] % 32 == 0 and x.flags.c_contiguous and x.data.ptr % 16 == 0)  # whole q8_1 blocks
        xq = self._q8_out(out) if rows else None  # for the matvecs next
        cuda_ops.rms_norm(x, self._weight(weight), out, self.cfg.rms_eps, xq=xq, stream=self.stream)
        return out

    def matmul(self, w: QuantMatrix, x: cp.ndarray, bias: np.ndarray | None = None) -> cp.ndarray:
        return self._matmul(self._weight(w), x, None if bias is None else self._weight(bias))

    def matmuls(self, ws: tuple[QuantMatrix, ...], x: cp.ndarray, biases: tuple | None = None) -> tuple:
        """matmul(w, x, bias) for each of ws, one launch per row group; a one-token step's outputs are views
        of their group's output, a prompt chunk's are contiguous copies of its columns (as the ops want)."""
        groups = self._groups.get(_group_key(ws, biases))
        if groups is None:  # a lent layer's call: each matrix uploaded for it
            return tuple(self.matmul(w, x, b) for w, b in zip(ws, biases or (None,) * len(ws)))
        outs = [None] * len(ws)
        paired = self._pair(groups, x)
        for j, g in enumerate(groups):
            if paired is None and x.shape[0] > 1 and len(g.parts) > 1:
                for (i, _, _), y in zip(g.parts, self._matmul_parts(g, x)):
                    outs[i] = y
                continue
            y = paired[j] if paired is not None else self._matmul(g.weight, x, g.bias)  # [n, g.weight.n_rows]
            for i, first, end in g.parts:
                outs[i] = y[:, first:end]
        return tuple(outs)

    def _matmul_parts(self, g: RowGroup, x: cp.ndarray) -> list:
        """A prompt chunk's or a verify step's product of a row group, each member's rows in an output of its own
        (contiguous, as the ops after want them): written there by the GEMMs on the fp16 path and by a verify step's
        matvec_tokens (parts), else copied out of one output."""
        n = x.shape[0]
        if self.in_step:  # each member's [n, rows] one after the other in y's memory
            y = self._matmul(g.weight, x, None, parts=tuple(first for _, first, _ in g.parts[1:])).reshape(-1)
            outs = [y[n * first:n * end].reshape(n, end - first) for _, first, end in g.parts]
            if g.bias is not None:
                for out, (_, first, end) in zip(outs, g.parts):
                    cuda_ops.add_bias(out, g.bias[first:end], stream=self.stream)
            return outs
        if not cuda_prefill.takes_f16(g.weight, n):
            y = self._matmul(g.weight, x, g.bias)
            return [self._contiguous(y[:, first:end]) for _, first, end in g.parts]
        outs = [self._empty((x.shape[0], end - first)) for _, first, end in g.parts]
        self._set_cublas_stream()
        with self.stream:
            cuda_prefill.matmul_f16(g.weight, self._f16(x), outs, self._scratch(g.weight.n_cols))
        if g.bias is not None:
            for y, (_, first, end) in zip(outs, g.parts):
                cuda_ops.add_bias(y, g.bias[first:end], stream=self.stream)
        return outs

    def _f16(self, x: cp.ndarray) -> cp.ndarray:
        """A prompt chunk's x [n, cols] in fp16 for the cuBLAS matmuls, once however many matrices read it (the
        row groups of q, k and v; the routed and the shared experts). x is held with it, so that its address
        cannot come back as another array's while remembered."""
        if self._f16_of is None or self._f16_of[0] is not x:
            with self.stream:
                self._f16_of = (x, x.astype(cp.float16))
        return self._f16_of[1]

    def _pair(self, groups: list[RowGroup], x: cp.ndarray) -> tuple | None:
        """A one-token step's two row groups of different types (a K-quant mix's q, k and attn_v) in one launch:
        their outputs [1, n_rows] as views of one buffer. None where matvec_pair does not apply."""
        if (x.shape[0] != 1 or len(groups) != 2 or any(g.bias is not None for g in groups)
                or not pairs_in_one_launch(groups[0].weight, groups[1].weight)):
            return None
        n0 = groups[0].weight.n_rows
        y = self._empty((1, n0 + groups[1].weight.n_rows))
        matvec_pair(groups[0].weight, groups[1].weight, self._q8(x), y[0, :n0], y[0, n0:], stream=self.stream)
        return y[:, :n0], y[:, n0:]

    def _weight(self, t):
        """The device copy of a host weight (a QuantMatrix, or a vector as float32): uploaded at load, or in a
        prompt chunk's lent layer for the op that reads it (its VRAM returns to the pool after)."""
        d = self._dev.get(id(t))
        if d is not None:
            return d
        assert self.n >= OFFLOAD_MIN_TOKENS, "only a prompt chunk runs lent layers"
        if isinstance(t, QuantMatrix):
            raw = self._upload(t.data)
            with self.stream:
                return to_device(raw, t.qtype)
        with self.stream:  # a copy first: the vector may share a page with pinned weights (_uploaded_from_host)
            return cp.asarray(np.array(t, np.float32))

    def _upload(self, data: np.ndarray) -> cp.ndarray:
        """A host weight's bytes in VRAM for one prompt chunk (its VRAM returns to the pool after). From pages
        pinned in place (CPU layers' matrices, host experts): one asynchronous copy. Else through a pinned buffer
        filled by all cores, as a copy straight from the file's pageable pages ran at ~1.6 GB/s on the H100
        machine; that waits for the copy, since the buffer serves the next upload."""
        if self._pinned is not None and self._pinned.holds(data):
            with self.stream:
                raw = cp.empty(data.shape, cp.uint8)
            cuda_host.copy_up(raw, data, self.stream)
            return raw
        if self._staging is None or self._staging.size < data.size:
            self._staging = cupyx.empty_pinned(data.size, np.uint8)  # grows to the largest weight
        staged = self._staging[:data.size].reshape(data.shape)
        cpu_ops.parallel_copy(data.reshape(-1), staged.reshape(-1))
        with self.stream:
            raw = cp.empty(data.shape, cp.uint8)
            raw.set(staged, stream=self.stream)
        self.stream.synchronize()
        return raw

    def add_matmul(self, x: cp.ndarray, w: QuantMatrix, a: cp.ndarray, norm: np.ndarray | None = None) -> cp.ndarray:
        """x + W a, W a normalized by norm first when given (sandwich norms); one launch in a one-token step."""
        if norm is not None:
            return self.add(x, self.rms_norm(self.matmul(w, a), norm))
        return self._matmul(self._weight(w), a, None, residual=x)

    def _matmul(self, dw: DeviceWeight, x: cp.ndarray, bias: cp.ndarray | None,
                residual: cp.ndarray | None = None, parts: tuple[int, ...] = ()) -> cp.ndarray:
        """W x (+ bias) (+ residual [n, dw.n_rows]); a one-token step adds the residual inside the matvec. parts
        (a verify step's, matvec_tokens'): the output's rows split into parts, each contiguous."""
        out = self._empty((x.shape[0], dw.n_rows))
        if x.shape[0] == 1:
            matvec(dw, self._q8(x) if dw.takes_q8 else x.reshape(-1), out.reshape(-1), stream=self.stream,
                   residual=None if residual is None else residual.reshape(-1))
        elif self.in_step:
            # a verify step: one pass over W for its few tokens; a float W (an F32 router) too, where the fp16 path
            # would take CuPy's pool and cuBLAS into the captured step
            matvec_tokens(dw, self._q8(x) if dw.takes_q8 else self._contiguous(x), x.shape[0], out,
                          stream=self.stream, residual=residual, parts=parts)
        else:
            if cuda_prefill.takes_f16(dw, x.shape[0]):
                self._set_cublas_stream()
                with self.stream:
                    cuda_prefill.matmul_f16(dw, self._f16(x), out, self._scratch(dw.n_cols))
            else:
                cuda_prefill.matmul(dw, x, out, self._scratch(dw.n_cols), stream=self.stream)
            if residual is not None:
                cuda_ops.add(out, residual, out, stream=self.stream)
        if bias is not None:
            cuda_ops.add_bias(out, bias, stream=self.stream)
        return out

    def rope_kv_write(self, layer: int, q: cp.ndarray, k: cp.ndarray | None, v: cp.ndarray | None, rope: tuple,
                      head_norms: tuple | None = None) -> cp.ndarray:
        """q [n, heads, head_dim] and k (normalized per head first with head_norms (q_norm, k_norm[, v_norm]), v too
        with a v_norm: gemma4) rotated in place for positions pos..pos+n-1 by the layer's rope (ModelConfig.layer_rope),
        then k and v stored in the layer's cache, in one launch; returns q (a copy where q was a strided view: q taken
        from its output gate). k and v None: q alone (gemma4's KV-shared layers). v may be k (gemma4's v from k's
        projection: the kernel reads it before it rotates k)."""
        q = self._contiguous(q)
        key = rope
        if key not in self._inv_freq:
            with self.stream:
                self._inv_freq[key] = cp.asarray(rope_speeds(self.cfg, rope, self._rope_freqs))
        if head_norms is not None and q.shape[2] % cuda_ops.HEAD_NORM_MULTIPLE:  # no whole warps for the fused norms
            q = self.rms_norm(q, head_norms[0])
            if k is not None:
                v = self.rms_norm(v, head_norms[2]) if len(head_norms) > 2 else v  # of v as it came: v may be k
                k = self.rms_norm(k, head_norms[1])
            head_norms = None
        norms = None if head_norms is None else tuple(None if w is None else self._weight(w) for w in head_norms)
        neox = self.cfg.rope_style == "neox"
        if k is None:
            cuda_ops.rope_kv_write(q, None, None, self._inv_freq[key], self.pos, neox, None, None, head_norms=norms,
                                   eps=self.cfg.rms_eps, mscale=self.cfg.rope_mscale, stream=self.stream)
            return q
        cache = self._cache(layer)
        cuda_ops.rope_kv_write(q, k, v, self._inv_freq[key], self.pos, neox, *cache, head_norms=norms,
                               eps=self.cfg.rms_eps, mscale=self.cfg.rope_mscale, stream=self.stream)
        if layer not in self.caches:
            self._give_back(layer, cache)
        return q

    def _cache(self, layer: int) -> tuple[cp.ndarray, cp.ndarray]:
        """The layer's (k, v) cache in VRAM: its own, or for a lent layer, one as long as the chunk's last position
        with the host cache's keys and values before the chunk copied in (float32 up, float16 here)."""
        if layer in self.caches:
            return self.caches[layer]
        if self._lent is None or self._lent[0] != layer:
            self._lent = None  # the last lent layer's cache back to the pool first
            p, end = self._pos, self._pos + self.n
            # gemma4's layers read by KV-shared layers come again after their own write: with this chunk's rows too
            filled = end if layer in self._shared_sources else p
            host = self._host_caches(layer)
            with self.stream:
                cache = tuple(cp.empty((a.shape[0], end, a.shape[2]), cp.float16) for a in host)
                for c, a in zip(cache, host):
                    if filled:
                        c[:, :filled] = cp.asarray(np.ascontiguousarray(a[:, :filled]))
            self._lent = (layer, cache)
        return self._lent[1]

    def _host_caches(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        return self._host_kv[0][layer], self._host_kv[1][layer]

    def _give_back(self, layer: int, cache: tuple[cp.ndarray, cp.ndarray]) -> None:
        """A lent layer's keys and values of this chunk into the host cache (float16 -> float32)."""
        p, end = self._pos, self._pos + self.n
        for c, a in zip(cache, self._host_caches(layer)):
            with self.stream:
                rows = c[:, p:end].astype(cp.float32)
            a[:, p:end] = rows.get(stream=self.stream)

    def attention(self, layer: int, q: cp.ndarray, window: int, scale: float,
                  sinks: np.ndarray | None = None) -> cp.ndarray:
        """Attention of q [n, heads, head_dim] over the layer's cache; sinks [heads] (gpt-oss): each head's sink logit
        in its softmax."""
        n, heads, head_dim = q.shape
        sinks = None if sinks is None else self._weight(sinks)
        out = self._empty((n, heads, head_dim))
        k_cache, v_cache = self._cache(layer)
        kind = (heads, k_cache.shape[0], head_dim)
        if n == 1:
            cuda_ops.attention_decode(q[0], k_cache, v_cache, out[0], self.pos, self._attn_scratch[kind], scale,
                                      window, xq=self._q8_out(out), sinks=sinks, stream=self.stream)
        elif self.in_step:
            # a verify step's few tokens: split over the keys as a decode's (a prompt's kernel gives them a few blocks
            # a kv head); no xq, as its matmuls quantize their input of several rows themselves (_q8)
            cuda_ops.attention_decode(q, k_cache, v_cache, out, self.pos, self._verify.attn_scratch[kind], scale,
                                      window, sinks=sinks, stream=self.stream)
        else:
            cuda_ops.attention_prefill(q, k_cache, v_cache, out, self.pos, scale, window, sinks=sinks,
                                       stream=self.stream)
        return out.reshape(n, heads * head_dim)

    def _contiguous(self, x: cp.ndarray) -> cp.ndarray:
        """x, or a copy of it where it is a strided view (q and its gate taken apart per head)."""
        if x.flags.c_contiguous:
            return x
        out = self._empty(x.shape)
        with self.stream:
            out[...] = x
        return out

    def sigmoid_mul(self, a: cp.ndarray, gate: cp.ndarray) -> cp.ndarray:
        """a [n, d] * sigmoid(gate) (its d values in any shape, a strided view too): the attention output's gate
        (qwen35); a step's output also quantized for the projection."""
        out = self._empty(a.shape)
        cuda_ops.sigmoid_mul(a, self._contiguous(gate).reshape(a.shape), out,
                             xq=self._q8_out(out) if self._fuses_q8 else None, stream=self.stream)
        return out

    def delta_net(self, layer: int, dn: DeltaNetWeights, qkv: cp.ndarray, z: cp.ndarray, alpha: cp.ndarray,
                  beta: cp.ndarray) -> cp.ndarray:
        """The DeltaNet mixer of a recurrent layer on its projections (forward.delta_net): the causal conv, the
        delta rule and the gated norm (kernels/cuda/deltanet), the layer's states moved on in place; where the
        forward keeps snapshots (set_input's, a verify step's), the kernels also write the states after each token
        into the layer's snapshot rows."""
        n = qkv.shape[0]
        conv_rows = delta_rows = None
        if self._snapshots is not None:
            conv_rows, delta_rows = self._snapshot_buffers(layer, n)
        y = self._empty(qkv.shape)
        cuda_deltanet.conv_silu(self._contiguous(qkv), self.conv_state[layer], self._weight(dn.conv), y,
                                stream=self.stream, snapshots=conv_rows)
        out = self._empty((n, self.cfg.ssm_v_heads * self.cfg.ssm_state))
        cuda_deltanet.delta_rule(y, self._contiguous(alpha), self._contiguous(beta), self._weight(dn.dt_bias),
                                 self._weight(dn.a), self._contiguous(z), self._weight(dn.norm),
                                 self.delta_state[layer], out, self.cfg.ssm_k_heads, self.cfg.rms_eps,
                                 stream=self.stream, snapshots=delta_rows)
        return out

    def _grow_snapshots(self, n: int) -> None:
        """The recurrent layers' snapshot rows for n tokens at least (all layers' at once: made or grown, else kept)."""
        if self._snapshot_rows is None or self._snapshot_rows[0].shape[1] < n:
            with self.stream:
                self._snapshot_rows = tuple(cp.empty((len(a), n, *a.shape[1:]), cp.float32) for a in self._states)

    def _snapshot_buffers(self, layer: int, n: int) -> tuple[cp.ndarray, cp.ndarray]:
        """The layer's snapshot rows (conv [n, K - 1, C], delta [n, Hv, S, S]) for n tokens."""
        self._grow_snapshots(n)
        j = list(self.conv_state).index(layer)
        return self._snapshot_rows[0][j, :n], self._snapshot_rows[1][j, :n]

    def glu(self, gate: cp.ndarray, up: cp.ndarray) -> cp.ndarray:
        """activation(gate) * up; up may be a strided view (gemma4's per-layer input of a layer)."""
        out = self._empty(gate.shape)
        xq = self._q8_out(out) if self._fuses_q8 else None
        cuda_ops.glu(gate, self._contiguous(up), out, self.cfg.activation, xq=xq, stream=self.stream)
        return out

    def add_moe(self, x: cp.ndarray, experts: ExpertFFN, norm: np.ndarray, k: int) -> cp.ndarray:
        """x + the mixture of experts on rms_norm(x [n, n_embd], norm) (backend_cuda_moe)."""
        return backend_cuda_moe.add_moe(self, x, experts, norm, k)

    def moe(self, x: cp.ndarray, experts: ExpertFFN, norm: np.ndarray, k: int) -> cp.ndarray:
        """The mixture of experts alone on rms_norm(x [n, n_embd], norm): gemma4's, beside its dense FFN."""
        return backend_cuda_moe.moe(self, x, experts, norm, k)

    def concat(self, x: cp.ndarray, y: cp.ndarray) -> cp.ndarray:
        """[x y]: x [n, a] and y [n, b] side by side, [n, a + b] (the MTP block's input: forward.mtp)."""
        a = x.shape[1]
        out = self._empty((x.shape[0], a + y.shape[1]))
        with self.stream:
            out[:, :a] = x
            out[:, a:] = y
        return out

    def scale(self, x: cp.ndarray, s: float) -> cp.ndarray:
        out = self._empty(x.shape)
        cuda_ops.scale(x, s, out, stream=self.stream)
        return out

    def add(self, x: cp.ndarray, y: cp.ndarray) -> cp.ndarray:
        out = self._empty(x.shape)
        cuda_ops.add(x, y, out, stream=self.stream)
        return out

    def add_bias(self, x: cp.ndarray, bias: np.ndarray) -> cp.ndarray:
        """x [n, d] + bias [d] on every row (gpt-oss's attention output bias, onto the residual)."""
        out = self._empty(x.shape)
        cuda_ops.add_bias(x, self._weight(bias), out, stream=self.stream)
        return out

    def logits(self, w: QuantMatrix, x: cp.ndarray) -> cp.ndarray:
        y = self.matmul(w, x)  # [n, n_vocab]
        if self.cfg.final_softcap > 0:
            cuda_ops.softcap(y, self.cfg.final_softcap, stream=self.stream)
        return y

    # ---- choosing the next token on the device ----

    def start_sampling(self, params: SamplingParams, seed: int | None, history: list[int]) -> None:
        """Before sampling the token after history (whose last token's logits are the last forward's)."""
        seed = int(np.random.default_rng(seed).integers(1 << 32))
        cuda_ops.set_sampling_params(self.fparams, self.iparams, temperature=params.temperature, top_k=params.top_k,
                                     top_p=params.top_p, min_p=params.min_p, repeat_penalty=params.repeat_penalty,
                                     seed=seed, stream=self.stream)
        ring = np.zeros(REPEAT_LAST_N, np.int32)
        for p in range(max(0, len(history) - REPEAT_LAST_N), len(history)):
            ring[p % REPEAT_LAST_N] = history[p]
        self.history.set(ring, stream=self.stream)
        self.pos.set(np.array([len(history) - 1], np.int32), stream=self.stream)

    def sample(self, logits: cp.ndarray, greedy: bool) -> None:
        """logits [n_vocab] of the token at pos[0] -> token[0], the history ring, pos[0] + 1."""
        if greedy:
            cuda_ops.argmax(logits, self._argmax_scratch, self.token, self.history, self.pos, stream=self.stream)
        else:
            cuda_ops.sample(logits, self._sample_scratch, self.fparams, self.iparams, self.token, self.history,
                            self.pos, stream=self.stream)

    def mask_logits(self, logits: cp.ndarray) -> None:
        """logits [n_vocab] of the tokens allowed_host leaves out to -inf, before sample (its copy up is a node of
        the captured step: the host writes allowed_host before the step's piece that holds it is launched)."""
        cuda_host.copy_up(self.allowed, self.allowed_host, self.stream)
        cuda_ops.mask_logits(logits, self.allowed, stream=self.stream)

    def read_token(self) -> int:
        return int(self.token.get(stream=self.stream)[0])

    def mark_sampled(self) -> None:
        """Remember this point of the stream: read_sampled waits for it, not for the steps queued after it."""
        self._sampled.record(self.stream)

    def read_sampled(self, pos: int) -> int:
        """The token sampled for position pos (kept in the history ring) by the work before mark_sampled, read on
        a stream of its own once that work is done, so that a step queued after it may already run (and
        overwrite token[0]): the ring keeps REPEAT_LAST_N positions."""
        self._sampled.synchronize()
        return int(self.history[pos % REPEAT_LAST_N].get(stream=self._read_stream))

    # ---- helpers ----

    def _q8(self, x: cp.ndarray) -> Q8Vector:
        """x [n, cols] quantized to q8_1, once a step however many matrices read it (arena addresses are unique
        within a step; pool addresses come back, so outside a step a prompt chunk's every call quantizes)."""
        if (not self._fuses_q8 or self._q8_of is None or self._q8_of[0] != x.data.ptr
                or self._q8_of[1].qs.size != x.size):  # a view that starts where a remembered array does
            quantize_q8_1(x.reshape(-1), self._q8_out(x), stream=self.stream)
        return self._q8_of[1]

    @property
    def _fuses_q8(self) -> bool:
        """Whether the forward's kernels that feed matvecs also write their output's q8_1 copy (_q8_out): a step's
        (a decode step's one token, a verify step's few) or a lone token's, not a prompt chunk's (cuBLAS reads
        fp16)."""
        return self.n == 1 or self.in_step

    def _q8_out(self, x: cp.ndarray) -> Q8Vector | None:
        """Room for x [1, ...] quantized to q8_1, remembered as x's quantization: the kernel that writes x fills
        it (a one-token step's norms, glu and attention do, so the matvecs after them need no quantize launch).
        None where x is not whole q8_1 blocks (the kernel then writes x alone)."""
        if x.size % 32:
            return None
        xq = self._empty_q8(x.size)
        self._q8_of = (x.data.ptr, xq)
        return xq

    def _empty_q8(self, n: int) -> Q8Vector:
        """Room for n values quantized to q8_1 (from the arena in a one-token step)."""
        return Q8Vector(self._empty((n,), cp.int8), self._empty((n // 32, 2)))

    def _scratch(self, n_cols: int) -> cuda_prefill.Scratch:
        s = self._prefill_scratch
        if s is None or s.x16.size < self.n * n_cols:
            cfg = self.cfg
            max_cols = max(cfg.n_embd, cfg.n_ff, cfg.n_heads * cfg.v_head_dim, n_cols)  # n_cols: the MTP eh_proj's
            largest = max(cfg.n_ff * cfg.n_embd, cfg.n_heads * cfg.head_dim * cfg.n_embd)
            with self.stream:
                s = self._prefill_scratch = cuda_prefill.Scratch.empty(self.n, max_cols,
                                                                       prefill_tile_elems(cfg, largest))
        return s

    def _set_cublas_stream(self) -> None:
        cp.cuda.cublas.setStream(cp.cuda.device.get_cublas_handle(), self.stream.ptr)


def _matmuls_calls(lw: LayerWeights):
    """The (matrices, biases) of forward()'s matmuls calls in a layer."""
    if lw.delta_net is not None:
        yield lw.delta_net.projections, None
    else:
        yield lw.qkv, lw.qkv_bias
    if lw.ffn_gate is not None:  # a dense FFN (gemma4's beside its experts too)
        yield lw.gate_up, None
    if lw.experts is not None and lw.experts.shared is not None:
        yield (lw.experts.shared.gate, lw.experts.shared.up), None


def _group_key(ws: tuple, biases: tuple | None) -> tuple:
    return tuple(map(id, ws)) + tuple(map(id, biases or (None,) * len(ws)))


def row_groups(ws: tuple[QuantMatrix, ...], biases: tuple | None, place=to_device) -> list[RowGroup]:
    """ws split by (type, width), each part uploaded as one weight (a Q4_K_M file's Q6_K attn_v stays apart);
    place: to_device (VRAM) or to_pinned (host memory the GPU reads, gpu_share.py)."""
    biases = biases or (None,) * len(ws)
    by_kind: dict[tuple, list[int]] = {}
    for i, w in enumerate(ws):
        by_kind.setdefault((w.qtype.name, w.n_cols), []).append(i)
    groups = []
    for idx in by_kind.values():
        raw = np.concatenate([ws[i].data for i in idx]) if len(idx) > 1 else ws[idx[0]].data  # [rows, row_bytes]
        ends = np.cumsum([ws[i].n_rows for i in idx]).tolist()
        bias = None
        if any(biases[i] is not None for i in idx):
            bias = cp.asarray(np.concatenate([np.zeros(ws[i].n_rows, np.float32) if biases[i] is None else biases[i]
                                              for i in idx]))
        groups.append(RowGroup(place(raw, ws[idx[0]].qtype), bias,
                               tuple(zip(idx, [0] + ends[:-1], ends))))
    return groups


def _uploaded_from_host(w: ModelWeights, cpu_layers: range, host_experts: range):
    """The host bytes a prompt chunk uploads: the CPU layers' matrices and expert stacks (lent layers) and the
    stacks of the host experts of this backend's layers (backend_cuda_moe.upload_experts). Nothing else may be handed to CuPy
    from the file's pages after they are pinned: CuPy copies from a pinned address without staging, and the
    driver refuses a copy that runs past the registered (page-rounded) range, as a vector next to a pinned matrix
    would (_weight copies a lent layer's vectors first)."""
    for i in cpu_layers:
        lw = w.layers[i]
        for name in lw.__dataclass_fields__:
            if isinstance(t := getattr(lw, name), QuantMatrix):
                yield t.data
        if lw.experts is not None:
            yield from (stack.data for stack in lw.experts.host_stacks)
    for i in host_experts:
        yield from (stack.data for stack in w.layers[i].experts.host_stacks)


def out_of_vram(e: Exception) -> bool:
    """CuPy's pool failing to allocate, a CUDA call failing for memory (cudaErrorMemoryAllocation = 2), or cuBLAS
    unable to make its handle's workspace (CUBLAS_STATUS_ALLOC_FAILED = 3)."""
    from cupy_backends.cuda.libs.cublas import CUBLASError  # noqa: PLC0415
    return isinstance(e, cp.cuda.memory.OutOfMemoryError) or (
        isinstance(e, cp.cuda.runtime.CUDARuntimeError) and e.status == 2) or (
        isinstance(e, CUBLASError) and e.status == 3)


def _host_tensors(w: ModelWeights, layers: range, host_experts: range = range(0)):
    """Every weight forward() hands to an op on its own in these layers and the head: matrices, expert stacks (but
    those of host_experts' layers) and norm vectors (not the matmuls calls'); token_embd (and gemma4's per-layer
    embeddings) only with the first layer (else the CPU embeds). The MTP block's layer (the last of w.layers, after
    the model's) comes with the block's embedding, projection, norms and head (forward.mtp) in the head's place."""
    if layers.start == 0:
        yield w.token_embd
        if w.per_layer is not None:
            yield from (w.per_layer.token_embd, w.per_layer.model_proj, w.per_layer.proj_norm)
    nx = w.nextn
    if nx is not None and layers.stop == len(w.layers):
        yield from (nx.embed, nx.eh_proj, nx.enorm, nx.hnorm, nx.head_norm, nx.head)
    else:
        yield from (w.output, w.output_norm)
    for i in layers:
        lw = w.layers[i]
        grouped = {id(t) for ws, biases in _matmuls_calls(lw) for t in ws + (biases or ())}
        for name in lw.__dataclass_fields__:
            t = getattr(lw, name)
            if isinstance(t, ExpertFFN):
                yield from (t.router,) if i in host_experts else (t.router, t.gate, t.up, t.down)
                yield from (b for b in (t.router_bias, t.gate_bias, t.up_bias, t.down_bias, t.router_norm,
                                        t.down_scale) if b is not None)
                if t.shared is not None:
                    yield from (t.shared.gate_inp, t.shared.down)
            elif isinstance(t, DeltaNetWeights):
                yield from (getattr(t, f) for f in t.__dataclass_fields__ if id(getattr(t, f)) not in grouped)
            elif isinstance(t, PerLayerInput):
                yield from (t.inp_gate, t.proj, t.post_norm)
            elif isinstance(t, (QuantMatrix, np.ndarray)) and id(t) not in grouped:  # not output_scale, a float
                yield t
