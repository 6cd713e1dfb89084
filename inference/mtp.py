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
comes to the host (draft_from samples there), or under plain greedy sampling its argmax alone.
"""
import numpy as np

from inference.backend_cpu import CPUBackend
from inference.forward import mtp
from inference.sampling import SamplingParams, plain_greedy
from inference.speculative import Draft, SpeculationError, common_prefix, draft_from
from inference.weights import ModelWeights
from models.config import ModelConfig


class MTPDrafter:
    def __init__(self, cfg: ModelConfig, weights: ModelWeights, be, cost: float):
        self.cfg, self.weights = cfg, weights
        self.cost = cost  # what a step of the block costs, as a share of one step of the model
        self.be = be  # a backend of the block's layer alone (mtp_drafter's), on the device of the model's head
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
            self.be.set_input(np.array(history[start + 1:start + 1 + size], np.int32), start)
            mtp(self.be, self.cfg, self.weights, self.states[start:start + size])
            start += size
        tokens, h = history[start + 1:], self.states[start:pos]
        greedy = plain_greedy(params)  # a draft is the argmax: a point mass, taken on the device
        draft, picked = Draft([], None if greedy else []), []
        tokens = np.array(tokens, np.int32)
        for _ in range(k):
            self.be.set_input(tokens, start)
            logits, h = mtp(self.be, self.cfg, self.weights, h)
            start += len(tokens)
            if greedy:  # the argmax stays where it is, the next step's input: the host waits once, at the end
                picked.append(self.be.argmax_rows(logits))
                tokens = picked[-1]
            else:
                draft_from(self.be.to_host(logits)[0], history, params, rng, draft)
                tokens = np.array(draft.tokens[-1:], np.int32)
            h = self.be.copy(h[-1:])  # the block's state out of the step's buffers (a GPU step's arena is the next's)
        if greedy:
            draft.tokens = [int(self.be.to_host(t)[0]) for t in picked]
        return draft


def mtp_drafter(engine, gguf) -> MTPDrafter:
    """The drafter of --spec mtp for an engine.Engine of the file gguf, or the one-line reason there is none."""
    config, n = engine.config, engine.config.n_layers
    if engine._weights.nextn is None:
        raise SpeculationError(f"this model file has no MTP block (blk.{n}.nextn.*): use --spec ngram or --draft")
    # decode reads the weights once a token: a step of the block costs its share of the bytes (and the head's)
    block = sum(t.nbytes for name, t in gguf.tensors.items() if name.startswith(f"blk.{n}."))
    cost = (block + engine._weights.nextn.head.data.nbytes) / gguf.file_size
    layers, model = range(n, n + 1), engine._be  # the model's backend that runs its head
    if isinstance(model, CPUBackend):
        be = CPUBackend(config, engine._weights, engine.n_ctx, layers, head=model._head)
    else:
        from inference.backend_cuda import CUDABackend, out_of_vram  # noqa: PLC0415  (CuPy only on this path)
        try:
            be = CUDABackend(config, engine._weights, engine.n_ctx, layers, prefill_chunk=model.prefill_chunk,
                             shares=model)
        except Exception as e:
            if not out_of_vram(e):
                raise
            # placement sets aside an estimate of the block's VRAM (mtp_block_bytes); past it, a one-line refusal
            raise SpeculationError("the MTP block does not fit in VRAM beside the model: use --spec off, or fewer "
                                   "--gpu-layers") from None
    return MTPDrafter(config, engine._weights, be, cost)
