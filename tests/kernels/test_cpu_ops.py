"""The CPU ops against plain loops written straight from their definitions."""
import math

import numpy as np
import pytest

from kernels.cpu import ops as cpu_ops


def test_gpt_oss_routing_and_glu():
    """gpt-oss's routing (llama.cpp's SOFTMAX_WEIGHT): the k largest logits, a softmax over them alone, which is
    route's renormalized softmax; swiglu_oai: ggml_swiglu_oai's g * sigmoid(1.702 g) * (u + 1), g = min(gate, 7),
    u = up clamped to [-7, 7]."""
    logits = np.array([[0.5, 3.0, -1.0, 2.0, 2.5], [1.0, 1.0, 0.0, 4.0, -2.0]], np.float32)
    ids, w = cpu_ops.route(logits, 3)
    assert ids.tolist() == [[1, 4, 3], [3, 0, 1]]  # a tie goes to the lower id
    e = np.exp(np.take_along_axis(logits, ids, 1).astype(np.float64))
    np.testing.assert_allclose(w, e / e.sum(1, keepdims=True), rtol=1e-6)
    gate = np.array([-20.0, -1.0, 0.0, 0.5, 6.9, 7.5, 30.0], np.float32)
    up = np.array([-9.0, -1.0, 2.0, -0.5, 7.0, 8.0, -30.0], np.float32)
    g, u = np.minimum(gate.astype(np.float64), 7), np.clip(up.astype(np.float64), -7, 7)
    want = g / (1 + np.exp(-1.702 * g)) * (u + 1)
    np.testing.assert_allclose(cpu_ops.glu(gate[None], up[None], "swiglu_oai")[0], want, rtol=1e-6, atol=1e-30)


def test_yarn_speeds_blend_scaled_and_unscaled_pairs():
    """llama.cpp's corr dims for gpt-oss's rope (64 dims, base 150000, 4096 trained, factor 32) are pairs 8 and 18:
    below 8 the speeds are unscaled, from 18 on scaled by 1 / 32, linearly blended between."""
    plain = cpu_ops.rope_inv_freq(64, 150000.0)
    yarn = cpu_ops.yarn_inv_freq(64, 150000.0, 1 / 32, 4096)
    np.testing.assert_allclose(yarn[:9], plain[:9])
    np.testing.assert_allclose(yarn[18:], plain[18:] / 32)
    ramp = 1 - (np.arange(9, 18) - 8) / 10
    np.testing.assert_allclose(yarn[9:18], plain[9:18] * (ramp + (1 - ramp) / 32))


@pytest.mark.parametrize("style", ["normal", "neox"])
def test_rope_rotates_the_right_pairs(style):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 2, 10)).astype(np.float32)
    positions = np.array([0, 4, 9])
    inv = cpu_ops.rope_inv_freq(8, 10000.0)  # 8 of 10 dims rotate
    got = cpu_ops.rope(x, positions, inv, style)
    want = x.astype(np.float64).copy()
    for t, p in enumerate(positions):
        for i in range(4):
            a, b = (2 * i, 2 * i + 1) if style == "normal" else (i, i + 4)
            theta = p * 10000.0 ** (-2 * i / 8)
            x0, x1 = x[t, :, a], x[t, :, b]
            want[t, :, a] = x0 * math.cos(theta) - x1 * math.sin(theta)
            want[t, :, b] = x0 * math.sin(theta) + x1 * math.cos(theta)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[..., 8:], x[..., 8:])


@pytest.mark.parametrize("parallel", [False, True])
def test_rms_norm_and_glu(parallel, monkeypatch):
    monkeypatch.setattr(cpu_ops, "GLU_PARALLEL_SIZE", 0 if parallel else 1 << 62)  # a big model's path, a small one's
    x = np.array([[3.0, 4.0]], np.float32)
    np.testing.assert_allclose(cpu_ops.rms_norm(x, np.array([1.0, 2.0], np.float32), 0.0),
                               [[3 / math.sqrt(12.5), 8 / math.sqrt(12.5)]], rtol=1e-6)
    g = np.array([-30.0, -1.0, 0.0, 2.0], np.float32)
    up = np.full(4, 2.0, np.float32)
    np.testing.assert_allclose(cpu_ops.glu(g, up, "silu"), 2 * g / (1 + np.exp(-g.astype(np.float64))), rtol=1e-6)
    # gelu from a table (cpu_ops.GELU_TABLE): within 2e-6 of the formula everywhere, the tails included
    g = np.linspace(-14, 14, 20001).astype(np.float32)
    x = g.astype(np.float64)
    gelu = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    np.testing.assert_allclose(cpu_ops.glu(g, np.full_like(g, 2.0), "gelu"), 2 * gelu, rtol=0, atol=4e-6)


@pytest.mark.parametrize("style", ["normal", "neox"])
@pytest.mark.parametrize("n,pos", [(1, 0), (1, 37), (5, 11)])
def test_rope_kv_store_is_rope_then_cache_writes(style, n, pos):
    """One call's rotated q, and k and v in the caches, are what rope_rotate of q and of k and the two writes give,
    bit for bit (the same arithmetic); the rest of the caches untouched."""
    rng = np.random.default_rng(n + pos)
    n_heads, n_kv, hd, vd, n_ctx = 6, 2, 10, 7, 64
    q = rng.standard_normal((n, n_heads, hd)).astype(np.float32)
    k = rng.standard_normal((n, n_kv, hd)).astype(np.float32)
    v = rng.standard_normal((n, n_kv, vd)).astype(np.float32)
    cos, sin = cpu_ops.rope_cos_sin(np.arange(pos, pos + n), cpu_ops.rope_inv_freq(8, 10000.0))  # 8 of 10 rotate
    k_cache = rng.standard_normal((n_kv, n_ctx, hd)).astype(np.float32)
    v_cache = rng.standard_normal((n_kv, n_ctx, vd)).astype(np.float32)
    want_k, want_v = k_cache.copy(), v_cache.copy()
    want_k[:, pos:pos + n] = cpu_ops.rope_rotate(k, cos, sin, style).transpose(1, 0, 2)
    want_v[:, pos:pos + n] = v.transpose(1, 0, 2)
    got_q = cpu_ops.rope_kv_store(q, k, v, cos, sin, style, k_cache, v_cache, pos)
    np.testing.assert_array_equal(got_q, cpu_ops.rope_rotate(q, cos, sin, style))
    np.testing.assert_array_equal(k_cache, want_k)
    np.testing.assert_array_equal(v_cache, want_v)


def test_exp_f32_is_exp_to_float32_precision():
    """exp_f32 (arithmetic alone, so the softmax and silu loops vectorize) within 2e-7 relative of exp over the
    range it serves, every power of two's neighbourhood and the clamped ends included; 0 for what underflows.
    Planted: the polynomial's r^3 coefficient off in its 4th digit fails here (3e-6)."""
    import numba as nb

    @nb.njit
    def exp_all(x):
        out = np.empty_like(x)
        for i in range(x.size):
            out[i] = cpu_ops.exp_f32(x[i])
        return out

    x = np.concatenate([np.linspace(-87.0, 88.0, 400_001), np.log(2.0) * np.arange(-125, 127) + 1e-4,
                        np.random.default_rng(0).uniform(-20, 20, 100_000)]).astype(np.float32)
    want = np.exp(x.astype(np.float64))
    assert np.max(np.abs(exp_all(x) - want) / want) < 2e-7
    assert exp_all(np.array([-200.0], np.float32))[0] < 1e-37


@pytest.mark.parametrize("kernel", ["deltanet._conv_silu", "ops._glu_serial"])
def test_silu_loops_vectorize(kernel):
    """The serial kernels that take silu of many values (a DeltaNet layer's conv, the one-token GLU) compile its exp
    to packed instructions: numba's default error model checks each division for a zero, a branch that left them
    scalar (6-16x slower), so they take error_model "numpy". A fresh compile with the kernel's own options (the
    cached code cannot be inspected), its assembly holding a packed round (exp_f32's floor); planted: the default
    error model compiles none."""
    import re

    import numba as nb

    from kernels.cpu import deltanet
    module, name = kernel.split(".")
    f = getattr({"deltanet": deltanet, "ops": cpu_ops}[module], name)
    x = np.zeros((2, 64), np.float32)
    args = {"_conv_silu": (x, np.zeros((3, 64), np.float32), np.zeros((4, 64), np.float32), x.copy()),
            "_glu_serial": (x[0], x[0], False, np.zeros(8, np.float32), x[0].copy())}[name]
    options = {k: v for k, v in f.targetoptions.items() if k not in ("cache", "nopython")}
    fresh = nb.njit(**options)(f.py_func)
    fresh(*args)
    asm = next(iter(fresh.inspect_asm().values()))
    assert re.search(r"\b(?:v?roundps|vrndscaleps)\b", asm), f"{kernel}'s silu loop is scalar"


def test_silu_glu_over_the_float32_range(monkeypatch):
    """silu(g) * up on one core and on all (the prompt's vectorized loop), against float64, where exp(-g)
    overflows float32 (g < -88) and where silu is 0 to float32 precision (g <= -80) too."""
    g = np.concatenate([np.linspace(-100, 100, 20001), [-88.5, -80.0, -79.9]]).astype(np.float32)
    up = np.random.default_rng(4).uniform(0.5, 2, g.size).astype(np.float32)
    x = g.astype(np.float64)
    want = x / (1 + np.exp(-x)) * up
    serial = cpu_ops.glu(g, up, "silu")
    np.testing.assert_allclose(serial, want, rtol=1e-6, atol=1e-30)
    monkeypatch.setattr(cpu_ops, "GLU_PARALLEL_SIZE", 0)
    np.testing.assert_array_equal(cpu_ops.glu(g, up, "silu"), serial)


def test_glu_of_a_token_on_one_core_matches_all_cores(monkeypatch):
    """A decode step's GLU (one numba loop on one core) gives what the prompt's parallel loop gives, bit for bit."""
    g = np.random.default_rng(2).standard_normal((1, 1536)).astype(np.float32) * 4
    up = np.random.default_rng(3).standard_normal((1, 1536)).astype(np.float32)
    for activation in ("silu", "gelu"):
        serial = cpu_ops.glu(g, up, activation)
        monkeypatch.setattr(cpu_ops, "GLU_PARALLEL_SIZE", 0)
        np.testing.assert_array_equal(serial, cpu_ops.glu(g, up, activation))
        monkeypatch.undo()


def test_rope_kv_store_refuses_what_does_not_fit():
    """Positions past the cache, or heads of another shape, are refused before the kernel (which does not check
    bounds) writes."""
    q, k, v = np.zeros((1, 4, 8), np.float32), np.zeros((1, 2, 8), np.float32), np.zeros((1, 2, 8), np.float32)
    cos, sin = cpu_ops.rope_cos_sin(np.arange(1), cpu_ops.rope_inv_freq(8, 10000.0))
    caches = np.zeros((2, 16, 8), np.float32), np.zeros((2, 16, 8), np.float32)
    cpu_ops.rope_kv_store(q, k, v, cos, sin, "normal", *caches, 15)
    with pytest.raises(ValueError, match="do not fit"):
        cpu_ops.rope_kv_store(q, k, v, cos, sin, "normal", *caches, 16)
    with pytest.raises(ValueError, match="do not fit"):
        cpu_ops.rope_kv_store(q, np.zeros((1, 3, 8), np.float32), v, cos, sin, "normal", *caches, 0)
