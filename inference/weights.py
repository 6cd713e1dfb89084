"""The model's tensors as the forward pass uses them: quantized matrices stay zero-copy views of the file."""
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from kernels.cpu.quant import OneTokenExperts
from models.config import ModelConfig
from models.errors import UserError
from models.ggml_types import TYPES_BY_NAME, GGMLType, require_supported
from models.gguf import GGUFModel


class MissingTensorError(UserError, KeyError):
    def __str__(self) -> str:
        return self.args[0]


class TensorShapeError(UserError, ValueError):
    pass


@dataclass(frozen=True)
class QuantMatrix:
    """A weight matrix [n_rows, n_cols] kept in its file's blocks: data is uint8 [n_rows, row_bytes]."""
    data: np.ndarray
    qtype: GGMLType
    n_rows: int
    n_cols: int


@dataclass(frozen=True)
class QuantExperts:
    """n_expert matrices [n_rows, n_cols] stacked (a ggml tensor of shape (n_cols, n_rows, n_expert)), kept in
    the file's blocks: data is uint8 [n_expert, n_rows, row_bytes]."""
    data: np.ndarray
    qtype: GGMLType
    n_rows: int
    n_cols: int

    def expert(self, e: int) -> QuantMatrix:
        """Expert e's matrix: a view, no copy."""
        return QuantMatrix(self.data[e], self.qtype, self.n_rows, self.n_cols)


@dataclass(frozen=True)
class SharedExpert:
    """A SwiGLU FFN every token runs beside its routed experts, its output scaled by sigmoid(gate_inp . h)."""
    gate_inp: QuantMatrix  # ffn_gate_inp_shexp [1, n_embd] (a vector in the file)
    gate: QuantMatrix  # ffn_gate_shexp [n_ff_shexp, n_embd]
    up: QuantMatrix  # ffn_up_shexp [n_ff_shexp, n_embd]
    down: QuantMatrix  # ffn_down_shexp [n_embd, n_ff_shexp]


@dataclass(frozen=True)
class ExpertFFN:
    """A mixture-of-experts FFN: the router scores every expert, the chosen ones run as SwiGLU FFNs."""
    router: QuantMatrix  # ffn_gate_inp [n_expert, n_embd]
    gate: QuantExperts  # ffn_gate_exps [n_expert, n_ff_exp, n_embd]
    up: QuantExperts  # ffn_up_exps [n_expert, n_ff_exp, n_embd]
    down: QuantExperts  # ffn_down_exps [n_expert, n_embd, n_ff_exp]
    shared: SharedExpert | None = None  # qwen35moe
    # gpt-oss: biases of the router's logits and of each expert's gate, up and down outputs
    router_bias: np.ndarray | None = None  # ffn_gate_inp.bias [n_expert]
    gate_bias: np.ndarray | None = None  # ffn_gate_exps.bias [n_expert, n_ff_exp]
    up_bias: np.ndarray | None = None  # ffn_up_exps.bias [n_expert, n_ff_exp]
    down_bias: np.ndarray | None = None  # ffn_down_exps.bias [n_expert, n_embd]
    # gemma4: the router reads rms_norm(x, router_norm), the residual's norm times ffn_gate_inp.scale / sqrt(n_embd)
    # (not the experts' normed input), and expert e's output is scaled by down_scale[e] (ffn_down_exps.scale)
    router_norm: np.ndarray | None = None  # [n_embd]
    down_scale: np.ndarray | None = None  # [n_expert]
    gate_up: QuantExperts | None = None  # ffn_gate_up_exps [n_expert, 2 n_ff_exp, n_embd] where gate, up are views of it

    @property
    def host_stacks(self) -> tuple[QuantExperts, ...]:
        """The stacks as the file holds them (contiguous): gate_up where gate and up are its views, else gate, up;
        then down."""
        return ((self.gate_up,) if self.gate_up is not None else (self.gate, self.up)) + (self.down,)

    @property
    def has_biases(self) -> bool:
        return self.gate_bias is not None

    @cached_property
    def one_token(self) -> OneTokenExperts:
        """The stacks as the CPU's one-token expert kernels take them, checked on first use (not every decode
        token: ~10 us a call on the 2-core VM) and kept with this FFN. Only for INT8_IDS types."""
        biases = (self.gate_bias, self.up_bias, self.down_bias) if self.has_biases else None
        if self.gate_up is not None:  # gate and up are views of it: the kernels read it in place
            return OneTokenExperts((self.gate_up.data, self.down.data), (self.gate_up.qtype, self.down.qtype), biases)
        return OneTokenExperts((self.gate.data, self.up.data, self.down.data),
                               (self.gate.qtype, self.up.qtype, self.down.qtype), biases)


@dataclass(frozen=True)
class DeltaNetWeights:
    """A Gated DeltaNet mixer (a recurrent layer of qwen35): Hv value heads of size S, Hk key heads."""
    qkv: QuantMatrix  # attn_qkv [(2 Hk + Hv) S, n_embd]: the conv's input channels, q | k | v
    z: QuantMatrix  # attn_gate [Hv S, n_embd]: the output gate
    alpha: QuantMatrix  # ssm_alpha [Hv, n_embd]: the decay's input
    beta: QuantMatrix  # ssm_beta [Hv, n_embd]: the write strength's input
    conv: np.ndarray  # ssm_conv1d [(2 Hk + Hv) S, K] float32 taps, the last one for the current token
    dt_bias: np.ndarray  # ssm_dt.bias [Hv]
    a: np.ndarray  # ssm_a [Hv]: -exp(A_log), as the converter stores it
    norm: np.ndarray  # ssm_norm [S]: the gated norm's weight, shared by the heads (no +1 folded, none needed)
    out: QuantMatrix  # ssm_out [n_embd, Hv S]

    @property
    def projections(self) -> tuple[QuantMatrix, ...]:
        """The matrices forward() multiplies by the normed input in one be.matmuls call."""
        return self.qkv, self.z, self.alpha, self.beta


@dataclass(frozen=True)
class PerLayerInput:
    """A layer's use of its per-layer embedding (gemma4 E2B/E4B): x += rms_norm(proj (gelu(inp_gate x) * e), post_norm)
    with e the layer's slice of ModelWeights.per_layer's input."""
    inp_gate: QuantMatrix  # inp_gate [n_embd_per_layer, n_embd]
    proj: QuantMatrix  # proj [n_embd, n_embd_per_layer]
    post_norm: np.ndarray  # [n_embd]


@dataclass(frozen=True)
class PerLayerEmbeddings:
    """Every layer's input from the token (gemma4 E2B/E4B): a table row of n_layers slices, and a projection of
    the embedded token (forward.per_layer_inputs)."""
    token_embd: QuantMatrix  # per_layer_token_embd [n_vocab, n_layers * n_embd_per_layer]
    model_proj: QuantMatrix  # per_layer_model_proj [n_layers * n_embd_per_layer, n_embd]
    proj_norm: np.ndarray  # per_layer_proj_norm [n_embd_per_layer]


@dataclass(frozen=True)
class LayerWeights:
    attn_norm: np.ndarray  # [n_embd]
    attn_q: QuantMatrix | None  # [n_heads * head_dim, n_embd] ([n_heads * 2 * head_dim] with an output gate); None
    attn_k: QuantMatrix | None  # [n_kv_heads * head_dim, n_embd]      in a recurrent layer; gemma4: k and v None in a
    attn_v: QuantMatrix | None  # [n_kv_heads * v_head_dim, n_embd]    KV-shared layer, v None where v is k's rows
    attn_output: QuantMatrix | None  # [n_embd, n_heads * v_head_dim]
    ffn_norm: np.ndarray  # [n_embd]
    ffn_gate: QuantMatrix | None  # [n_ff, n_embd]; None where the layer has experts
    ffn_up: QuantMatrix | None  # [n_ff, n_embd]
    ffn_down: QuantMatrix | None  # [n_embd, n_ff]
    experts: ExpertFFN | None = None  # in place of ffn_gate, ffn_up and ffn_down (cfg.n_expert > 0)
    attn_q_bias: np.ndarray | None = None  # [n_heads * head_dim] (qwen2)
    attn_k_bias: np.ndarray | None = None  # [n_kv_heads * head_dim]
    attn_v_bias: np.ndarray | None = None  # [n_kv_heads * v_head_dim]
    attn_output_bias: np.ndarray | None = None  # [n_embd] (gpt-oss)
    attn_sinks: np.ndarray | None = None  # [n_heads] each head's sink logit (gpt-oss)
    attn_q_norm: np.ndarray | None = None  # [head_dim] (qwen3, gemma3)
    attn_k_norm: np.ndarray | None = None  # [head_dim]
    post_attention_norm: np.ndarray | None = None  # [n_embd] (gemma3)
    post_ffw_norm: np.ndarray | None = None  # [n_embd]
    delta_net: DeltaNetWeights | None = None  # in place of the attention matrices (cfg.is_recurrent)
    # gemma4
    v_norm: np.ndarray | None = None  # [head_dim] of ones: v's rms norm has no weight (cfg.v_norm)
    post_ffw_norm_1: np.ndarray | None = None  # [n_embd] the dense FFN's output norm beside experts
    pre_ffw_norm_2: np.ndarray | None = None  # [n_embd] the experts' input norm
    post_ffw_norm_2: np.ndarray | None = None  # [n_embd] the experts' output norm
    per_layer: PerLayerInput | None = None
    output_scale: float | None = None  # layer_output_scale: the layer's output (the whole residual) times this

    # The matrices forward() multiplies by one activation in one be.matmuls call (a backend may fuse them): q, k, v,
    # those the layer has (gemma4: q alone in a KV-shared layer, q and k where v is k)
    @property
    def qkv(self) -> tuple[QuantMatrix, ...]:
        return tuple(m for m in (self.attn_q, self.attn_k, self.attn_v) if m is not None)

    @property
    def qkv_bias(self) -> tuple[np.ndarray | None, ...]:
        return (self.attn_q_bias, self.attn_k_bias, self.attn_v_bias)[:len(self.qkv)]

    @property
    def gate_up(self) -> tuple[QuantMatrix, QuantMatrix]:
        return self.ffn_gate, self.ffn_up


@dataclass(frozen=True)
class NextN:
    """What qwen35's multi-token-prediction block has beside its full-attention layer (ModelWeights.layers[n_layers]):
    the projection of a token and the model's state into that layer's input, and the head after it (forward.mtp)."""
    eh_proj: QuantMatrix  # [n_embd, 2 n_embd]: the normed embedding's columns, then the normed state's
    enorm: np.ndarray  # [n_embd]
    hnorm: np.ndarray  # [n_embd]
    embed: QuantMatrix  # nextn.embed_tokens where the file has it, else token_embd
    head_norm: np.ndarray  # nextn.shared_head_norm, else output_norm
    head: QuantMatrix  # nextn.shared_head_head, else output


@dataclass(frozen=True)
class ModelWeights:
    token_embd: QuantMatrix  # [n_vocab, n_embd]
    layers: list[LayerWeights]  # the trunk's n_layers, then the MTP block's layer where the file has one (nextn)
    output_norm: np.ndarray  # [n_embd]
    output: QuantMatrix  # [n_vocab, n_embd]; token_embd itself when the file ties them
    rope_freqs: np.ndarray | None  # [rope_dim // 2] divisors of the rope frequencies (llama 3.1+)
    per_layer: PerLayerEmbeddings | None = None  # gemma4 E2B/E4B
    nextn: NextN | None = None  # qwen35's MTP block (speculative.MTPDrafter)


def load_weights(model: GGUFModel, cfg: ModelConfig) -> ModelWeights:
    def tensor(name: str, optional: bool = False):
        info = model.tensors.get(name)
        if info is None:
            if optional:
                return None
            raise MissingTensorError(f"the model file has no tensor '{name}' ({cfg.arch} needs it)")
        require_supported(info.type, name)
        raw = model.tensor_bytes(name)
        if len(info.shape) == 1:
            if info.type.name != "F32":
                raise TensorShapeError(f"tensor '{name}' is {info.type.name}; a vector must be F32")
            return raw.view(np.float32)
        n_cols = info.shape[0]
        n_rows = info.n_elems // n_cols
        return QuantMatrix(raw.reshape(n_rows, -1), info.type, n_rows, n_cols)

    def matrix(name: str, n_rows: int, n_cols: int) -> QuantMatrix:
        m = tensor(name)
        if not isinstance(m, QuantMatrix) or (m.n_rows, m.n_cols) != (n_rows, n_cols):
            raise TensorShapeError(f"tensor '{name}' has the wrong shape for {cfg.arch} (want {n_rows} x {n_cols})")
        return m

    def experts(name: str, n_rows: int, n_cols: int) -> QuantExperts:
        m = tensor(name)
        if not isinstance(m, QuantMatrix) or model.tensors[name].shape != (n_cols, n_rows, cfg.n_expert):
            raise TensorShapeError(f"tensor '{name}' has the wrong shape for {cfg.arch} (want {cfg.n_expert} "
                                   f"experts of {n_rows} x {n_cols})")
        return QuantExperts(m.data.reshape(cfg.n_expert, n_rows, -1), m.qtype, n_rows, n_cols)

    def vector(name: str, n: int) -> np.ndarray:
        v = tensor(name)
        if not isinstance(v, np.ndarray) or v.shape != (n,):
            raise TensorShapeError(f"tensor '{name}' has the wrong shape for {cfg.arch} (want {n} values)")
        return v

    def expert_bias(name: str, n: int) -> np.ndarray:
        """An F32 bias per expert (a ggml tensor of shape (n, n_expert)): float32 [n_expert, n]."""
        m = tensor(name)
        if not isinstance(m, QuantMatrix) or m.qtype.name != "F32" or model.tensors[name].shape != (n, cfg.n_expert):
            raise TensorShapeError(f"tensor '{name}' has the wrong shape or type for {cfg.arch} (want F32, "
                                   f"{cfg.n_expert} experts of {n} values)")
        return m.data.view(np.float32)

    def dense(p: str, n_ff: int) -> dict:
        return dict(ffn_gate=matrix(p + "ffn_gate.weight", n_ff, cfg.n_embd),
                    ffn_up=matrix(p + "ffn_up.weight", n_ff, cfg.n_embd),
                    ffn_down=matrix(p + "ffn_down.weight", cfg.n_embd, n_ff))

    def ffn(p: str) -> dict:
        """The layer's FFN: dense matrices, or the router and experts (and a shared expert where the arch has one;
        gemma4: the dense FFN, and experts beside it where the layer has a router)."""
        i = int(p.split(".")[1])
        if cfg.dense_with_experts:
            with_experts = cfg.n_expert and (p + "ffn_gate_inp.weight") in model.tensors
            return dense(p, cfg.layer_ff(i)) | (dict(
                experts=gemma4_experts(p), post_ffw_norm_1=vector(p + "post_ffw_norm_1.weight", cfg.n_embd),
                pre_ffw_norm_2=vector(p + "pre_ffw_norm_2.weight", cfg.n_embd),
                post_ffw_norm_2=vector(p + "post_ffw_norm_2.weight", cfg.n_embd)) if with_experts else {})
        if not cfg.n_expert:
            return dense(p, cfg.layer_ff(i))
        shared = None
        if cfg.n_ff_shexp:
            gate_inp = vector(p + "ffn_gate_inp_shexp.weight", cfg.n_embd)
            shared = SharedExpert(
                gate_inp=QuantMatrix(gate_inp.view(np.uint8).reshape(1, -1), TYPES_BY_NAME["F32"], 1, cfg.n_embd),
                gate=matrix(p + "ffn_gate_shexp.weight", cfg.n_ff_shexp, cfg.n_embd),
                up=matrix(p + "ffn_up_shexp.weight", cfg.n_ff_shexp, cfg.n_embd),
                down=matrix(p + "ffn_down_shexp.weight", cfg.n_embd, cfg.n_ff_shexp))
        biases = {}
        if cfg.arch == "gpt-oss":
            biases = dict(router_bias=vector(p + "ffn_gate_inp.bias", cfg.n_expert),
                          gate_bias=expert_bias(p + "ffn_gate_exps.bias", cfg.n_ff_exp),
                          up_bias=expert_bias(p + "ffn_up_exps.bias", cfg.n_ff_exp),
                          down_bias=expert_bias(p + "ffn_down_exps.bias", cfg.n_embd))
        return dict(ffn_gate=None, ffn_up=None, ffn_down=None, experts=ExpertFFN(
            router=matrix(p + "ffn_gate_inp.weight", cfg.n_expert, cfg.n_embd),
            gate=experts(p + "ffn_gate_exps.weight", cfg.n_ff_exp, cfg.n_embd),
            up=experts(p + "ffn_up_exps.weight", cfg.n_ff_exp, cfg.n_embd),
            down=experts(p + "ffn_down_exps.weight", cfg.n_embd, cfg.n_ff_exp), shared=shared, **biases))

    def gemma4_experts(p: str) -> ExpertFFN:
        """gemma4's experts: gate and up in one stack (ffn_gate_up_exps, gate's rows first: views of it, each expert's
        rows contiguous) or two, the router's input norm and the experts' output scales."""
        ff = cfg.n_ff_exp
        gate_up = None
        if p + "ffn_gate_up_exps.weight" in model.tensors:
            gate_up = experts(p + "ffn_gate_up_exps.weight", 2 * ff, cfg.n_embd)
            gate, up = (QuantExperts(gate_up.data[:, rows], gate_up.qtype, ff, cfg.n_embd)
                        for rows in (slice(0, ff), slice(ff, 2 * ff)))
        else:
            gate, up = (experts(p + f"ffn_{n}_exps.weight", ff, cfg.n_embd) for n in ("gate", "up"))
        return ExpertFFN(router=matrix(p + "ffn_gate_inp.weight", cfg.n_expert, cfg.n_embd), gate=gate, up=up,
                         down=experts(p + "ffn_down_exps.weight", cfg.n_embd, ff),
                         router_norm=vector(p + "ffn_gate_inp.scale", cfg.n_embd) / np.float32(np.sqrt(cfg.n_embd)),
                         down_scale=vector(p + "ffn_down_exps.scale", cfg.n_expert), gate_up=gate_up)

    def per_layer_input(p: str) -> PerLayerInput:
        n = cfg.n_embd_per_layer
        return PerLayerInput(inp_gate=matrix(p + "inp_gate.weight", n, cfg.n_embd),
                             proj=matrix(p + "proj.weight", cfg.n_embd, n),
                             post_norm=vector(p + "post_norm.weight", cfg.n_embd))

    def delta_net(p: str) -> DeltaNetWeights:
        hv, s, conv_dim = cfg.ssm_v_heads, cfg.ssm_state, cfg.ssm_conv_dim
        conv = matrix(p + "ssm_conv1d.weight", conv_dim, cfg.ssm_conv_kernel)
        if conv.qtype.name != "F32":
            raise TensorShapeError(f"tensor '{p}ssm_conv1d.weight' is {conv.qtype.name}; the conv's taps must be F32")
        return DeltaNetWeights(
            qkv=matrix(p + "attn_qkv.weight", conv_dim, cfg.n_embd), z=matrix(p + "attn_gate.weight", hv * s, cfg.n_embd),
            alpha=matrix(p + "ssm_alpha.weight", hv, cfg.n_embd), beta=matrix(p + "ssm_beta.weight", hv, cfg.n_embd),
            conv=conv.data.view(np.float32), dt_bias=vector(p + "ssm_dt.bias", hv), a=vector(p + "ssm_a", hv),
            norm=vector(p + "ssm_norm.weight", s), out=matrix(p + "ssm_out.weight", cfg.n_embd, hv * s))

    def attention(p: str) -> dict:
        i = int(p.split(".")[1])
        if cfg.is_recurrent(i):
            return dict(attn_q=None, attn_k=None, attn_v=None, attn_output=None, delta_net=delta_net(p))
        heads, kv_heads, head_dim, v_head_dim = cfg.layer_heads(i)
        q_rows = heads * head_dim * (2 if cfg.attn_output_gate else 1)  # q and its gate, per head
        has_kv = cfg.has_kv(i)  # gemma4's KV-shared layers: their file may hold K/V matrices, which go unused
        # gemma4: no attn_v where v is k's projection (HF attention_k_eq_v)
        v_optional = cfg.arch == "gemma4" and (p + "attn_v.weight") not in model.tensors
        return dict(attn_q=matrix(p + "attn_q.weight", q_rows, cfg.n_embd),
                    attn_k=matrix(p + "attn_k.weight", kv_heads * head_dim, cfg.n_embd) if has_kv else None,
                    attn_v=matrix(p + "attn_v.weight", kv_heads * v_head_dim, cfg.n_embd)
                    if has_kv and not v_optional else None,
                    attn_output=matrix(p + "attn_output.weight", cfg.n_embd, heads * v_head_dim),
                    v_norm=np.ones(v_head_dim, np.float32) if cfg.v_norm else None)

    def output_scale(p: str) -> float | None:
        s = tensor(p + "layer_output_scale.weight", optional=True)
        if s is not None and (not isinstance(s, np.ndarray) or s.shape != (1,)):
            raise TensorShapeError(f"tensor '{p}layer_output_scale.weight' must be one F32 value")
        return None if s is None else float(s[0])

    # the pre-FFN norm: qwen35 and gpt-oss files name it post_attention_norm (llama.cpp's LLM_TENSOR_ATTN_POST_NORM)
    ffn_norm = "post_attention_norm.weight" if cfg.arch in ("qwen35", "qwen35moe", "gpt-oss") else "ffn_norm.weight"
    # llama.cpp runs one MTP block (n_nextn_layers 1); a file may state it yet leave its tensors out
    mtp = cfg.n_nextn_layers == 1 and f"blk.{cfg.n_layers}.nextn.eh_proj.weight" in model.tensors
    layers = []
    for i in range(cfg.n_layers + mtp):
        p = f"blk.{i}."
        opt = lambda n: tensor(p + n, optional=True)  # noqa: E731
        recurrent = cfg.is_recurrent(i)
        layers.append(LayerWeights(
            attn_norm=tensor(p + "attn_norm.weight"),
            **attention(p),
            ffn_norm=tensor(p + ffn_norm),
            **ffn(p),
            attn_q_bias=tensor(p + "attn_q.bias") if cfg.qkv_bias else opt("attn_q.bias"),
            attn_k_bias=tensor(p + "attn_k.bias") if cfg.qkv_bias else opt("attn_k.bias"),
            attn_v_bias=tensor(p + "attn_v.bias") if cfg.qkv_bias else opt("attn_v.bias"),
            attn_output_bias=vector(p + "attn_output.bias", cfg.n_embd) if cfg.arch == "gpt-oss" else None,
            attn_sinks=vector(p + "attn_sinks.weight", cfg.n_heads) if cfg.attn_sinks else None,
            attn_q_norm=tensor(p + "attn_q_norm.weight") if cfg.qk_norm and not recurrent else None,
            attn_k_norm=tensor(p + "attn_k_norm.weight") if cfg.qk_norm and not recurrent and cfg.has_kv(i) else None,
            post_attention_norm=tensor(p + "post_attention_norm.weight") if cfg.sandwich_norm else None,
            post_ffw_norm=tensor(p + "post_ffw_norm.weight") if cfg.sandwich_norm else None,
            per_layer=per_layer_input(p) if cfg.n_embd_per_layer else None,
            output_scale=output_scale(p),
        ))
    token_embd = matrix("token_embd.weight", cfg.n_vocab, cfg.n_embd)
    output = tensor("output.weight", optional=True)  # absent: tied to the embeddings (SmolLM2, Gemma)
    output = matrix("output.weight", cfg.n_vocab, cfg.n_embd) if output is not None else token_embd
    output_norm = tensor("output_norm.weight")

    def nextn(p: str) -> NextN:
        opt = lambda n, default, read: read(p + n) if p + n in model.tensors else default  # noqa: E731
        return NextN(eh_proj=matrix(p + "eh_proj.weight", cfg.n_embd, 2 * cfg.n_embd),
                     enorm=vector(p + "enorm.weight", cfg.n_embd), hnorm=vector(p + "hnorm.weight", cfg.n_embd),
                     embed=opt("embed_tokens.weight", token_embd, lambda n: matrix(n, cfg.n_vocab, cfg.n_embd)),
                     head_norm=opt("shared_head_norm.weight", output_norm, lambda n: vector(n, cfg.n_embd)),
                     head=opt("shared_head_head.weight", output, lambda n: matrix(n, cfg.n_vocab, cfg.n_embd)))

    return ModelWeights(
        token_embd=token_embd,
        layers=layers,
        output_norm=output_norm,
        output=output,
        rope_freqs=(np.array(cfg.text_rope_divisors()) if cfg.rope_sections
                    else tensor("rope_freqs.weight", optional=True)),
        per_layer=PerLayerEmbeddings(
            token_embd=matrix("per_layer_token_embd.weight", cfg.n_vocab, cfg.n_layers * cfg.n_embd_per_layer),
            model_proj=matrix("per_layer_model_proj.weight", cfg.n_layers * cfg.n_embd_per_layer, cfg.n_embd),
            proj_norm=vector("per_layer_proj_norm.weight", cfg.n_embd_per_layer)) if cfg.n_embd_per_layer else None,
        nextn=nextn(f"blk.{cfg.n_layers}.nextn.") if mtp else None,
    )
