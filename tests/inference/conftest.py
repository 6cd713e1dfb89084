"""Engines shared by the engine tests (loading once per session keeps the files under a few minutes), and the
synthetic models of the GPU tests.

Small synthetic files (random weights scaled so that logits depend on the input) are written by
tests/inference/synthetic.py; llama files with real shapes (synth_1b) and the q4_k_m Qwen3 MoE by
tests/synth_gguf.py (the team's bench writer, carried in the repository so that a clone needs nothing beside
it; $SYNTH_GGUF overrides it), whose logits barely depend on the input.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.inference.synthetic import IQ4_XS_LAYERS, LLAMA_K_SHAPES, Q4_K_M_LAYERS, SHAPES, write_synthetic


@pytest.fixture(scope="session")
def smollm2_engine(smollm2):
    from inference import load
    return load(smollm2, device="cpu", ctx=512)


@pytest.fixture(scope="session")
def gemma3_engine(gemma3):
    from inference import load
    return load(gemma3, device="cpu", ctx=640)


SYNTH_GGUF = os.environ.get("SYNTH_GGUF") or str(Path(__file__).parents[1] / "synth_gguf.py")


@pytest.fixture(scope="session")
def synth_1b(tmp_path_factory):
    return _synth(tmp_path_factory, "llama-1b", "q4_k_m")


@pytest.fixture(scope="session")
def synth_llama_k(tmp_path_factory):
    """A 2-layer llama in llama.cpp's Q4_K_M mix (Q4_K q, k, attention output, gate, up; Q6_K v and down) with its
    own SentencePiece vocabulary, written by tests/inference/synthetic.py: random K-quant blocks scaled so that
    logits depend on the input (two prompts' last logits correlate 0.06; 0.99998 on tests/synth_gguf.py's tiny
    preset). Its output is tied to the random embeddings, so top-1 is the input token: comparisons of its logits
    rest on their correlation, which a dropped attention brings to 0.80 (test_synthetic.py)."""
    path = tmp_path_factory.mktemp("synth") / "llama_k.gguf"
    write_synthetic(path, "llama", shapes=LLAMA_K_SHAPES, types=Q4_K_M_LAYERS)
    return path


@pytest.fixture(scope="session")
def synth_llama_iq4_xs(tmp_path_factory):
    """synth_llama_k's llama with every layer matrix IQ4_XS (llama.cpp's IQ4_XS mix), random blocks."""
    path = tmp_path_factory.mktemp("synth") / "llama_iq4_xs.gguf"
    write_synthetic(path, "llama", shapes=LLAMA_K_SHAPES, types=IQ4_XS_LAYERS)
    return path


@pytest.fixture(scope="session")
def synth_tiny_iq3_xxs(tmp_path_factory):
    """tests/synth_gguf.py's tiny llama in llama-quantize's IQ3_XXS mix: IQ3_XXS, IQ3_S, IQ2_S, Q3_K, Q5_K."""
    return _synth(tmp_path_factory, "tiny", "iq3_xxs")


@pytest.fixture(scope="session")
def synth_gemma3(tmp_path_factory):
    return _write_small(tmp_path_factory, "gemma3")


@pytest.fixture(scope="session")
def synth_qwen2(tmp_path_factory):
    return _write_small(tmp_path_factory, "qwen2")


@pytest.fixture(scope="session")
def synth_qwen3moe_k(tmp_path_factory):
    """Qwen3 MoE in q4_k_m (tests/synth_gguf.py's qwen3moe-tiny): Q4_K gate and up experts, down Q4_K in layer 0 and
    Q6_K in layer 1, the types the GPU reads in place from host memory. Its logits barely depend on the input:
    compare a layer's output (test_hybrid's op tests), not logits, where the comparison must see the input."""
    return _synth(tmp_path_factory, "qwen3moe-tiny", "q4_k_m")


@pytest.fixture(scope="session")
def synth_qwen3moe(tmp_path_factory):
    """16 experts, 4 of them run a token."""
    return _write_small(tmp_path_factory, "qwen3moe")


@pytest.fixture(scope="session")
def synth_qwen35(tmp_path_factory):
    """Qwen3.5's hybrid: 2 Gated DeltaNet layers and a gated attention layer (synthetic.DELTANET: 2 key heads, 4
    value heads of 64)."""
    return _write_small(tmp_path_factory, "qwen35")


@pytest.fixture(scope="session")
def synth_qwen35moe(tmp_path_factory):
    """qwen35 with 16 experts (4 run a token) and a shared expert in every layer. Its logits amplify the 8-bit
    rounding of activations (the CPU engine's own int8 path against its float32 reference: mean correlation 0.996,
    a token's experts flipping on near-ties): compare its layers (test_cuda_engine), not its logits."""
    return _write_small(tmp_path_factory, "qwen35moe")


@pytest.fixture(scope="session")
def synth_gpt_oss(tmp_path_factory):
    """gpt-oss (synthetic.py: biases on q, k, v, the output, the router and the experts, sinks, a 128-token window on
    layer 0, YaRN, swiglu_oai) with MXFP4 experts, as published files have them; q's 8 x 64 rows differ from n_embd. Its layer matrices F16: with Q8_0 ones this random network amplifies the 8-bit rounding of
    activations past the parity bar (H200: the CPU engine's own int8 path against its float32 reference, 40 steps
    after a 12-token prompt, mean correlation 0.9985, the GPU's decode steps 0.9987; F16: 0.9998 both)."""
    path = tmp_path_factory.mktemp("synth") / "gpt-oss.gguf"
    write_synthetic(path, "gpt-oss")
    return path


def _synth(factory, preset: str, ftype: str):
    path = factory.mktemp("synth") / f"{preset}.gguf"
    subprocess.run([sys.executable, SYNTH_GGUF, str(path), "--preset", preset, "--ftype", ftype], check=True)
    return path


def _write_small(factory, arch: str, own_output: bool = False, mtp: bool = False, k_quants: bool = False):
    """The path of a small random model (tests/inference/synthetic.py) with a made-up SentencePiece vocabulary of
    its own (nothing outside the repository), its matrices Q8_0, Q5_0, Q4_1 and F16 so that the GPU runs several matvec and prefill types. gemma3: 6 layers,
    five of them with a 16-token sliding window, head_dim 256; qwen2: qkv biases, its own output matrix;
    qwen3moe: Q4_1 gate and up experts, Q5_0 down experts (the GPU's expert kernels take quantized types); qwen35,
    qwen35moe: 3 layers, the first two Gated DeltaNet (projections of attn_q's type, output of attn_output's); 6 of
    them amplified the 8-bit rounding of activations past the parity bar (mean correlation 0.998). own_output: an
    output matrix of its own, not tied to the embeddings (see write_synthetic); mtp: an MTP block after the layers
    (qwen35, qwen35moe); k_quants: q4_k_m's types instead (Q4_K, Q6_K attn_v and ffn_down)."""
    from gguf import GGMLQuantizationType as T  # noqa: PLC0415

    gemma = arch == "gemma3"
    types = dict(attn_q=T.Q8_0, attn_k=T.Q8_0, attn_v=T.Q5_0, attn_output=T.Q8_0, ffn_gate=T.F16 if gemma else T.Q4_1,
                 ffn_up=T.F16 if gemma else T.Q4_1, ffn_down=T.Q5_0)
    if k_quants:
        types = dict(attn_q=T.Q4_K, attn_k=T.Q4_K, attn_v=T.Q6_K, attn_output=T.Q4_K, ffn_gate=T.Q4_K,
                     ffn_up=T.Q4_K, ffn_down=T.Q6_K)
    shapes = (None if gemma else (3, *SHAPES[arch][1:]) if arch.startswith("qwen35")  # a layer of each kind's 3
              else (2, 256, 256 if arch == "qwen3moe" else 512, 4, 2, 64))
    path = factory.mktemp("synth") / f"{arch}{'_k' if k_quants else ''}.gguf"
    write_synthetic(path, arch, shapes=shapes, types=types, own_output=own_output, mtp=mtp)
    return path
