"""Drafts from the model's own multi-token-prediction block (qwen35's nextn: forward.mtp), for speculative.py.

The block's layer keeps a KV cache of its own, an entry per position p: the token at p + 1 and the model's state
after the output norm at p. A step of the block at p gives the logits of the token at p + 2. Drafting after a
history whose last token (at pos) the model has not run yet: the block first catches up on the positions it lacks
up to pos - 1, with the model's states there (kept by the engine as its forward runs: keep), whose last row
drafts the token at pos + 1; each next draft is a step at the next position on the block's own state and the
draft before (a chain). The chain's entries past pos - 1 are provisional: the next call writes them again from
the position the model's states then reach.

The block runs where the model's head does (the CPU engine's backend, or the GPU's last segment), on a backend of its
layer alone that shares the model's head: the model's states stay on that device, and only a draft's logits row
comes to the host (draft_from samples there). Under plain greedy sampling on the GPU the catch-up's last few tokens
and each draft's step are captured steps (cuda_graph.DraftStep) that feed each argmax to the next on the device, and
the host reads the drafts once; on the CPU each argmax is taken in turn.
"""
import numpy as np

from inference.backend_cpu import CPUBackend
from inference.forward import mtp
from inference.sampling import SamplingParams, plain_greedy
from inference.speculative import Draft, SpeculationError, common_prefix, draft_from
from inference.weights import ModelWeights
from models.config import ModelConfig


class MTPDrafter:
    def __init__(self, cfg: ModelConfig, weights: ModelWeights, be, cost: float, step=None):
        self.cfg, self.weights = cfg, weights
        self.cost = cost  # what a step of the block costs, as a share of one step of the model
        self.be = be  # a backend of the block's layer alone (mtp_drafter's), on the device of the model's head
        self.step = step  # on the GPU, cuda_graph.DraftStep: a greedy propose's captured steps
        self.states = be.rows(cfg.n_embd)  # the model's state after the output norm at each position (be's device)
        self.entered: list[int] = []  # the history the cache's entries up to len - 2 were made from

    def keep(self, pos: int, states) -> None:
        """The model's states [n, n_embd] (on the block's device) at positions pos.. of the tokens it just ran."""
        self.states = self.be.put_rows(self.states, pos, states)

    def propose(self, history: list[int], k: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        pos = len(history) - 1  # the last token's, which the model runs next: its states stop at pos - 1
        # entry p is the block's on history[p + 1] and the state after history[:p + 1]: those that history shares
        # with the one they were made from hold
        start = max(0, min(common_prefix(history, self.entered) - 1, pos - 1))
        self.entered = list(history)
        size = self.be.prefill_chunk
        while pos - start > size:  # a long catch-up (a prompt's) a chunk at a time, as a prompt runs
            start = self._catch_up(history, start, size)
        greedy = plain_greedy(params)  # a draft is the argmax: a point mass, taken on the device
        if greedy and self.step is not None:  # the GPU: the catch-up's last tokens and the drafts are captured steps
            start = self._catch_up(history, start, max(0, pos - start - self.step.n_max))
            return Draft(self.step.drafts(history[start + 1:], start, self.states[start:pos], k), None)
        tokens, h = history[start + 1:], self.states[start:pos]
        draft = Draft([], None if greedy else [])
        for _ in range(k):
            self.be.set_input(np.array(tokens, np.int32), start)
            logits, h = mtp(self.be, self.cfg, self.weights, h)
            if greedy:
                draft.tokens.append(int(self.be.to_host(self.be.argmax_rows(logits))[0]))
            else:
                draft_from(self.be.to_host(logits)[0], history, params, rng, draft)
            # the block's state out of the step's buffers (a GPU step's arena is the next step's)
            start, tokens, h = start + len(tokens), draft.tokens[-1:], self.be.copy(h[-1:])
        return draft

    def _catch_up(self, history: list[int], start: int, n: int) -> int:
        """The block's entries start..start + n - 1 from history and the model's states there, eagerly (its logits
        unused); the next entry's position."""
        if n:
            self.be.set_input(np.array(history[start + 1:start + 1 + n], np.int32), start)
            mtp(self.be, self.cfg, self.weights, self.states[start:start + n])
        return start + n


def mtp_drafter(engine, gguf, k_max: int) -> MTPDrafter:
    """The drafter of --spec mtp for an engine.Engine of the file gguf, at most k_max drafts a propose, or the one-line
    reason there is none."""
    config, n = engine.config, engine.config.n_layers
    if engine._weights.nextn is None:
        raise SpeculationError(f"this model file has no MTP block (blk.{n}.nextn.*): use --spec ngram or --draft")
    # decode reads the weights once a token: a step of the block costs its share of the bytes (and the head's)
    block = sum(t.nbytes for name, t in gguf.tensors.items() if name.startswith(f"blk.{n}."))
    cost = (block + engine._weights.nextn.head.data.nbytes) / gguf.file_size
    layers, model = range(n, n + 1), engine._be  # the model's backend that runs its head
    if isinstance(model, CPUBackend):
        return MTPDrafter(config, engine._weights, CPUBackend(config, engine._weights, engine.n_ctx, layers,
                                                              head=model._head), cost)
    from inference.backend_cuda import CUDABackend, out_of_vram  # noqa: PLC0415  (CuPy only on this path)
    from inference.cuda_graph import DraftStep  # noqa: PLC0415
    from kernels.cuda.quant import MATVEC_MAX_TOKENS  # noqa: PLC0415
    try:
        be = CUDABackend(config, engine._weights, engine.n_ctx, layers, prefill_chunk=model.prefill_chunk,
                         shares=model)
        # a catch-up after a verify step takes the kept drafts and the token after them
        step = DraftStep(be, config, engine._weights, min(k_max + 1, MATVEC_MAX_TOKENS), engine._cuda_graph)
    except Exception as e:
        if not out_of_vram(e):
            raise
        # placement sets aside an estimate of the block's VRAM (mtp_block_bytes); past it, a one-line refusal
        raise SpeculationError("the MTP block does not fit in VRAM beside the model: use --spec off, or fewer "
                               "--gpu-layers") from None
    return MTPDrafter(config, engine._weights, be, cost, step)
