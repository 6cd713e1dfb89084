"""The synthetic writer's K-quant matrices (tests/inference/synthetic.py) and the Q4_K_M llama of the GPU tests
(conftest.py's synth_llama_k): values of the asked mean and std, the types llama.cpp's reader sees, logits that
depend on the input, and a planted fault that the GPU tests' comparison (gpu_compare.assert_close_logits) sees.
Its CPU engine against llama.cpp: test_parity.py. The bench writer tests/synth_gguf.py's IQ3_XXS mix: its types and
blocks."""
import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from models.dequant import DEQUANTIZERS
from tests.inference.gpu_compare import assert_close_logits, random_prompt, reference_logits
from tests.inference.parity import PROMPTS
from tests.inference.synthetic import IQ_TYPES, Q4_K_M_LAYERS, random_quant


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q5_K, T.Q6_K, *IQ_TYPES], ids=lambda t: t.name)
@pytest.mark.parametrize("shape, std", [((512, 256), 0.125), ((4, 256, 512), 0.044)])
def test_random_quant_blocks_have_mean_0_and_the_asked_std(qtype, shape, std):
    raw = random_quant(np.random.default_rng(1), shape, std, qtype)
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    assert raw.dtype == np.uint8 and raw.shape == (*shape[:-1], shape[-1] // block_elems * block_bytes)
    w = DEQUANTIZERS[qtype.name](raw.reshape(-1, block_bytes))
    assert abs(w.mean()) < 0.05 * std and abs(w.std() / std - 1) < 0.1, (w.mean(), w.std())
    assert np.isfinite(w).all()


def test_the_llama_k_file_holds_the_q4_k_m_mix(synth_llama_k):
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(synth_llama_k).tensors}
    for i in range(2):
        for name, qtype in Q4_K_M_LAYERS.items():
            assert types[f"blk.{i}.{name}.weight"] == qtype, name
    assert set(Q4_K_M_LAYERS.values()) == {T.Q4_K, T.Q6_K}


def test_synth_gguf_writes_llama_quantizes_iq3_xxs_mix_with_zero_mean_blocks(synth_tiny_iq3_xxs):
    """llama.cpp's IQ3_XXS choices for a 2-layer llama with GQA 2, as llama-quantize makes them without an imatrix
    (llama-quant.cpp): ffn_down Q3_K past the first n_layer/8 (= 0) layers, attn_v IQ3_S below GQA 4."""
    tensors = {t.name: t for t in gguf.GGUFReader(synth_tiny_iq3_xxs).tensors}
    mix = {"attn_q": T.IQ2_S, "attn_k": T.IQ2_S, "attn_v": T.IQ3_S, "attn_output": T.IQ3_S, "ffn_gate": T.IQ3_XXS,
           "ffn_up": T.IQ3_XXS, "ffn_down": T.Q3_K}
    expected = {"token_embd.weight": T.IQ3_S, "output.weight": T.Q5_K}
    expected |= {f"blk.{i}.{name}.weight": qtype for i in range(2) for name, qtype in mix.items()}
    assert {name: tensors[name].tensor_type for name in expected} == expected
    for name in expected:
        block_bytes = gguf.GGML_QUANT_SIZES[tensors[name].tensor_type][1]
        w = DEQUANTIZERS[tensors[name].tensor_type.name](np.asarray(tensors[name].data).reshape(-1, block_bytes))
        assert np.isfinite(w).all() and abs(w.mean()) < 0.05 * w.std(), (name, w.mean(), w.std())


@pytest.fixture(scope="module")
def llama_k(synth_llama_k):
    from inference import load
    return load(synth_llama_k, device="cpu", ctx=128)


def test_the_llama_k_logits_depend_on_the_input(llama_k):
    """Two prompts' last logits correlate < 0.5 (tests/synth_gguf.py's tiny preset, which the GPU tests used
    before: 0.99998)."""
    first, second = (llama_k.logits(llama_k.tokenizer.encode(text)[:64])[-1] for text in PROMPTS[:2])
    corr = np.corrcoef(first, second)[0, 1]
    print(f"llama_k: two prompts' last logits correlate {corr:.4f}")
    assert corr < 0.5


def test_the_gpu_tests_comparison_sees_a_dropped_attention(llama_k, monkeypatch):
    """The GPU tests compare a device's logits with reference_logits (the CPU engine, float activations): here
    the CPU engine's own int8-rounded logits pass it, and with layer 1's attention output zeroed they fail it
    (mean correlation ~0.80; on the tiny preset's file the same fault kept 0.99998 and passed)."""
    import inference.backend_cpu as backend_cpu
    ids = random_prompt(llama_k, 70, seed=70)
    ref = reference_logits(llama_k, ids)
    assert_close_logits(llama_k.logits(ids), ref, "llama_k, activations rounded to 8 bits")
    attention = backend_cpu.CPUBackend.attention

    def dropped(self, layer, q, window, scale, sinks=None):
        out = attention(self, layer, q, window, scale, sinks)
        return out * 0 if layer == 1 else out

    monkeypatch.setattr(backend_cpu.CPUBackend, "attention", dropped)
    with pytest.raises(AssertionError, match="mean correlation"):
        assert_close_logits(llama_k.logits(ids), ref, "llama_k, layer 1's attention dropped")
