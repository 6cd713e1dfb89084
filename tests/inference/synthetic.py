"""Small random-weight GGUF files for architectures and quant types with no real test file.

Written with gguf-py's writer and a real vocabulary's metadata (copied from vocab_from), so llama.cpp loads
them too and serves as the oracle. The weights are random but scaled so logits spread out and top-1 is rarely
a near-tie.
"""
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T, GGUFWriter
from gguf.quants import quantize

from models.dequant import DEQUANTIZERS
from models.gguf import open_gguf

# layers, n_embd, n_ff, heads, kv heads, head size
SHAPES = {
    "qwen2": (2, 256, 512, 8, 2, 32),
    "qwen3": (2, 256, 512, 8, 2, 64),  # a head size that does not divide n_embd
    "qwen3moe": (2, 256, 128, 8, 2, 64),  # n_ff is each expert's width
    "llama": (2, 256, 128, 8, 2, 32),  # with experts (Mixtral's kind): n_ff is each expert's width
    "gemma3": (6, 256, 512, 2, 1, 256),
    "gemma4": (0, 256, 256, 0, 0, 0),  # n_embd and the FFN's (and experts') width: GEMMA4_* say the rest
    "qwen35": (6, 256, 512, 4, 2, 64),  # heads, kv heads, head size: the attention layers'
    "qwen35moe": (6, 256, 128, 4, 2, 64),  # n_ff is each expert's width
    "gpt-oss": (2, 256, 128, 8, 2, 64),  # n_ff is each expert's width; q's 8 x 64 rows differ from n_embd
}
LLAMA_K_SHAPES = (2, 256, 512, 4, 2, 64)  # a llama whose matrices' rows are whole blocks of 256 (K and IQ quants)
# gpt-oss: its window and period (layer 0 local, layer 1 global) and rope (YaRN) as the real models state them
OSS_WINDOW, OSS_ROPE_BASE, OSS_YARN_FACTOR, OSS_YARN_ORIG_CTX = 128, 150000.0, 32.0, 4096
# The DeltaNet layers of the hybrid models: key heads, value heads (2x: value head h reads key head h % 2, which
# differs from h // 2), state size, conv taps, a full-attention layer every HYBRID_INTERVAL (layers 2 and 5 of 6),
# rotated dims of an attention head, the shared expert's width (qwen35moe)
DELTANET = dict(k_heads=2, v_heads=4, state=64, conv=4)
HYBRID_INTERVAL = 3
HYBRID_ROPE_DIMS = 16
SHARED_EXPERT_FF = 192
# gemma4's three kinds of file (layer pattern: S sliding, G global; the last `shared` layers read the K/V of the last
# S and G before them; experts (count, used) beside the dense FFN; per-layer embeddings of this size), its sliding and
# global layers' (heads, kv heads, head size), the global layers' rotated share of a head (llama.cpp's "proportional"
# rope: rope_freqs of 1e30 stop the rest), the window, and the layers that scale their output (layer_output_scale)
GEMMA4_KINDS = {
    "dense": dict(pattern="SSGSGSG", shared=2, experts=None, per_layer=0),
    "moe": dict(pattern="SGSG", shared=0, experts=(8, 2), per_layer=0),
    "per_layer": dict(pattern="SGSGSG", shared=2, experts=None, per_layer=32),
}
GEMMA4_HEADS = dict(S=(4, 2, 64), G=(2, 1, 128))
GEMMA4_REAL_HEADS = dict(S=(4, 2, 256), G=(4, 1, 512))  # Gemma 4's head sizes (31B, 26B-A4B), the GPU's 512 kernels
GEMMA4_ROTATED, GEMMA4_WINDOW, GEMMA4_SCALED_LAYERS = 0.25, 16, (1, 3)
# Layer matrices F16 for parity with llama.cpp: it rounds activations to 8 bits for quantized weights, and a
# random network amplifies that noise far more than a trained one (top-1 agreement fell to 94% with Q8_0).
F16_LAYERS = dict.fromkeys(["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"], T.F16)
EXPERTS = (16, 4)  # qwen3moe's experts, used per token
# llama.cpp's Q4_K_M mix of a llama's layer matrices (v and down one step up, as its quantizer does for most layers)
Q4_K_M_LAYERS = dict(attn_q=T.Q4_K, attn_k=T.Q4_K, attn_v=T.Q6_K, attn_output=T.Q4_K, ffn_gate=T.Q4_K,
                     ffn_up=T.Q4_K, ffn_down=T.Q6_K)
IQ4_XS_LAYERS = dict.fromkeys(Q4_K_M_LAYERS, T.IQ4_XS)  # llama.cpp's IQ4_XS: every layer matrix IQ4_XS
# the IQ types random bytes make valid blocks of (any index picks a grid entry), their fp16 d in bytes 0-1
IQ_TYPES = (T.IQ4_NL, T.IQ4_XS, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S)


def random_quant(rng, shape: tuple, std: float, qtype) -> np.ndarray:
    """Random Q4_K / Q5_K / Q6_K blocks (uint8 [..., rows, row bytes]) whose values have mean 0 and the given std.

    gguf-py has no quantizer for the K-quants (gguf.quants.quantize raises NotImplementedError), so the blocks
    are written directly: random bytes for the quants and the 6-bit sub-block scales, then the fp16 super-block
    scales. Q6_K is w = d * sc * (q - 32) with sc drawn symmetric in [-127, 127]: mean 0. Q4_K / Q5_K is
    w = d * sc * q - dmin * m with sc, m uniform in [0, 63]: dmin = d * E[q] (7.5, 15.5) makes the mean 0.
    d varies by block (x0.5 to x1.5) so that a kernel reading another block's d is seen, and is scaled by the
    measured std of the dequantized values (models/dequant.py, the bit-exact reference). The IQ_TYPES (gguf-py
    quantizes none of them either): random bytes, d of random sign so that the mean is 0 (IQ4's 16 values and
    IQ1's shifted grids are not symmetric)."""
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    n = int(np.prod(shape)) // block_elems
    blocks = rng.integers(0, 256, (n, block_bytes), dtype=np.uint8)
    u = rng.uniform(0.5, 1.5, n) * (rng.choice([-1, 1], n) if qtype in IQ_TYPES else 1)

    def set_d(d):
        f16 = lambda x: x.astype("<f2")[:, None].view(np.uint8)  # noqa: E731
        if qtype == T.Q6_K:  # ql[128] | qh[64] | scales[16] (int8) | d
            blocks[:, 208:210] = f16(d)
        elif qtype in IQ_TYPES:  # d | ...
            blocks[:, 0:2] = f16(d)
        else:  # d | dmin | scales[12] | (qh[32] for Q5_K) | qs[128]
            blocks[:, 0:2], blocks[:, 2:4] = f16(d), f16(d * (7.5 if qtype == T.Q4_K else 15.5))

    if qtype == T.Q6_K:
        blocks[:, 192:208] = rng.integers(-127, 128, (n, 16)).astype(np.int8).view(np.uint8)
    set_d(u)
    set_d(u * std / DEQUANTIZERS[qtype.name](blocks).std())
    return blocks.reshape(*shape[:-1], shape[-1] // block_elems * block_bytes)


def spm_vocab(n_vocab: int = 1024) -> dict:
    """The tokenizer metadata of a made-up SentencePiece vocabulary (as tests/synth_gguf.py's): the
    control tokens, the 256 byte tokens and n_vocab - 259 words, for a file that needs no other file."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581t{i}" for i in range(n_vocab - len(tokens))]
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": [0.0] * 259 + [-float(i) for i in range(n_vocab - 259)],
            "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * (n_vocab - 259),
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}


def write_synthetic(path, arch: str, vocab_from=None, shapes=None, types=F16_LAYERS, window: int = 16,
                    experts=None, deltanet=DELTANET, gemma4: str = "dense", g4_heads: dict = GEMMA4_HEADS,
                    own_output: bool = False, mtp: bool = False) -> None:
    """A random {arch} model at path with Q8_0 embeddings, layer matrices of `types` (name -> quant type; the
    K-quants Q4_K, Q5_K, Q6_K and the IQ types but IQ4_NL need widths that are multiples of 256, e.g.
    Q4_K_M_LAYERS, IQ4_XS_LAYERS):
    qwen35 / qwen35moe hybrid: DeltaNet layers (deltanet: DELTANET's keys) with a gated full-attention layer every HYBRID_INTERVAL, and
    for qwen35moe experts with a shared expert;
    qwen2 with qkv biases and its own output matrix, qwen3 with q/k norms, gemma3 with q/k and sandwich norms
    and a `window`-token sliding window; gpt-oss with its biases, sinks, MXFP4 experts, 128-token window and YaRN
    (OSS_*); the others tie the output to the embeddings (their top-1 is then the input token: greedy replies repeat
    it) unless own_output. qwen3moe is qwen3
    with experts = (count, used) in every layer (default EXPERTS), its expert matrices of the ffn_* types, its
    router F32 (as llama.cpp's quantizer leaves it); llama takes experts too (Mixtral's kind: no expert width of
    its own). gemma4: one of GEMMA4_KINDS (layers, FFN width and experts from there, n_embd from SHAPES, the heads of its
    sliding and global layers g4_heads (GEMMA4_HEADS' form); the KV-shared
    layers' FFN twice as wide, and with K/V matrices of their own that llama.cpp leaves unused, so that a forward that
    uses them is seen). mtp (qwen35, qwen35moe): one multi-token-prediction block after the layers, counted in
    block_count (blk.{L}: a gated attention layer with the layers' FFN, and nextn's eh_proj, enorm and hnorm; its
    head the model's). The vocabulary is vocab_from's (a GGUF file), else spm_vocab()'s."""
    rng = np.random.default_rng(0)
    experts = experts or (EXPERTS if arch in ("qwen3moe", "qwen35moe", "gpt-oss") else None)
    oss = arch == "gpt-oss"
    hybrid = arch in ("qwen35", "qwen35moe")
    src = open_gguf(vocab_from).metadata if vocab_from else spm_vocab()
    n_vocab = len(src["tokenizer.ggml.tokens"])
    L, d, ff, nh, nkv, hd = shapes or SHAPES[arch]
    g4 = GEMMA4_KINDS[gemma4] if arch == "gemma4" else None
    if g4:
        L, experts = len(g4["pattern"]), g4["experts"]

    w = GGUFWriter(str(path), arch)
    w.add_context_length(2048)
    w.add_embedding_length(d)
    w.add_block_count(L + mtp)
    if mtp:
        w.add_uint32(f"{arch}.nextn_predict_layers", 1)
    if g4:
        pattern, first_shared = g4["pattern"], L - g4["shared"]
        layer_ff = [ff * (2 if i >= first_shared else 1) for i in range(L)]
        w.add_array("gemma4.feed_forward_length", layer_ff)
        w.add_array("gemma4.attention.head_count", [g4_heads[k][0] for k in pattern])
        w.add_array("gemma4.attention.head_count_kv", [g4_heads[k][1] for k in pattern])
        w.add_key_length(g4_heads["G"][2])
        w.add_value_length(g4_heads["G"][2])
        w.add_uint32("gemma4.attention.key_length_swa", g4_heads["S"][2])
        w.add_uint32("gemma4.attention.value_length_swa", g4_heads["S"][2])
        w.add_rope_dimension_count(g4_heads["G"][2])
        w.add_uint32("gemma4.rope.dimension_count_swa", g4_heads["S"][2])
        w.add_float32("gemma4.rope.freq_base_swa", 10000.0)
        w.add_sliding_window(GEMMA4_WINDOW)
        w.add_array("gemma4.attention.sliding_window_pattern", [k == "S" for k in pattern])
        w.add_uint32("gemma4.attention.shared_kv_layers", g4["shared"])
        w.add_uint32("gemma4.embedding_length_per_layer_input", g4["per_layer"])
        if gemma4 != "dense":  # the dense file leaves it out: llama.cpp's default of 30
            w.add_float32("gemma4.final_logit_softcapping", 20.0)
    else:
        w.add_feed_forward_length(ff)
        w.add_head_count(nh)
        w.add_head_count_kv(nkv)
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(OSS_ROPE_BASE if oss else 1e6)
    if arch == "gemma3":
        w.add_sliding_window(window)
    if oss:
        from gguf import RopeScalingType
        w.add_sliding_window(OSS_WINDOW)
        w.add_rope_scaling_type(RopeScalingType.YARN)
        w.add_rope_scaling_factor(OSS_YARN_FACTOR)
        w.add_rope_scaling_orig_ctx_len(OSS_YARN_ORIG_CTX)
    if experts:
        w.add_expert_count(experts[0])
        w.add_expert_used_count(experts[1])
        if arch in ("qwen3moe", "qwen35moe", "gpt-oss", "gemma4"):
            w.add_expert_feed_forward_length(ff)
    if hybrid:
        dn = deltanet
        w.add_rope_dimension_count(HYBRID_ROPE_DIMS)
        w.add_array(f"{arch}.rope.dimension_sections", [3, 3, 2, 0])  # the converter's [11, 11, 10, 0] scaled down
        w.add_uint32(f"{arch}.full_attention_interval", HYBRID_INTERVAL)
        w.add_uint32(f"{arch}.ssm.conv_kernel", dn["conv"])
        w.add_uint32(f"{arch}.ssm.inner_size", dn["v_heads"] * dn["state"])
        w.add_uint32(f"{arch}.ssm.state_size", dn["state"])
        w.add_uint32(f"{arch}.ssm.time_step_rank", dn["v_heads"])
        w.add_uint32(f"{arch}.ssm.group_count", dn["k_heads"])
        if experts:
            w.add_uint32(f"{arch}.expert_shared_feed_forward_length", SHARED_EXPERT_FF)
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
    if "tokenizer.chat_template" in src:
        w.add_chat_template(src["tokenizer.chat_template"])

    def mat(name, rows, cols, std, qtype, n_expert=0):
        shape = (n_expert, rows, cols) if n_expert else (rows, cols)
        if qtype in (T.Q4_K, T.Q5_K, T.Q6_K, *IQ_TYPES):
            w.add_tensor(name, random_quant(rng, shape, std, qtype), raw_dtype=qtype)
            return
        a = (rng.standard_normal(shape) * std).astype(np.float32)
        if qtype in (T.F32, T.F16):
            w.add_tensor(name, a.astype(np.float16 if qtype == T.F16 else np.float32))
        else:
            w.add_tensor(name, quantize(a, qtype), raw_dtype=qtype)

    def vec(name, n, mean=1.0, std=0.1):
        w.add_tensor(name, (mean + rng.standard_normal(n) * std).astype(np.float32))

    def delta_net(p):
        """A Gated DeltaNet mixer: its projections of the layer matrices' types (attn_q's for qkv and z, attn_output's
        for the output), its small vectors and the alpha / beta projections F32 as llama.cpp's quantizer leaves them."""
        hk, hv, s, taps = deltanet["k_heads"], deltanet["v_heads"], deltanet["state"], deltanet["conv"]
        mat(p + "attn_qkv.weight", (2 * hk + hv) * s, d, 2 / np.sqrt(d), types["attn_q"])
        mat(p + "attn_gate.weight", hv * s, d, 1 / np.sqrt(d), types["attn_q"])
        w.add_tensor(p + "ssm_conv1d.weight", (rng.standard_normal(((2 * hk + hv) * s, taps)) * 0.5).astype(np.float32))
        vec(p + "ssm_dt.bias", hv, 0.0, 0.5)
        w.add_tensor(p + "ssm_a", (-np.exp(rng.standard_normal(hv) * 0.5)).astype(np.float32))  # -exp(A_log)
        mat(p + "ssm_beta.weight", hv, d, 1 / np.sqrt(d), T.F32)
        mat(p + "ssm_alpha.weight", hv, d, 1 / np.sqrt(d), T.F32)
        vec(p + "ssm_norm.weight", s)
        mat(p + "ssm_out.weight", d, hv * s, 1 / np.sqrt(hv * s), types["attn_output"])

    def gpt_oss_layer(p):
        """gpt-oss: biased q, k, v and output, a sink logit per head, post_attention_norm before the experts, a
        biased router, MXFP4 experts with biases (gate, up [n_expert, ff]; down [n_expert, d])."""
        vec(p + "attn_norm.weight", d)
        vec(p + "post_attention_norm.weight", d)
        mat(p + "attn_q.weight", nh * hd, d, 2 / np.sqrt(d), types["attn_q"])
        mat(p + "attn_k.weight", nkv * hd, d, 2 / np.sqrt(d), types["attn_k"])
        mat(p + "attn_v.weight", nkv * hd, d, 1 / np.sqrt(d), types["attn_v"])
        mat(p + "attn_output.weight", d, nh * hd, 1 / np.sqrt(nh * hd), types["attn_output"])
        for t, n in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd), ("output", d)):
            vec(p + f"attn_{t}.bias", n, 0.0, 0.5)
        vec(p + "attn_sinks.weight", nh, 1.0, 1.0)  # a sink that takes a real share of each softmax
        # a router with logits spread by ~4 (twice the other files'): its 8-bit rounding of the experts' x makes
        # llama.cpp's residual differ from ours by ~1e-2 now and then, which must not flip a choice often
        mat(p + "ffn_gate_inp.weight", experts[0], d, 4 / np.sqrt(d), T.F32)
        vec(p + "ffn_gate_inp.bias", experts[0], 0.0, 0.5)
        e = experts[0]
        mat(p + "ffn_gate_exps.weight", ff, d, 1 / np.sqrt(d), T.MXFP4, e)
        mat(p + "ffn_up_exps.weight", ff, d, 1 / np.sqrt(d), T.MXFP4, e)
        mat(p + "ffn_down_exps.weight", d, ff, 2 / np.sqrt(ff), T.MXFP4, e)
        w.add_tensor(p + "ffn_gate_exps.bias", (rng.standard_normal((e, ff)) * 0.5).astype(np.float32))
        w.add_tensor(p + "ffn_up_exps.bias", (rng.standard_normal((e, ff)) * 0.5).astype(np.float32))
        w.add_tensor(p + "ffn_down_exps.bias", (rng.standard_normal((e, d)) * 0.1).astype(np.float32))

    def gemma4_layer(p, i):
        """gemma4: heads of the layer's kind (S, G), V taken from K in the global layers (no attn_v), norms as the
        file stores them (no +1 added when read), the dense FFN (and the MoE kind's experts beside it, gate and up
        in one stack, a scale per expert, the router's input scale), the per-layer embedding's gate and projection."""
        kind = g4["pattern"][i]
        h, hkv, hdl = g4_heads[kind]
        for n in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            vec(p + f"{n}.weight", d, 1.0, 0.3)
        mat(p + "attn_q.weight", h * hdl, d, 2 / np.sqrt(d), types["attn_q"])
        mat(p + "attn_k.weight", hkv * hdl, d, 2 / np.sqrt(d), types["attn_k"])
        if kind == "S":
            mat(p + "attn_v.weight", hkv * hdl, d, 1 / np.sqrt(d), types["attn_v"])
        mat(p + "attn_output.weight", d, h * hdl, 1 / np.sqrt(h * hdl), types["attn_output"])
        # heads over 128 (GEMMA4_REAL_HEADS) score as spread as 128's: with attention scale 1, q . k of random normed
        # heads of 512 spread ~2x wider and their near one-hot softmaxes amplified the 8-bit rounding of activations
        # (the GPU's, llama.cpp's) to mean correlation 0.9989 against float32 (measured on the CPU engine)
        vec(p + "attn_q_norm.weight", hdl, min(1.0, (128 / hdl) ** 0.5))
        vec(p + "attn_k_norm.weight", hdl)
        if i in GEMMA4_SCALED_LAYERS:
            w.add_tensor(p + "layer_output_scale.weight", np.array([0.7], np.float32))
        f = layer_ff[i]
        mat(p + "ffn_gate.weight", f, d, 1 / np.sqrt(d), types["ffn_gate"])
        mat(p + "ffn_up.weight", f, d, 1 / np.sqrt(d), types["ffn_up"])
        mat(p + "ffn_down.weight", d, f, 1 / np.sqrt(f), types["ffn_down"])
        if experts:
            e = experts[0]
            mat(p + "ffn_gate_inp.weight", e, d, 2, T.F32)  # its input is the residual's rms norm / sqrt(n_embd)
            vec(p + "ffn_gate_inp.scale", d, 1.0, 0.3)
            for n in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
                vec(p + f"{n}.weight", d, 1.0, 0.3)
            mat(p + "ffn_gate_up_exps.weight", 2 * ff, d, 1 / np.sqrt(d), types["ffn_gate"], e)
            mat(p + "ffn_down_exps.weight", d, ff, 1 / np.sqrt(ff), types["ffn_down"], e)
            vec(p + "ffn_down_exps.scale", e, 1.0, 0.5)
        if g4["per_layer"]:
            mat(p + "inp_gate.weight", g4["per_layer"], d, 1 / np.sqrt(d), types["ffn_gate"])
            mat(p + "proj.weight", d, g4["per_layer"], 1 / np.sqrt(g4["per_layer"]), types["ffn_down"])
            vec(p + "post_norm.weight", d, 1.0, 0.3)

    def hybrid_layer(p, recurrent):
        """A qwen35 layer: Gated DeltaNet or gated attention, then the FFN (qwen35moe: experts and a shared one)."""
        vec(p + "attn_norm.weight", d)
        vec(p + "post_attention_norm.weight", d)  # qwen35 names its pre-FFN norm so
        if recurrent:
            delta_net(p)
        else:  # attention with an output gate: each head's q rows, then its gate rows
            mat(p + "attn_q.weight", nh * 2 * hd, d, 2 / np.sqrt(d), types["attn_q"])
            mat(p + "attn_k.weight", nkv * hd, d, 2 / np.sqrt(d), types["attn_k"])
            mat(p + "attn_v.weight", nkv * hd, d, 1 / np.sqrt(d), types["attn_v"])
            mat(p + "attn_output.weight", d, nh * hd, 1 / np.sqrt(nh * hd), types["attn_output"])
            vec(p + "attn_q_norm.weight", hd)
            vec(p + "attn_k_norm.weight", hd)
        if experts:
            mat(p + "ffn_gate_inp.weight", experts[0], d, 2 / np.sqrt(d), T.F32)
            w.add_tensor(p + "ffn_gate_inp_shexp.weight", (rng.standard_normal(d) * 2 / np.sqrt(d)).astype(np.float32))
            mat(p + "ffn_gate_shexp.weight", SHARED_EXPERT_FF, d, 1 / np.sqrt(d), types["ffn_gate"])
            mat(p + "ffn_up_shexp.weight", SHARED_EXPERT_FF, d, 1 / np.sqrt(d), types["ffn_up"])
            mat(p + "ffn_down_shexp.weight", d, SHARED_EXPERT_FF, 1 / np.sqrt(SHARED_EXPERT_FF), types["ffn_down"])
        e, suffix = (experts[0], "_exps") if experts else (0, "")
        mat(p + f"ffn_gate{suffix}.weight", ff, d, 1 / np.sqrt(d), types["ffn_gate"], e)
        mat(p + f"ffn_up{suffix}.weight", ff, d, 1 / np.sqrt(d), types["ffn_up"], e)
        mat(p + f"ffn_down{suffix}.weight", d, ff, (2 if e else 1) / np.sqrt(ff), types["ffn_down"], e)

    mat("token_embd.weight", n_vocab, d, 0.5, T.Q8_0)
    if g4:
        rotated = int(g4_heads["G"][2] * GEMMA4_ROTATED / 2)
        w.add_tensor("rope_freqs.weight", np.array([1.0] * rotated + [1e30] * (g4_heads["G"][2] // 2 - rotated),
                                                   np.float32))
        if g4["per_layer"]:
            n_pl = g4["per_layer"]
            mat("per_layer_token_embd.weight", n_vocab, n_pl * L, 1.0, T.Q8_0)
            mat("per_layer_model_proj.weight", n_pl * L, d, 1 / np.sqrt(d), T.F16)
            vec("per_layer_proj_norm.weight", n_pl, 1.0, 0.3)
    for i in range(L):
        p = f"blk.{i}."
        if oss:
            gpt_oss_layer(p)
            continue
        if g4:
            gemma4_layer(p, i)
            continue
        if hybrid:
            hybrid_layer(p, (i + 1) % HYBRID_INTERVAL)
            continue
        vec(p + "attn_norm.weight", d)
        mat(p + "attn_q.weight", nh * hd, d, 2 / np.sqrt(d), types["attn_q"])
        mat(p + "attn_k.weight", nkv * hd, d, 2 / np.sqrt(d), types["attn_k"])
        mat(p + "attn_v.weight", nkv * hd, d, 1 / np.sqrt(d), types["attn_v"])
        mat(p + "attn_output.weight", d, nh * hd, 1 / np.sqrt(nh * hd), types["attn_output"])
        if arch == "qwen2":
            for t, n in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd)):
                vec(p + f"attn_{t}.bias", n, 0.0, 0.5)
        elif arch != "llama":
            vec(p + "attn_q_norm.weight", hd)
            vec(p + "attn_k_norm.weight", hd)
        if arch == "gemma3":
            vec(p + "post_attention_norm.weight", d)
            vec(p + "post_ffw_norm.weight", d)
        vec(p + "ffn_norm.weight", d)
        if experts:  # the router's logits spread by ~2: clear choices, few near-ties
            mat(p + "ffn_gate_inp.weight", experts[0], d, 2 / np.sqrt(d), T.F32)
        e, suffix = (experts[0], "_exps") if experts else (0, "")
        mat(p + f"ffn_gate{suffix}.weight", ff, d, 1 / np.sqrt(d), types["ffn_gate"], e)
        mat(p + f"ffn_up{suffix}.weight", ff, d, 1 / np.sqrt(d), types["ffn_up"], e)
        # an expert's output is weighted by ~1/used: twice the scale keeps the FFN's part of the residual
        mat(p + f"ffn_down{suffix}.weight", d, ff, (2 if e else 1) / np.sqrt(ff), types["ffn_down"], e)
    vec("output_norm.weight", d)
    # gpt-oss has an output matrix of its own (llama.cpp requires it); gemma4's files tie it, but tied to the random
    # embeddings the logits' top-1 is the input token whatever the layers do (conftest's synth_llama_k)
    if arch in ("qwen2", "gpt-oss", "gemma4") or own_output:
        mat("output.weight", n_vocab, d, 0.5, T.Q8_0)
    if mtp:  # last, so that the other tensors are the file's without it; norms used as stored (+1 folded)
        hybrid_layer(f"blk.{L}.", recurrent=False)
        mat(f"blk.{L}.nextn.eh_proj.weight", d, 2 * d, 1 / np.sqrt(2 * d), types["attn_output"])
        vec(f"blk.{L}.nextn.enorm.weight", d, 1.0, 0.3)
        vec(f"blk.{L}.nextn.hnorm.weight", d, 1.0, 0.3)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
