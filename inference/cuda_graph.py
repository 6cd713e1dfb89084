"""The GPU decode step: token[0] at pos[0] through the model, then the sampler writes the next token into
token[0] and bumps pos[0], so each step feeds the next with no host traffic but reading the new token id.

The first step of a sampling mode (greedy or not) runs eagerly as the warm-up (kernels compiled, buffers
allocated, inverse frequencies uploaded) and is a real step; the same call sequence is then captured into a
CUDA graph on the backend's stream, and every later step is one graph launch. use_graph=False runs every
step eagerly (the same ops), so the graph's effect can be measured.

With the first layers on the CPU (placement.py) a step starts on the host: the CPU backend embeds the token
just read back and runs its layers, stage() puts the hidden state in pinned memory, and the GPU part (its
copy onto the GPU, the GPU layers, the head and the sampler) is the graph.

With experts on the host (GPU layers whose experts stay in host memory), the GPU part is captured as pieces:
graphs, and between them the host's work (the CPU runs a layer's chosen experts), which host_point of the
backend's host_experts marks (host_experts.py); a replay launches each graph and calls each piece of host work,
which waits for its layer's choice to reach the host (the GPU's share of those experts runs on meanwhile).

A constrained reply (a grammar: inference/grammar.py) has its own captured step, split the same way (step_pieces):
the model's graph, then the host's work (the grammar takes the token just read and writes the next token's mask
into pinned memory) while the GPU runs that graph, then a graph that copies the mask up, applies it to the logits
and samples. The mask costs the step the launch of a second graph, not its own time.

Speculative decoding's verify step (VerifyStep) is captured the same way, a graph for each count of tokens, and so is
the MTP block's greedy draft step (DraftStep), which feeds its argmax to the next as a decode step does.
"""
from collections.abc import Iterator

import cupy as cp
import numpy as np

from inference.backend_cpu import CPUBackend
from inference.backend_cuda import CUDABackend
from inference.forward import head, inputs, layers, mtp
from inference.grammar import Guide
from inference.sampling import SamplingParams, plain_greedy
from inference.weights import ModelWeights
from kernels.cuda.module import programmatic_launches
from models.config import ModelConfig


class DecodeStep:
    def __init__(self, be: CUDABackend, cfg: ModelConfig, weights: ModelWeights, use_graph: bool = True,
                 cpu: CPUBackend | None = None):
        self.be = be
        self.cpu = cpu  # runs layers 0..be.layers.start - 1 first; None: the GPU holds them all
        self.cfg = cfg
        self.weights = weights
        self.use_graph = use_graph
        # (greedy, masked) -> the captured step: cupy.cuda.Graph pieces and host work between them
        self.graphs = {}
        self.logits = None  # [1, n_vocab] in the arena: the latest step's logits (the same buffer every step)
        self.guide = None  # the constrained reply's grammar state (tokens() sets it)

    def _gpu_part(self, greedy: bool, masked: bool):
        be = self.be
        be.begin_step()
        # the hidden state (and gemma4's per-layer inputs) from the CPU's part, or made here
        x, per_layer = (*be.staged(), None)[:2] if self.cpu else inputs(be, self.cfg, self.weights)
        logits = head(be, self.cfg, self.weights, layers(be, self.cfg, self.weights, x, be.layers, per_layer))
        if masked:
            be.pieces.host_point(self._write_mask)
            be.mask_logits(logits[0])
        be.sample(logits[0], greedy)
        return logits

    def _write_mask(self) -> None:
        """The next token's mask into the backend's pinned words, where the step's next graph copies it from."""
        self.guide.mask_bits(self.be.allowed_host)

    def __call__(self, greedy: bool, token: int, pos: int, masked: bool = False) -> None:
        """Run one step on token at pos (the host does not wait for the GPU). The GPU part reads both from its
        own buffers, where the last step's sampler left them; the CPU part takes them from the host. masked: the
        step samples among the tokens self.guide allows (it has taken the token in)."""
        if self.be.conv_state:  # the recurrent states take this token in (in place, in the graph too)
            if self.be.state_pos != pos:
                raise RuntimeError(f"the recurrent state is at token {self.be.state_pos}, not at {pos}")
            self.be.state_pos = pos + 1
        if self.be.rings:  # the step writes its token's k, v at pos
            self.be.rings.wrote(pos, 1)
        if self.cpu:
            self.cpu.set_input(np.array([token], np.int32), pos)
            x, per_layer = inputs(self.cpu, self.cfg, self.weights)
            x = layers(self.cpu, self.cfg, self.weights, x, self.cpu.layers, per_layer)
            self.be.stage(x, *(() if per_layer is None else (per_layer,)))
        pieces = self.graphs.get((greedy, masked))
        if pieces is not None:
            for piece in pieces:
                if callable(piece):  # host work: it waits for what it needs of the graphs before it
                    piece()
                else:
                    piece.launch(self.be.stream)
            return
        self.logits = self._gpu_part(greedy, masked)
        if self.use_graph:
            stream = self.be.stream
            self.be.pieces.begin()
            stream.begin_capture()
            try:
                with programmatic_launches():  # each kernel's launch overlaps the one ahead (cuda_module)
                    logits = self._gpu_part(greedy, masked)
            finally:
                pieces = self.be.pieces.end(stream.end_capture())
            assert logits.data.ptr == self.logits.data.ptr, "the captured step must reuse the warm-up's buffers"
            self.graphs[(greedy, masked)] = pieces

    def wait(self) -> None:
        """Until the device has done everything asked of it."""
        self.be.stream.synchronize()

    def tokens(self, logits, params: SamplingParams, seed: int | None, history: list[int],
               max_tokens: int | None = None, guide: Guide | None = None) -> Iterator[int]:
        """The tokens after history (at most max_tokens), sampled on the device from logits [1, n_vocab] (the
        last forward's, of history's last token). The step on each token but the last is launched before the
        token is handed out, so the GPU runs it while the caller handles the token (detokenizing, stop strings)
        and the next next() only waits for it (with layers on the CPU, their part runs first, on the host; with
        every layer and expert on the GPU, the step is queued even before its token is read back).
        A caller that stops early (end of generation, a stop string)
        leaves one step done for nothing: its cache row lies past the engine's cached tokens, so a later
        prompt overwrites it before anything reads it.
        guide: each token is among those its grammar allows, and taken in by it before the next is sampled."""
        greedy = plain_greedy(params)  # argmax; else the sampler kernel
        masked, self.guide = guide is not None, guide
        self.be.start_sampling(params, seed, history)
        if masked:
            self._write_mask()
            self.be.mask_logits(logits[0])
        self.be.sample(logits[0], greedy)
        pos = len(history)  # of the token read next
        end = self.be.n_ctx if max_tokens is None else min(self.be.n_ctx, pos + max_tokens - 1)
        # a step that needs no host work reads its token on the device: it is queued before that token is read,
        # so the GPU goes on from one step to the next without waiting for the host to read, return and launch
        # (a constrained step needs the token on the host first: its grammar takes it in before the next mask)
        ahead = self.cpu is None and not self.be.host_experts.layers and not masked
        while True:
            if ahead:
                self.be.mark_sampled()
                if pos < end:  # a step writes the token's k, v at pos: only inside the cache, only if more come
                    self(greedy, 0, pos)  # the token is the sampler's, on the device
                token = self.be.read_sampled(pos)
            else:
                token = self.be.read_token()
                if masked:
                    guide.accept(token)
                if pos < end:
                    self(greedy, token, pos, masked)
            pos += 1
            yield token


class VerifyStep:
    """Speculative decoding's verify step on the GPU (speculative.py): n tokens (the last one kept and n - 1 drafts)
    at pos.. through the model, the logits of every one, the recurrent states kept after each (rewind_states). The
    first step of each n runs eagerly, as DecodeStep's first does, and is captured; later ones copy the ids and the
    position up and launch its graph. Its buffers are the backend's verify buffers (reserve_verify), never
    reallocated, and the capture takes nothing from CuPy's pool. For a model whose layers and experts are all on
    the GPU (a split step has host work in its middle). hidden: the step also gives the states after the output
    norm (the MTP block's input)."""

    def __init__(self, be: CUDABackend, cfg: ModelConfig, weights: ModelWeights, n_max: int, use_graph: bool = True,
                 hidden: bool = False):
        be.reserve_verify(n_max)
        self.be, self.cfg, self.weights = be, cfg, weights
        self.n_max, self.use_graph, self.hidden = n_max, use_graph, hidden
        self.graphs = {}  # n -> the captured step of n tokens
        self.outs = {}  # n -> (logits [n, n_vocab], states [n, n_embd] or None): the same buffers every step

    def __call__(self, tokens: list[int], pos: int) -> tuple:
        """(logits [n, n_vocab], states [n, n_embd] or None) of tokens at pos.., on the device (queued, not waited
        for)."""
        n = len(tokens)
        if not 1 <= n <= self.n_max:
            raise ValueError(f"a verify step takes 1 to {self.n_max} tokens, not {n}")
        self.be.set_verify_input(np.asarray(tokens, np.int32), pos)
        graph = self.graphs.get(n)
        if graph is not None:
            graph.launch(self.be.stream)
            return self.outs[n]
        self.outs[n] = self._forward(n)
        if self.use_graph:
            self.graphs[n], out = _captured(self.be.stream, lambda: self._forward(n))
            assert out[0].data.ptr == self.outs[n][0].data.ptr, "the captured step must reuse the warm-up's buffers"
        return self.outs[n]

    def _forward(self, n: int) -> tuple:
        be = self.be
        be.begin_verify(n)
        x, per_layer = inputs(be, self.cfg, self.weights)
        x = layers(be, self.cfg, self.weights, x, be.layers, per_layer)
        out = head(be, self.cfg, self.weights, x, all_logits=True, hidden=self.hidden)
        return out if self.hidden else (out, None)


class DraftStep:
    """The MTP block's greedy drafts (mtp.py) on the GPU as captured steps, one wait a propose. A catch-up step: the
    block on the verify buffers' n tokens at pos[0].. (its backend's reserve_verify) and the model's states there
    (copied into h_in), the last row's argmax into token[0] and the history ring. A draft step: the block on token[0]
    at pos[0] and its own state in h, the argmax likewise. Each moves pos[0] past its tokens and leaves the block's
    new state in h, so the host launches a catch-up and a chain of draft steps and reads the drafts once from the
    ring. The first launch of each runs eagerly and is captured, as DecodeStep's. For the block's layer, a full
    attention one (no ring, no recurrent state)."""

    def __init__(self, be: CUDABackend, cfg: ModelConfig, weights: ModelWeights, n_max: int, use_graph: bool = True):
        be.reserve_verify(n_max)
        self.be, self.cfg, self.weights, self.n_max, self.use_graph = be, cfg, weights, n_max, use_graph
        with be.stream:
            self.h_in = cp.empty((n_max, cfg.n_embd), cp.float32)
            self.h = cp.empty((1, cfg.n_embd), cp.float32)
        self.graphs = {}  # n -> the catch-up of n tokens; 0 -> the draft step

    def drafts(self, tokens: list[int], pos: int, h: cp.ndarray, k: int) -> list[int]:
        """k greedy drafts after the block's catch-up on tokens (1 to n_max) at its entries pos.. (h [n, n_embd] the
        model's states there): the catch-up's argmax, then k - 1 draft steps each on the draft before."""
        be, n = self.be, len(tokens)
        be.set_verify_input(np.asarray(tokens, np.int32), pos)
        with be.stream:
            self.h_in[:n] = h
        self._run(n, lambda: self._catch_up(n))
        for _ in range(k - 1):
            self._run(0, self._draft_step)
        ring = be.history.get(stream=be.stream)
        return [int(ring[(pos + n + j) % len(ring)]) for j in range(k)]

    def _run(self, key: int, forward) -> None:
        graph = self.graphs.get(key)
        if graph is not None:
            graph.launch(self.be.stream)
            return
        forward()  # the warm-up, a real step
        if self.use_graph:
            self.graphs[key], _ = _captured(self.be.stream, forward)

    def _catch_up(self, n: int) -> None:
        be = self.be
        be.begin_verify(n)
        logits, h = mtp(be, self.cfg, self.weights, self.h_in[:n])
        if n > 1:
            with be.stream:
                be.pos += n - 1  # the last token's, whose argmax the sampler writes after it
        self._sampled(logits, h)

    def _draft_step(self) -> None:
        self.be.begin_step()
        self._sampled(*mtp(self.be, self.cfg, self.weights, self.h))

    def _sampled(self, logits: cp.ndarray, h: cp.ndarray) -> None:
        self.be.sample(logits[0], greedy=True)
        with self.be.stream:
            self.h[...] = h[-1:]


def _captured(stream: cp.cuda.Stream, forward):
    """(the graph of forward's ops on stream, forward's result): captured, not run, under launches that overlap the
    one ahead and an allocator that raises."""
    stream.begin_capture()
    try:
        with programmatic_launches(), cp.cuda.using_allocator(_no_allocation):
            out = forward()
    finally:
        graph = stream.end_capture()
    return graph, out


def _no_allocation(size: int):
    """CuPy's allocator while a verify or draft step is captured: an address from the pool would stay in the graph
    after the pool had handed it to another array."""
    raise RuntimeError(f"a captured step asked CuPy's pool for {size} bytes")
