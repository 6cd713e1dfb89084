"""What a model is, from its GGUF header alone: the facts `gguf-chat info` shows.

Metadata of a valid file can still hold odd types (a string where a count belongs); such a value is
reported as absent rather than trusted, so a summary never fails on a file the reader accepted.
"""
from dataclasses import asdict, dataclass

import numpy as np

from models.ggml_types import TYPES_BY_NAME
from models.gguf import GGUFModel

# tokenizer.ggml.model -> the algorithm it names
TOKENIZER_KINDS = {"llama": "SentencePiece", "gpt2": "BPE", "bert": "WordPiece", "t5": "Unigram",
                   "rwkv": "RWKV", "plamo2": "PLaMo-2", "gemma4": "BPE (SentencePiece-style)", "none": "none"}


@dataclass(frozen=True)
class QuantShare:
    type: str
    tensors: int
    bytes: int
    bits_per_weight: float  # the type's own: its block's bits over its block's values (IQ4_XS 4.25)


@dataclass(frozen=True)
class ModelInfo:
    path: str
    file_size: int
    parts: int
    gguf_version: int
    architecture: str | None
    name: str | None
    parameters: int  # sum of tensor elements, as llama.cpp's "model params"
    bits_per_weight: float
    context_length: int | None
    block_count: int | None
    deltanet_layers: int  # layers whose token mixer is a Gated DeltaNet (qwen35), not attention
    nextn_layers: int  # multi-token-prediction blocks counted in block_count, not part of the forward pass
    embedding_length: int | None
    feed_forward_length: int | list[int] | None  # gemma4 E2B/E4B: one a layer
    head_count: int | list[int] | None  # a few architectures store one value per layer
    head_count_kv: int | list[int] | None
    head_dim: int | None
    # layers of two kinds (gemma4: the file's pattern array): "S" a sliding-window layer, "G" global, one a layer
    layer_pattern: str | None
    sliding_window: int | None
    head_dim_swa: int | None  # the sliding layers' head size where it differs (gemma4)
    shared_kv_layers: int  # the last layers that reuse an earlier layer's K/V (gemma4)
    embedding_length_per_layer: int  # per-layer embeddings' size (gemma4 E2B/E4B), 0 for none
    tokenizer_model: str | None
    tokenizer_kind: str | None
    tokenizer_pre: str | None
    vocab_size: int | None
    expert_count: int | None  # mixture of experts: experts a layer, None for a dense model
    expert_used_count: int | None  # experts a token runs through
    expert_feed_forward_length: int | None  # each expert's FFN width
    expert_bytes: int  # bytes of the expert tensors (*_exps), 0 for a dense model
    active_parameters: int  # parameters a token uses: all but the experts it does not run
    chat_template: bool
    tensor_count: int
    quant_mix: list[QuantShare]  # largest share first

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(model: GGUFModel) -> ModelInfo:
    meta = model.metadata
    arch = _str(meta.get("general.architecture"))

    def arch_int(key: str):
        return _int(meta.get(f"{arch}.{key}")) if arch else None

    params = sum(t.n_elems for t in model.tensors.values())
    experts = [t for name, t in model.tensors.items() if name.endswith("_exps.weight")]
    n_expert, n_used = arch_int("expert_count"), arch_int("expert_used_count")
    expert_params = sum(t.n_elems for t in experts)
    active = params - expert_params + (expert_params * n_used // n_expert if n_expert and n_used else 0)
    tensor_bytes = sum(t.nbytes for t in model.tensors.values())
    shares: dict[str, list[int]] = {}
    for t in model.tensors.values():
        count_bytes = shares.setdefault(t.type.name, [0, 0])
        count_bytes[0] += 1
        count_bytes[1] += t.nbytes
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = len(tokens) if isinstance(tokens, list) else arch_int("vocab_size")
    tok_model = _str(meta.get("tokenizer.ggml.model"))
    heads = _int_or_ints(meta.get(f"{arch}.attention.head_count"))
    embd = arch_int("embedding_length")
    head_dim = arch_int("attention.key_length")
    if head_dim is None and isinstance(heads, int) and heads and embd:
        head_dim = embd // heads
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    pattern = "".join("S" if s else "G" for s in pattern) if isinstance(pattern, np.ndarray) else None
    return ModelInfo(
        path=str(model.path), file_size=model.file_size, parts=len(model.files), gguf_version=model.version,
        architecture=arch, name=_str(meta.get("general.name")), parameters=params,
        bits_per_weight=round(tensor_bytes * 8 / params, 2) if params else 0.0,
        context_length=arch_int("context_length"), block_count=arch_int("block_count"),
        deltanet_layers=len({name.split(".")[1] for name in model.tensors if name.endswith(".ssm_a")}),
        nextn_layers=arch_int("nextn_predict_layers") or 0,
        embedding_length=embd, feed_forward_length=_int_or_ints(meta.get(f"{arch}.feed_forward_length")),
        head_count=heads, head_count_kv=_int_or_ints(meta.get(f"{arch}.attention.head_count_kv")),
        head_dim=head_dim, layer_pattern=pattern, sliding_window=arch_int("attention.sliding_window"),
        head_dim_swa=arch_int("attention.key_length_swa"), shared_kv_layers=arch_int("attention.shared_kv_layers") or 0,
        embedding_length_per_layer=arch_int("embedding_length_per_layer_input") or 0, tokenizer_model=tok_model, tokenizer_kind=TOKENIZER_KINDS.get(tok_model, tok_model),
        tokenizer_pre=_str(meta.get("tokenizer.ggml.pre")), vocab_size=vocab,
        expert_count=n_expert or None, expert_used_count=n_used if n_expert else None,
        expert_feed_forward_length=(arch_int("expert_feed_forward_length") or arch_int("feed_forward_length"))
        if n_expert else None,
        expert_bytes=sum(t.nbytes for t in experts), active_parameters=active,
        chat_template=isinstance(meta.get("tokenizer.chat_template"), str), tensor_count=len(model.tensors),
        quant_mix=[QuantShare(name, n, b, TYPES_BY_NAME[name].block_bytes * 8 / TYPES_BY_NAME[name].block_elems)
                   for name, (n, b) in
                   sorted(shares.items(), key=lambda item: -item[1][1])],
    )


def _str(v) -> str | None:
    return v if isinstance(v, str) else None


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _int_or_ints(v) -> int | list[int] | None:
    if isinstance(v, np.ndarray) and v.dtype.kind in "iu":
        return v.tolist()
    return _int(v)
