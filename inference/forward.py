"""The transformer forward pass, written once over the backend's op set; ModelConfig says what differs."""
from models.config import ModelConfig
from inference.weights import ModelWeights


def forward(be, cfg: ModelConfig, w: ModelWeights, all_logits: bool = False):
    """Run be.tokens at positions be.pos.. through the model, filling the KV cache.

    Returns logits [n, n_vocab] for every token when all_logits, else [1, n_vocab] for the last one.
    """
    x = be.embed(w.token_embd, cfg.embed_scale)  # [n, n_embd]
    n = len(x)
    for i, lw in enumerate(w.layers):
        h = be.rms_norm(x, lw.attn_norm)
        q, k, v = be.matmuls(lw.qkv, h, lw.qkv_bias)
        q = q.reshape(n, cfg.n_heads, cfg.head_dim)
        k = k.reshape(n, cfg.n_kv_heads, cfg.head_dim)
        v = v.reshape(n, cfg.n_kv_heads, cfg.v_head_dim)
        if cfg.qk_norm:
            q = be.rms_norm(q, lw.attn_q_norm)
            k = be.rms_norm(k, lw.attn_k_norm)
        q = be.rope_kv_write(i, q, k, v, cfg.layer_rope_base(i), cfg.layer_rope_scale(i))
        a = be.attention(i, q, cfg.layer_window(i), cfg.softmax_scale)  # [n, n_heads * v_head_dim]
        x = be.add_matmul(x, lw.attn_output, a, lw.post_attention_norm if cfg.sandwich_norm else None)

        h = be.rms_norm(x, lw.ffn_norm)
        gate, up = be.matmuls(lw.gate_up, h)
        x = be.add_matmul(x, lw.ffn_down, be.glu(gate, up), lw.post_ffw_norm if cfg.sandwich_norm else None)
    if not all_logits:
        x = x[-1:]
    return be.logits(w.output, be.rms_norm(x, w.output_norm))
