"""Small random-weight GGUF files for architectures with no real test file (qwen2, qwen3).

Written with gguf-py's writer and a real vocabulary's metadata (SmolLM2's), so llama.cpp loads them too and
serves as the oracle. The weights are random but scaled so logits spread out and top-1 is rarely a near-tie.
"""
import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from models.gguf import open_gguf

SHAPES = dict(n_layers=2, n_embd=256, n_ff=512, n_heads=8, n_kv_heads=2)


def write_synthetic(path, arch: str, vocab_from, seed: int = 0) -> None:
    """A 2-layer {arch} model at path, F16 layer matrices and Q8_0 embeddings: qwen2 with qkv biases and its own
    output matrix, qwen3 with q/k norms, a head size that does not divide n_embd and tied embeddings.

    Layer matrices are F16, not Q8_0: llama.cpp rounds activations to 8 bits for Q8_0 weights, and a random
    network amplifies that noise far more than a trained one (top-1 agreement fell to 94% with Q8_0)."""
    rng = np.random.default_rng(seed)
    src = open_gguf(vocab_from).metadata
    n_vocab = len(src["tokenizer.ggml.tokens"])
    L, d, ff, nh, nkv = (SHAPES[k] for k in ("n_layers", "n_embd", "n_ff", "n_heads", "n_kv_heads"))
    hd = 64 if arch == "qwen3" else d // nh

    w = GGUFWriter(str(path), arch)
    w.add_context_length(2048)
    w.add_embedding_length(d)
    w.add_block_count(L)
    w.add_feed_forward_length(ff)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    if arch == "qwen3":
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_tokenizer_model(src["tokenizer.ggml.model"])
    w.add_tokenizer_pre(src["tokenizer.ggml.pre"])
    w.add_token_list(src["tokenizer.ggml.tokens"])
    w.add_token_types(list(map(int, src["tokenizer.ggml.token_type"])))
    w.add_token_merges(src["tokenizer.ggml.merges"])
    w.add_bos_token_id(int(src["tokenizer.ggml.bos_token_id"]))
    w.add_eos_token_id(int(src["tokenizer.ggml.eos_token_id"]))

    def mat(name, rows, cols, std, qtype=GGMLQuantizationType.F16):
        a = (rng.standard_normal((rows, cols)) * std).astype(np.float32)
        if qtype == GGMLQuantizationType.F16:
            w.add_tensor(name, a.astype(np.float16))
        else:
            w.add_tensor(name, quantize(a, qtype), raw_dtype=qtype)

    def vec(name, n, mean=1.0, std=0.1):
        w.add_tensor(name, (mean + rng.standard_normal(n) * std).astype(np.float32))

    mat("token_embd.weight", n_vocab, d, 0.5, GGMLQuantizationType.Q8_0)
    for i in range(L):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", d)
        mat(p + "attn_q.weight", nh * hd, d, 1 / np.sqrt(d) * 2)
        mat(p + "attn_k.weight", nkv * hd, d, 1 / np.sqrt(d) * 2)
        mat(p + "attn_v.weight", nkv * hd, d, 1 / np.sqrt(d))
        mat(p + "attn_output.weight", d, nh * hd, 1 / np.sqrt(nh * hd))
        if arch == "qwen2":
            for t, n in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd)):
                vec(p + f"attn_{t}.bias", n, 0.0, 0.5)
        else:
            vec(p + "attn_q_norm.weight", hd)
            vec(p + "attn_k_norm.weight", hd)
        vec(p + "ffn_norm.weight", d)
        mat(p + "ffn_gate.weight", ff, d, 1 / np.sqrt(d))
        mat(p + "ffn_up.weight", ff, d, 1 / np.sqrt(d))
        mat(p + "ffn_down.weight", d, ff, 1 / np.sqrt(ff))
    vec("output_norm.weight", d)
    if arch == "qwen2":
        mat("output.weight", n_vocab, d, 0.5, GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
