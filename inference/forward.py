"""The transformer forward pass, written once over the backend's op set; ModelConfig says what differs.

A model may run in segments on different devices (placement.py: the first layers on the CPU, the rest on
the GPU): each segment is a backend and the layers it holds, and only the hidden state crosses between them.
"""
import math

from models.config import ModelConfig
from inference.weights import DeltaNetWeights, LayerWeights, ModelWeights


def embed(be, cfg: ModelConfig, w: ModelWeights):
    """The hidden state [n, n_embd] of be.tokens."""
    return be.embed(w.token_embd, cfg.embed_scale)


def per_layer_inputs(be, cfg: ModelConfig, w: ModelWeights, x):
    """gemma4's per-layer embeddings (E2B/E4B) of be.tokens, embedded as x [n, n_embd]: [n, n_layers,
    n_embd_per_layer], layer i's slice the sum of the token's table row (times sqrt(n_embd_per_layer)) and x's
    projection (over sqrt(n_embd), rms-normed a slice at a time), over sqrt(2) (llama.cpp's
    project_per_layer_inputs)."""
    pl, n, m = w.per_layer, len(x), cfg.n_embd_per_layer
    table = be.embed(pl.token_embd, math.sqrt(m)).reshape(n, cfg.n_layers, m)
    proj = be.scale(be.matmul(pl.model_proj, x), 1 / math.sqrt(cfg.n_embd)).reshape(n, cfg.n_layers, m)
    return be.scale(be.add(be.rms_norm(proj, pl.proj_norm), table), 1 / math.sqrt(2))


def inputs(be, cfg: ModelConfig, w: ModelWeights) -> tuple:
    """(the hidden state [n, n_embd] of be.tokens, their per_layer_inputs or None): what the first layer takes."""
    x = embed(be, cfg, w)
    return x, per_layer_inputs(be, cfg, w, x) if w.per_layer is not None else None


def attention(be, cfg: ModelConfig, lw: LayerWeights, i: int, h):
    """Attention of layer i on h [n, n_embd] (normed), filling its KV cache (gemma4's KV-shared layers: reading
    an earlier layer's, cfg.kv_source): [n, n_heads * v_head_dim]."""
    n = len(h)
    heads, kv_heads, head_dim, v_head_dim = cfg.layer_heads(i)
    qkv = be.matmuls(lw.qkv, h, lw.qkv_bias)  # q, and k and v or k alone (v is k's rows) where the layer makes them
    q, gate, k, v = qkv[0], None, None, None
    if cfg.attn_output_gate:  # q's rows hold each head's q, then its gate: strided views [n, n_heads, head_dim]
        q, gate = q.reshape(n, heads, 2, head_dim).transpose(2, 0, 1, 3)
    else:
        q = q.reshape(n, heads, head_dim)
    if len(qkv) > 1:
        k = qkv[1].reshape(n, kv_heads, head_dim)
        v = qkv[2].reshape(n, kv_heads, v_head_dim) if len(qkv) > 2 else k  # k before its norm and rope
    head_norms = (lw.attn_q_norm, lw.attn_k_norm) + ((lw.v_norm,) if cfg.v_norm else ()) if cfg.qk_norm else None
    cache = cfg.kv_source(i)
    q = be.rope_kv_write(cache, q, k, v, cfg.layer_rope(i), head_norms)
    a = be.attention(cache, q, cfg.layer_window(i), cfg.softmax_scale, lw.attn_sinks)
    return a if gate is None else be.sigmoid_mul(a, gate)


def delta_net(be, dn: DeltaNetWeights, i: int, h):
    """The Gated DeltaNet mixer of layer i on h [n, n_embd] (normed), carrying its recurrent state on:
    [n, Hv * S], the gated norm applied (the backend's delta_net op: conv, delta rule, norm)."""
    qkv, z, alpha, beta = be.matmuls(dn.projections, h)
    return be.delta_net(i, dn, qkv, z, alpha, beta)


def ffn(be, cfg: ModelConfig, lw: LayerWeights, x):
    """x + the layer's FFN on x [n, n_embd]: dense, experts, or (gemma4) both side by side."""
    if lw.experts is not None and lw.ffn_gate is None:
        return be.add_moe(x, lw.experts, lw.ffn_norm, cfg.n_expert_used)
    h = be.rms_norm(x, lw.ffn_norm)
    gate, up = be.matmuls(lw.gate_up, h)
    if lw.experts is None:
        return be.add_matmul(x, lw.ffn_down, be.glu(gate, up), lw.post_ffw_norm if cfg.sandwich_norm else None)
    # gemma4: the dense FFN's output and the experts' (on their own norm of x), each normed, their sum normed
    dense = be.rms_norm(be.matmul(lw.ffn_down, be.glu(gate, up)), lw.post_ffw_norm_1)
    routed = be.rms_norm(be.moe(x, lw.experts, lw.pre_ffw_norm_2, cfg.n_expert_used), lw.post_ffw_norm_2)
    return be.add(x, be.rms_norm(be.add(dense, routed), lw.post_ffw_norm))


def layer(be, cfg: ModelConfig, lw: LayerWeights, i: int, x, per_layer=None):
    """Layer i on x [n, n_embd] for the tokens at positions be.pos.., filling its KV cache or carrying its
    recurrent state on; per_layer: per_layer_inputs' [n, n_layers, n_embd_per_layer] (gemma4 E2B/E4B)."""
    h = be.rms_norm(x, lw.attn_norm)
    if lw.delta_net is not None:
        x = be.add_matmul(x, lw.delta_net.out, delta_net(be, lw.delta_net, i, h))
    else:
        a = attention(be, cfg, lw, i, h)
        if lw.attn_output_bias is not None:  # x + (W a + b), the bias added to the residual first (gpt-oss)
            x = be.add_bias(x, lw.attn_output_bias)
        x = be.add_matmul(x, lw.attn_output, a, lw.post_attention_norm if cfg.sandwich_norm else None)
    x = ffn(be, cfg, lw, x)
    if lw.per_layer is not None:  # x + rms_norm(proj (gelu(inp_gate x) * the layer's input), post_norm)
        pl = lw.per_layer
        x = be.add_matmul(x, pl.proj, be.glu(be.matmul(pl.inp_gate, x), per_layer[:, i]), pl.post_norm)
    return x if lw.output_scale is None else be.scale(x, lw.output_scale)


def layers(be, cfg: ModelConfig, w: ModelWeights, x, indices: range, per_layer=None):
    for i in indices:
        x = layer(be, cfg, w.layers[i], i, x, per_layer)
    return x


def head(be, cfg: ModelConfig, w: ModelWeights, x, all_logits: bool = False, hidden: bool = False):
    """Logits [n, n_vocab] of every token when all_logits, else [1, n_vocab] of the last one; hidden: (those
    logits, every token's state after the output norm [n, n_embd]: what the MTP block takes, see mtp)."""
    if not (all_logits or hidden):
        x = x[-1:]
    h = be.rms_norm(x, w.output_norm)
    logits = be.logits(w.output, h if all_logits else h[-1:])
    return (logits, h) if hidden else logits


def forward(segments, cfg: ModelConfig, w: ModelWeights, all_logits: bool = False, hidden: bool = False):
    """Run the tokens each backend was given (set_input) through the model, filling the KV caches.

    segments: (backend, layer range) pairs in order, covering every layer; the first embeds the tokens, each
    next one takes the hidden state over (be.receive), and the last gives the logits (see head)."""
    x = per_layer = None
    for be, indices in segments:
        if x is None:
            x, per_layer = inputs(be, cfg, w)
        else:
            x = be.receive(x)
            per_layer = be.receive(per_layer) if per_layer is not None else None
        x = layers(be, cfg, w, x, indices, per_layer)
    return head(be, cfg, w, x, all_logits, hidden)


def mtp(be, cfg: ModelConfig, w: ModelWeights, h, all_logits: bool = False):
    """qwen35's MTP block (llama.cpp's graph_mtp) on be.tokens at be.pos..: h [n, n_embd] the model's states after
    the output norm (head's hidden) at those positions, each token the one after its state's. Its layer (a full
    attention one, layers[n_layers]) fills its own KV cache. (logits [n or 1, n_vocab] of the token after each
    token, as head gives them; the block's states after its head norm [n, n_embd], the h of a next, chained step.)"""
    nx, i = w.nextn, cfg.n_layers
    e = be.embed(nx.embed, 1.0)
    x = be.matmul(nx.eh_proj, be.concat(be.rms_norm(e, nx.enorm), be.rms_norm(h, nx.hnorm)))  # embedding first
    x = layer(be, cfg, w.layers[i], i, x)
    h = be.rms_norm(x, nx.head_norm)
    return be.logits(nx.head, h if all_logits else h[-1:]), h
