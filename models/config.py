"""ModelConfig: everything the forward pass needs to know about an architecture, read from GGUF keys.

Architecture differences live here as data (rope style, qkv bias, q/k norms, sandwich norms, embedding
scale, sliding-window layers), never as copies of the forward.
"""
import math
from dataclasses import dataclass

from models.errors import UserError

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3moe", "gemma3", "gemma4", "qwen35", "qwen35moe", "gpt-oss")

# What the GGUF keys do not say: llama.cpp's per-architecture choices (llama-model.cpp, llama-arch.cpp).
ARCH_TRAITS = {
    "llama": dict(rope_style="normal", activation="silu"),  # Llama 2/3, Mistral, SmolLM
    "qwen2": dict(rope_style="neox", activation="silu", qkv_bias=True),
    "qwen3": dict(rope_style="neox", activation="silu", qk_norm=True),
    "qwen3moe": dict(rope_style="neox", activation="silu", qk_norm=True),  # qwen3 with experts in every layer
    "gemma3": dict(rope_style="neox", activation="gelu", qk_norm=True, sandwich_norm=True,
                   swa_period=6, rope_base_local=10000.0),
    # Gemma 4 (llama.cpp's gemma4.cpp): gemma3's layer with the file's norms as stored (its converter adds no 1, nor
    # did gemma3's forward), q and k unscaled (attention scale 1), v rms-normed per head with no weight, a per-layer
    # list of sliding layers, sliding and global layers of their own head size, count and rope (rope_freqs turns only
    # a quarter of a global head: "proportional"), the last layers reading an earlier layer's K/V, and in some files
    # experts beside the dense FFN and per-layer embeddings; logits softcapped at 30 unless the file says otherwise
    "gemma4": dict(rope_style="neox", activation="gelu", qk_norm=True, sandwich_norm=True, attn_scale=1.0,
                   v_norm=True, rope_freqs_global_only=True, final_softcap=30.0),
    # Qwen3.5 / 3.6: Gated DeltaNet layers with a full-attention layer every full_attention_interval; rope is
    # llama.cpp's IMROPE, which for text (every section at the token's position) is neox over rope_dim dims
    "qwen35": dict(rope_style="neox", activation="silu", qk_norm=True, hybrid=True),
    "qwen35moe": dict(rope_style="neox", activation="silu", qk_norm=True, hybrid=True),  # + routed and shared experts
    # gpt-oss (llama.cpp's openai-moe.cpp): biases on q, k, v, the attention output, the router and the experts;
    # a learned sink logit per head in the softmax; every other layer (the even ones) a sliding window; YaRN rope
    # on every layer; experts chosen by top-k of the router's logits, weighted by a softmax over those k (what
    # cpu_ops.route gives); the experts' GLU is its clamped swiglu with alpha (kernels/cpu/ops.swiglu_oai)
    "gpt-oss": dict(rope_style="neox", activation="swiglu_oai", qkv_bias=True, swa_period=2, attn_sinks=True,
                    yarn=True),
}
MOE_ARCHITECTURES = ("qwen3moe", "qwen35moe", "gpt-oss")  # the file must state expert_count
EMBED_SCALED = ("gemma3", "gemma4")  # token embeddings times sqrt(n_embd)


class UnsupportedArchitectureError(UserError, ValueError):
    pass


class MissingConfigKeyError(UserError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class BadConfigValueError(UserError, ValueError):
    pass


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layers: int
    n_embd: int
    n_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int  # per-head size of q and k
    v_head_dim: int  # per-head size of v
    n_vocab: int
    n_ctx_train: int  # the context the model was trained for
    rms_eps: float
    rope_base: float  # rope frequency base of global layers
    rope_dim: int  # leading dims of each head that rotate
    rope_scale: float  # positions are multiplied by this (linear rope scaling; YaRN's freq_scale, 1 / factor)
    rope_style: str  # "normal": adjacent pairs rotate (llama); "neox": halves rotate
    activation: str  # "silu", "gelu" (tanh approximation) or "swiglu_oai" (gpt-oss), gating the up projection
    qkv_bias: bool = False
    qk_norm: bool = False  # rms_norm over each head of q and k before rope
    sandwich_norm: bool = False  # extra rms_norm on the attention and ffn outputs (gemma)
    embed_scale: float = 1.0  # embeddings are multiplied by this
    attn_scale: float = 0.0  # softmax scale; 1/sqrt(head_dim) when 0
    sliding_window: int = 0  # tokens a local layer sees, itself included; 0: none
    swa_period: int = 0  # every swa_period-th layer is global, the others local; 0: all global
    rope_base_local: float = 0.0  # rope base of the local (sliding-window) layers
    rope_scale_local: float = 1.0  # rope_scale of the local layers (gemma3 scales only its global ones)
    # YaRN (rope.scaling.type "yarn", gpt-oss): the context the model was trained at before scaling; 0: no YaRN.
    # The rotation of pair i is blended between scaled and unscaled by a ramp over the pairs, and cos and sin are
    # multiplied by rope_mscale (kernels/cpu/ops.yarn_inv_freq, as llama.cpp's ggml rope_yarn)
    rope_yarn_orig_ctx: int = 0
    rope_attn_factor: float = 1.0  # rope.scaling.attn_factor: a further factor of cos and sin
    attn_sinks: bool = False  # each head's softmax has one more logit, learned, with no value (gpt-oss)
    final_softcap: float = 0.0  # logits = c * tanh(logits / c) when > 0
    # Mixture of experts (qwen3moe; llama with experts, as Mixtral): every layer's FFN is n_expert SwiGLU experts
    # of width n_ff_exp, of which a router picks n_expert_used per token (inference/forward.py)
    n_expert: int = 0  # 0: a dense FFN of width n_ff
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0  # a shared expert of this width runs beside the routed ones, gated by a sigmoid (qwen35moe)
    # gemma4: a layer with experts (one with a router) keeps its dense FFN beside them, the two outputs normed apart
    # and summed; the router reads the residual rms-normed and scaled, each expert's output has a scale of its own
    dense_with_experts: bool = False
    # Hybrid models (qwen35, qwen35moe): the layers marked recurrent mix tokens with a Gated DeltaNet (a causal
    # conv of ssm_conv_kernel taps, then a delta rule over a [ssm_state x ssm_state] matrix per value head) in
    # place of attention; the attention layers gate their output by a sigmoid of a second half of q's projection
    recurrent: tuple[bool, ...] = ()  # per layer; () none
    ssm_conv_kernel: int = 0
    ssm_state: int = 0  # key and value head size of the delta rule
    ssm_k_heads: int = 0  # q and k heads; value head h reads key head h % ssm_k_heads
    ssm_v_heads: int = 0
    attn_output_gate: bool = False
    rope_sections: tuple[int, ...] = ()  # IMROPE (qwen35): rotated pairs given to the t, h, w and a 4th position
    n_nextn_layers: int = 0  # multi-token-prediction blocks after the trunk's n_layers (not part of the forward)
    # Layers that differ (gemma4). The scalars above are the largest (n_heads, n_kv_heads, n_ff) or the global layers'
    # (head_dim, rope_dim); these say each layer's, () where every layer is the same
    swa_layers: tuple[bool, ...] = ()  # per layer, True: sliding-window (the file's pattern); (): swa_period says
    n_heads_by_layer: tuple[int, ...] = ()
    n_kv_heads_by_layer: tuple[int, ...] = ()
    n_ff_by_layer: tuple[int, ...] = ()  # the dense FFN's width (gemma4's KV-shared layers: twice the others')
    head_dim_local: int = 0  # q, k and v head size of the sliding-window layers; 0: head_dim
    rope_dim_local: int = 0  # rotated dims of the sliding-window layers; 0: rope_dim
    rope_freqs_global_only: bool = False  # rope_freqs divides the speeds of the global layers only (gemma4)
    kv_shared_layers: int = 0  # the last this many layers make no K/V: they read an earlier layer's (kv_source)
    v_norm: bool = False  # v rms-normed per head with no weight before it is cached (gemma4)
    n_embd_per_layer: int = 0  # per-layer embeddings: each layer adds a gated input of this size (gemma4 E2B/E4B)

    def is_recurrent(self, layer: int) -> bool:
        return layer < len(self.recurrent) and self.recurrent[layer]  # the MTP block (n_layers) is full attention

    @property
    def attention_layers(self) -> list[int]:
        return [i for i in range(self.n_layers) if not self.is_recurrent(i)]

    def text_rope_divisors(self) -> list[float] | None:
        """IMROPE on text as llama.cpp runs it (ggml rope_multi with is_imrope): pair i turns with the position of
        its sector's section, and a text token's t, h and w positions are its position, the 4th 0. So a pair turns
        as plain neox rope's, or not at all: as divisors of its frequency (rope_freqs' meaning), 1 or infinity.
        None: the model has no sections. With the converter's sections every pair turns."""
        if not self.rope_sections:
            return None
        s = self.rope_sections
        div = []
        for i in range(self.rope_dim // 2):
            sector = i % sum(s)
            turns = any(sector % 3 == r and sector < 3 * s[r] for r in range(3))
            div.append(1.0 if turns else math.inf)
        return div

    @property
    def ssm_conv_dim(self) -> int:
        """Channels of the causal conv: q and k of every key head, v of every value head."""
        return (2 * self.ssm_k_heads + self.ssm_v_heads) * self.ssm_state

    def is_local(self, layer: int) -> bool:
        if self.swa_layers:
            return self.sliding_window > 0 and self.swa_layers[layer]
        return self.sliding_window > 0 and self.swa_period > 0 and layer % self.swa_period < self.swa_period - 1

    def layer_heads(self, layer: int) -> tuple[int, int, int, int]:
        """(q heads, kv heads, q and k head size, v head size) of an attention layer."""
        heads = self.n_heads_by_layer[layer] if self.n_heads_by_layer else self.n_heads
        kv = self.n_kv_heads_by_layer[layer] if self.n_kv_heads_by_layer else self.n_kv_heads
        if self.head_dim_local and self.is_local(layer):
            return heads, kv, self.head_dim_local, self.head_dim_local
        return heads, kv, self.head_dim, self.v_head_dim

    def layer_ff(self, layer: int) -> int:
        return self.n_ff_by_layer[layer] if self.n_ff_by_layer else self.n_ff

    def layer_rope(self, layer: int) -> tuple[float, float, int, bool]:
        """(base, scale, rotated dims, divided by rope_freqs) of the layer's rope."""
        local = self.is_local(layer)
        dim = self.rope_dim_local if local and self.rope_dim_local else self.rope_dim
        return (self.layer_rope_base(layer), self.layer_rope_scale(layer), dim,
                not (local and self.rope_freqs_global_only))

    def kv_source(self, layer: int) -> int:
        """The layer whose K/V cache this layer's attention reads: itself, or for the last kv_shared_layers the last
        layer before them of its kind (llama.cpp's create_memory: the one before them if global, two before if
        sliding; ModelConfig's check holds those to the kind)."""
        first_shared = self.n_layers - self.kv_shared_layers
        if layer < first_shared or layer >= self.n_layers:  # the MTP block (n_layers) has a cache of its own
            return layer
        return first_shared - (2 if self.is_local(layer) else 1)

    def has_kv(self, layer: int) -> bool:
        return self.kv_source(layer) == layer

    def layer_window(self, layer: int) -> int:
        return self.sliding_window if self.is_local(layer) else 0

    def layer_rope_base(self, layer: int) -> float:
        return self.rope_base_local if self.is_local(layer) else self.rope_base

    def layer_rope_scale(self, layer: int) -> float:
        return self.rope_scale_local if self.is_local(layer) else self.rope_scale

    @property
    def rope_mscale(self) -> float:
        """What cos and sin are multiplied by: llama.cpp's yarn_attn_factor (attn_factor once its own get_mscale is
        cancelled) times the 1 + 0.1 ln(factor) its rope kernel applies under YaRN; 1 without YaRN."""
        if not self.rope_yarn_orig_ctx:
            return 1.0
        factor = 1.0 / self.rope_scale
        return self.rope_attn_factor * (1.0 + 0.1 * math.log(factor) if factor > 1.0 else 1.0)

    @property
    def softmax_scale(self) -> float:
        return self.attn_scale or 1.0 / math.sqrt(self.head_dim)


def config_from_metadata(metadata: dict) -> ModelConfig:
    """Fill a ModelConfig from GGUF metadata; a missing required key raises an error naming it."""
    arch = metadata.get("general.architecture")
    if arch is None:
        raise MissingConfigKeyError("the model file has no general.architecture key")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"architecture '{arch}' is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    traits = ARCH_TRAITS[arch]

    def get(key: str, default=None):
        value = metadata.get(f"{arch}.{key}", default)
        if value is None:
            raise MissingConfigKeyError(f"the model file is missing the required key {arch}.{key}")
        return value

    n_embd = int(get("embedding_length"))
    # experts: qwen3moe states their count and width; Mixtral (llama with experts) gives their width as the FFN's
    moe_arch = arch in MOE_ARCHITECTURES
    n_expert = int(get("expert_count", None if moe_arch else 0))
    n_expert_used = int(get("expert_used_count")) if n_expert else 0
    if n_expert and not 0 < n_expert_used <= n_expert:
        raise BadConfigValueError(f"the model file has {n_expert} experts but {arch}.expert_used_count is "
                                  f"{n_expert_used} (want 1..{n_expert})")
    n_nextn = int(get("nextn_predict_layers", 0))
    n_layers = int(get("block_count")) - n_nextn  # the MTP blocks are counted in block_count

    def by_layer(key: str, default=None) -> tuple[int, tuple[int, ...]]:
        """A count the file gives once or per layer (gemma4): (the largest, per layer or () when given once)."""
        value = get(key, default)
        if isinstance(value, (int, float)):
            return int(value), ()
        per_layer = tuple(int(v) for v in value)
        if len(per_layer) < n_layers or min(per_layer) < 0:
            raise BadConfigValueError(f"{arch}.{key} has {len(per_layer)} values for {n_layers} layers")
        per_layer = per_layer[:n_layers]
        return max(per_layer), per_layer

    n_ff, n_ff_by_layer = by_layer("feed_forward_length", 0 if n_expert else None)
    n_ff_exp = int(get("expert_feed_forward_length", None if moe_arch or arch == "gemma4" else n_ff)) if n_expert else 0
    n_heads, n_heads_by_layer = by_layer("attention.head_count")
    n_kv_heads, n_kv_heads_by_layer = by_layer("attention.head_count_kv", n_heads_by_layer or n_heads)
    head_dim = int(get("attention.key_length", n_embd // n_heads))
    n_vocab = metadata.get(f"{arch}.vocab_size")
    if n_vocab is None:
        tokens = metadata.get("tokenizer.ggml.tokens")
        if tokens is None:
            raise MissingConfigKeyError(f"the model file has neither {arch}.vocab_size nor tokenizer.ggml.tokens")
        n_vocab = len(tokens)
    rope_scale = 1.0
    scaling = metadata.get(f"{arch}.rope.scaling.type")
    if scaling == "linear" or (scaling == "yarn" and traits.get("yarn")):
        rope_scale = 1.0 / float(get("rope.scaling.factor"))
    yarn = scaling == "yarn" and traits.get("yarn")  # other architectures' YaRN keys are not read (yet)
    n_ctx_train = int(get("context_length"))
    # gemma3 scales q by query_pre_attn_scalar**-0.5, which llama.cpp takes as 1/sqrt(key_length) (27B aside)
    swa_period = traits.get("swa_period", 0)
    sliding_window = 0
    if swa_period:
        # gpt-oss must state its window; llama.cpp reads a period from sliding_window_pattern (default 2)
        sliding_window = int(get("attention.sliding_window", None if arch == "gpt-oss" else 0))
        if arch == "gpt-oss":
            swa_period = get("attention.sliding_window_pattern", swa_period)
            if not isinstance(swa_period, int) or swa_period < 1:
                raise BadConfigValueError(f"{arch}.attention.sliding_window_pattern must be a layer period (an "
                                          f"integer >= 1), got {swa_period!r}")
    rope_base = float(get("rope.freq_base", 10000.0))
    hybrid = _hybrid_fields(get, n_layers) if traits.get("hybrid") else {}
    layer_kinds = dict(n_heads_by_layer=n_heads_by_layer, n_kv_heads_by_layer=n_kv_heads_by_layer,
                       n_ff_by_layer=n_ff_by_layer)
    if arch == "gemma4":
        sliding_window = int(get("attention.sliding_window"))
        layer_kinds |= _gemma4_fields(get, n_layers, head_dim)
    return ModelConfig(
        arch=arch,
        n_layers=n_layers,
        n_embd=n_embd,
        n_ff=n_ff,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        v_head_dim=int(get("attention.value_length", head_dim)),
        n_vocab=int(n_vocab),
        n_ctx_train=n_ctx_train,
        rms_eps=float(get("attention.layer_norm_rms_epsilon")),
        rope_base=rope_base,
        rope_dim=int(get("rope.dimension_count", head_dim)),
        rope_scale=rope_scale,
        rope_style=traits["rope_style"],
        activation=traits["activation"],
        qkv_bias=traits.get("qkv_bias", False),
        qk_norm=traits.get("qk_norm", False),
        sandwich_norm=traits.get("sandwich_norm", False),
        embed_scale=math.sqrt(n_embd) if arch in EMBED_SCALED else 1.0,
        sliding_window=sliding_window,
        swa_period=swa_period,
        # llama.cpp's default base of the sliding layers: gemma4's 10000 when the file has none, the global one's else
        rope_base_local=float(traits.get("rope_base_local", 0.0)
                              or get("rope.freq_base_swa", 10000.0 if arch == "gemma4" else rope_base)),
        rope_scale_local=rope_scale if arch == "gpt-oss" else 1.0,  # gpt-oss scales every layer's rope
        rope_yarn_orig_ctx=int(get("rope.scaling.original_context_length", n_ctx_train)) if yarn else 0,
        rope_attn_factor=float(get("rope.scaling.attn_factor", 1.0)),
        attn_sinks=traits.get("attn_sinks", False),
        attn_scale=traits.get("attn_scale", 0.0),
        v_norm=traits.get("v_norm", False),
        rope_freqs_global_only=traits.get("rope_freqs_global_only", False),
        final_softcap=float(metadata.get(f"{arch}.final_logit_softcapping", traits.get("final_softcap", 0.0))),
        n_expert=n_expert,
        n_expert_used=n_expert_used,
        n_ff_exp=n_ff_exp,
        n_ff_shexp=(int(get("expert_shared_feed_forward_length", 0)) or n_ff) if moe_arch and hybrid else 0,
        dense_with_experts=arch == "gemma4",
        n_nextn_layers=n_nextn,
        **hybrid,
        **layer_kinds,
    )


def _hybrid_fields(get, n_layers: int) -> dict:
    """The DeltaNet keys of a qwen35 / qwen35moe file, checked: llama.cpp's kernels assume what is checked here."""
    recurrent = get("attention.recurrent_layers", 0)
    if recurrent:
        recurrent = tuple(bool(r) for r in recurrent[:n_layers])
    else:  # every full_attention_interval-th layer is full attention
        interval = int(get("full_attention_interval", 4))
        recurrent = tuple((i + 1) % interval != 0 for i in range(n_layers))
    f = dict(recurrent=recurrent, ssm_conv_kernel=int(get("ssm.conv_kernel")), ssm_state=int(get("ssm.state_size")),
             ssm_k_heads=int(get("ssm.group_count")), ssm_v_heads=int(get("ssm.time_step_rank")), attn_output_gate=True,
             rope_sections=tuple(int(x) for x in get("rope.dimension_sections")))
    inner = int(get("ssm.inner_size"))
    if len(recurrent) != n_layers or inner != f["ssm_v_heads"] * f["ssm_state"] or f["ssm_k_heads"] < 1 \
            or f["ssm_v_heads"] % f["ssm_k_heads"] or f["ssm_conv_kernel"] < 2 or len(f["rope_sections"]) != 4 \
            or sum(f["rope_sections"]) < 1:
        raise BadConfigValueError(
            f"the model file's DeltaNet shape is inconsistent: {f['ssm_k_heads']} key heads, {f['ssm_v_heads']} value "
            f"heads of {f['ssm_state']}, inner size {inner}, conv kernel {f['ssm_conv_kernel']}, rope sections "
            f"{f['rope_sections']}, "
            f"{len(recurrent)} layer kinds for {n_layers} layers")
    return f


def _gemma4_fields(get, n_layers: int, head_dim: int) -> dict:
    """gemma4's layer kinds (llama.cpp's llama_model_gemma4::load_arch_hparams), checked: the sliding layers' head size,
    rope, the KV-shared layers' sources of their kind, the per-layer embeddings."""
    pattern = tuple(bool(x) for x in get("attention.sliding_window_pattern"))
    if len(pattern) < n_layers:
        raise BadConfigValueError(f"gemma4.attention.sliding_window_pattern has {len(pattern)} values for {n_layers} "
                                  "layers")
    pattern = pattern[:n_layers]
    head_dim_local = int(get("attention.key_length_swa", head_dim))
    if int(get("attention.value_length_swa", head_dim_local)) != head_dim_local:
        raise BadConfigValueError("gemma4's sliding layers need keys and values of one head size (as llama.cpp)")
    shared = int(get("attention.shared_kv_layers", 0))
    f = dict(swa_layers=pattern, head_dim_local=head_dim_local,
             rope_dim_local=int(get("rope.dimension_count_swa", get("rope.dimension_count", head_dim))),
             kv_shared_layers=shared, n_embd_per_layer=int(get("embedding_length_per_layer_input")))
    first = n_layers - shared
    if shared and (first < 2 or not pattern[first - 2] or pattern[first - 1]
                   or any(pattern[i] != pattern[first - (2 if pattern[i] else 1)] for i in range(first, n_layers))):
        raise BadConfigValueError(
            f"gemma4's {shared} KV-shared layers read layers {first - 2} (sliding) and {first - 1} (global), which the "
            f"file's layer pattern does not have: {''.join('S' if s else 'G' for s in pattern)}")
    return f
