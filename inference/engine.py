"""Engine: a loaded model with its KV cache; logits for tests and streaming generation for people."""
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from inference.backend_cpu import CPUBackend
from inference.forward import forward
from inference.grammar import Constraint, Guide, vocabulary
from inference.kv_ring import cache_rows
from inference.placement import (DEFAULT_GPU_SHARE, OFFLOAD_MIN_TOKENS, PREFILL_CHUNK, Placement, VramBudgetError,
                                 all_on_cpu, free_vram, holds_kv_sources, plan_placement, split)
from inference.sampling import Sampler, SamplingParams
from inference.mtp import MTPDrafter, mtp_drafter
from inference.speculative import (SPEC_K, VERIFY_TOKEN_COST, DraftModel, PromptLookup, Speculation, SpecCounts,
                                   check_draft_vocabulary, check_spec_options, common_prefix, drafts_can_pay,
                                   speculative_tokens)
from inference.weights import load_weights
from kernels.cuda.shapes import ATTENTION_HEAD_DIMS, DELTANET_CONV_K, DELTANET_HEAD_SIZES
from models.chat_template import load_chat_template
from models.config import ModelConfig, config_from_metadata
from models.errors import UserError
from models.gguf import open_gguf
from models.model_ref import resolve_model
from models.tokenizer import Tokenizer


# Recurrent layers (qwen35's DeltaNet) keep a state that cannot be rewound: the engine keeps copies of it in host
# memory (checkpoints) at the end of each prompt and each reply, and every CHECKPOINT_EVERY tokens of a long prompt,
# so that a prompt that diverges from the cached conversation (regenerate, an edited last message, a request that
# shares a system prompt) resumes from the last checkpoint inside the prefix it shares, not from its start. The
# oldest-used go first beyond CHECKPOINT_MAX of them or CHECKPOINT_BYTES in all.
CHECKPOINT_EVERY = 512
CHECKPOINT_MAX = 32
CHECKPOINT_BYTES = 2 << 30
# Engine.verify_token_cost: the best of this many timed forwards each, its cost rounded to this step
VERIFY_COST_REPS, VERIFY_COST_STEP = 2, 0.05

# Engine.warm_up's prompt: long enough that its decode steps take the paths a longer context takes (the CPU's
# parallel decode attention from kernels/cpu/attention.ATTENTION_PARALLEL_WORK: ~114 keys on SmolLM2, 64 on Gemma 3;
# the GPU's grouped experts from placement.GROUPED_MIN_TOKENS), so that none compiles during a first reply.
WARM_UP_TOKENS = 160


class PromptTooLongError(UserError, ValueError):
    pass


class EmptyPromptError(UserError, ValueError):
    pass


class NoChatTemplateError(UserError, ValueError):
    pass


def gpu_gap(config: ModelConfig) -> str | None:
    """What of this model the GPU kernels do not take yet (None: they take all of it): it then runs on the CPU."""
    head_dims = sorted({config.layer_heads(i)[2] for i in config.attention_layers} - set(ATTENTION_HEAD_DIMS))
    if head_dims:
        return f"attention heads of {', '.join(map(str, head_dims))} (only {', '.join(map(str, ATTENTION_HEAD_DIMS))})"
    if config.recurrent and any(config.recurrent):
        if config.ssm_state not in DELTANET_HEAD_SIZES:
            return f"DeltaNet heads of {config.ssm_state} (only {', '.join(map(str, DELTANET_HEAD_SIZES))})"
        if config.ssm_conv_kernel != DELTANET_CONV_K:
            return f"a DeltaNet conv of {config.ssm_conv_kernel} taps (only {DELTANET_CONV_K})"
    return None


class DeviceError(UserError, ValueError):
    pass


@dataclass
class GenerationStats:
    prompt_tokens: int  # tokens processed for this prompt (those reused from the cache not counted)
    prompt_seconds: float
    generated_tokens: int  # tokens of the reply (an end-of-generation token is not one)
    generation_seconds: float
    finish_reason: str  # "stop", "length", "context full" or "cancelled" (during the prompt)
    context_tokens: int  # tokens in the context after the reply: the prompt (all of it) and the reply, <= n_ctx
    stop_string: str | None = None  # the stop string that ended the reply (finish_reason "stop"), if one did
    drafted: int = 0  # speculative decoding's drafts the model checked (speculative.py)
    accepted: int = 0  # of them, those it kept

    @property
    def prompt_tok_s(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    @property
    def generation_tok_s(self) -> float:
        return self.generated_tokens / self.generation_seconds if self.generation_seconds > 0 else 0.0

    def to_dict(self) -> dict:
        """Every field and both rates, for JSON and the chat store."""
        return asdict(self) | {"prompt_tok_s": self.prompt_tok_s, "generation_tok_s": self.generation_tok_s}


class Engine:
    def __init__(self, path: Path, config: ModelConfig, weights, tokenizer, gguf, n_ctx: int, placement: Placement,
                 cuda_graph: bool = True, notify=None, gpu_share=DEFAULT_GPU_SHARE):
        self.path = path
        self.config = config
        self.tokenizer = tokenizer
        self.n_ctx = n_ctx
        self._weights = weights
        self._cuda_graph = cuda_graph
        self._gpu_share = gpu_share  # of the CPU layers' rows, for their one-token matmuls (gpu_share.py)
        self._notify = notify or _to_stderr  # says what load and recovery decided (OOM retries)
        self._gguf = gguf  # keeps the memory map the weights view alive
        self._place(placement)
        self.chat_template = load_chat_template(gguf.metadata)  # None: the file has none
        self._cached: list[int] = []  # tokens whose keys and values are in the cache, from position 0
        self._prompt_logits = None  # (ids, logits [1, n_vocab] of ids[-1]) of the last prompt prefilled
        self._checkpoints: list[Checkpoint] = []  # of the recurrent layers' state, most recently used last
        self._prefill_start = 0  # where the last prefill began: the tokens before it came from the cache
        self.speculation: Speculation | None = None  # drafts verified a step (speculative.py); None: a token a step
        self._verify_cost: float | None = None  # verify_token_cost's measurement, once made

    def _place(self, placement: Placement) -> None:
        """Build the backends for placement: (backend, layers) segments in order, the GPU ones last; if the GPU
        runs out of memory while uploading, retry with fewer GPU layers (and say so) down to none."""
        self.placement = placement
        self._verify_step = None  # cuda_graph.VerifyStep, made by the first verify step that can be captured
        while True:
            k = self.placement.n_gpu_layers
            try:
                self._segments, self._decode = _build(self.config, self._weights, self.n_ctx, k, self._cuda_graph,
                                                      self._gpu_share, self._notify, self.placement.cpu_expert_layers,
                                                      self.placement.prefill_chunk)
                break
            except Exception as e:
                if k == 0 or not _out_of_vram(e):
                    raise
            # here, past the except, the traceback no longer holds the half-built backend
            self.placement = self._with_gpu_layers(_fewer_layers(k, self._notify, "loading"))
        self.device = "cpu" if k == 0 else "cuda"
        self._be = self._segments[-1][0]  # gives the logits
        first = self._segments[0][0]
        # a prompt chunk of OFFLOAD_MIN_TOKENS or more runs every layer on the GPU, the CPU layers lent to it
        # (backend_cuda): the CPU embeds its tokens only. Not for recurrent layers: their states stay where they are
        self._chunk_segments = self._segments if len(self._segments) == 1 or any(self.config.recurrent) else [
            (first, range(0)), (self._be, range(self.config.n_layers))]
        self.gpu_share = first.share if isinstance(first, CPUBackend) else None  # a GpuShare or None

    def warm_up(self) -> None:
        """Run a prompt and a few sampled decode steps once and forget them, so that the kernels a reply needs are
        compiled (numba's on a first start: ~30-70 s on 2 cores; CUDA's, the sampler's and the decode graph on a GPU)
        before a reply is timed or waited for. The prompt is WARM_UP_TOKENS long where the context allows."""
        ids = self.tokenizer.encode("Hello, world. Hello again, world. " * (WARM_UP_TOKENS // 4))
        ids = ids[:min(WARM_UP_TOKENS, self.n_ctx - 3)]
        if ids:
            for _ in self.generate(ids, max_tokens=3, temperature=1.0, seed=0):
                pass
        self.reset()

    def reset(self) -> None:
        """Forget the cached context and the checkpoints of it: the next prompt starts from an empty context."""
        self._cached, self._prompt_logits, self._checkpoints = [], None, []

    def summary(self) -> str:
        """Where the model runs (run --verbose): the placement, the GPU's share of the CPU layers if any, and who
        runs the experts kept in host memory if any."""
        host_experts = self._be.host_experts.describe() if self.device == "cuda" else None
        return "\n  ".join([self.placement.summary()] + [s for s in (self.gpu_share and self.gpu_share.describe(),
                                                                    host_experts) if s])

    def _with_gpu_layers(self, k: int) -> Placement:
        """The placement with only its last k layers on the GPU, after running out of VRAM."""
        p, reason = self.placement, "out of GPU memory"
        if k == 0 or not holds_kv_sources(self.config, k):  # gemma4: fewer would part the KV-shared layers' caches
            return all_on_cpu(self.config.n_layers, self.n_ctx, reason)
        return split(self._gguf.tensors, self.config, self.n_ctx, k, p.budget_bytes, p.reserve_bytes, reason,
                     p.cpu_expert_layers, longer_chunks=False)  # the counts fell short: no spare VRAM to count on

    def logits(self, ids) -> np.ndarray:
        """Teacher-forced logits [len(ids), n_vocab] float32 of a fresh context."""
        ids = list(ids)
        self._check_fits(len(ids))
        self._cached = []
        return self._prefill(ids, all_logits=True)

    def check_prompt(self, prompt, chat_template: str | None = None, template_vars: dict | None = None) -> None:
        """Raise the UserError generate() would raise for this prompt (no chat template, empty, longer than the
        context) now, before a warm-up is spent on it."""
        self._check_fits(len(self.prompt_ids(prompt, chat_template, template_vars)))

    def _check_fits(self, n: int) -> None:
        if n == 0:
            raise EmptyPromptError("the prompt is empty")
        if n > self.n_ctx:
            raise PromptTooLongError(f"the prompt is {n} tokens but the context holds {self.n_ctx} "
                                     "(raise it with --ctx)")

    def _prefill(self, ids: list[int], all_logits: bool, cancelled=None):
        """Process ids after the longest prefix already cached. all_logits: numpy [n_new, n_vocab] of every new
        token; else the last token's logits [1, n_vocab], left on the backend's device. If the prompt's buffers
        do not fit in VRAM next to the layers, layers move to the CPU (said) and the prompt starts over."""
        while True:
            try:
                return self._prefill_chunks(ids, all_logits, cancelled)
            except Exception as e:
                if self.device != "cuda" or not _out_of_vram(e):
                    raise
            # past the except, no traceback holds the old backends: dropping them frees their VRAM (the MTP block's
            # backend shares the head's copy and the stream: it is made again with the new ones)
            remake = self._mtp() is not None
            if remake:
                self.speculation.drafter = None
            self._segments = self._chunk_segments = self._decode = self._be = self.gpu_share = None
            self._verify_step = None
            self._cached = []
            self._place(self._with_gpu_layers(_fewer_layers(self.placement.n_gpu_layers, self._notify,
                                                            "processing the prompt")))
            if remake:
                self.speculation.drafter = mtp_drafter(self, self._gguf, self.speculation.k_max)

    def _prefill_chunks(self, ids: list[int], all_logits: bool, cancelled=None):
        cached = common_prefix(ids, self._cached)
        if (not all_logits and cached == len(ids) and self._prompt_logits and self._prompt_logits[0] == ids
                and self._rewind(ids, len(ids)) == len(ids)):
            # the same prompt again (regenerate): its logits as they were, not its last token re-run alone,
            # whose one-token matmuls round activations to 8 bits and may pick another greedy reply
            self._cached = list(ids)  # what came after the prompt last time is overwritten from here on
            self._prefill_start = len(ids)
            return self._be.copy(self._prompt_logits[1])
        # else the last token always runs: its logits pick the next one
        keep = self._rewind(ids, min(cached, len(ids) - 1))
        self._prefill_start = keep
        out = []
        # the GPU's chunk where there is a GPU: it runs every layer of a chunk (_chunk_segments); one shorter than
        # OFFLOAD_MIN_TOKENS, shorter than the CPU's too, runs on the segments as placed
        size = self._be.prefill_chunk
        for start in range(keep, len(ids), size):
            if cancelled is not None and cancelled():
                return None  # the chunks so far stay cached: a later prompt that shares them goes on from there
            chunk = np.array(ids[start:start + size], np.int32)
            segments = self._chunk_segments if len(chunk) >= OFFLOAD_MIN_TOKENS else self._segments
            for be, _ in segments:
                be.set_input(chunk, start)
            logits = self._forward(segments, start, all_logits)
            out.append(self._be.to_host(logits) if all_logits else logits)
            self._cached = ids[:start + len(chunk)]
            if (start + len(chunk)) // CHECKPOINT_EVERY > start // CHECKPOINT_EVERY or start + len(chunk) == len(ids):
                self._checkpoint()
        if all_logits:
            return np.concatenate(out).astype(np.float32, copy=False)
        self._prompt_logits = (list(ids), self._be.copy(out[-1]))
        return out[-1]

    def _checkpoint(self) -> None:
        """Keep a copy of the recurrent layers' state as it is now, after the cached tokens (a model without such
        layers keeps none)."""
        if not any(self.config.recurrent) or not self._cached:
            return
        self._checkpoints = [c for c in self._checkpoints if c.tokens != self._cached]
        states = {}
        for be, _ in self._segments:
            states |= be.recurrent_state()
        self._checkpoints.append(Checkpoint(list(self._cached), states))
        while len(self._checkpoints) > CHECKPOINT_MAX or sum(c.nbytes for c in self._checkpoints) > CHECKPOINT_BYTES:
            self._checkpoints.pop(0)

    def _rewind(self, ids: list[int], keep: int) -> int:
        """Where a prompt ids whose first keep tokens are cached can start: keep where nothing recurrent stands in
        the way (attention's cache is overwritten from there), else the end of the last checkpoint inside those
        keep tokens, whose state is restored (0: the start, nothing to restore). A sliding window's ring that no
        longer holds the window before keep (overwritten by later tokens) sends the prompt to its start too."""
        if keep < len(self._cached) and not all(be.can_resume(keep) for be, _ in self._segments):
            return 0
        if not any(self.config.recurrent) or keep == len(self._cached):
            return keep  # the recurrent state is after the cached tokens, where the prompt goes on
        inside = [c for c in self._checkpoints if len(c.tokens) <= keep and c.tokens == ids[:len(c.tokens)]]
        if not inside:
            return 0
        best = max(inside, key=lambda c: len(c.tokens))
        for be, _ in self._segments:
            be.restore_recurrent_state(best.states)
        self._checkpoints.remove(best)
        self._checkpoints.append(best)  # the most recently used
        self._cached = list(best.tokens)
        return len(best.tokens)

    def _host_tokens(self, logits, params: SamplingParams, seed: int | None, history: list[int],
                     guide: Guide | None = None) -> Iterator[int]:
        """The CPU engine's tokens after history, sampled from logits [1, n_vocab] (of history's last token), among
        those guide's grammar allows. Each next() after the first runs the model on the token before it (the
        caller caches it first)."""
        sampler = Sampler(params, seed)
        history = list(history)
        while True:
            allowed = guide.mask() if guide else None
            token = sampler(self._be.to_host(logits)[0], history, allowed)
            if guide:
                guide.accept(token)
            yield token
            history.append(token)
            logits = self._run([token], len(self._cached) - 1)

    def _run(self, tokens: list[int], pos: int, all_logits: bool = False, snapshots: bool = False):
        """The logits of tokens run at pos.. on the segments as placed (one CPU backend; on the GPU its segments, as
        a short prompt runs): [1, n_vocab] of the last token, or [len(tokens), n_vocab] of each (all_logits), on
        the backend's device. snapshots: the recurrent states are kept after each token (rewind_states)."""
        for be, _ in self._segments:
            be.set_input(np.array(tokens, np.int32), pos, snapshots)
        return self._forward(self._segments, pos, all_logits)

    def _forward(self, segments, pos: int, all_logits: bool):
        """forward() of the tokens the segments were given at pos; where the MTP block drafts, it is handed the
        model's states there (mtp.MTPDrafter.keep)."""
        drafter = self._mtp()
        if drafter is None:
            return forward(segments, self.config, self._weights, all_logits=all_logits)
        logits, states = forward(segments, self.config, self._weights, all_logits=all_logits, hidden=True)
        drafter.keep(pos, states)  # on the device of the head, where the block runs
        return logits

    def _mtp(self) -> MTPDrafter | None:
        """The MTP block's drafter where it drafts: every forward of the model keeps its states for it."""
        spec = self.speculation
        return spec.drafter if spec is not None and isinstance(spec.drafter, MTPDrafter) else None

    def _verify(self, tokens: list[int], pos: int, argmax: bool = False) -> np.ndarray:
        """A verify step of speculative decoding: logits [len(tokens), n_vocab] on the host, or with argmax each
        row's argmax [len(tokens)] (taken where the logits are), the recurrent states kept after each token. On the
        GPU a captured step (cuda_graph.VerifyStep) where it can be, else the eager forward."""
        step = self._captured_verify(len(tokens))
        if step is None:
            # a lone token (a step that drafted nothing) has nothing to take back: no copies of the states (on
            # the CPU ~4% of a qwen35 step)
            rows = self._run(tokens, pos, all_logits=True, snapshots=len(tokens) > 1)
        else:
            rows, states = step(tokens, pos)
            if states is not None:
                self._mtp().keep(pos, states)
        return self._be.to_host(self._be.argmax_rows(rows) if argmax else rows)

    def _captured_verify(self, n: int):
        """The captured verify step (cuda_graph.VerifyStep) for the speculation as it is, made on first use, or None
        where verify steps run eagerly: on the CPU, with layers or experts on the host (host work in the step's
        middle), or for a k_max whose steps pass the few-token matvecs' MATVEC_MAX_TOKENS."""
        decode, spec = self._decode, self.speculation
        if decode is None or decode.cpu is not None or self._be.host_experts.layers or spec is None:
            return None
        from kernels.cuda.quant import MATVEC_MAX_TOKENS  # noqa: PLC0415  (CuPy only on this path)
        n_max, hidden = spec.k_max + 1, self._mtp() is not None
        if n_max > MATVEC_MAX_TOKENS:
            # eager steps may grow the snapshot rows a captured step's graphs hold: a later one is captured anew
            self._verify_step = None
            return None
        step = self._verify_step
        if step is None or step.n_max < n_max or step.hidden != hidden:  # another speculation than the step's
            from inference.cuda_graph import VerifyStep  # noqa: PLC0415
            step = self._verify_step = VerifyStep(self._be, self.config, self._weights, n_max, decode.use_graph,
                                                  hidden)
        return step

    def verify_token_cost(self, k: int) -> float:
        """What one more token of a verify step costs, as a share of a one-token step (speculative.DraftLength). On
        the CPU, measured once: forwards of 1 token (a decode step's) and of k + 1 with all logits and the states'
        snapshots (a verify step's) at a fresh context's start, the best of VERIFY_COST_REPS each, rounded to
        VERIFY_COST_STEP so that the draft lengths of a seeded reply do not move with the machine's noise; the
        context is cleared after. On the GPU (explicit --spec only: auto does not speculate there), the constant."""
        k = min(k, self.n_ctx - 1)  # the forwards fit the context
        if self.device != "cpu" or k < 1:
            return VERIFY_TOKEN_COST
        if self._verify_cost is None:
            ids = self.tokenizer.encode("Hello, world. " * (k + 1))[:k + 1]

            def best(n: int, verify: bool) -> float:
                times = []
                for _ in range(VERIFY_COST_REPS + 1):  # the first compiles what it needs
                    t = time.perf_counter()
                    self._run(ids[:n], 0, all_logits=verify, snapshots=verify)
                    times.append(time.perf_counter() - t)
                return min(times[1:])
            one, many = best(1, False), best(k + 1, True)
            cost = max(0.0, (many / one - 1) / k)
            self._verify_cost = round(cost / VERIFY_COST_STEP) * VERIFY_COST_STEP
            self.reset()
        return self._verify_cost

    def _rewind_states(self, n: int) -> None:
        """The recurrent states back to after the context's first n tokens (inside the last verify step's)."""
        for be, _ in self._segments:
            be.rewind_states(n)

    def next_logits(self, ids: list[int]) -> np.ndarray:
        """The logits [n_vocab] (host) after ids, running only what the cache does not hold (a draft model's
        step, speculative.DraftModel)."""
        return self._be.to_host(self._prefill(list(ids), all_logits=False))[0]

    def prompt_ids(self, prompt, chat_template: str | None = None, template_vars: dict | None = None) -> list[int]:
        """Token ids of a plain-text prompt, of messages rendered with the chat template, or ids as given."""
        if isinstance(prompt, np.ndarray) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
            return [int(t) for t in prompt]
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        return self.tokenizer.encode_prompt(self.prompt_text(prompt, chat_template, template_vars))

    def template(self, chat_template: str | None = None):
        """The model's ChatTemplate (None: the file has none), or the built-in one named."""
        return load_chat_template(self._gguf.metadata, chat_template) if chat_template else self.chat_template

    def prompt_text(self, messages: list[dict], chat_template: str | None = None,
                    template_vars: dict | None = None) -> str:
        """Messages rendered with the model's chat template (or the built-in one named); template_vars: more names
        it may read (reasoning_effort, enable_thinking)."""
        template = self.template(chat_template)
        if template is None:
            raise NoChatTemplateError("this model has no chat template: use plain completion (--raw) "
                                      "or name one with --chat-template")
        return template.render(messages, **(template_vars or {}))

    def _fit_messages(self, messages: list[dict], chat_template: str | None, room: int,
                      template_vars: dict | None = None) -> list[int]:
        messages = list(messages)
        while True:
            ids = self.prompt_ids(messages, chat_template, template_vars)
            turns = [i for i, m in enumerate(messages[:-1]) if m["role"] != "system"]
            if len(ids) + room <= self.n_ctx or not turns:
                return ids
            del messages[turns[0]]
            # templates want a conversation to open with the user: an orphaned reply goes with its question
            rest = [i for i, m in enumerate(messages[:-1]) if m["role"] != "system"]
            if rest and messages[rest[0]]["role"] == "assistant":
                del messages[rest[0]]

    def generate(self, prompt, max_tokens: int = 512, temperature: float = 0.8, top_k: int = 40,
                 top_p: float = 0.95, min_p: float = 0.05, repeat_penalty: float = 1.0, seed: int | None = None,
                 stop=(), chat_template: str | None = None, template_vars: dict | None = None,
                 drop_old_turns: bool = False, cancelled=None, special: bool = False, shown=(),
                 constraint: Constraint | None = None) -> Iterator:
        """Yield the reply as text pieces, then one GenerationStats. Closing the generator stops it; cancelled()
        returning True stops a long prompt between its chunks (finish_reason "cancelled", no text), where
        nothing else could: the prompt runs before the first piece.
        drop_old_turns: messages that do not fit lose their oldest turns (never a system message or the last
        message) until the reply has room for max_tokens or half the context, whichever is less.
        special: control tokens come as their text (<|python_tag|>, harmony's <|channel|>...), for a parser of the
        chat format's tool calls. shown: texts of the control tokens that come as text all the same (the chat
        template's reply_markup: Gemma 4's channel markers, which its reply's split reads).
        constraint: the reply follows its grammar (inference/grammar.py), token by token; it then ends with
        finish_reason "stop" once the grammar is complete, or "length" at max_tokens before that (an unfinished
        text, as OpenAI's API returns it). On the GPU such a reply has its own captured step, which applies the
        grammar's mask on the device (cuda_graph.DecodeStep)."""
        guide = Guide(vocabulary(self.tokenizer), constraint) if constraint else None
        if drop_old_turns and isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            ids = self._fit_messages(prompt, chat_template, min(max_tokens, self.n_ctx // 2), template_vars)
        else:
            ids = self.prompt_ids(prompt, chat_template, template_vars)
        self._check_fits(len(ids))
        params = SamplingParams(temperature, top_k, top_p, min_p, repeat_penalty)
        eog = self.tokenizer.eog_ids
        spec = self.speculation if not guide else None  # a grammar's masks go a token at a time: no speculation
        # measured before the prompt runs: measuring clears the context
        verify_cost = self.verify_token_cost(spec.k_max) if spec and spec.measured else VERIFY_TOKEN_COST
        if spec and spec.measured and not drafts_can_pay(spec.k_max, spec.drafter.cost, verify_cost):
            # --spec auto's drafter where a checked token costs too much of a step here: plain decoding from now on
            self.speculation = spec = None
        t0 = time.perf_counter()
        logits = self._prefill(ids, all_logits=False, cancelled=cancelled)
        n_reused = self._prefill_start
        if logits is None:
            processed = max(0, common_prefix(ids, self._cached) - n_reused)
            yield GenerationStats(processed, time.perf_counter() - t0, 0, 0.0, "cancelled", len(self._cached))
            return
        if self._decode:
            self._decode.wait()  # the GPU works asynchronously: count the prompt's time in its stats
        t1 = time.perf_counter()
        counts = SpecCounts()
        if spec:
            tokens = speculative_tokens(self._be.to_host(logits)[0], ids, params, seed, spec.drafter, spec.k_max,
                                        self._verify, self._rewind_states, min(self.n_ctx, len(ids) + max_tokens - 1),
                                        counts, verify_cost)
        elif self._decode and not self._mtp():  # the captured step keeps no states for the block: eager steps
            tokens = self._decode.tokens(logits, params, seed, ids, max_tokens, guide)
        else:
            tokens = self._host_tokens(logits, params, seed, ids, guide)
        # a reply continues its prompt: " Paris" keeps its space
        detok = self.tokenizer.stream(special, at_start=False, shown=shown)
        text = StopScanner(stop)
        generated = 0
        finish = "length"
        stopped = None  # the stop string that ended the reply: what follows it is dropped
        try:
            while generated < max_tokens:
                token = next(tokens)
                if token in eog:  # ends the reply, not a part of it
                    finish = "stop"
                    break
                generated += 1
                piece, stopped = text.feed(detok.push(token))
                if piece:
                    yield piece
                if stopped:
                    finish = "stop"
                    break
                if generated == max_tokens:
                    break
                if len(self._cached) >= self.n_ctx:
                    finish = "context full"
                    break
                self._cached.append(token)  # the next next(tokens) runs it through the model
        finally:  # a verify step may have run past the last token the reply kept (an end token, a stop string,
            # a closed generator): the recurrent states go back to the end of the cached tokens
            if spec:
                self._rewind_states(len(self._cached))
        if not stopped:
            tail, _ = text.feed(detok.flush(), final=True)
            if tail:
                yield tail
        if self._decode and not spec and getattr(self._be, "state_pos", 0) == len(self._cached) + 1:
            # the GPU ran the step on the last token before handing it out (DecodeStep.tokens): a recurrent state
            # cannot leave it out again, so it belongs to the context (a chat's next prompt often starts with it)
            self._cached.append(token)
        self._checkpoint()  # the end of the reply: where the next turn of the conversation goes on
        t2 = time.perf_counter()
        # a reply that fills the context ends with a token that has no room in it
        yield GenerationStats(len(ids) - n_reused, t1 - t0, generated, t2 - t1, finish,
                              min(len(ids) + generated, self.n_ctx), stopped, counts.drafted, counts.accepted)


@dataclass
class Checkpoint:
    """The recurrent layers' state after tokens: layer -> (position, conv state, delta state), in host memory."""
    tokens: list[int]
    states: dict

    @property
    def nbytes(self) -> int:
        return sum(conv.nbytes + delta.nbytes for _, conv, delta in self.states.values())


class StopScanner:
    """Streams text through, holding back what might be the start of a stop string until it is decided."""

    def __init__(self, stop):
        self.stop = [s for s in stop if s]
        self.held = ""

    def feed(self, text: str, final: bool = False) -> tuple[str, str | None]:
        """(text safe to show, the stop string found or None)."""
        self.held += text
        for s in self.stop:
            at = self.held.find(s)
            if at >= 0:
                return self.held[:at], s
        keep = 0 if final else max((_suffix_prefix(self.held, s) for s in self.stop), default=0)
        out, self.held = self.held[:len(self.held) - keep], self.held[len(self.held) - keep:]
        return out, None


def _suffix_prefix(text: str, s: str) -> int:
    """Length of the longest end of text that is a beginning of s."""
    for n in range(min(len(text), len(s) - 1), 0, -1):
        if s.startswith(text[-n:]):
            return n
    return 0


def _default_ctx(cfg: ModelConfig, file_size: int, memory: int | None = None) -> int:
    """The model's context, capped so the CPU engine's float32 KV cache fits in half the memory (default: the
    host's) left after the weights. A sliding layer's ring (kv_ring.py) costs the same at any longer context, so
    Gemma's and gpt-oss's caches grow with their global layers alone."""
    layers = [i for i in cfg.attention_layers if cfg.has_kv(i)]  # gemma4's KV-shared layers add none

    def cache_bytes(n_ctx: int) -> int:  # each attention layer's own heads (gemma4's differ by kind)
        return sum(4 * kv * (hd + vd) * cache_rows(cfg, n_ctx, i, CPUBackend.prefill_chunk)
                   for i, (kv, hd, vd) in ((i, cfg.layer_heads(i)[1:]) for i in layers))
    if memory is None:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    room, lo, hi = memory // 2 - file_size, 256, cfg.n_ctx_train
    while lo < hi:  # the longest context whose cache fits the room (cache_bytes grows with it)
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if cache_bytes(mid) <= room else (lo, mid - 1)
    return min(lo, cfg.n_ctx_train)


def cuda_available() -> bool:
    """CuPy imports and sees a GPU (CuPy is optional: the CPU engine needs none)."""
    try:
        import cupy  # noqa: PLC0415
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver, no device: all mean the CPU
        return False


def _build(config: ModelConfig, weights, n_ctx: int, n_gpu_layers: int, cuda_graph: bool, gpu_share=DEFAULT_GPU_SHARE,
           notify=None, cpu_expert_layers: int = 0, prefill_chunk: int = PREFILL_CHUNK):
    """(segments, decode step) with the last n_gpu_layers layers on the GPU (decode None: all on the CPU); the
    GPU multiplies gpu_share of the CPU layers' rows in their decode steps; the experts of layers
    0 .. cpu_expert_layers - 1 stay on the host (of GPU layers, the CPU runs them for the GPU backend); the GPU
    takes a prompt prefill_chunk tokens a forward."""
    n = config.n_layers
    if n_gpu_layers == 0:
        return [(CPUBackend(config, weights, n_ctx), range(n))], None
    from inference.backend_cuda import CUDABackend  # noqa: PLC0415  (CuPy only on this path)
    from inference.cuda_graph import DecodeStep  # noqa: PLC0415
    first = n - n_gpu_layers
    gpu = CUDABackend(config, weights, n_ctx, range(first, n), host_experts=range(first, cpu_expert_layers),
                      prefill_chunk=prefill_chunk)
    cpu = CPUBackend(config, weights, n_ctx, range(first), with_gpu=True) if first else None
    if cpu:
        gpu.lend(cpu.k_cache, cpu.v_cache)
        from inference.gpu_share import build_share  # noqa: PLC0415
        cpu.share = build_share(gpu.stream, weights, cpu.layers, gpu_share, cuda_graph, notify or _to_stderr)
    segments = ([(cpu, cpu.layers)] if cpu else []) + [(gpu, gpu.layers)]
    return segments, DecodeStep(gpu, config, weights, cuda_graph, cpu)


def _out_of_vram(e: Exception) -> bool:
    from inference.backend_cuda import out_of_vram  # noqa: PLC0415  (only asked once a GPU backend raised)
    return out_of_vram(e)


def _fewer_layers(k: int, notify, doing: str) -> int:
    """After running out of VRAM with k GPU layers: release what the failed attempt held, say so, and give the
    count to retry with (an eighth fewer, at least one; 0 is the CPU)."""
    import gc  # noqa: PLC0415

    import cupy  # noqa: PLC0415
    gc.collect()  # the half-built backend's arrays, held by the exception's frames until now
    cupy.get_default_memory_pool().free_all_blocks()
    fewer = k - max(1, k // 8)
    notify(f"out of GPU memory {doing} with {k} layers on the GPU: retrying with {fewer}"
           + (" (everything on the CPU)" if fewer == 0 else ""))
    return fewer


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def plan_gpu(gguf, config: ModelConfig, n_ctx: int | None, gpu_layers, vram_budget: int | None,
             free: int, cpu_moe="auto", mtp: bool = False) -> Placement:
    """Where the layers go on a GPU with free bytes of VRAM (what load() decides; info --plan shows it).
    Without a --ctx, a context too large for every layer to fit shrinks (halving, not below 4096) before layers
    leave the GPU: a fast reply matters more than a context the conversation may never fill. mtp: the MTP block
    runs beside them (plan_placement)."""
    ctx = n_ctx if n_ctx is not None else _default_ctx(config, gguf.file_size)
    try:
        plan = plan_placement(gguf.tensors, config, ctx, free, gpu_layers, vram_budget, cpu_moe, mtp)
    except VramBudgetError:
        if vram_budget is not None or gpu_layers != "auto":
            raise  # asked for: say why it cannot be
        return all_on_cpu(config.n_layers, ctx, f"{free / 2**30:.2f} GiB of free VRAM holds no layer")
    while (n_ctx is None and gpu_layers == "auto" and ctx > 4096
           and (plan.n_gpu_layers < config.n_layers or (cpu_moe == "auto" and plan.cpu_expert_layers))):
        ctx = max(4096, ctx // 2)
        plan = plan_placement(gguf.tensors, config, ctx, free, gpu_layers, vram_budget, cpu_moe, mtp)
    return plan


def load(model, device: str = "auto", gpu_layers="auto", ctx: int | None = None, progress=None,
         cuda_graph: bool = True, vram_budget: int | None = None, notify=None,
         gpu_share: float = DEFAULT_GPU_SHARE, cpu_moe="auto", spec: str = "auto", spec_k: int = SPEC_K,
         draft=None) -> Engine:
    """Open a GGUF model ready to generate: model is a path, owner/repo[:QUANT] or a pulled name (None: the
    default model); progress reports a download. device "cuda", "cpu" or "auto" (CUDA when CuPy sees a GPU).
    gpu_layers: "auto" (as many of the last layers as fit) or how many go on the GPU; vram_budget: bytes to plan
    with as on a smaller card (placement.py). cuda_graph=False runs the GPU decode step eagerly instead of
    replaying its captured graph. notify(message) hears about OOM retries (default: stderr). gpu_share: with
    layers on the CPU, the fraction of their matrix rows the GPU multiplies each decode step, streamed over PCIe
    from pinned host memory (gpu_share.py); 0 is off. cpu_moe (a model with experts): how many of the first
    layers keep their experts on the CPU ("all", a count, or "auto": as few as make the rest fit).
    spec: speculative decoding (speculative.py): "ngram" (prompt lookup), "draft" (the model draft, loaded on the
    same device), "mtp" (the model's own MTP block: mtp.py), "off", or "auto" (draft when one is given, else mtp
    on the CPU engine, else off); spec_k: at most that many drafts a step."""
    check_spec_options(spec, spec_k, draft)
    if device not in ("auto", "cpu", "cuda"):
        raise DeviceError(f"device '{device}' is not available (use auto, cpu or cuda)")
    reason = "--device cpu"
    if device == "auto":
        device, reason = ("cuda", "") if cuda_available() else ("cpu", "no CUDA GPU found")
    elif device == "cuda" and not cuda_available():
        raise DeviceError("device 'cuda' needs CuPy and an NVIDIA GPU, and none was found (use --device cpu)")
    path = resolve_model(model, progress)
    gguf = open_gguf(path)
    config = config_from_metadata(gguf.metadata)
    gap = gpu_gap(config) if device == "cuda" else None
    if gap:
        if reason == "":  # auto: the CPU runs it
            device, reason = "cpu", f"the GPU kernels do not take {gap} yet: the CPU runs it"
        else:
            raise DeviceError(f"the GPU kernels do not take {gap} yet: use --device cpu")
    weights = load_weights(gguf, config)
    tokenizer = Tokenizer(gguf.metadata)
    if ctx is not None and ctx < 1:
        raise DeviceError(f"the context size must be at least 1 (got {ctx})")
    if device == "cpu":
        n_ctx = ctx if ctx is not None else _default_ctx(config, gguf.file_size)
        placement = all_on_cpu(config.n_layers, n_ctx, reason)
    else:
        # --spec mtp on the GPU: the block's VRAM set aside (auto runs the block on the CPU engine only)
        mtp = spec == "mtp" and config.n_nextn_layers > 0
        placement = plan_gpu(gguf, config, ctx, gpu_layers, vram_budget, free_vram(), cpu_moe, mtp)
    engine = Engine(path, config, weights, tokenizer, gguf, placement.n_ctx, placement, cuda_graph, notify, gpu_share)
    engine.speculation = _speculation(engine, spec, spec_k, draft, progress)
    return engine


def _speculation(engine: Engine, spec: str, spec_k: int, draft, progress) -> Speculation | None:
    """The drafter load's spec, spec_k and draft (checked) give engine, or None for plain decoding."""
    if spec == "ngram":
        return Speculation("ngram", PromptLookup(), spec_k)
    if draft is not None and spec in ("auto", "draft"):
        drafter = load(draft, device=engine.device, ctx=engine.n_ctx, progress=progress, spec="off")
        check_draft_vocabulary(engine.tokenizer, drafter.tokenizer)
        # decode reads the weights once a token: a draft token costs what its file's share of the bytes says
        cost = drafter._gguf.file_size / engine._gguf.file_size
        return Speculation("draft", DraftModel(drafter, engine.config.n_vocab, cost), spec_k)
    # auto leaves the GPU's block off until it is measured to pay there: DraftLength's cost is linear in the drafts,
    # the GPU's verify step is not (a fixed ~0.3 of a step more at any length), and a step that drafts nothing is a
    # one-token verify step with a host round trip, slower than the decode graph (inference/NOTES_gpu.md)
    if spec == "mtp" or (spec == "auto" and engine._weights.nextn is not None and engine.device == "cpu"):
        return Speculation("mtp", mtp_drafter(engine, engine._gguf, spec_k), spec_k, measured=spec == "auto")
    return None

