"""Speculative decoding: a drafter guesses the next few tokens, the model checks them all in one forward.

A verify step runs the last token and k drafts at once (the prompt path, all logits) and keeps the longest prefix
of drafts the model agrees with, then one token of its own: the correction at the first rejected draft, or a bonus
token after the last when all are kept. So a step yields 1 to k + 1 tokens for about the cost of one while the
forward reads each weight once for all of its tokens (the CPU's matvecs up to cpu_quant.MATVEC_MAX_TOKENS).

Agreement is the standard speculative-sampling rule (Leviathan et al. 2023, Chen et al. 2023): draft d, drawn from
the drafter's distribution q, is kept with probability min(1, p(d) / q(d)), p the model's distribution there after
sampling.distribution's transforms (repeat penalty, top-k, top-p, min-p, temperature: the tokens before d, drafts
included, count for the penalty); on rejection the token is drawn from max(0, p - q) normalized. Every token then
follows the model's own p. A drafter with no distribution (prompt lookup) is a point mass: q(d) = 1. Greedy is the
same rule with p the point mass on the argmax: a draft is kept when it is the argmax, else the argmax replaces it.

The caller rewinds what the verify step wrote for rejected drafts (engine.py): attention's cache rows past the kept
tokens are overwritten by later steps before anything reads them, and a recurrent state (DeltaNet) goes back to
the copy the verify step kept after each of its tokens (backend_cpu.set_input's snapshots).
"""
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from inference.sampling import REPEAT_LAST_N, SamplingParams, distribution, plain_greedy
from models.errors import UserError
from models.tokenizer import Tokenizer

SPEC_KINDS = ("auto", "ngram", "draft", "mtp", "off")  # --spec (engine.load's spec)
# --spec-k's default: a CPU step of up to cpu_quant.MATVEC_MAX_TOKENS (4) tokens reads the weights once, so a verify
# of 3 drafts costs ~1.4 steps (VERIFY_TOKEN_COST); more take the prompt's path, ~3x a step
SPEC_K = 3
SPEC_VOCAB_SLACK = 128  # tokens a draft's vocabulary may have more or fewer than the model's (llama.cpp's bound)

# What one more verified token costs, as a share of a one-token step, where it is not measured (the GPU's): a 4-token
# forward of SmolLM2 took ~1.4x a one-token one on the 2-core VM (the matvecs read the weights once for all of them),
# so ~0.15 a token. The CPU engine measures its own (Engine.verify_token_cost): ~0.2 on a 0.8B qwen35 with K-quants
# (0.55-0.8 while its few-token matvecs decoded each block again a token, before session 35)
VERIFY_TOKEN_COST = 0.15
# the prior of the acceptance rate (kept / reached drafts): worth RATE_PRIOR_WEIGHT drafts, and older drafts' weight
# decays by RATE_DECAY a verify step, so the rate follows what the text is doing now
RATE_PRIOR, RATE_PRIOR_WEIGHT, RATE_DECAY = 0.5, 2.0, 0.9
# while no draft length pays (plain steps give more tokens per unit of cost), one step in PROBE_EVERY still drafts a
# token, so that the rate can tell when drafting pays again (the text turns to quoting, the drafts start to agree)
PROBE_EVERY = 16
# --spec auto keeps its measured drafter (Engine.generate) only where some draft length would pay at this acceptance
# rate, a good one for a model's own MTP block: on the 2-core VM a 0.8B Qwen3.5 with K-quants verified a token more
# at 0.55-0.75 of a step and its block drafts at 0.33, where 80% of drafts kept still gave fewer tokens per unit of
# cost than plain steps and its probes cost ~5% of a reply (BENCHMARKS.md, session 34, CPU); since its K-quant blocks
# are decoded once for a verify step's tokens, a token more costs ~0.2 of a step and the block pays (session 35)
AUTO_RATE = 0.8


@dataclass
class Draft:
    tokens: list[int]
    q: list[np.ndarray] | None = None  # float64 [n_vocab] the distribution each token was drawn from; None: points


class Drafter(Protocol):
    cost: float  # what drafting one token costs, as a share of one step of the model

    def propose(self, history: list[int], k: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        """Up to k tokens that may follow history (prompt and reply so far)."""


@dataclass
class Speculation:
    """How an engine decodes speculatively: who drafts, and at most how many tokens a step."""
    kind: str  # "ngram", "draft" or "mtp" (--spec)
    drafter: Drafter
    k_max: int
    # --spec auto's choice: what a verified token costs is measured (Engine.verify_token_cost), so that drafting stops
    # where it cannot pay, and the drafter is dropped where it could not at AUTO_RATE; a --spec asked for by name
    # takes VERIFY_TOKEN_COST
    measured: bool = False


@dataclass
class SpecCounts:
    drafted: int = 0  # drafts the model checked
    accepted: int = 0  # of them, those it kept


class PromptLookup:
    """Prompt lookup (n-gram) drafts: the tokens that followed the latest earlier occurrence of history's last n
    tokens (n from n_max down to n_min), as many as k. No model, no cost: pays where the reply quotes its context
    (code edits, summaries, extraction)."""
    cost = 0.0

    def __init__(self, n_max: int = 3, n_min: int = 1):
        self.n_max, self.n_min = n_max, n_min

    def propose(self, history: list[int], k: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        h = np.asarray(history)
        for n in range(min(self.n_max, len(h) - 1), self.n_min - 1, -1):
            # starts m < len(h) - n whose n tokens equal the last n: the latest leaves the most recent text to quote
            windows = np.lib.stride_tricks.sliding_window_view(h[:-1], n)
            hits = np.flatnonzero((windows == h[-n:]).all(axis=1))
            if len(hits):
                m = hits[-1] + n
                return Draft(h[m:m + k].tolist())
        return Draft([])


class DraftModel:
    """Drafts drawn from a smaller model with the same vocabulary (a second Engine), token by token, from its own
    distribution under the same sampling parameters (greedy: its argmax). Its cache follows history: each call runs
    only what it lacks (a recurrent draft goes back to its checkpoint of the last kept token: engine._prefill)."""

    def __init__(self, engine, n_vocab: int, cost: float):
        self.engine = engine
        self.n_vocab = n_vocab  # the model's: q is over its ids
        self.cost = cost

    def propose(self, history: list[int], k: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        draft = Draft([], [])
        for _ in range(k):
            # ids both vocabularies share
            draft_from(self.engine.next_logits(history + draft.tokens)[:self.n_vocab], history, params, rng, draft)
        return draft


def draft_from(logits: np.ndarray, history: list[int], params: SamplingParams, rng: np.random.Generator,
               draft: Draft) -> None:
    """One more token of draft (drafts with their distribution) drawn from a drafter's logits [n_vocab] after
    history and the drafts so far, under the model's sampling parameters (greedy: the argmax)."""
    ids, probs = distribution(logits, params, _recent(history + draft.tokens))
    dense = np.zeros(len(logits))
    dense[ids] = probs
    draft.tokens.append(_draw(ids, probs, rng))
    draft.q.append(dense)


def accepted_tokens(logits: np.ndarray, history: list[int], draft: Draft, params: SamplingParams,
                    rng: np.random.Generator) -> list[int]:
    """The tokens a verify step gives: the drafts kept (module doc's rule), then the correction of the first one
    rejected or, all kept, a bonus token. logits [1 + len(draft.tokens), n_vocab]: row i the model's logits after
    history and drafts[:i]."""
    out = []
    for i, d in enumerate(draft.tokens):
        ids, p = distribution(logits[i], params, _recent(history + out))
        p_d = p[ids == d].sum()
        q_d = 1.0 if draft.q is None else draft.q[i][d]
        if p_d >= q_d or (p_d > 0 and rng.random() * q_d < p_d):
            out.append(d)
            continue
        rest = np.maximum(p - (_point(ids, d) if draft.q is None else draft.q[i][ids]), 0)
        return out + [_draw(ids, rest / rest.sum(), rng)]  # > 0: p(d) < q(d) <= 1 leaves p mass elsewhere
    ids, p = distribution(logits[len(draft.tokens)], params, _recent(history + out))
    return out + [_draw(ids, p, rng)]


def greedy_tokens(argmax: np.ndarray, drafts: list[int]) -> list[int]:
    """accepted_tokens for plain greedy sampling (sampling.plain_greedy) from each row's argmax alone: the drafts
    that are the argmax of the row before them, then the argmax after the last kept one."""
    kept = 0
    while kept < len(drafts) and drafts[kept] == argmax[kept]:
        kept += 1
    return drafts[:kept] + [int(argmax[kept])]


class DraftLength:
    """How many tokens to draft next (0 to k_max): the k with the most tokens per unit of cost, the expected
    tokens of a verify step (1 + a + ... + a^k, at the running acceptance rate a of a draft reached) over its
    cost (one step, plus verify_cost and the drafter's cost a draft); 0 (a plain step) where no k beats a
    plain step's one token, but for a probe every PROBE_EVERY steps, and never where a token more costs a step or
    more (no k pays even if every draft is kept). From counts and the two costs alone, not the steps' timings, so
    that a seed gives the same reply every time."""

    def __init__(self, k_max: int, draft_cost: float, verify_cost: float = VERIFY_TOKEN_COST):
        self.k_max = k_max
        self.cost = verify_cost + draft_cost
        self.kept, self.reached = RATE_PRIOR * RATE_PRIOR_WEIGHT, RATE_PRIOR_WEIGHT
        self.plain_steps = 0  # in a row, since the last draft

    def __call__(self) -> int:
        gain = _gains(self.kept / self.reached, self.k_max, self.cost)
        if max(gain) > 1 or (self.plain_steps + 1 == PROBE_EVERY and self.cost < 1):
            self.plain_steps = 0
            return 1 + int(np.argmax(gain))
        self.plain_steps += 1
        return 0

    def update(self, drafted: int, kept: int) -> None:
        """After a verify step of drafted tokens that kept the first kept: those were reached and kept, and the
        first rejected one was reached."""
        self.kept = self.kept * RATE_DECAY + kept
        self.reached = self.reached * RATE_DECAY + kept + (kept < drafted)


def drafts_can_pay(k_max: int, draft_cost: float, verify_cost: float, rate: float = AUTO_RATE) -> bool:
    """Whether drafting up to k_max tokens gives more tokens per unit of cost than plain steps (DraftLength's
    measure) where a draft is kept at rate."""
    return max(_gains(rate, k_max, verify_cost + draft_cost)) > 1


def _gains(a: float, k_max: int, cost: float) -> list[float]:
    """Of k = 1..k_max drafts: the expected tokens of a verify step (1 + a + ... + a^k, each draft reached kept at
    rate a) over its cost (a step and cost a draft), against a plain step's one token a step."""
    return [sum(a ** j for j in range(k + 1)) / (1 + cost * k) for k in range(1, k_max + 1)]


def speculative_tokens(logits: np.ndarray, history: list[int], params: SamplingParams, seed: int | None,
                       drafter: Drafter, k_max: int, run: Callable, rewind: Callable, end: int,
                       counts: SpecCounts, verify_cost: float = VERIFY_TOKEN_COST) -> Iterator[int]:
    """The tokens after history, as Engine._host_tokens gives them (the caller caches each before the next
    next()), from logits [n_vocab] of history's last token; each step after the first drafts up to k_max tokens
    and verifies them. run(tokens, pos, argmax): the model's logits [len(tokens), n_vocab] (host) of tokens at
    pos.., or with argmax each row's argmax [len(tokens)] alone (plain greedy: the logits stay on the device), the
    recurrent states' copy kept after each token; rewind(n): those states back to after the context's first n
    tokens. Runs write positions below end only. counts: drafts checked and kept, added to as they go.
    verify_cost: what one more token of a run costs, as a share of a one-token run (DraftLength)."""
    rng = np.random.default_rng(seed)
    history = list(history)
    length = DraftLength(k_max, drafter.cost, verify_cost)
    greedy = plain_greedy(params)
    ids, p = distribution(logits, params, _recent(history))
    token = _draw(ids, p, rng)
    while True:
        yield token
        history.append(token)
        pos = len(history) - 1  # the token's, which runs next
        k = min(length(), end - 1 - pos)
        draft = drafter.propose(history, k, params, rng) if k > 0 else Draft([])
        rows = run([token] + draft.tokens, pos, greedy)
        taken = greedy_tokens(rows, draft.tokens) if greedy else accepted_tokens(rows, history, draft, params, rng)
        kept = len(taken) - 1
        if draft.tokens:
            counts.drafted += len(draft.tokens)
            counts.accepted += kept
            length.update(len(draft.tokens), kept)
            if kept < len(draft.tokens):
                rewind(pos + 1 + kept)  # the token and the drafts kept; the rest of the run is forgotten
        for t in taken[:-1]:  # already run: the caller caches them as they go
            yield t
            history.append(t)
        token = taken[-1]


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many tokens a and b share from the start."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _recent(tokens: list[int]) -> np.ndarray:
    """What the repeat penalty looks back over (as sampling.Sampler)."""
    return np.asarray(tokens[-REPEAT_LAST_N:], np.int64)


def _point(ids: np.ndarray, d: int) -> np.ndarray:
    """The point mass on d, over ids."""
    return (ids == d).astype(np.float64)


def _draw(ids: np.ndarray, probs: np.ndarray, rng: np.random.Generator) -> int:
    """One of ids by probs (as sampling.sample draws; one id: that one, no draw)."""
    return int(ids[0]) if len(ids) == 1 else int(ids[rng.choice(len(ids), p=probs)])


class SpeculationError(UserError, ValueError):
    pass


def check_spec_options(spec: str, spec_k: int, draft) -> None:
    """--spec, --spec-k and --draft as engine.load takes them: one-line errors before anything loads."""
    if spec not in SPEC_KINDS:
        raise SpeculationError(f"--spec '{spec}' is not one of {', '.join(SPEC_KINDS)}")
    if spec == "draft" and draft is None:
        raise SpeculationError("--spec draft needs a draft model: --draft MODEL")
    if spec_k < 1:
        raise SpeculationError(f"--spec-k must be at least 1 (got {spec_k})")


def check_draft_vocabulary(model: Tokenizer, draft: Tokenizer) -> None:
    """A draft model must tokenize as the model does: the same tokens, but for at most SPEC_VOCAB_SLACK more or
    fewer at the end (padding: Qwen's sizes differ so), as llama.cpp's speculative decoding requires."""
    a, b = model.tokens, draft.tokens
    n = min(len(a), len(b))
    differ = next((i for i in range(n) if a[i] != b[i]), None)
    if differ is not None or abs(len(a) - len(b)) > SPEC_VOCAB_SLACK:
        where = f"token {differ} is {b[differ]!r}, not {a[differ]!r}" if differ is not None else \
            f"{len(b)} tokens, not {len(a)}"
        raise SpeculationError(f"the draft model's vocabulary is not the model's ({where}): use a draft of the "
                               "same family")
