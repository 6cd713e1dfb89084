"""One token's chosen experts on the CPU (a mixture of experts' decode step): the stack kernels of kernels/cpu/matvec
(expert_matvecs_int8, expert_ffn_int8) and cpu_quant's wrappers around them, against
the per-matrix kernels (tests/kernels/test_cpu_quant.py holds those to gguf-py's dequantization) and x8 @ W.T."""
import numpy as np
import pytest

from kernels.bench.cpu import random_weight
from kernels.cpu.ops import GELU_TABLE
from kernels.cpu.types import F16_TO_F32
from models.ggml_types import TYPES_BY_NAME
from tests.kernels.test_cpu_quant import expected


def expert_stack(name: str, n_expert: int, n_rows: int, n_cols: int, seed: int) -> np.ndarray:
    """Random valid bytes of n_expert [n_rows, n_cols] matrices stacked as a GGUF file stacks them (read-only)."""
    return random_weight(name, n_expert * n_rows, n_cols, seed).reshape(n_expert, n_rows, -1)


@pytest.mark.parametrize("gate_up, down", [("Q4_K", "Q6_K"), ("Q4_K", "Q4_K"), ("Q8_0", "Q8_0"), ("Q6_K", "Q4_0"),
                                           ("Q4_1", "Q5_0")])
def test_expert_matvecs_equal_the_per_matrix_path_bit_for_bit(gate_up, down):
    """One token's chosen experts from the stacks in one call (a decode step's gate and up; its downs, each slot by
    its own row of x) give what quantized_matmuls on the 2k chosen matrices and quantized_matvecs_own_rows on the
    k downs give, bit for bit (the same quantized x, dots and chunks of rows), and x8 @ W.T of the dequantized
    experts. Ids out of order, 41 rows (an odd last row), both kinds of x blocks.
    Planted fault, seen once: the kernel reading expert ids[(s + 1) % k] for slot s fails every case here."""
    from kernels.cpu.quant import expert_matvecs, quantized_matmuls, quantized_matvecs_own_rows
    n_expert, ids = 6, np.array([4, 0, 5], np.int32)
    qg, qd = TYPES_BY_NAME[gate_up], TYPES_BY_NAME[down]
    gate, up = expert_stack(gate_up, n_expert, 41, 512, 1), expert_stack(gate_up, n_expert, 41, 512, 2)
    downs = expert_stack(down, n_expert, 512, 256, 3)
    rng = np.random.default_rng(4)
    x, act = rng.standard_normal((1, 512), np.float32), rng.standard_normal((len(ids), 256), np.float32)

    got = expert_matvecs((gate, up), (qg, qg), ids, x)
    assert got.shape == (2, len(ids), 41)
    per_matrix = quantized_matmuls([m[e] for e in ids for m in (gate, up)], [qg] * 2 * len(ids), x)
    np.testing.assert_array_equal(got, np.stack([np.concatenate(per_matrix[0::2]), np.concatenate(per_matrix[1::2])]))
    ys = expert_matvecs((downs,), (qd,), ids, act, own_rows=True)
    assert ys.shape == (1, len(ids), 512)
    np.testing.assert_array_equal(ys[0], np.concatenate(quantized_matvecs_own_rows([downs[e] for e in ids],
                                                                                  [qd] * len(ids), act)))
    for s, e in enumerate(ids):  # against the dequantized experts, as the int8 matvecs are held above
        for m, stack in enumerate((gate, up)):
            want, bound = expected(stack[e], gate_up, x)
            assert np.all(np.abs(got[m, s] - want[0]) <= bound[0]), (m, s)
        want, bound = expected(downs[e], down, act[s:s + 1])
        assert np.all(np.abs(ys[0, s] - want[0]) <= bound[0]), s


@pytest.mark.parametrize("activation", ["silu", "gelu"])
@pytest.mark.parametrize("gate_t, up_t, down_t", [("Q4_K", "Q4_K", "Q6_K"), ("Q4_K", "Q4_K", "Q4_K"),
                                                  ("Q8_0", "Q8_0", "Q8_0"), ("Q6_K", "Q6_K", "Q4_0"),
                                                  ("Q4_1", "Q4_1", "Q5_0"), ("Q4_K", "Q6_K", "Q8_0"),
                                                  ("IQ4_XS", "IQ4_XS", "IQ4_NL")])
def test_one_token_experts_sum_the_downs_as_weights_times_expert_matvecs(gate_t, up_t, down_t, activation):
    """OneTokenExperts.ffn (a decode step's experts: gate/up with the GLU, the downs and their weighted sum in one
    kernel, expert_ffn_int8) gives weights @ expert_matvecs of the downs on cpu_ops.glu of expert_matvecs' gate and up
    (the GLU in the kernel bit for bit: any other act would move the downs' dots past the bound), to float32 rounding
    of the k-term sum (summed in slot order, not BLAS's), into out when given; neither the kernel's chunks nor the
    number of workers claiming them changes a bit. Ids out of order, random weights, the INT8_IDS types the expert
    test covers, gate and up of different types.
    Planted faults, each seen once: the kernel taking weight 1 for slot 1 fails every case here; a slot's activation
    quantized by the thread that finishes its first gate/up chunk instead of its last fails every case here; gelu
    for silu and silu for gelu fails every case here."""
    _check_one_token_experts((gate_t, up_t, down_t), activation, biased=False)


def test_gpt_oss_experts_in_one_kernel_with_their_biases_and_glu():
    """gpt-oss's experts (MXFP4, a bias on each expert's gate, up and down outputs, its clamped swiglu) through the
    one-token kernel as any other's: what the per-matrix path with the biases added gives, as above.
    Planted fault, seen once: the down bias of expert ids[0] added to every slot fails here."""
    _check_one_token_experts(("MXFP4",) * 3, "swiglu_oai", biased=True)


def _check_one_token_experts(names: tuple[str, str, str], activation: str, biased: bool) -> None:
    from kernels.cpu import ops as cpu_ops
    from kernels.cpu.matvec import expert_ffn_int8
    from kernels.cpu.quant import OneTokenExperts, expert_matvecs
    n_expert, ids = 6, np.array([4, 0, 5], np.int32)
    qtypes = tuple(TYPES_BY_NAME[t] for t in names)
    stacks = (expert_stack(names[0], n_expert, 256, 512, 1), expert_stack(names[1], n_expert, 256, 512, 2),
              expert_stack(names[2], n_expert, 512, 256, 3))
    rng = np.random.default_rng(4)
    h, weights = rng.standard_normal((1, 512), np.float32), rng.uniform(0.1, 1, len(ids)).astype(np.float32)
    # gate values near 1, where silu and gelu differ: random blocks' dots run to hundreds, where both give 0 or g
    h /= np.median(np.abs(expert_matvecs(stacks[:1], qtypes[:1], ids, h)))
    biases = None
    if biased:
        biases = tuple(rng.standard_normal((n_expert, n), np.float32) for n in (256, 256, 512))
    experts = OneTokenExperts(stacks, qtypes, biases)
    out = np.full((1, 512), np.nan, np.float32)
    assert experts.ffn(h, ids, weights, activation, out) is out

    gate, up = expert_matvecs(stacks[:2], qtypes[:2], ids, h)
    if biased:
        gate, up = gate + biases[0][ids], up + biases[1][ids]
    act = cpu_ops.glu(gate, up, activation)
    ys = expert_matvecs(stacks[2:], qtypes[2:], ids, act, own_rows=True)[0]
    if biased:
        ys = ys + biases[2][ids]
    bound = len(ids) * np.finfo(np.float32).eps * (np.abs(weights) @ np.abs(ys))
    assert np.all(np.abs(out[0] - weights @ ys) <= bound)
    np.testing.assert_array_equal(experts.ffn(h, ids, weights, activation), out)
    for n_chunks, n_workers in [(1, 3), (6, 1), (7, 2), (64, 3), (300, 4)]:  # one chunk a pair, rows split unevenly
        again = np.full((1, 512), np.nan, np.float32)
        expert_ffn_int8(experts.gate_up_tids, experts.gate_up, experts.step, experts.down_tid, experts.down, ids,
                        weights, h, cpu_ops.ACTIVATIONS[activation], experts.biases, GELU_TABLE, again, F16_TO_F32,
                        n_chunks, n_workers)
        np.testing.assert_array_equal(again, out, err_msg=str((n_chunks, n_workers)))


def test_one_token_experts_refuse_bad_arguments():
    from kernels.cpu.quant import OneTokenExperts
    q4_k, q6_k = TYPES_BY_NAME["Q4_K"], TYPES_BY_NAME["Q6_K"]
    gate, up = expert_stack("Q4_K", 4, 256, 512, 0), expert_stack("Q4_K", 4, 256, 512, 1)
    with pytest.raises(ValueError, match="down stack"):
        OneTokenExperts((gate, up, expert_stack("Q6_K", 4, 256, 512, 2)), (q4_k, q4_k, q6_k))
    with pytest.raises(ValueError, match="INT8_IDS"):
        OneTokenExperts((gate, up, expert_stack("Q5_K", 4, 512, 256, 2)), (q4_k, q4_k, TYPES_BY_NAME["Q5_K"]))
    experts = OneTokenExperts((gate, up, expert_stack("Q6_K", 4, 512, 256, 2)), (q4_k, q4_k, q6_k))
    h, ids, weights = np.ones((1, 512), np.float32), np.array([1, 3], np.int32), np.ones(2, np.float32)
    with pytest.raises(IndexError, match="expert id"):
        experts.ffn(h, np.array([1, 4], np.int32), weights, "silu")
    with pytest.raises(ValueError, match="h must be"):
        experts.ffn(np.ones((2, 512), np.float32), ids, weights, "silu")
    with pytest.raises(ValueError, match="ids and weights"):
        experts.ffn(h, ids, np.ones(3, np.float32), "silu")
    with pytest.raises(ValueError, match="k >= 1"):  # expert_ffn_int8's chunk table needs a slot
        experts.ffn(h, np.array([], np.int32), np.array([], np.float32), "silu")
    with pytest.raises(ValueError, match="out must be"):
        experts.ffn(h, ids, weights, "silu", np.empty((1, 512), np.float64))


def test_expert_matvecs_refuse_bad_stacks_and_ids():
    from kernels.cpu.quant import expert_matvecs
    q4_k, q5_k = TYPES_BY_NAME["Q4_K"], TYPES_BY_NAME["Q5_K"]
    stack, x = expert_stack("Q4_K", 4, 8, 256, 0), np.ones((1, 256), np.float32)
    with pytest.raises(IndexError, match="expert id"):
        expert_matvecs((stack,), (q4_k,), np.array([1, 4], np.int32), x)
    with pytest.raises(ValueError, match="INT8_IDS"):
        expert_matvecs((expert_stack("Q5_K", 4, 8, 256, 0),), (q5_k,), np.array([1], np.int32), x)
    with pytest.raises(ValueError, match="expert stacks"):
        expert_matvecs((stack, expert_stack("Q4_K", 4, 16, 256, 0)), (q4_k, q4_k), np.array([1], np.int32), x)
    with pytest.raises(ValueError, match="x must be"):
        expert_matvecs((stack,), (q4_k,), np.array([1, 2], np.int32), x, own_rows=True)
