"""The transformer forward pass, written once over the backend's op set; ModelConfig says what differs.

A model may run in segments on different devices (placement.py: the first layers on the CPU, the rest on
the GPU): each segment is a backend and the layers it holds, and only the hidden state crosses between them.
"""
from models.config import ModelConfig
from inference.weights import DeltaNetWeights, LayerWeights, ModelWeights


def embed(be, cfg: ModelConfig, w: ModelWeights):
    """The hidden state [n, n_embd] of be.tokens."""
    return be.embed(w.token_embd, cfg.embed_scale)


def attention(be, cfg: ModelConfig, lw: LayerWeights, i: int, h):
    """Attention of layer i on h [n, n_embd] (normed), filling its KV cache: [n, n_heads * v_head_dim]."""
    n = len(h)
    q, k, v = be.matmuls(lw.qkv, h, lw.qkv_bias)
    gate = None
    if cfg.attn_output_gate:  # q's rows hold each head's q, then its gate: strided views [n, n_heads, head_dim]
        q, gate = q.reshape(n, cfg.n_heads, 2, cfg.head_dim).transpose(2, 0, 1, 3)
    else:
        q = q.reshape(n, cfg.n_heads, cfg.head_dim)
    k = k.reshape(n, cfg.n_kv_heads, cfg.head_dim)
    v = v.reshape(n, cfg.n_kv_heads, cfg.v_head_dim)
    head_norms = (lw.attn_q_norm, lw.attn_k_norm) if cfg.qk_norm else None
    q = be.rope_kv_write(i, q, k, v, cfg.layer_rope_base(i), cfg.layer_rope_scale(i), head_norms)
    a = be.attention(i, q, cfg.layer_window(i), cfg.softmax_scale, lw.attn_sinks)
    return a if gate is None else be.sigmoid_mul(a, gate)


def delta_net(be, dn: DeltaNetWeights, i: int, h):
    """The Gated DeltaNet mixer of layer i on h [n, n_embd] (normed), carrying its recurrent state on:
    [n, Hv * S], the gated norm applied (the backend's delta_net op: conv, delta rule, norm)."""
    qkv, z, alpha, beta = be.matmuls(dn.projections, h)
    return be.delta_net(i, dn, qkv, z, alpha, beta)


def layer(be, cfg: ModelConfig, lw: LayerWeights, i: int, x):
    """Layer i on x [n, n_embd] for the tokens at positions be.pos.., filling its KV cache or carrying its
    recurrent state on."""
    h = be.rms_norm(x, lw.attn_norm)
    if lw.delta_net is not None:
        x = be.add_matmul(x, lw.delta_net.out, delta_net(be, lw.delta_net, i, h))
    else:
        a = attention(be, cfg, lw, i, h)
        if lw.attn_output_bias is not None:  # x + (W a + b), the bias added to the residual first (gpt-oss)
            x = be.add_bias(x, lw.attn_output_bias)
        x = be.add_matmul(x, lw.attn_output, a, lw.post_attention_norm if cfg.sandwich_norm else None)

    if lw.experts is not None:
        return be.add_moe(x, lw.experts, lw.ffn_norm, cfg.n_expert_used)
    h = be.rms_norm(x, lw.ffn_norm)
    gate, up = be.matmuls(lw.gate_up, h)
    return be.add_matmul(x, lw.ffn_down, be.glu(gate, up), lw.post_ffw_norm if cfg.sandwich_norm else None)


def layers(be, cfg: ModelConfig, w: ModelWeights, x, indices: range):
    for i in indices:
        x = layer(be, cfg, w.layers[i], i, x)
    return x


def head(be, cfg: ModelConfig, w: ModelWeights, x, all_logits: bool = False):
    """Logits [n, n_vocab] of every token when all_logits, else [1, n_vocab] of the last one."""
    if not all_logits:
        x = x[-1:]
    return be.logits(w.output, be.rms_norm(x, w.output_norm))


def forward(segments, cfg: ModelConfig, w: ModelWeights, all_logits: bool = False):
    """Run the tokens each backend was given (set_input) through the model, filling the KV caches.

    segments: (backend, layer range) pairs in order, covering every layer; the first embeds the tokens, each
    next one takes the hidden state over (be.receive), and the last gives the logits (see head)."""
    x = None
    for be, indices in segments:
        x = embed(be, cfg, w) if x is None else be.receive(x)
        x = layers(be, cfg, w, x, indices)
    return head(be, cfg, w, x, all_logits)
