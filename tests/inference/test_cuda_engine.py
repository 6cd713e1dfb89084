"""The GPU engine against the CPU engine (teacher-forced logits, decode-step logits), and the captured decode
graph against the same step run eagerly (greedy and sampled tokens, logits).

Models: the packaged SmolLM2 and Gemma 3, and the synthetic ones of conftest.py.
"""
import numpy as np
import pytest

from tests.inference.gpu_compare import (assert_close_logits, assert_graph_replay_equals_eager, greedy_steps,
                                         long_sampled_run, reference_logits, teacher_prompt)

pytestmark = pytest.mark.gpu

CTX = 512


# CPU parity: the real models and the small synthetic ones, whose logits depend on the input (synth_llama_k, the
# Q4_K / Q6_K one: test_synthetic.py shows a dropped attention failing assert_close_logits on it). Not synth_1b:
# its random 16 layers amplify the q8_1 rounding of activations (which the GPU matvecs do, as llama.cpp's do)
# until a row's logits flip sign; the CPU engine does the same once its activations are rounded alike. And its
# logits, as those of tests/synth_gguf.py's files, barely depend on the input: a comparison of them is blind.
PARITY_MODELS = ["smollm2", "gemma3", "synth_llama_k", "synth_gemma3", "synth_qwen2", "synth_qwen3moe", "synth_qwen35",
                 "synth_gpt_oss", "synth_llama_iq4_xs"]
MODELS = PARITY_MODELS + ["synth_1b", "synth_qwen35moe"]


@pytest.fixture(scope="module")
def engines(request):
    """(cpu, gpu with the graph, gpu eager) engines of one model."""
    from inference import load
    path = request.getfixturevalue(request.param)
    return (load(path, device="cpu", ctx=CTX), load(path, device="cuda", ctx=CTX),
            load(path, device="cuda", ctx=CTX, cuda_graph=False))


@pytest.mark.parametrize("engines", PARITY_MODELS, indirect=True)
def test_teacher_forced_logits_match_cpu(engines, request):
    cpu, gpu, _ = engines
    for n in (1, 9, 70, 300):  # decode path, the few-token q8 matmul, the fp16 cuBLAS one, past gpt-oss's window
        ids = teacher_prompt(request, cpu, n, seed=n)
        ours = gpu.logits(ids)
        assert ours.shape == (n, cpu.config.n_vocab) and ours.dtype == np.float32
        assert_close_logits(ours, reference_logits(cpu, ids), f"{cpu.path.name} logits of {n} tokens")


@pytest.mark.parametrize("engines", ["synth_qwen3moe", "synth_gpt_oss"], indirect=True)
def test_both_expert_prompt_paths_match_cpu(engines, request, monkeypatch):
    """A prompt chunk's experts run grouped by expert (kernels/cuda/moe_mm.cu, tensor cores) or, below
    GROUPED_MIN_TOKENS, per (token, slot) pair with the decode kernels: both against the CPU engine (gpt-oss: with
    the experts' biases and its GLU)."""
    import inference.backend_cuda_moe as backend_cuda_moe
    cpu, gpu, _ = engines
    ids = teacher_prompt(request, cpu, 70, seed=5)
    grouped = gpu.logits(ids)
    monkeypatch.setattr(backend_cuda_moe, "GROUPED_MIN_TOKENS", len(ids) + 1)  # every chunk per pair
    per_pair = gpu.logits(ids)
    ref = reference_logits(cpu, ids)
    assert_close_logits(grouped, ref, "experts grouped")
    assert_close_logits(per_pair, ref, "experts per pair")
    assert np.abs(grouped - per_pair).max() > 0  # two computations, not one twice


@pytest.mark.parametrize("engines", MODELS, indirect=True)
def test_graph_replay_equals_eager(engines):
    _, graph, eager = engines
    assert_graph_replay_equals_eager(graph, eager)


@pytest.mark.parametrize("engines", PARITY_MODELS, indirect=True)
def test_decode_steps_match_cpu(engines, request):
    """The logits of each greedy decode step against the CPU engine's, teacher-forced on the same tokens."""
    cpu, graph, _ = engines
    ids = teacher_prompt(request, cpu, 12)
    tokens, logits = greedy_steps(graph, ids, 40)
    ref = reference_logits(cpu, ids + tokens[:-1])[len(ids):]
    assert_close_logits(logits, ref, f"{cpu.path.name} decode steps")


@pytest.mark.parametrize("engines", ["synth_qwen35", "synth_qwen35moe", "synth_gpt_oss"], indirect=True)
def test_hybrid_layers_match_cpu(engines):
    """Each layer of the hybrids on the GPU (DeltaNet mixers with their states, gated attention, the shared expert)
    given the CPU's input gives the CPU's output (float32 reference), for a decode step, a few tokens and a chunk
    (the chunked delta rule): layer by layer, so that the 8-bit rounding of activations does not compound (on
    qwen35moe it takes the logits below the bar, see conftest). gpt-oss's layers too: sinks, biases, YaRN, its
    biased experts against backend_cpu.moe_experts (a decode step's fused kernels, per pair, grouped)."""
    from inference.forward import embed, layer
    from tests.inference.gpu_compare import float_activations
    cpu, gpu, _ = engines
    cb, gb = cpu._segments[0][0], gpu._be
    for n in (1, 9, 70):
        ids = np.random.default_rng(n).integers(3, cpu.config.n_vocab, n).astype(np.int32)
        with float_activations(cpu):
            cb.set_input(ids, 0)
            gb.set_input(ids, 0)
            x = embed(cb, cpu.config, cpu._weights)
            for i in range(cpu.config.n_layers):
                want = layer(cb, cpu.config, cpu._weights.layers[i], i, x)
                got = gb.to_host(layer(gb, gpu.config, gpu._weights.layers[i], i, gb.receive(x)))
                corr = np.array([np.corrcoef(a, b)[0, 1] for a, b in zip(got - x, want - x)])  # what the layer adds
                print(f"{gpu.path.name} layer {i}, {n} tokens: what it adds, corr mean {corr.mean():.6f} min {corr.min():.6f}")
                assert corr.mean() >= 0.9995 and corr.min() >= 0.99, (i, n, corr.min())
                x = want
    cpu._cached, gpu._cached = [], []


def _fresh_generate(engine, prompt: str, **kw) -> list:
    engine._cached = []  # no reuse of an earlier prompt's cache: the same computation every time
    return list(engine.generate(prompt, **kw))


@pytest.mark.parametrize("engines", MODELS, indirect=True)
def test_sampled_generation_equal_graph_and_eager(engines):
    _, graph, eager = engines
    kw = dict(max_tokens=50, temperature=0.9, top_k=40, top_p=0.95, min_p=0.0, repeat_penalty=1.1, seed=7)
    g = _fresh_generate(graph, "Once upon a time", **kw)
    assert g[:-1] == _fresh_generate(eager, "Once upon a time", **kw)[:-1]
    assert _fresh_generate(graph, "Once upon a time", **kw)[:-1] == g[:-1]  # the seed repeats the draw


@pytest.mark.parametrize("engines", MODELS, indirect=True)
def test_greedy_generation_of_200_tokens_equal_graph_and_eager(engines):
    _, graph, eager = engines
    kw = dict(max_tokens=200, temperature=0.0, stop=())
    g = _fresh_generate(graph, "The history of the city", **kw)
    e = _fresh_generate(eager, "The history of the city", **kw)
    assert "".join(g[:-1]) == "".join(e[:-1])
    assert g[-1].generated_tokens == e[-1].generated_tokens
    assert g[-1].finish_reason == e[-1].finish_reason


@pytest.mark.parametrize("engines", MODELS, indirect=True)
def test_multi_turn_reuses_the_cache_on_the_gpu(engines):
    """A prompt extending the last one reprocesses only its new tokens, then greedy decoding goes on as from
    a fresh context (the same first token)."""
    _, gpu, _ = engines
    list(gpu.generate("Hello there", max_tokens=5, temperature=0))
    text = "Hello there, and then some more words"
    again = list(gpu.generate(text, max_tokens=1, temperature=0))
    assert again[-1].prompt_tokens < len(gpu.tokenizer.encode(text))
    gpu._cached = []
    assert list(gpu.generate(text, max_tokens=1, temperature=0))[:-1] == again[:-1]


@pytest.mark.parametrize("engines", MODELS, indirect=True)
def test_the_same_prompt_again_gives_the_same_greedy_reply(engines):
    """Regenerate: the prompt's cache and its last logits are kept (a device copy), and decoding starts over
    right after the prompt, overwriting the first reply's cache rows."""
    _, gpu, _ = engines
    gpu._cached = []
    first = list(gpu.generate("The history of the city", max_tokens=20, temperature=0, stop=()))
    again = list(gpu.generate("The history of the city", max_tokens=20, temperature=0, stop=()))
    assert "".join(again[:-1]) == "".join(first[:-1]) and again[-1].generated_tokens == first[-1].generated_tokens


@pytest.mark.parametrize("engines", ["synth_qwen35", "synth_qwen35moe"], indirect=True)
def test_an_edited_prompt_resumes_from_a_checkpoint_on_the_gpu(engines):
    """The hybrids' recurrent states go to host memory at a prompt's end (copies queued, not waited for); a
    prompt that keeps that prompt and replaces the reply after it restores them and processes only its new
    tokens, with the logits a fresh context gives (a restore that read the copies before they landed would not)."""
    from tests.inference.parity import parity
    _, gpu, _ = engines
    rng = np.random.default_rng(5)
    first = rng.integers(3, gpu.config.n_vocab, 90).tolist()
    edited = first + rng.integers(3, gpu.config.n_vocab, 30).tolist()
    gpu._cached = []
    list(gpu.generate(first, max_tokens=12, temperature=0, stop=()))  # the reply runs the states on past first
    got = gpu._prefill(edited, all_logits=True)
    assert gpu._prefill_start == len(first)
    gpu._cached = []
    want = gpu._prefill(edited, all_logits=True)[len(first):]
    m = parity([got], [want])
    # the bars against llama.cpp: the mixture's near-ties route a token or two to other experts after
    # other splits of the tokens (measured corr min 0.9905, mean 0.99934 on synth_qwen35moe; qwen35: >= 0.999)
    assert m["corr_mean"] >= 0.999 and m["corr_min"] >= 0.99 and m["decided_mismatches"] == 0, m


@pytest.mark.parametrize("engines", ["synth_llama_k", "synth_qwen35", "synth_qwen35moe", "synth_gpt_oss"], indirect=True)
def test_a_prompt_in_chunks_gives_the_logits_of_one_chunk(engines, monkeypatch):
    """The placement picks the GPU's prompt chunk (512 tokens, longer where VRAM is left): a prompt in chunks of
    128 (the KV cache, the DeltaNet states and the grouped experts carried across them) gives the teacher-forced
    logits of the same prompt in one chunk."""
    from tests.inference.parity import parity
    _, gpu, _ = engines
    ids = np.random.default_rng(3).integers(3, gpu.config.n_vocab, 300).tolist()
    gpu.reset()
    whole = gpu._prefill(ids, all_logits=True)
    monkeypatch.setattr(gpu._be, "prefill_chunk", 128)
    gpu.reset()
    chunked = gpu._prefill(ids, all_logits=True)
    m = parity([chunked], [whole])
    # the mixture: other chunk shapes round the experts' inputs apart, so a near-tie routes a token elsewhere
    # (measured on synth_qwen35moe: one row of 300 at corr 0.954, mean 0.99976); the others hold 0.99 everywhere
    corr_min = 0.95 if gpu.config.n_expert else 0.99
    assert m["corr_mean"] >= 0.999 and m["corr_min"] >= corr_min and m["decided_mismatches"] == 0, m
    gpu.reset()


@pytest.mark.parametrize("engines", ["synth_qwen2", "synth_gemma3", "synth_1b"], indirect=True)
def test_matmuls_fuse_the_matrices_of_one_type(engines):
    """q/k/v and gate/up of one type and width run as one weight (rows concatenated, biases too) and give what
    each matrix uploaded alone gives, for one token (matvec), a few (q8 matmul) and many (cuBLAS); the fused
    weight holds exactly its members' bytes. qwen2: Q8_0 q+k with Q5_0 v apart; gemma3: F16 gate+up; the
    q4_k_m llama-1b: q+k+v fused where v is Q4_K (8 of 16 layers), q+k where it is Q6_K."""
    import cupy as cp  # noqa: PLC0415

    from inference.backend_cuda import _group_key, _matmuls_calls  # noqa: PLC0415
    from kernels.cuda.quant import to_device  # noqa: PLC0415
    _, gpu, _ = engines
    be, rng = gpu._be, np.random.default_rng(0)
    layers = gpu._weights.layers
    if gpu.path.name == "llama-1b.gguf":
        qkv_groups = [len(be._groups[_group_key(lw.qkv, lw.qkv_bias)]) for lw in layers]
        assert qkv_groups.count(1) == 8 and qkv_groups.count(2) == 8
    for lw in layers[:2]:
        for ws, biases in _matmuls_calls(lw):
            biases = biases or (None,) * len(ws)
            groups = be._groups[_group_key(ws, biases)]
            assert sorted(i for g in groups for i, _, _ in g.parts) == list(range(len(ws)))
            for g in groups:
                assert {ws[i].qtype.name for i, _, _ in g.parts} == {g.weight.qtype.name}
                assert g.weight.data.nbytes == sum(ws[i].data.nbytes for i, _, _ in g.parts)
            assert len(groups) == len({(w.qtype.name, w.n_cols) for w in ws})
            alone = [to_device(w.data, w.qtype) for w in ws]
            for n in (1, 5, 70):
                be.set_input(np.zeros(n, np.int32), 0)  # one token: outputs in the step arena
                with be.stream:
                    x = cp.asarray(rng.standard_normal((n, ws[0].n_cols)).astype(np.float32))
                    bias = [None if b is None else cp.asarray(b) for b in biases]
                outs = be.matmuls(ws, x, biases)
                for w, out, dw, b in zip(ws, outs, alone, bias):
                    assert out.shape == (n, w.n_rows) and out.flags.c_contiguous
                    got, ref = be.to_host(out), be.to_host(be._matmul(dw, x, b))
                    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max(), (w.qtype.name, n)


@pytest.mark.parametrize("model", ["synth_llama_k", "synth_gemma3", "synth_qwen3moe", "synth_qwen35", "synth_gpt_oss"])
def test_2000_tokens_neither_drift_nor_grow_memory(model, request):
    """2000 sampled tokens through the captured graph (gpt-oss: far past its 128-token window): the last 16 steps'
    logits still equal an eager recomputation of the whole sequence (CPU engine), and device memory stays what it
    was at token 100. Sixteen rows, not one, and on the random gpt-oss file one clear top-1 miss allowed: there a
    row is noise-bound by 8-bit x and the f16 cache (the CPU's own int8 x against its float32 reference, 2005
    tokens: 34 rows under 0.999, 3 clear misses in 1632 clear rows; llama.cpp's f16 cache: a decided miss in
    test_gpt_oss's long prompt; the GPU's 16 rows on the H200: mean 0.99941, one miss). Dropped sinks, YaRN's
    mscale or the router's bias took the decode test's correlation to 0.954, 0.898, 0.915 (Q8_0 experts)."""
    from inference import load
    path = request.getfixturevalue(model)
    gpu, cpu = load(path, device="cuda", ctx=2100), load(path, device="cpu", ctx=2100)
    ids, last = long_sampled_run(gpu)
    assert_close_logits(last, reference_logits(cpu, ids)[-16:], f"{path.name} after 2000 graph steps",
                        max_clear_misses=1 if model == "synth_gpt_oss" else 0)
