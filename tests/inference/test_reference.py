"""The GPU tests' CPU reference (gpu_compare.reference_logits) leaves the CPU engine's int8 paths for float32 ones,
and puts them back: runs in CI, so a renamed switch of kernels/cpu/quant fails here, not only on the device."""
import numpy as np

from inference import load
from tests.inference.gpu_compare import random_prompt, reference_logits


def test_reference_leaves_the_int8_paths_and_restores_them(synth_qwen2):
    cpu = load(str(synth_qwen2), device="cpu", ctx=128)
    ids = random_prompt(cpu, 40)
    fast = cpu.logits(ids)
    ref = reference_logits(cpu, ids)
    # x rounded to int8 (the engine's own paths, as llama.cpp's CPU) against float32: ~0.1-1 apart on this file
    assert np.abs(ref - fast).max() > 1e-2
    np.testing.assert_array_equal(cpu.logits(ids), fast)  # the switches are back
    # in float32 a row does not depend on the prompt's length (1 token takes the matvec path, 5 and 17 the prompt's)
    prefix = np.array([reference_logits(cpu, ids[:k])[-1] for k in (1, 5, 17)])
    np.testing.assert_allclose(prefix, ref[[0, 4, 16]], rtol=1e-4, atol=1e-4)
