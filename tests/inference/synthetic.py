"""Small random-weight GGUF files for architectures and quant types with no real test file.

Written with gguf-py's writer and a real vocabulary's metadata (copied from vocab_from), so llama.cpp loads
them too and serves as the oracle. The weights are random but scaled so logits spread out and top-1 is rarely
a near-tie.
"""
import numpy as np
from gguf import GGMLQuantizationType as T, GGUFWriter
from gguf.quants import quantize

from models.gguf import open_gguf

# layers, n_embd, n_ff, heads, kv heads, head size
SHAPES = {
    "qwen2": (2, 256, 512, 8, 2, 32),
    "qwen3": (2, 256, 512, 8, 2, 64),  # a head size that does not divide n_embd
    "gemma3": (6, 256, 512, 2, 1, 256),
}
# Layer matrices F16 for parity with llama.cpp: it rounds activations to 8 bits for quantized weights, and a
# random network amplifies that noise far more than a trained one (top-1 agreement fell to 94% with Q8_0).
F16_LAYERS = dict.fromkeys(["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"], T.F16)


def write_synthetic(path, arch: str, vocab_from, shapes=None, types=F16_LAYERS, window: int = 16) -> None:
    """A random {arch} model at path with Q8_0 embeddings, layer matrices of `types` (name -> quant type):
    qwen2 with qkv biases and its own output matrix, qwen3 with q/k norms, gemma3 with q/k and sandwich norms
    and a `window`-token sliding window; qwen3 and gemma3 tie the output to the embeddings."""
    rng = np.random.default_rng(0)
    src = open_gguf(vocab_from).metadata
    n_vocab = len(src["tokenizer.ggml.tokens"])
    L, d, ff, nh, nkv, hd = shapes or SHAPES[arch]

    w = GGUFWriter(str(path), arch)
    w.add_context_length(2048)
    w.add_embedding_length(d)
    w.add_block_count(L)
    w.add_feed_forward_length(ff)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    if arch == "gemma3":
        w.add_sliding_window(window)
    w.add_tokenizer_model(src["tokenizer.ggml.model"])
    if "tokenizer.ggml.pre" in src:
        w.add_tokenizer_pre(src["tokenizer.ggml.pre"])
    w.add_token_list(src["tokenizer.ggml.tokens"])
    if "tokenizer.ggml.scores" in src:
        w.add_token_scores(list(map(float, src["tokenizer.ggml.scores"])))
    w.add_token_types(list(map(int, src["tokenizer.ggml.token_type"])))
    if "tokenizer.ggml.merges" in src:
        w.add_token_merges(src["tokenizer.ggml.merges"])
    w.add_bos_token_id(int(src["tokenizer.ggml.bos_token_id"]))
    w.add_eos_token_id(int(src["tokenizer.ggml.eos_token_id"]))

    def mat(name, rows, cols, std, qtype):
        a = (rng.standard_normal((rows, cols)) * std).astype(np.float32)
        if qtype == T.F16:
            w.add_tensor(name, a.astype(np.float16))
        else:
            w.add_tensor(name, quantize(a, qtype), raw_dtype=qtype)

    def vec(name, n, mean=1.0, std=0.1):
        w.add_tensor(name, (mean + rng.standard_normal(n) * std).astype(np.float32))

    mat("token_embd.weight", n_vocab, d, 0.5, T.Q8_0)
    for i in range(L):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", d)
        mat(p + "attn_q.weight", nh * hd, d, 2 / np.sqrt(d), types["attn_q"])
        mat(p + "attn_k.weight", nkv * hd, d, 2 / np.sqrt(d), types["attn_k"])
        mat(p + "attn_v.weight", nkv * hd, d, 1 / np.sqrt(d), types["attn_v"])
        mat(p + "attn_output.weight", d, nh * hd, 1 / np.sqrt(nh * hd), types["attn_output"])
        if arch == "qwen2":
            for t, n in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd)):
                vec(p + f"attn_{t}.bias", n, 0.0, 0.5)
        else:
            vec(p + "attn_q_norm.weight", hd)
            vec(p + "attn_k_norm.weight", hd)
        if arch == "gemma3":
            vec(p + "post_attention_norm.weight", d)
            vec(p + "post_ffw_norm.weight", d)
        vec(p + "ffn_norm.weight", d)
        mat(p + "ffn_gate.weight", ff, d, 1 / np.sqrt(d), types["ffn_gate"])
        mat(p + "ffn_up.weight", ff, d, 1 / np.sqrt(d), types["ffn_up"])
        mat(p + "ffn_down.weight", d, ff, 1 / np.sqrt(ff), types["ffn_down"])
    vec("output_norm.weight", d)
    if arch == "qwen2":
        mat("output.weight", n_vocab, d, 0.5, T.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
