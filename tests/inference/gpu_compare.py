"""Comparisons the GPU tests share: prompts, the CPU reference's logits, logits against it, greedy decode steps."""
from contextlib import contextmanager

import numpy as np

from inference.sampling import SamplingParams
from kernels.cpu import quant as cpu_quant

REAL_MODELS = {"smollm2", "gemma3"}  # the packaged models' fixtures; the others are synthetic files
TEXT = ("The history of the city begins with a small fishing village at the mouth of a wide river. Traders "
        "came up the coast in spring, and by the twelfth century the village had a market, a stone bridge and "
        "a church whose tower still stands. When the railway arrived in 1851, the population doubled within "
        "twenty years: mills were built along the water, and workers moved into long rows of brick houses on "
        "the hills above the harbour. The old town kept its narrow streets, where you can still find bakeries, "
        "bookshops and small restaurants that serve fish stew with bread. Today about two hundred thousand "
        "people live here. The university, founded in 1965, brought students from all over the country, and "
        "the museum by the river explains how the city grew, with maps, photographs and models of the ships "
        "that were built in its yards. Visitors often ask when to come: the summer is mild and dry, while the "
        "autumn brings rain, storms from the sea and a music festival that fills every hall for two weeks.")


def random_prompt(engine, n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(3, engine.config.n_vocab, n).tolist()


def teacher_prompt(request, engine, n: int, seed: int = 0) -> list[int]:
    """n ids to teacher-force: English text (with the BOS the file asks for, repeated as needed) for a real model,
    random ids for a synthetic file, whose random weights know no language. Random ids are far from anything a
    real model saw in training: Gemma 3's activations then carry outliers, and the 8-bit rounding of activations
    that the GPU matvecs share with llama.cpp's costs it 0.3-0.5% of correlation (kernels/cpu/NOTES_cpu.md)."""
    if not REAL_MODELS & set(request.node.callspec.params.values()):
        return random_prompt(engine, n, seed)
    ids = engine.tokenizer.encode(TEXT)
    return (ids + engine.tokenizer.encode(TEXT, add_special=False) * (n // len(ids)))[:n]


@contextmanager
def float_activations(cpu):
    """The CPU engine cpu with x kept in float32 in its matvecs and matmuls: its one-to-four-token kernels, its
    prompts' int8 GEMM and its repacked 4-bit matrices round x to 8 bits for speed (as llama.cpp's CPU does),
    which a reference must not (nor MXFP4's kernel, which takes x in int8 blocks). The file's layout and
    dequantize + BLAS instead."""
    backends = [be for be, _ in cpu._segments]
    saved = cpu_quant.MATVEC_MAX_TOKENS, cpu_quant.INT8_IDS, cpu_quant.MXFP4_INT8_X, [be._repacked for be in backends]
    cpu_quant.MATVEC_MAX_TOKENS, cpu_quant.INT8_IDS, cpu_quant.MXFP4_INT8_X = 0, (), False
    for be in backends:
        be._repacked = {}
    try:
        yield
    finally:
        cpu_quant.MATVEC_MAX_TOKENS, cpu_quant.INT8_IDS, cpu_quant.MXFP4_INT8_X = saved[:3]
        for be, repacked in zip(backends, saved[3]):
            be._repacked = repacked


def reference_logits(cpu, ids: list[int]) -> np.ndarray:
    """The CPU engine's logits of ids [n, n_vocab], computed in float32 from the quantized weights."""
    with float_activations(cpu):
        return cpu.logits(ids)


def assert_close_logits(ours: np.ndarray, ref: np.ndarray, what: str, max_clear_misses: int = 0) -> None:
    """Rows of logits [n, n_vocab]: mean correlation >= 0.999, and the same top-1 wherever ref's best leads
    its second by more than 0.5 (but in max_clear_misses rows)."""
    corr = np.array([np.corrcoef(a, b)[0, 1] for a, b in zip(ours.astype(np.float64), ref.astype(np.float64))])
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 0.5
    same = ours.argmax(1) == ref.argmax(1)
    err = np.abs(ours - ref).max()
    print(f"{what}: mean corr {corr.mean():.6f} (min {corr.min():.6f}), max |err| {err:.4f}, "
          f"top-1 {same.mean():.3f} ({clear.sum()} clear rows, {same[clear].mean() if clear.any() else 1:.3f})")
    assert corr.mean() >= 0.999, f"{what}: mean correlation {corr.mean()}"
    assert (clear & ~same).sum() <= max_clear_misses, f"{what}: top-1 differs at rows {np.flatnonzero(clear & ~same)}"


def greedy_steps(engine, ids: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """n greedy tokens after ids on the device, and the logits [n - 1, n_vocab] of each decode step."""
    engine._cached = []
    decode = engine._decode
    tokens = decode.tokens(engine._prefill(ids, all_logits=False), SamplingParams(temperature=0), None, ids)
    out, logits = [], []
    for _ in range(n):
        out.append(next(tokens))
        logits.append(engine._be.to_host(decode.logits)[0])  # of the step on that token, launched before it came
    engine._cached = []
    return out, np.array(logits[:-1])


def assert_decode_close(engine, other, ids: list[int], n: int, min_agree: int, what: str) -> None:
    """n greedy decode steps of two engines of one model after ids: the same tokens for more than min_agree steps,
    and close logits over the steps before the first token they choose apart (a near-tie; after it the two run
    different contexts)."""
    tokens, logits = greedy_steps(engine, ids, n)
    other_tokens, other_logits = greedy_steps(other, ids, n)
    agree = next((i for i, (a, b) in enumerate(zip(tokens, other_tokens)) if a != b), len(tokens))
    print(f"{what}: greedy tokens agree for {agree} of {n}")
    assert agree > min_agree, (tokens, other_tokens)
    if agree > 1:
        assert_close_logits(logits[:agree - 1], other_logits[:agree - 1], what)


def host_experts_ffn(engine, layer: int, x: np.ndarray, in_place: bool) -> np.ndarray:
    """What layer's experts add to x (float32 [1, n_embd]) through the engine's backend as a decode step runs them
    with its experts on the host (the router on the GPU, the experts on the cores), with (in_place) or without the
    GPU's share of the chosen ones. gemma4's: its routed experts alone, which run beside its dense FFN (be.moe)."""
    import cupy as cp
    be, lw, k = engine._be, engine._weights.layers[layer], engine.config.n_expert_used
    saved = be.host_experts.in_place
    be.host_experts.in_place = saved if in_place else {}
    try:
        be.begin_step()
        with be.stream:  # copied up on the stream that reads it: from the null stream, which be.stream does not wait
            x_dev = cp.asarray(x)  # for, the copy could land after the kernels read (seen once under load: corr -0.03)
        if lw.ffn_gate is not None:
            return be.to_host(be.moe(x_dev, lw.experts, lw.pre_ffw_norm_2, k))
        return be.to_host(be.add_moe(x_dev, lw.experts, lw.ffn_norm, k)) - x
    finally:
        be.host_experts.in_place = saved


def assert_graph_replay_equals_eager(graph, eager) -> None:
    """Engines of one model with and without the CUDA graph: the same 40 greedy tokens and bit-equal logits."""
    ids = random_prompt(graph, 12)
    g_tokens, g_logits = greedy_steps(graph, ids, 40)
    e_tokens, e_logits = greedy_steps(eager, ids, 40)
    assert graph._decode.graphs and not eager._decode.graphs
    assert g_tokens == e_tokens
    assert np.array_equal(g_logits, e_logits)


def long_sampled_run(gpu, n: int = 2000, last: int = 16) -> tuple[list[int], np.ndarray]:
    """n tokens sampled through the captured graph after a short prompt, asserting that device memory stays what it
    was at token 100: (the prompt's and the tokens' ids, the logits [last, n_vocab] of the last steps, each the step
    on the token just appended)."""
    import cupy as cp
    ids = gpu.tokenizer.encode("The history of the city")
    # the decode loop itself, so that an end-of-generation token does not end the run early
    steps = gpu._decode.tokens(gpu._prefill(ids, all_logits=False),
                               SamplingParams(temperature=1.0, top_k=40, top_p=1.0, min_p=0.0), 7, ids)
    pool = cp.get_default_memory_pool()
    logits = []
    for i in range(n):
        ids.append(next(steps))  # and launches the graph step on it
        if i == 100:
            early = (pool.used_bytes(), pool.total_bytes(), cp.cuda.runtime.memGetInfo()[0])
        if i >= n - last:
            cp.cuda.Device().synchronize()
            logits.append(cp.asnumpy(gpu._decode.logits))
    late = (pool.used_bytes(), pool.total_bytes(), cp.cuda.runtime.memGetInfo()[0])
    assert late == early, f"device memory (used, pool, free) grew from {early} to {late}"
    return ids, np.concatenate(logits)
