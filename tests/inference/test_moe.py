"""Mixture of experts (qwen3moe) on the CPU: config, info, routing, the experts op, and logits against llama.cpp.

The parity file's layer matrices are F32, so llama.cpp computes in float32 as we do: with F16 or quantized
matrices it rounds activations to 16 or 8 bits, and an expert choice that is a near-tie can flip between the
two engines (seen with F16: 3 positions of 384 below 0.99). The expert kernels' quantized types are checked
against models/dequant.py below instead.
"""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from app.cli import main
from inference.weights import ExpertFFN
from kernels.cpu import ops as cpu_ops
from models.config import BadConfigValueError, config_from_metadata
from models.dequant import dequantize
from models.gguf import open_gguf
from tests.inference.parity import oracle_logits, parity
from tests.inference.synthetic import EXPERTS, F16_LAYERS, write_synthetic

F32_LAYERS = dict.fromkeys(F16_LAYERS, T.F32)


@pytest.fixture(scope="module")
def moe_f32(tmp_path_factory, smollm2):
    path = tmp_path_factory.mktemp("moe") / "qwen3moe-f32.gguf"
    write_synthetic(path, "qwen3moe", vocab_from=smollm2, types=F32_LAYERS)
    return path


@pytest.fixture(scope="module")
def moe_oracle(moe_f32):
    return oracle_logits(moe_f32)


@pytest.fixture(scope="module")
def moe_engine(moe_f32):
    from inference import load
    return load(moe_f32, device="cpu", ctx=64)


def test_qwen3moe_config(moe_f32):
    meta = open_gguf(moe_f32).metadata
    cfg = config_from_metadata(meta)
    assert (cfg.arch, cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp) == ("qwen3moe", *EXPERTS, 128)
    assert cfg.qk_norm and cfg.rope_style == "neox"
    with pytest.raises(BadConfigValueError, match="expert_used_count is 17"):
        config_from_metadata(dict(meta) | {"qwen3moe.expert_used_count": 17})


def test_info_shows_the_experts(moe_f32, capsys):
    assert main(["info", str(moe_f32)]) == 0
    out = capsys.readouterr().out
    experts = next(line for line in out.splitlines() if line.startswith("experts"))
    assert "16, 4 used a token, FFN 128 each" in experts
    share = int(experts.split("(")[1].split("%")[0])
    assert 40 < share < 100, experts  # 2 layers x 16 experts x 3 x 128 x 256 F32 against the rest
    assert main(["info", str(moe_f32), "--json"]) == 0
    import json
    info = json.loads(capsys.readouterr().out)
    assert (info["expert_count"], info["expert_used_count"], info["expert_feed_forward_length"]) == (16, 4, 128)
    assert info["active_parameters"] < info["parameters"]


def test_info_plan_puts_experts_on_the_host_first(moe_f32, capsys):
    """info --plan on a machine without a GPU plans for the budget given: too small for every expert, the first
    layers' experts go to the host while every layer stays on the GPU; --n-cpu-moe asks for some."""
    import math

    from inference.placement import MiB, plan_placement
    from tests.inference.test_placement import needed
    model = open_gguf(moe_f32)
    cfg = config_from_metadata(model.metadata)
    all_on_host = plan_placement(model.tensors, cfg, 4096, 80 * 2**30, vram_budget=80 * 2**30, cpu_moe=2)
    need = needed(all_on_host, model.tensors, cfg)
    budget = f"{math.ceil(need / MiB)}MiB"  # enough with all experts on the host, not with any on the GPU
    assert main(["info", str(moe_f32), "--plan", "--ctx", "4096", "--vram-budget", budget]) == 0
    plan = capsys.readouterr().out
    assert "placement: 2/2 layers on GPU; experts of layers 0-1 on CPU" in plan, plan
    assert main(["info", str(moe_f32), "--plan", "--ctx", "4096", "--vram-budget", "8", "--n-cpu-moe", "1"]) == 0
    assert "2/2 layers on GPU; experts of layer 0 on CPU" in capsys.readouterr().out


def _reference_route(logits, k):
    """Softmax gating written out per token: the k largest probabilities (lower id first on ties), renormalized."""
    ids, weights = [], []
    for row in logits.astype(np.float64):
        p = np.exp(row - row.max())
        p /= p.sum()
        top = sorted(range(len(p)), key=lambda e: (-p[e], e))[:k]
        ids.append(top)
        weights.append(p[top] / p[top].sum())
    return np.array(ids), np.array(weights)


def test_route_matches_softmax_gating():
    logits = np.random.default_rng(0).standard_normal((50, 128)).astype(np.float32) * 2
    logits[0, [3, 7]] = 9.0  # a tie at the top: the lower id first
    ids, weights = cpu_ops.route(logits, 8)
    ref_ids, ref_weights = _reference_route(logits, 8)
    assert ids.dtype == np.int32 and weights.dtype == np.float32
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(weights, ref_weights, rtol=1e-5)
    assert list(ids[0, :2]) == [3, 7]


def _random_experts(types: dict, n_expert=8, d=256, ff=256, seed=0) -> ExpertFFN:
    """An ExpertFFN of random valid blocks (tests/models/quant_blocks.py), stacked as a GGUF file stacks them."""
    from inference.weights import QuantExperts, QuantMatrix
    from models.ggml_types import TYPES_BY_ID
    from tests.models.quant_blocks import random_blocks

    rng = np.random.default_rng(seed)

    def stack(name, rows, cols):
        qtype = TYPES_BY_ID[int(types[name])]
        raw = random_blocks(rng, qtype, n_expert * rows * cols // qtype.block_elems)
        return QuantExperts(raw.reshape(n_expert, rows, -1), qtype, rows, cols)

    router = (rng.standard_normal((n_expert, d)) / np.sqrt(d) * 2).astype(np.float32)
    return ExpertFFN(QuantMatrix(router.view(np.uint8), TYPES_BY_ID[0], n_expert, d),
                     stack("gate", ff, d), stack("up", ff, d), stack("down", d, ff))


def _reference_moe(x, experts: ExpertFFN, h, k):
    """x + the experts on h, from matrices dequantized by models/dequant.py, in float64."""
    def dense(q, e):
        return dequantize(q.data[e], q.qtype, (q.n_cols, q.n_rows)).reshape(q.n_rows, q.n_cols).astype(np.float64)

    router = experts.router.data.view(np.float32).reshape(experts.router.n_rows, -1)
    ids, weights = _reference_route(h @ router.T, k)
    out = x.astype(np.float64)
    for t in range(len(h)):
        for e, w in zip(ids[t], weights[t]):
            g, u = dense(experts.gate, e) @ h[t], dense(experts.up, e) @ h[t]
            with np.errstate(over="ignore"):  # exp(-g) is inf for very negative g, where silu is 0
                out[t] += w * dense(experts.down, e) @ (g / (1 + np.exp(-g)) * u)
    return out


@pytest.mark.parametrize("n_tokens", [1, 3, 40])  # one token (decode), few (matvec kernels), many (tiles + BLAS)
@pytest.mark.parametrize("gate_up, down", [(T.Q4_K, T.Q6_K), (T.Q8_0, T.Q8_0), (T.Q5_K, T.Q4_0), (T.F16, T.F16),
                                           (T.IQ4_XS, T.IQ2_XXS), (T.IQ4_NL, T.IQ1_M)])
def test_cpu_experts_op_matches_numpy_reference(n_tokens, gate_up, down):
    from inference.backend_cpu import CPUBackend
    experts = _random_experts(dict(gate=gate_up, up=gate_up, down=down))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n_tokens, 256)).astype(np.float32)
    norm = rng.uniform(0.5, 1.5, 256).astype(np.float32)
    h = x / np.sqrt((x.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + 1e-6) * norm
    be = CPUBackend.__new__(CPUBackend)  # add_moe needs no cache: only the config's activation, eps and no GPU share
    be.share, be.cfg = None, type("Cfg", (), {"activation": "silu", "rms_eps": 1e-6})()
    ours = be.add_moe(x, experts, norm, 3)
    ref = _reference_moe(x, experts, h, 3)
    # x is rounded to int8 for the quantized kernels (as llama.cpp does): errors of ~1% of the FFN's output
    ffn = ref - x
    err = np.abs((ours - x) - ffn).max() / np.abs(ffn).max()
    assert err < 0.03, err
    assert np.corrcoef((ours - x).ravel(), ffn.ravel())[0, 1] > 0.999


@pytest.mark.parametrize("gate_up, down", [(T.Q4_K, T.Q6_K), (T.Q8_0, T.Q8_0), (T.Q4_0, T.Q4_K), (T.Q4_1, T.Q5_0)])
def test_one_token_experts_match_one_matrix_a_call(gate_up, down):
    """A decode step's experts (backend_cpu.moe_experts, one token: two kernel calls on the stacks) against the
    chosen experts one matrix a call (quantized_matmul, glu, the weighted sum in float64): float32 rounding apart,
    where the bound above allows 3%; a slot paired with another slot's weight or activation fails it."""
    from inference.backend_cpu import moe_experts
    from kernels.cpu.quant import quantized_matmul
    experts = _random_experts(dict(gate=gate_up, up=gate_up, down=down))
    rng = np.random.default_rng(2)
    h = rng.standard_normal((1, 256)).astype(np.float32)
    ids, weights = np.array([[6, 1, 3]], np.int32), np.array([[0.5, 0.3, 0.2]], np.float32)
    ours = moe_experts(experts, h, ids, weights, "silu")
    want = np.zeros((1, 256))
    for e, w in zip(ids[0], weights[0]):
        gate, up, down = experts.gate.expert(e), experts.up.expert(e), experts.down.expert(e)
        act = cpu_ops.glu(quantized_matmul(gate.data, gate.qtype, h), quantized_matmul(up.data, up.qtype, h), "silu")
        want += w * quantized_matmul(down.data, down.qtype, act).astype(np.float64)
    assert ours.shape == (1, 256) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, want, rtol=0, atol=1e-5 * np.abs(want).max())



@pytest.mark.parametrize("n_tokens", [1, 3])
@pytest.mark.parametrize("gate_up, down", [(T.Q4_K, T.Q6_K), (T.F16, T.F16)])  # the int8 kernels' branch; the list's
def test_moe_experts_write_out(n_tokens, gate_up, down):
    """moe_experts(..., out=buf) (host_experts' pinned buffer) writes into buf what it returns without out, and
    returns buf, in each branch."""
    from inference.backend_cpu import moe_experts
    experts = _random_experts(dict(gate=gate_up, up=gate_up, down=down))
    rng = np.random.default_rng(3)
    h = rng.standard_normal((n_tokens, 256)).astype(np.float32)
    ids = np.array([[6, 1, 3], [0, 6, 2], [5, 4, 1]][:n_tokens], np.int32)
    weights = rng.uniform(0.1, 1, (n_tokens, 3)).astype(np.float32)
    want = moe_experts(experts, h, ids, weights, "silu")
    buf = np.full((n_tokens, 256), np.nan, np.float32)
    assert moe_experts(experts, h, ids, weights, "silu", out=buf) is buf
    np.testing.assert_array_equal(buf, want)


@pytest.mark.parametrize("gate_up, down", [(T.Q4_K, T.Q8_0), (T.Q8_0, T.Q6_K)])
def test_a_stacked_gate_up_runs_in_place_in_the_one_token_kernel(gate_up, down, monkeypatch):
    """gemma4's experts with gate and up in one stack (ffn_gate_up_exps: each expert's gate rows, then its up rows;
    weights.gemma4_experts makes gate and up views of it) take the one-token kernel as two stacks do, reading the
    stack in place, and give what the same experts as two contiguous stacks give, bit for bit (the same kernel, dots
    and chunks). Planted fault, seen once: the kernel reading each expert's gate rows as its up fails every case."""
    from inference import backend_cpu
    from inference.weights import QuantExperts
    two = _random_experts(dict(gate=gate_up, up=gate_up, down=down), seed=4)
    n, ff, d = two.gate.data.shape[0], two.gate.n_rows, two.gate.n_cols
    stack = np.concatenate((two.gate.data, two.up.data), axis=1)  # [n, 2 ff, row bytes], as the file holds it
    stack.flags.writeable = False  # as the file's mmap: a writable stack would compile the kernel anew
    one = QuantExperts(stack, two.gate.qtype, 2 * ff, d)
    gate, up = (QuantExperts(stack[:, rows], one.qtype, ff, d) for rows in (slice(0, ff), slice(ff, 2 * ff)))
    stacked = ExpertFFN(two.router, gate, up, two.down, gate_up=one)
    h = np.random.default_rng(5).standard_normal((1, d)).astype(np.float32)
    ids, weights = np.array([[n - 1, 0, 3]], np.int32), np.array([[0.5, 0.3, 0.2]], np.float32)
    want = backend_cpu.moe_experts(two, h, ids, weights, "silu")
    monkeypatch.setattr(backend_cpu, "_moe_experts_listed", None)  # the per-expert path: not taken
    np.testing.assert_array_equal(backend_cpu.moe_experts(stacked, h, ids, weights, "silu"), want)
    kernel = vars(stacked)["one_token"]
    assert kernel.step == 2 and all(np.shares_memory(m, stack) for m in kernel.gate_up)  # no copy


def test_one_token_experts_are_checked_once_and_dropped_with_their_ffn():
    """moe_experts' one-token branch checks an FFN's stacks on its first call (ExpertFFN.one_token, kept in the
    FFN) and keeps them no longer than the FFN."""
    import gc
    import weakref

    from inference import backend_cpu
    experts = _random_experts(dict(gate=T.Q4_K, up=T.Q4_K, down=T.Q6_K))
    h, ids, weights = np.ones((1, 256), np.float32), np.array([[6, 1, 3]], np.int32), np.ones((1, 3), np.float32)
    assert "one_token" not in vars(experts)
    backend_cpu.moe_experts(experts, h, ids, weights, "silu")
    checked = vars(experts)["one_token"]
    backend_cpu.moe_experts(experts, h, ids, weights, "silu")
    assert vars(experts)["one_token"] is checked
    gone = weakref.ref(checked)
    del experts, checked
    gc.collect()
    assert gone() is None


@pytest.mark.parametrize("model", ["synth_qwen3moe", "synth_qwen3moe_k"])  # Q4_1 and Q5_0 experts; Q4_K and Q6_K
def test_float_reference_of_one_token(model, request):
    """The GPU tests' CPU reference (gpu_compare.reference_logits: cpu_quant's int8 kernels off, x in float32) of one
    token, which runs the experts as a decode step does, is the first row of a longer prompt's reference to float32
    rounding (x rounded to int8 is 0.3-3% off here). Session 11's moe_experts chose expert_matvecs by a type list of
    its own, which the reference does not empty, and expert_matvecs refused the stacks by the emptied one: this
    raised for the Q4_K file, and 4 GPU tests of the Q4_1 file failed until the stack path was kept from Q4_1."""
    from inference import load
    from tests.inference.gpu_compare import random_prompt, reference_logits
    cpu = load(request.getfixturevalue(model), device="cpu", ctx=64)
    ids = random_prompt(cpu, 9)
    one, first = reference_logits(cpu, ids[:1])[0], reference_logits(cpu, ids)[0]
    assert np.abs(one - first).max() <= 1e-5 * np.abs(first).max()

def _check_moe_parity(m: dict) -> None:
    """The issue's bar for experts: mean correlation >= 0.999, min >= 0.99, llama.cpp's clear top-1 kept."""
    assert m["decided_mismatches"] == 0, m
    assert m["corr_mean"] >= 0.999, m
    assert m["corr_min"] >= 0.99, m


def _moe_parity(engine, cases, what: str) -> dict:
    """parity of our logits of llama.cpp's cases (oracle_logits) against theirs, once the comparison is seen to
    see the input: two different prompts give clearly different logits."""
    ours = [engine.logits(ids) for ids, _ in cases]
    assert np.corrcoef(ours[0][-1], ours[1][-1])[0, 1] < 0.5
    m = parity(ours, [ref for _, ref in cases])
    print(what, m)
    return m


def test_qwen3moe_matches_llama_cpp(moe_engine, moe_oracle):
    _check_moe_parity(_moe_parity(moe_engine, moe_oracle, "qwen3moe"))


def test_llama_with_experts_matches_llama_cpp(tmp_path, smollm2):
    """Mixtral's kind: the llama architecture with llama.expert_count, 8 experts of which 2 run a token, the
    experts as wide as llama.feed_forward_length says; the same op as qwen3moe's."""
    from inference import load
    path = tmp_path / "llama-moe.gguf"
    write_synthetic(path, "llama", vocab_from=smollm2, types=F32_LAYERS, experts=(8, 2))
    engine = load(path, device="cpu", ctx=64)
    assert (engine.config.arch, engine.config.n_expert, engine.config.n_expert_used, engine.config.n_ff_exp) == (
        "llama", 8, 2, 128)
    _check_moe_parity(_moe_parity(engine, oracle_logits(path), "llama with experts"))


def test_qwen3moe_with_iq4_nl_experts_matches_llama_cpp(tmp_path):
    """Expert stacks of an IQ type (IQ4_NL: the experts' 128 columns are not whole blocks of 256), attention F32
    and the file's own vocabulary: mean correlation 0.99989, min 0.9986 when written. With quantized attention
    too, llama.cpp's 8-bit activations flip a routing choice now and then (min 0.89 at one position)."""
    from inference import load
    path = tmp_path / "qwen3moe-iq4_nl.gguf"
    experts = dict.fromkeys(["ffn_gate", "ffn_up", "ffn_down"], T.IQ4_NL)
    write_synthetic(path, "qwen3moe", types={**F32_LAYERS, **experts})
    engine = load(path, device="cpu", ctx=64)
    _check_moe_parity(_moe_parity(engine, oracle_logits(path), "qwen3moe, IQ4_NL experts"))


def test_parity_catches_routing_without_renormalized_weights(moe_engine, moe_oracle, monkeypatch):
    """A planted fault: the top-k probabilities used as they are, not divided by their sum (as qwen2moe does,
    but not qwen3moe). The comparison above must fail on it."""
    route = cpu_ops.route

    def unnormalized(logits, k):
        ids, _ = route(logits, k)
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        return ids, np.take_along_axis(p / p.sum(axis=1, keepdims=True), ids, axis=1).astype(np.float32)

    monkeypatch.setattr(cpu_ops, "route", unnormalized)
    m = parity([moe_engine.logits(ids) for ids, _ in moe_oracle], [ref for _, ref in moe_oracle])
    with pytest.raises(AssertionError):
        _check_moe_parity(m)
