"""Placement arithmetic on the CPU: real tensor tables of the packaged models and llama3-8b's built from shapes."""
import pytest

from inference.placement import (CUDA_CONTEXT_BYTES, GiB, MiB, RUNTIME_RESERVE_BYTES, GpuLayersError,
                                 VramBudgetError, free_vram, kv_bytes_per_layer, parse_vram_budget, plan_placement)
from models.config import ModelConfig, config_from_metadata
from models.ggml_types import TYPES_BY_NAME
from models.gguf import TensorInfo, open_gguf

H100_FREE = 80552 * MiB  # memGetInfo's free on an H100 once the context exists


def tensor(name: str, shape: tuple[int, ...], type_name: str) -> TensorInfo:
    qtype = TYPES_BY_NAME[type_name]
    n = 1
    for d in shape:
        n *= d
    return TensorInfo(name, shape, qtype, 0, n // qtype.block_elems * qtype.block_bytes)


def llama3_8b_q4_k_m() -> tuple[dict[str, TensorInfo], ModelConfig]:
    """llama3-8b's tensors as llama.cpp's Q4_K_M writes them: Q6_K attn_v and ffn_down in the first and last
    eighth of the layers and every third between (use_more_bits), Q6_K output, Q4_K elsewhere."""
    L, d, ff, nkv, hd, vocab = 32, 4096, 14336, 8, 128, 128256
    t = [tensor("token_embd.weight", (d, vocab), "Q4_K"), tensor("output.weight", (d, vocab), "Q6_K"),
         tensor("output_norm.weight", (d,), "F32"), tensor("rope_freqs.weight", (hd // 2,), "F32")]
    for i in range(L):
        more_bits = i < L // 8 or i >= 7 * L // 8 or (i - L // 8) % 3 == 2
        big = "Q6_K" if more_bits else "Q4_K"
        t += [tensor(f"blk.{i}.attn_norm.weight", (d,), "F32"), tensor(f"blk.{i}.ffn_norm.weight", (d,), "F32"),
              tensor(f"blk.{i}.attn_q.weight", (d, d), "Q4_K"), tensor(f"blk.{i}.attn_k.weight", (d, nkv * hd), "Q4_K"),
              tensor(f"blk.{i}.attn_v.weight", (d, nkv * hd), big), tensor(f"blk.{i}.attn_output.weight", (d, d), "Q4_K"),
              tensor(f"blk.{i}.ffn_gate.weight", (d, ff), "Q4_K"), tensor(f"blk.{i}.ffn_up.weight", (d, ff), "Q4_K"),
              tensor(f"blk.{i}.ffn_down.weight", (ff, d), big)]
    cfg = ModelConfig(arch="llama", n_layers=L, n_embd=d, n_ff=ff, n_heads=32, n_kv_heads=nkv, head_dim=hd,
                      v_head_dim=hd, n_vocab=vocab, n_ctx_train=8192, rms_eps=1e-5, rope_base=500000.0, rope_dim=hd,
                      rope_scale=1.0, rope_style="normal", activation="silu")
    return {x.name: x for x in t}, cfg


@pytest.fixture(scope="module")
def llama3():
    return llama3_8b_q4_k_m()


def test_llama3_size_matches_the_published_file(llama3):
    tensors, _ = llama3
    # Meta-Llama-3-8B-Instruct.Q4_K_M.gguf is 4.92 GB, ~8 MB of it metadata and vocabulary
    assert 4.90e9 < sum(t.nbytes for t in tensors.values()) < 4.93e9


def test_llama3_at_6_gb(llama3):
    tensors, cfg = llama3
    p = plan_placement(tensors, cfg, 8192, H100_FREE, vram_budget=6 * GiB)
    print(p.summary())
    assert 0 < p.n_gpu_layers < 32 and p.layers[-1] == "gpu" and p.layers[0] == "cpu"
    assert p.output == "gpu" and p.embedding == "cpu"
    assert p.kv_bytes == p.n_gpu_layers * 2 * 8 * 8192 * 256  # 32 MiB a layer at 8192
    assert p.total_bytes <= 6 * GiB
    assert p.summary().startswith(f"placement: {p.n_gpu_layers}/32 layers on GPU, layers 0-{31 - p.n_gpu_layers} "
                                  "on CPU: VRAM budget exhausted")
