"""The MTP drafter (inference/mtp.py): qwen35's own multi-token-prediction block drafts for speculative decoding.

llama-cpp-python 0.3.36 loads a file with the block (it leaves the block out of its forward: the trunk's logits
match ours), but runs the block only through its MTP context and extended batches, which these tests do not
drive: the oracle is a float64 numpy step written from llama.cpp's graph_mtp (src/models/qwen35.cpp), below."""
import numpy as np
import pytest

from inference import load
from inference.backend_cpu import CPUBackend
from inference.forward import mtp
from inference.sampling import SamplingParams
from inference.speculative import SpeculationError, drafts_can_pay
from kernels.cpu.ops import rope_inv_freq
from models.dequant import dequantize
from tests.inference.conftest import _write_small
from tests.inference.test_speculative import PROMPT, reply

N_TOKENS = 16
GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def qwen35_mtp(tmp_path_factory):
    return load(_write_small(tmp_path_factory, "qwen35", own_output=True, mtp=True), device="cpu", ctx=256,
                spec="mtp")


@pytest.fixture(scope="module")
def qwen35moe_mtp(tmp_path_factory):
    return load(_write_small(tmp_path_factory, "qwen35moe", own_output=True, mtp=True), device="cpu", ctx=256,
                spec="mtp")


@pytest.mark.parametrize("name", ["qwen35", "qwen35moe"])
def test_greedy_reply_is_the_same_with_mtp_drafts(name, request):
    """Random weights: the block's drafts are almost all rejected, so each verify step rewinds (the replayed drafts
    of test_speculative hold the kept ones to the same reply)."""
    engine = request.getfixturevalue(f"{name}_mtp")
    spec = engine.speculation
    assert spec.kind == "mtp"
    ids = engine.tokenizer.encode(PROMPT)
    plain, _ = reply(engine, ids, n=N_TOKENS + 1)
    ours, stats = reply(engine, ids, spec, n=N_TOKENS + 1)
    engine.speculation = spec  # as loaded, for the other tests (reply leaves none)
    assert ours == plain and stats.drafted > 0


def _matrix(m) -> np.ndarray:
    return dequantize(m.data, m.qtype, (m.n_cols, m.n_rows)).astype(np.float64)


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def reference_mtp(engine, tokens, states, swap_norms=False):
    """llama.cpp's graph_mtp in float64 on entries 0..n-1 at positions 0..n-1 (tokens[j] the token after position j,
    states[j] the model's state after the output norm there), causal attention over them all: (logits [n, n_vocab],
    the block's states after its head norm [n, n_embd]). A dense FFN (qwen35). swap_norms: enorm and hnorm swapped."""
    cfg, w = engine.config, engine._weights
    nx, lw, eps = w.nextn, w.layers[cfg.n_layers], cfg.rms_eps
    n, (heads, kv_heads, hd, _) = len(tokens), cfg.layer_heads(cfg.n_layers)
    enorm, hnorm = (nx.hnorm, nx.enorm) if swap_norms else (nx.enorm, nx.hnorm)
    e = _matrix(nx.embed)[tokens]
    h = np.asarray(states, np.float64)
    x = np.concatenate([_rms(e, enorm, eps), _rms(h, hnorm, eps)], 1) @ _matrix(nx.eh_proj).T  # embedding first
    a = _rms(x, lw.attn_norm, eps)
    qg = (a @ _matrix(lw.attn_q).T).reshape(n, heads, 2, hd)  # each head's q, then its gate
    q, gate = _rms(qg[:, :, 0], lw.attn_q_norm, eps), qg[:, :, 1]
    k = _rms((a @ _matrix(lw.attn_k).T).reshape(n, kv_heads, hd), lw.attn_k_norm, eps)
    v = (a @ _matrix(lw.attn_v).T).reshape(n, kv_heads, hd)
    half = cfg.rope_dim // 2  # neox rope of the first rope_dim dims (IMROPE on text: ModelConfig.text_rope_divisors)
    theta = np.arange(n)[:, None, None] * rope_inv_freq(cfg.rope_dim, cfg.rope_base, np.array(cfg.text_rope_divisors()))
    for t in (q, k):
        x1, x2 = t[..., :half].copy(), t[..., half:2 * half].copy()
        c, s = np.cos(theta), np.sin(theta)
        t[..., :half], t[..., half:2 * half] = x1 * c - x2 * s, x2 * c + x1 * s
    k, v = (np.repeat(t, heads // kv_heads, axis=1) for t in (k, v))  # q head h reads kv head h // (heads / kv)
    scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + np.triu(np.full((n, n), -np.inf), 1)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    o = np.einsum("hqk,khd->qhd", p / p.sum(-1, keepdims=True), v) / (1 + np.exp(-gate))
    x = x + o.reshape(n, -1) @ _matrix(lw.attn_output).T
    f = _rms(x, lw.ffn_norm, eps)
    g = f @ _matrix(lw.ffn_gate).T
    x = x + (g / (1 + np.exp(-g)) * (f @ _matrix(lw.ffn_up).T)) @ _matrix(lw.ffn_down).T
    h = _rms(x, nx.head_norm, eps)
    return h @ _matrix(nx.head).T, h


def _prefilled(engine):
    """The prompt's ids and the model's logits of them, run by the engine (its drafter then holds the model's states
    at every position)."""
    ids = engine.tokenizer.encode(PROMPT)
    engine.reset()
    return ids, engine.logits(ids)


def _corr(a, b) -> np.ndarray:
    return np.array([np.corrcoef(x, y)[0, 1] for x, y in zip(a, b)])


def test_mtp_step_matches_the_float64_reference(qwen35_mtp):
    """The block's logits at every position of a prompt (each token with the state before it) against the reference.
    The comparison can fail: enorm and hnorm swapped in the reference fall below the bar, and so did the engine with
    them swapped in forward.mtp (planted once: correlation 0.85, then removed); so does the reference on the model's
    states before its output norm, and the engine keeping those (planted once in forward.head, then removed) fails
    the first check: the kept states times the output matrix are the model's logits."""
    engine = qwen35_mtp
    ids, logits = _prefilled(engine)
    drafter, n = engine.speculation.drafter, len(ids) - 1
    states = drafter.states[:n].copy()
    assert _corr(states @ _matrix(engine._weights.output).T, logits[:n]).min() >= 0.999
    drafter.be.set_input(np.array(ids[1:], np.int32), 0)
    ours, _ = mtp(drafter.be, engine.config, engine._weights, states, all_logits=True)
    ref, _ = reference_mtp(engine, ids[1:], states)
    assert _corr(ours, ref).min() >= 0.999
    assert _corr(ours, reference_mtp(engine, ids[1:], states, swap_norms=True)[0]).min() < 0.999
    # and the model's states taken before its output norm (up to a scale, which hnorm's rms takes out): 0.994
    assert _corr(ref, reference_mtp(engine, ids[1:], states / engine._weights.output_norm)[0]).min() < 0.999


def test_drafts_are_the_reference_argmax_chain(qwen35_mtp, monkeypatch):
    """Greedy drafts after a prompt and a token: the block's catch-up over the prompt (in chunks of 8 here), then its
    chain on its own states, as the reference gives them from the same model states."""
    monkeypatch.setattr(CPUBackend, "prefill_chunk", 8)
    engine = qwen35_mtp
    history = _prefilled(engine)[0] + [7]
    drafter, pos = engine.speculation.drafter, len(history) - 1
    drafter.entered = []  # a fresh cache: its entries made from nothing
    drafts = drafter.propose(history, 3, GREEDY, np.random.default_rng(0)).tokens
    tokens, states = history[1:], list(drafter.states[:pos])
    want = []
    for _ in range(3):
        logits, h = reference_mtp(engine, tokens, states)
        want.append(int(logits[-1].argmax()))
        if len(want) == 1:  # the first step again, on the cache the catch-up's chunks wrote: 0.99993 (their states
            # taken a position late, planted once: 0.990)
            drafter.be.set_input(np.array(history[-1:], np.int32), pos - 1)
            again, _ = mtp(drafter.be, engine.config, engine._weights, drafter.states[pos - 1:pos])
            assert _corr(again, logits[-1:])[0] >= 0.999
        tokens, states = tokens + want[-1:], states + [h[-1]]
    assert drafts == want
    # again after two more tokens: the cache's entries for the prompt stay, the chain's are made again
    history += want[:2]
    engine.logits(history[:-1])
    more = drafter.propose(history, 2, GREEDY, np.random.default_rng(0)).tokens
    tokens, states = history[1:], list(drafter.states[:len(history) - 1])
    logits, h = reference_mtp(engine, tokens, states)
    assert more[0] == int(logits[-1].argmax())


def test_spec_mtp_needs_the_block(synth_qwen35, qwen35_mtp):
    with pytest.raises(SpeculationError, match="no MTP block"):
        load(synth_qwen35, device="cpu", ctx=64, spec="mtp")
    assert load(synth_qwen35, device="cpu", ctx=64).speculation is None  # auto: nothing to draft with
    auto = load(qwen35_mtp.path, device="cpu", ctx=64)
    assert auto.speculation.kind == "mtp" and auto.speculation.measured  # auto picks the block, and weighs its cost
    list(auto.generate([5, 6, 7, 8], max_tokens=3, temperature=0))
    assert auto._verify_cost is not None and not qwen35_mtp.speculation.measured  # --spec mtp: the constant


@pytest.mark.parametrize("cost, kept", [(0.8, False), (0.1, True)])
def test_auto_keeps_the_block_where_its_drafts_can_pay(qwen35_mtp, monkeypatch, cost, kept):
    """--spec auto measures what a checked token costs before its first reply (Engine.verify_token_cost) and drops the
    block's drafts where no draft length would pay with AUTO_RATE of them kept (this file's block and head cost 0.33
    of a step a draft): at 0.8 of a step a token (a K-quant Qwen3.5 on few cores) the reply is plain decoding, the
    same tokens; at 0.1 it drafts."""
    engine = load(qwen35_mtp.path, device="cpu", ctx=256, spec="auto")
    assert engine.speculation.kind == "mtp" and engine.speculation.measured
    assert drafts_can_pay(3, 0.0, 0.15) and not drafts_can_pay(3, 0.33, 0.55)  # 1.8 tokens for 1.88 steps at k = 1
    assert drafts_can_pay(3, 0.33, 0.55, rate=0.95)
    ids, spec = engine.tokenizer.encode(PROMPT), engine.speculation
    plain, _ = reply(engine, ids, n=N_TOKENS)  # without speculation
    engine.speculation = spec
    monkeypatch.setattr(engine, "verify_token_cost", lambda k: cost)
    engine.reset()
    *_, stats = engine.generate(ids, max_tokens=N_TOKENS, temperature=0, stop=())
    assert (engine.speculation is not None) == kept and (stats.drafted > 0) == kept
    assert engine._cached[len(ids):] == plain[:len(engine._cached) - len(ids)]


def test_sampled_drafts_repeat_with_a_seed(qwen35_mtp):
    """Sampled drafts come with the block's distribution (speculative.draft_from): a seed repeats the reply."""
    engine, spec = qwen35_mtp, qwen35_mtp.speculation
    ids = engine.tokenizer.encode(PROMPT)
    a, b = (reply(engine, ids, spec, temperature=1.0, seed=3) for _ in range(2))
    engine.speculation = spec
    assert a[0] == b[0] and a[1].drafted == b[1].drafted > 0


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_drafts_are_kept_where_both_distributions_are_flat(device, request):
    """At a temperature so high that the model's distribution and the block's are both near uniform, the rule keeps
    almost every draft (min(1, p / q) ~ 1): the random block's drafts reach the verify's kept path (15 of 15 on the
    CPU), and the recurrent states end where the cached tokens do."""
    engine = request.getfixturevalue("qwen35_mtp" if device == "cpu" else "qwen35_mtp_gpu")
    spec = engine.speculation
    ids = engine.tokenizer.encode(PROMPT)
    _, stats = reply(engine, ids, spec, n=24, temperature=1e4, top_k=0, top_p=1.0, min_p=0.0, seed=0)
    engine.speculation = spec
    print(f"{device}: {stats.accepted} of {stats.drafted} drafts kept")
    assert stats.accepted > stats.drafted // 2 > 0
    at = engine._be.state_pos  # the GPU's: one position; the CPU's: a layer's each
    assert set(at.values() if isinstance(at, dict) else [at]) == {len(engine._cached)}


# ---- the GPU engine: the block runs where the model's head does, a CUDA backend of its layer alone

@pytest.fixture(scope="module")
def qwen35_mtp_gpu(qwen35_mtp):
    return load(qwen35_mtp.path, device="cuda", ctx=256, spec="mtp")


@pytest.fixture(scope="module")
def qwen35moe_mtp_gpu(qwen35moe_mtp):
    return load(qwen35moe_mtp.path, device="cuda", ctx=256, spec="mtp")


def _to_device(be, x: np.ndarray):
    """x in be's VRAM, copied on its stream (the ops that read it run there)."""
    import cupy as cp  # noqa: PLC0415  (the GPU tests only)
    with be.stream:
        return cp.asarray(x)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["qwen35", "qwen35moe"])
def test_greedy_reply_is_the_same_with_mtp_drafts_on_the_gpu(name, request):
    """The GPU engine drafting with its block (verify steps eager, rejected drafts rewound) gives the greedy reply
    of its decode graph; the block's backend is a CUDA one sharing the model's head and stream."""
    engine = request.getfixturevalue(f"{name}_mtp_gpu")
    spec = engine.speculation
    assert engine.device == "cuda" and spec.kind == "mtp" and type(spec.drafter.be).__name__ == "CUDABackend"
    be, model = spec.drafter.be, engine._be
    assert be.stream is model.stream and be.layers == range(engine.config.n_layers, engine.config.n_layers + 1)
    assert be._dev[id(engine._weights.nextn.head)] is model._dev[id(engine._weights.output)]  # the file's head
    assert not be._groups.keys() & model._groups.keys()  # the block's layer is its own
    ids = engine.tokenizer.encode(PROMPT)
    plain = reply(engine, ids, n=N_TOKENS + 1)[0][:N_TOKENS]
    ours, stats = reply(engine, ids, spec, n=N_TOKENS + 1)
    engine.speculation = spec
    print(f"{name}: {stats.accepted} of {stats.drafted} drafts kept")
    assert ours[:N_TOKENS] == plain and stats.drafted > 0
    assert engine._be.state_pos == len(engine._cached)


def _eager_chain(engine, history: list[int], k: int) -> list[int]:
    """The block's k greedy drafts after history (the model's states kept up to its last token but one), a step at a
    time on its backend: a catch-up over the whole history, its last n_max tokens a verify step as DraftStep's
    catch-up (the same kernels), then one-token steps, each argmax read back before the next step. Its entries are
    this chain's after it: the drafter's next propose makes them all again."""
    drafter, cfg, w = engine.speculation.drafter, engine.config, engine._weights
    be, pos, n = drafter.be, len(history) - 1, drafter.step.n_max
    be.set_input(np.array(history[1:pos - n + 1], np.int32), 0)
    mtp(be, cfg, w, drafter.states[:pos - n])
    be.set_verify_input(np.array(history[pos - n + 1:], np.int32), pos - n)
    be.begin_verify(n)
    logits, h = mtp(be, cfg, w, drafter.states[pos - n:pos])
    out = [int(be.to_host(be.argmax_rows(logits[-1:]))[0])]
    for j in range(k - 1):
        h = be.copy(h[-1:])  # out of the step's arena, which the next step takes again
        be.set_input(np.array(out[-1:], np.int32), pos + j)
        logits, h = mtp(be, cfg, w, h)
        out.append(int(be.to_host(be.argmax_rows(logits))[0]))
    drafter.entered = []
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["qwen35", "qwen35moe"])
def test_captured_draft_steps_chain_as_eager_block_steps(name, request):
    """Greedy drafts on the GPU, the block's catch-up and draft steps captured (cuda_graph.DraftStep: each argmax fed
    to the next step on the device, the drafts read once), are the chain of eager block steps that _eager_chain runs
    on the same kernels: 4 drafts after a prompt and a token, then 4 after two tokens more (the graphs replayed at
    other positions). Planted in reasoning, not run: DraftStep not copying the block's new state into its h (every
    step after the second ran on the first step's state), or not moving pos[0] to the catch-up's last token (each
    draft step at the wrong position): random weights' argmax then moves within 4 drafts. qwen35moe's block has
    experts: their router and choice run inside the graphs too."""
    engine = request.getfixturevalue(f"{name}_mtp_gpu")
    drafter = engine.speculation.drafter

    def drafts_as_eager(history: list[int]) -> list[int]:
        drafter.entered = []
        got = drafter.propose(history, 4, GREEDY, np.random.default_rng(0)).tokens
        assert set(drafter.step.graphs) == {0, drafter.step.n_max}
        assert got == _eager_chain(engine, history, 4)
        return got

    history = _prefilled(engine)[0] + [7]
    history += drafts_as_eager(history)[:2]
    engine.logits(history[:-1])  # the model's states at the two new positions
    drafts_as_eager(history)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["qwen35", "qwen35moe"])
def test_captured_catch_ups_give_the_eager_steps_drafts(name, request):
    """After a verify step the block catches up on the drafts kept and the token after them (1 to k_max + 1 tokens),
    a captured step for each count (cuda_graph.DraftStep). Through a reply's rounds that keep 0 to 3 drafts, twice
    (every graph replayed at other positions), the captured steps' drafts are those of the same steps run eagerly
    (use_graph=False) on the same entries. Planted in reasoning, not run: the catch-up's graph reading the states
    where the warm-up found them (h not copied into h_in), so a replay drafts from an old round's states."""
    from inference.cuda_graph import DraftStep  # noqa: PLC0415  (CuPy only on this path)
    engine = request.getfixturevalue(f"{name}_mtp_gpu")
    drafter, rng = engine.speculation.drafter, np.random.default_rng(0)
    captured = drafter.step
    eager = DraftStep(captured.be, engine.config, engine._weights, captured.n_max, use_graph=False)
    assert captured.n_max == engine.speculation.k_max + 1 == 4

    def drafts(history: list[int]) -> list[int]:
        entered = drafter.entered
        got = drafter.propose(history, 3, GREEDY, rng).tokens
        drafter.entered, drafter.step = entered, eager  # the same entries made again, eagerly
        try:
            assert drafter.propose(history, 3, GREEDY, rng).tokens == got
        finally:
            drafter.step = captured
        return got

    history = _prefilled(engine)[0] + [7]
    got = drafts(history)
    for kept in [0, 1, 2, 3] * 2:
        history += got[:kept] + [int(rng.integers(engine.config.n_vocab))]
        engine.logits(history[:-1])
        got = drafts(history)
    assert set(captured.graphs) == {0, 1, 2, 3, 4} and not eager.graphs


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["qwen35", "qwen35moe"])
def test_gpu_block_matches_the_cpu_block(name, request, monkeypatch):
    """The same model states (the CPU engine's, after a prompt) through the block on both devices: its logits at
    every position (a catch-up's chunk) and at the last alone (a draft's step) against the CPU's float32 ones, and
    the greedy drafts after the prompt and a token (qwen35: the same three; qwen35moe's chain may part at an
    expert's near tie). qwen35: the model's states the GPU engine kept are the CPU engine's too."""
    from inference.forward import mtp as block  # noqa: PLC0415
    from tests.inference.gpu_compare import assert_close_logits, float_activations  # noqa: PLC0415
    cpu, gpu = request.getfixturevalue(f"{name}_mtp"), request.getfixturevalue(f"{name}_mtp_gpu")
    cfg, w = cpu.config, cpu._weights
    cd, gd = cpu.speculation.drafter, gpu.speculation.drafter
    ids, _ = _prefilled(cpu)
    _prefilled(gpu)
    n = len(ids) - 1
    states = cd.states[:n].copy()
    if name == "qwen35":  # qwen35moe's three layers amplify the 8-bit rounding of activations (conftest)
        corr = _corr(gd.be.to_host(gd.states[:n]), states)  # the GPU's q8_1 activations against the cores' int8
        assert corr.mean() >= 0.999 and corr.min() >= 0.99, (corr.mean(), corr.min())
    monkeypatch.setattr(cd.be, "_repacked", {})  # float_activations' float32 reference, for the block's layer too
    with float_activations(cpu):
        cd.be.set_input(np.array(ids[1:], np.int32), 0)
        want = block(cd.be, cfg, w, states, all_logits=True)[0]
        cd.be.set_input(np.array(ids[-1:], np.int32), n - 1)
        want_last = block(cd.be, cfg, w, states[-1:])[0]
    gd.be.set_input(np.array(ids[1:], np.int32), 0)
    got = gd.be.to_host(block(gd.be, cfg, gpu._weights, _to_device(gd.be, states), all_logits=True)[0])
    gd.be.set_input(np.array(ids[-1:], np.int32), n - 1)
    got_last = gd.be.to_host(block(gd.be, cfg, gpu._weights, _to_device(gd.be, states[-1:]))[0])
    assert_close_logits(got, want, f"{name} block logits of {n} positions")
    assert_close_logits(got_last, want_last, f"{name} block logits of a step")
    # the drafts from the same states (the prompt's last token's too), each block's cache made again from nothing
    history = ids + [7]
    gd.states = gd.be.put_rows(gd.states, 0, _to_device(gd.be, cd.states[:n + 1].copy()))
    cd.entered = gd.entered = []
    with float_activations(cpu):
        want_drafts = cd.propose(history, 3, GREEDY, np.random.default_rng(0)).tokens
    drafts = gd.propose(history, 3, GREEDY, np.random.default_rng(0)).tokens
    print(f"{name} drafts: GPU {drafts}, CPU {want_drafts}")
    assert len(drafts) == 3 and (drafts == want_drafts or name != "qwen35")


@pytest.mark.gpu
def test_the_block_goes_with_the_head_when_layers_are_on_the_cpu(qwen35_mtp):
    """The first layers on the CPU, the last and the head on the GPU: the block runs on the GPU (the model's states
    come from its last segment), and the greedy reply with its drafts is the split engine's own (no GPU share of
    the CPU layers' rows: their steps are the cores' alone, as the verify's are)."""
    engine = load(qwen35_mtp.path, device="cuda", ctx=256, gpu_layers=1, gpu_share=0, spec="mtp")
    spec = engine.speculation
    assert [type(be).__name__ for be, _ in engine._segments] == ["CPUBackend", "CUDABackend"]
    assert spec.drafter.be.stream is engine._be.stream
    ids = engine.tokenizer.encode(PROMPT)
    plain = reply(engine, ids, n=N_TOKENS + 1)[0][:N_TOKENS]
    ours, stats = reply(engine, ids, spec, n=N_TOKENS + 1)
    engine.speculation = spec
    assert ours[:N_TOKENS] == plain and stats.drafted > 0


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_constrained_reply_keeps_the_states_for_the_block(device, request):
    """A reply under a grammar runs without drafts, a token at a time: with the block attached, the GPU's in eager
    steps (its captured step keeps no states), so that the block's record holds the reply's states (those a prompt of
    the same tokens keeps) for the drafts after it."""
    from inference.grammar import Constraint, json_schema_grammar  # noqa: PLC0415
    engine = request.getfixturevalue("qwen35_mtp" if device == "cpu" else "qwen35_mtp_gpu")
    drafter = engine.speculation.drafter
    ids = engine.tokenizer.encode(PROMPT)
    engine.reset()
    for _ in engine.generate(ids, max_tokens=8, temperature=0,
                             constraint=Constraint(json_schema_grammar({"type": "string"}))):
        pass
    ran = list(engine._cached)  # the prompt and the reply's tokens the model ran (all but the last: 7 on the CPU)
    assert len(ran) > len(ids) + 1
    assert engine._decode is None or not any(masked for _, masked in engine._decode.graphs)
    kept = np.array(drafter.be.to_host(drafter.states[:len(ran)]))  # a copy: the CPU's is the record itself
    engine.reset()
    engine.logits(ran)
    assert _corr(kept[len(ids):], drafter.be.to_host(drafter.states[len(ids):len(ran)])).min() >= 0.999


@pytest.mark.gpu
def test_spec_auto_leaves_the_gpus_block_off(qwen35_mtp):
    """auto picks the block on the CPU engine only (not measured to pay on the GPU yet); --spec mtp takes it."""
    assert load(qwen35_mtp.path, device="cuda", ctx=64).speculation is None
    assert load(qwen35_mtp.path, device="cuda", ctx=64, spec="mtp").speculation.kind == "mtp"


@pytest.mark.gpu
def test_the_block_is_planned_for_on_a_budget_that_just_holds_the_model(qwen35_mtp):
    """--spec mtp on the GPU: load() has placement set the block's VRAM aside (placement.mtp_block_bytes), so where
    a --vram-budget holds every layer (with 512-token prompt chunks) and no more, a layer goes to the CPU, and the
    block loads and drafts."""
    from inference.placement import CUDA_CONTEXT_BYTES, free_vram, plan_placement, scratch_bytes  # noqa: PLC0415
    from models.config import config_from_metadata  # noqa: PLC0415
    from models.gguf import open_gguf  # noqa: PLC0415
    gguf = open_gguf(qwen35_mtp.path)
    cfg, free = config_from_metadata(gguf.metadata), free_vram()
    full = plan_placement(gguf.tensors, cfg, 64, free)
    budget = (full.total_bytes - scratch_bytes(gguf.tensors, cfg, full.prefill_chunk) + scratch_bytes(gguf.tensors, cfg)
              + CUDA_CONTEXT_BYTES)  # a --vram-budget also holds the CUDA context, which free VRAM does not
    n = cfg.n_layers
    assert plan_placement(gguf.tensors, cfg, 64, free, vram_budget=budget).n_gpu_layers == n
    planned = plan_placement(gguf.tensors, cfg, 64, free, vram_budget=budget, mtp=True)
    assert 0 < planned.n_gpu_layers < n
    engine = load(qwen35_mtp.path, device="cuda", ctx=64, vram_budget=budget, spec="mtp")
    assert engine.placement.n_gpu_layers == planned.n_gpu_layers and engine.speculation.kind == "mtp"
    assert list(engine.generate([5, 6, 7, 8], max_tokens=6, temperature=0))[-1].drafted > 0


@pytest.mark.gpu
def test_no_vram_for_the_block_is_a_one_line_error(qwen35_mtp, monkeypatch):
    """Placement sets aside an estimate of the block's VRAM; a block that still finds none left is refused in one
    line (a UserError), not a CuPy traceback. The block's backend (the one made with shares=) is made to run out."""
    import cupy as cp  # noqa: PLC0415

    from inference import backend_cuda  # noqa: PLC0415
    from models.errors import UserError  # noqa: PLC0415
    made = backend_cuda.CUDABackend.__init__

    def out_of_vram(self, *args, shares=None, **kwargs):
        if shares is not None:
            raise cp.cuda.memory.OutOfMemoryError(1 << 30, 0)
        made(self, *args, **kwargs)

    monkeypatch.setattr(backend_cuda.CUDABackend, "__init__", out_of_vram)
    with pytest.raises(UserError, match="the MTP block does not fit in VRAM"):
        load(qwen35_mtp.path, device="cuda", ctx=64, spec="mtp")
