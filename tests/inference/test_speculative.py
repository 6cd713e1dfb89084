"""Speculative decoding (inference/speculative.py): greedy replies token for token those without it, for every
drafter, on a dense llama (SmolLM2), a mixture of experts and a DeltaNet hybrid; rejected drafts leave no trace;
sampling keeps the model's distribution (chi-square against the exact one)."""
import math

import numpy as np
import pytest

from inference import load
from inference import kv_ring
from inference.backend_cpu import CPUBackend
from inference.speculative import SpeculationError, check_draft_vocabulary
from inference.sampling import SamplingParams, distribution, plain_greedy
from inference.speculative import (PROBE_EVERY, Draft, DraftLength, DraftModel, PromptLookup, SpecCounts,
                                   Speculation, accepted_tokens, greedy_tokens, speculative_tokens)
from tests.inference.conftest import _write_small

N_TOKENS = 16


class Replay:
    """Drafts from a recorded greedy context, prompt and reply (forced acceptance): each token right with probability right (else
    the next id), so that rollback happens at every position of a verify step."""
    cost = 0.0

    def __init__(self, recorded: list[int], right: float = 1.0, seed: int = 0):
        self.recorded, self.right, self.rng = recorded, right, np.random.default_rng(seed)

    def propose(self, history, k, params, rng):
        tokens = [self.recorded[i] if i < len(self.recorded) else 0 for i in range(len(history), len(history) + k)]
        return Draft([t if self.rng.random() < self.right else t + 1 for t in tokens])


def reply(engine, ids, speculation=None, n=N_TOKENS, **kw):
    """(reply ids, stats) of a greedy reply from an empty context; the ids are what the cache holds after it,
    with the last token."""
    engine.reset()
    engine.speculation = speculation
    try:
        *_, stats = engine.generate(ids, max_tokens=n, temperature=kw.pop("temperature", 0), stop=(), **kw)
    finally:
        engine.speculation = None
    return engine._cached[len(ids):], stats


# the synthetic files with an output matrix of their own: tied to the embeddings, a greedy reply repeats its input
@pytest.fixture(scope="module")
def qwen35_engine(tmp_path_factory):
    return load(_write_small(tmp_path_factory, "qwen35", own_output=True), device="cpu", ctx=256)


@pytest.fixture(scope="module")
def qwen35_k_engine(tmp_path_factory):  # q4_k_m's types: the CPU's few-token matvecs decode its blocks once
    return load(_write_small(tmp_path_factory, "qwen35", own_output=True, k_quants=True), device="cpu", ctx=256)


@pytest.fixture(scope="module")
def qwen3moe_engine(tmp_path_factory):
    return load(_write_small(tmp_path_factory, "qwen3moe", own_output=True), device="cpu", ctx=256)


PROMPT = "one two three four five six seven one two three four"


@pytest.mark.parametrize("name", ["smollm2", "qwen3moe", "qwen35", "qwen35_k"])
def test_greedy_reply_is_the_same_with_every_drafter(name, request, smollm2_engine):
    """Replayed drafts all right, a third wrong, all wrong; prompt lookup; a draft model (the model itself: most kept,
    and for the synthetic files the other synthetic model, same made-up vocabulary: almost nothing kept), each priced
    as a draft model a twentieth of the model's size: one of its own size never pays, and DraftLength drafts nothing."""
    engine = smollm2_engine if name == "smollm2" else request.getfixturevalue(f"{name}_engine")
    ids = engine.tokenizer.encode(PROMPT)
    plain, _ = reply(engine, ids, n=N_TOKENS + 1)  # the cache then holds all N_TOKENS tokens
    assert len(plain) == N_TOKENS
    drafters = [Replay(ids + plain, 1.0), Replay(ids + plain, 0.67), Replay(ids + plain, 0.0), PromptLookup(),
                DraftModel(load(engine.path, device="cpu", ctx=256), engine.config.n_vocab, 0.05)]
    if name != "smollm2":
        other = "qwen35" if name == "qwen3moe" else "qwen3moe"  # qwen35_k's: its vocabulary is qwen35's
        drafters.append(DraftModel(request.getfixturevalue(f"{other}_engine"), engine.config.n_vocab, 0.05))
    for drafter in drafters:
        ours, stats = reply(engine, ids, Speculation("test", drafter, 3), n=N_TOKENS + 1)
        assert ours == plain, type(drafter).__name__
        assert stats.generated_tokens == N_TOKENS + 1
        # a random model's reply rarely repeats a token of its prompt: prompt lookup drafts on SmolLM2's
        assert stats.drafted > 0 or (isinstance(drafter, PromptLookup) and name != "smollm2")
        if isinstance(drafter, Replay) and drafter.right in (0.0, 1.0):
            assert stats.accepted == stats.drafted * drafter.right
        if isinstance(drafter, DraftModel) and drafter.engine.path == engine.path:
            # itself: its one-token logits and the verify's few-token ones may part at a near tie (CI kept 10 of 13
            # with drafts of 3), the rest is kept
            assert stats.accepted >= stats.drafted / 2
        elif isinstance(drafter, DraftModel):
            assert stats.accepted < stats.drafted  # the other model: rejected, so rollback ran


def test_rejected_drafts_leave_no_trace_in_the_recurrent_state(qwen35_engine, monkeypatch):
    """Planted fault: a rewind that moves the state's position back but keeps the state the rejected drafts left
    changes the greedy reply; the real one gives the reply without speculation."""
    ids = qwen35_engine.tokenizer.encode(PROMPT)
    plain, _ = reply(qwen35_engine, ids, n=N_TOKENS + 1)

    def position_only(be, n):
        for i in be.state_pos:
            be.state_pos[i] = n
    monkeypatch.setattr(CPUBackend, "rewind_states", position_only)
    faulty, stats = reply(qwen35_engine, ids, Speculation("test", Replay(ids + plain, 0.5), 3), n=N_TOKENS + 1)
    assert stats.accepted < stats.drafted and faulty != plain


def test_sliding_window_ring_keeps_the_window_through_rejected_drafts(tmp_path_factory, monkeypatch):
    """gemma3's sliding-window layers keep a ring (backend_cpu): made 16 + 8 + 8 rows here, a reply of 40 tokens
    goes round it and its rejected drafts are written into it; the reply stays the one without speculation."""
    monkeypatch.setattr(CPUBackend, "prefill_chunk", 8)
    monkeypatch.setattr(kv_ring, "RING_SLACK", 8)
    engine = load(_write_small(tmp_path_factory, "gemma3", own_output=True), device="cpu", ctx=256)
    assert engine._be.rings.rows == 32
    ids = engine.tokenizer.encode(PROMPT)
    plain, _ = reply(engine, ids, n=41)
    ours, stats = reply(engine, ids, Speculation("test", Replay(ids + plain, 0.67), 3), n=41)
    assert ours == plain and 0 < stats.accepted < stats.drafted


def test_a_reply_that_stops_inside_a_verify_step_leaves_the_state_at_its_end(qwen35_engine):
    """A reply cut by max_tokens right after kept drafts: the states go back to its last cached token, so the
    next turn (which reuses the cache) gives what a fresh context gives."""
    ids = qwen35_engine.tokenizer.encode(PROMPT)
    plain, _ = reply(qwen35_engine, ids, n=N_TOKENS + 1)
    reply(qwen35_engine, ids, Speculation("test", Replay(ids + plain, 1.0), 3), n=6)
    assert qwen35_engine._be.state_pos[0] == len(qwen35_engine._cached) == len(ids) + 5
    more = ids + plain[:5] + ids[:4]
    *_, again = qwen35_engine.generate(more, max_tokens=4, temperature=0)
    assert again.prompt_tokens == 4  # went on from the cache
    cached = qwen35_engine._cached[:]
    fresh, _ = reply(qwen35_engine, more, n=4)
    assert cached[len(more):] == fresh[:len(cached) - len(more)]


def test_a_closed_reply_leaves_the_state_at_its_cached_end(qwen35_engine):
    """A reply closed by its reader (the chat's Esc, Ctrl-C) after kept drafts it had not yet handed out: the
    states go back to the cached tokens, where the next prompt goes on."""
    engine = qwen35_engine
    ids = engine.tokenizer.encode(PROMPT)
    plain, _ = reply(engine, ids, n=N_TOKENS + 1)
    engine.reset()
    engine.speculation = Speculation("test", Replay(ids + plain, 1.0), 3)
    try:
        pieces = engine.generate(ids, max_tokens=N_TOKENS, temperature=0, stop=())
        for _ in range(3):
            next(pieces)
        pieces.close()
    finally:
        engine.speculation = None
    assert len(engine._cached) < len(ids) + N_TOKENS - 1
    assert set(engine._be.state_pos.values()) == {len(engine._cached)}


def test_prompt_lookup_proposes_what_followed_the_latest_match():
    lookup = PromptLookup(n_max=2)
    h = [5, 6, 7, 8, 1, 5, 6, 9, 9, 3, 5, 6]
    assert lookup.propose(h, 3, None, None).tokens == [9, 9, 3]  # "5 6" last seen before 9 9 3
    assert lookup.propose([1, 2, 3, 4], 3, None, None).tokens == []
    assert lookup.propose([4, 2, 4], 3, None, None).tokens == [2, 4]  # the one-token match, up to the end


def test_draft_length_follows_the_acceptance_rate():
    """Drafts that agree: the longest draft. Drafts that never agree: plain steps (0), drafting one token once in
    PROBE_EVERY steps, until drafts agree again."""
    length = DraftLength(3, 0.0)
    for _ in range(10):
        length.update(3, 3)
    assert length() == 3
    ks = []
    for _ in range(5 * PROBE_EVERY):
        ks.append(length())
        if ks[-1]:
            length.update(ks[-1], 0)
    tail = ks[-3 * PROBE_EVERY:]
    probes = [i for i, k in enumerate(tail) if k]
    assert set(tail) == {0, 1} and np.diff(probes).tolist() == [PROBE_EVERY] * 2
    for _ in range(3 * PROBE_EVERY):
        k = length()
        if k:
            length.update(k, k)
    assert length() == 3


def test_draft_length_weighs_what_a_verified_token_costs():
    """A token more in a verify step at 0.8 of a step (a K-quant model's few-token matvecs on the CPU): one draft
    where 9 in 10 agree, none where 7 in 10 do (but the probes); at a step or more, none at all, even if all agree
    (no k could pay, so not even a probe)."""
    def settled(cost, kept_of_10):  # one-token drafts, kept_of_10 of every 10 agreeing
        length = DraftLength(3, 0.0, verify_cost=cost)
        for _ in range(30):
            for i in range(10):
                length.update(1, int(i < kept_of_10))
        return [length() for _ in range(2 * PROBE_EVERY)]
    assert settled(0.8, 9)[0] == 1
    assert sorted(set(settled(0.8, 7))) == [0, 1] and settled(0.8, 7).count(1) == 2  # the probes
    assert set(settled(1.0, 10)) == {0}


def test_the_cpu_engine_measures_what_a_verified_token_costs(smollm2_engine):
    """Measured once (a multiple of 0.05, kept), at a fresh context's start, which it then clears; a greedy reply
    with speculation after it is the reply without."""
    engine = smollm2_engine
    ids = engine.tokenizer.encode(PROMPT)
    plain, _ = reply(engine, ids, n=20)
    engine._verify_cost = None
    engine._cached = list(ids)
    cost = engine.verify_token_cost(3)
    assert engine._cached == [] and 0 <= cost < 3 and abs(cost / 0.05 - round(cost / 0.05)) < 1e-9
    engine._run = None  # a second call measures nothing
    assert engine.verify_token_cost(3) == cost
    del engine._run
    ours, _ = reply(engine, ids, Speculation("test", PromptLookup(), 3), n=20)
    assert ours == plain


def test_draft_vocabulary_must_be_the_models(smollm2_engine, qwen35_engine, qwen3moe_engine):
    check_draft_vocabulary(qwen35_engine.tokenizer, qwen3moe_engine.tokenizer)
    with pytest.raises(SpeculationError, match="vocabulary is not the model's"):
        check_draft_vocabulary(smollm2_engine.tokenizer, qwen35_engine.tokenizer)


def test_load_checks_its_speculation_options(smollm2):
    with pytest.raises(SpeculationError, match="needs a draft model"):
        load(smollm2, device="cpu", ctx=64, spec="draft")
    with pytest.raises(SpeculationError, match="not one of"):
        load(smollm2, device="cpu", ctx=64, spec="medusa")
    with pytest.raises(SpeculationError, match="no MTP block"):
        load(smollm2, device="cpu", ctx=64, spec="mtp")
    assert load(smollm2, device="cpu", ctx=64, spec="ngram").speculation.kind == "ngram"


# --- the sampling rule: the tokens follow the model's own distribution (exact, over a tiny vocabulary) ---

VOCAB = 5
PARAMS = SamplingParams(temperature=0.9, top_k=4, top_p=0.95, min_p=0.02, repeat_penalty=2.0)


TOY_LOGITS = np.random.default_rng(0).normal(0, 1.5, (VOCAB, VOCAB, VOCAB)).astype(np.float32)
TOY_Q = np.random.default_rng(1).dirichlet(np.ones(VOCAB), VOCAB)


def toy_logits(history: list[int]) -> np.ndarray:
    """A toy model over VOCAB tokens whose logits depend on the last two tokens."""
    return TOY_LOGITS[history[-2], history[-1]]


def toy_p(history: list[int]) -> np.ndarray:
    """The model's distribution after history, dense."""
    ids, probs = distribution(toy_logits(history), PARAMS, np.asarray(history[-64:]))
    dense = np.zeros(VOCAB)
    dense[ids] = probs
    return dense


class ToyDraft:
    """A drafter with a distribution of its own (another toy model), drawing from it."""
    cost = 0.0

    def propose(self, history, k, params, rng):
        tokens, q = [], []
        for _ in range(k):
            qi = TOY_Q[(history + tokens)[-1]]
            tokens.append(int(rng.choice(VOCAB, p=qi)))
            q.append(qi)
        return Draft(tokens, q)


class ToyLookup:
    """A point-mass drafter: always proposes the token after the last one."""
    cost = 0.0

    def propose(self, history, k, params, rng):
        return Draft([(history[-1] + 1 + i) % VOCAB for i in range(k)])


def chi_square_passes(counts: np.ndarray, expected_p: np.ndarray) -> bool:
    """Pearson's chi-square at p = 0.001 (Wilson-Hilferty's quantile) over the outcomes expected at all."""
    n, keep = counts.sum(), expected_p > 0
    assert counts[~keep].sum() == 0, "an outcome the model gives no probability"
    expected = expected_p[keep] * n
    stat = ((counts[keep] - expected) ** 2 / expected).sum()
    dof = keep.sum() - 1
    z = 3.09
    return stat < dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def exact_three(prompt: list[int]) -> np.ndarray:
    """The model's own distribution of its next three tokens, [VOCAB ** 3]."""
    out = np.zeros((VOCAB,) * 3)
    p1 = toy_p(prompt)
    for a in range(VOCAB):
        p2 = toy_p(prompt + [a])
        for b in range(VOCAB):
            out[a, b] = p1[a] * p2[b] * toy_p(prompt + [a, b])
    return out.ravel()


@pytest.mark.parametrize("drafter, k", [(ToyDraft(), 1), (ToyDraft(), 2), (ToyLookup(), 1)],
                         ids=["draft-1", "draft-2", "lookup-1"])
def test_speculative_sampling_keeps_the_models_distribution(drafter, k):
    """The first three tokens of 3000 seeded replies against the exact joint distribution of the model's own: the
    first is sampled from the prompt's logits, the next come from verify steps of k drafts, which end in every way
    (k = 1: kept then a bonus token, or corrected; k = 2: the first or the second rejected)."""
    prompt = [0, 0, 0]  # few tokens to penalize: the drafts before a token count
    counts = np.zeros(VOCAB ** 3)
    for seed in range(3000):
        history = list(prompt)
        run = lambda tokens, pos, argmax: np.stack(  # noqa: E731  (the model after the context and the tokens before)
            [toy_logits(history[:pos + 1] + tokens[1:i + 1]) for i in range(len(tokens))])
        tokens = speculative_tokens(toy_logits(prompt), prompt, PARAMS, seed, drafter, k, run, lambda n: None, 100,
                                    SpecCounts())
        for _ in range(3):
            history.append(next(tokens))
        a, b, c = history[3:]
        counts[(a * VOCAB + b) * VOCAB + c] += 1
    assert chi_square_passes(counts, exact_three(prompt))


def test_accepted_tokens_is_greedy_at_temperature_zero():
    logits = np.array([[0, 3, 1], [2, 0, 1], [0, 0, 5]], np.float32)
    greedy = SamplingParams(temperature=0)
    rng = np.random.default_rng(0)
    assert accepted_tokens(logits, [0], Draft([1, 0]), greedy, rng) == [1, 0, 2]  # both kept, then the bonus
    assert accepted_tokens(logits, [0], Draft([1, 2]), greedy, rng) == [1, 0]  # the second corrected
    assert accepted_tokens(logits, [0], Draft([2, 0]), greedy, rng) == [1]


def test_greedy_tokens_are_accepted_tokens_at_plain_greedy():
    """The plain-greedy path (each row's argmax alone, the logits left on the device) keeps the same drafts and
    gives the same last token as the full rule at temperature 0, over random logits and drafts near the argmax."""
    rng = np.random.default_rng(1)
    greedy = SamplingParams(temperature=0)
    assert plain_greedy(greedy) and not plain_greedy(SamplingParams(temperature=0, repeat_penalty=1.1))
    for _ in range(500):
        n = int(rng.integers(1, 5))
        logits = rng.standard_normal((n + 1, 6)).astype(np.float32)
        drafts = [int(a) if rng.random() < 0.7 else int(rng.integers(6)) for a in np.argmax(logits[:n], axis=1)]
        want = accepted_tokens(logits, [0], Draft(drafts), greedy, rng)
        assert greedy_tokens(np.argmax(logits, axis=1), drafts) == want


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["smollm2", "qwen3moe", "qwen35"])
def test_greedy_reply_is_the_same_on_the_gpu(name, request, tmp_path_factory):
    """The GPU's verify step (captured: cuda_graph.VerifyStep, its DeltaNet a token at a time with the states kept):
    greedy replies with replayed drafts (all, 2/3, none right) and prompt lookup are the one the decode graph
    gives."""
    path = request.getfixturevalue("smollm2") if name == "smollm2" else _write_small(tmp_path_factory, name,
                                                                                      own_output=True)
    engine = load(path, device="cuda", ctx=256)
    ids = engine.tokenizer.encode(PROMPT)
    plain = reply(engine, ids, n=N_TOKENS + 1)[0][:N_TOKENS]
    for drafter in (Replay(ids + plain, 1.0), Replay(ids + plain, 0.67), Replay(ids + plain, 0.0), PromptLookup()):
        ours, stats = reply(engine, ids, Speculation("test", drafter, 3), n=N_TOKENS + 1)
        assert ours[:N_TOKENS] == plain, type(drafter).__name__
        assert stats.drafted > 0 or (isinstance(drafter, PromptLookup) and name != "smollm2")
        assert engine._be.state_pos == len(engine._cached) or not engine._be.conv_state


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["smollm2", "qwen3moe", "qwen35"])
def test_captured_verify_steps_give_the_eager_steps_logits(name, request, tmp_path_factory):
    """cuda_graph.VerifyStep captured against the same step run eagerly (use_graph=False: the same ops, no graph):
    steps of 1 to 4 tokens at successive positions, each rewound to its first token, so that every count's graph
    is replayed with other ids and positions and the recurrent states go back and forth. The same logits."""
    from inference.cuda_graph import VerifyStep
    path = request.getfixturevalue("smollm2") if name == "smollm2" else _write_small(tmp_path_factory, name,
                                                                                      own_output=True)
    engine = load(path, device="cuda", ctx=256)
    ids = engine.tokenizer.encode(PROMPT)
    drafts = np.random.default_rng(0).integers(0, engine.config.n_vocab, (12, 3)).tolist()

    def steps(use_graph: bool) -> list[np.ndarray]:
        reply(engine, ids, n=1)  # the prompt in the cache, the states after it
        engine.speculation = Speculation("test", PromptLookup(), 3)
        engine._verify_step = VerifyStep(engine._be, engine.config, engine._weights, 4, use_graph)
        out = []
        try:
            for j, draft in enumerate(drafts):
                pos, tokens = len(ids) + j, [ids[j % len(ids)]] + draft[:j % 4]
                out.append(engine._verify(tokens, pos))
                engine._rewind_states(pos + 1)
        finally:
            engine.speculation = None
        return out

    eager = steps(False)
    assert not engine._verify_step.graphs
    captured = steps(True)
    assert sorted(engine._verify_step.graphs) == [1, 2, 3, 4]
    for a, b in zip(eager, captured):
        np.testing.assert_array_equal(b, a)
    assert not np.array_equal(captured[4], captured[8])  # same count, other tokens: the replay read its inputs


def test_a_seed_gives_the_same_sampled_reply_with_speculation(qwen35_engine):
    """How many tokens to draft follows counts, not timings: a seed repeats the reply, drafts and all."""
    ids = qwen35_engine.tokenizer.encode(PROMPT)
    draft = load(qwen35_engine.path, device="cpu", ctx=256)  # the model as its own draft: q = p, all kept
    spec = lambda: Speculation("test", DraftModel(draft, qwen35_engine.config.n_vocab, 0.0), 3)  # noqa: E731
    a = reply(qwen35_engine, ids, spec(), temperature=1.0, seed=7)
    b = reply(qwen35_engine, ids, spec(), temperature=1.0, seed=7)
    assert a[0] == b[0] and (a[1].drafted, a[1].accepted) == (b[1].drafted, b[1].accepted) and a[1].drafted > 0
