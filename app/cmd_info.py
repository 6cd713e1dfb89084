"""`gguf-chat info MODEL [--json]`: what a model file is, without reading its weights."""
import json

from app.device_args import add_expert_args


def register(sub) -> None:
    p = sub.add_parser("info", help="show a model's architecture, size, quant mix and tokenizer")
    p.add_argument("model", help="a .gguf path (any part of a split model), owner/repo[:QUANT] or a pulled name")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plan", action="store_true", help="also show which layers would go on the GPU and why")
    p.add_argument("--ctx", type=int, help="--plan: context size in tokens (default: as run and chat choose it)")
    p.add_argument("--gpu-layers", default="auto", help="--plan: 'auto' or how many of the last layers (default auto)")
    p.add_argument("--vram-budget", metavar="GB", help="--plan: plan as on a card of this size (e.g. 6, 6.5GiB)")
    add_expert_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from app.progress import DownloadBar
    from models.gguf import open_gguf
    from models.model_info import summarize
    from models.model_ref import resolve_model

    with open_gguf(resolve_model(args.model, progress=DownloadBar())) as model:
        info = summarize(model)
        plan = placement_summary(model, args) if args.plan else None
    if args.json:
        print(json.dumps(info.to_dict() | ({"plan": plan} if plan else {})))
    else:
        print(format_info(info) + (f"\n{plan}" if plan else ""))
    return 0


def placement_summary(model, args) -> str:
    """Where the layers would run, counted before anything is uploaded (what load() will decide)."""
    from inference.engine import plan_gpu
    from inference.placement import free_vram, parse_cpu_moe, parse_gpu_layers, parse_vram_budget
    from models.config import config_from_metadata

    cfg = config_from_metadata(model.metadata)
    budget = parse_vram_budget(args.vram_budget) if args.vram_budget else None
    free = free_vram()
    if free is None and budget is None:
        return "placement: no CUDA GPU found (CuPy, driver, device): every layer on the CPU; --vram-budget plans for a card"
    plan = plan_gpu(model, cfg, args.ctx, parse_gpu_layers(args.gpu_layers), budget, budget if free is None else free,
                    parse_cpu_moe(args.cpu_moe, args.n_cpu_moe))
    return plan.summary()


def format_info(i) -> str:
    """A models.model_info.ModelInfo as aligned lines, like llama.cpp's load log but compact."""
    def opt(v) -> str:
        return "?" if v is None else str(v)

    heads = by_layer(i.head_count, i.layer_pattern) + (
        "" if i.head_count_kv is None else f" (kv {by_layer(i.head_count_kv, i.layer_pattern)})")
    if i.head_dim is not None:
        heads += f", head dim {i.head_dim}" + (f" (sliding {i.head_dim_swa})" if i.head_dim_swa else "")
    tokenizer = "?" if i.tokenizer_model is None else f"{i.tokenizer_kind} ({i.tokenizer_model}"
    if i.tokenizer_model is not None:
        tokenizer += f", pre {i.tokenizer_pre})" if i.tokenizer_pre else ")"
    parts = "" if i.parts == 1 else f", {i.parts} parts"
    layers = opt(i.block_count)
    if i.block_count is not None and (i.deltanet_layers or i.nextn_layers):
        trunk = i.block_count - i.nextn_layers
        kinds = [f"{i.deltanet_layers} Gated DeltaNet, {trunk - i.deltanet_layers} attention"] if i.deltanet_layers else []
        kinds += [f"{i.nextn_layers} MTP"] if i.nextn_layers else []
        layers += f" ({', '.join(kinds)})"
    if i.layer_pattern:
        layers += f" ({layer_pattern(i.layer_pattern)}"
        layers += f"; S: a sliding window of {i.sliding_window} tokens, G: global" + (
            f"; the last {i.shared_kv_layers} reuse earlier layers' K/V" if i.shared_kv_layers else "") + ")"
    rows = [
        ("file", f"{i.path} ({mib(i.file_size)}, GGUF v{i.gguf_version}{parts})"),
        ("architecture", opt(i.architecture) + (f" ({i.name})" if i.name else "")),
        ("parameters", f"{count(i.parameters)} ({i.bits_per_weight} bits per weight)"),
        ("context", opt(i.context_length)),
        ("layers", layers),
        ("heads", heads),
        ("embedding", opt(i.embedding_length)),
        ("feed-forward", by_layer(i.feed_forward_length, None)),
        *([("per-layer emb", f"{i.embedding_length_per_layer} a layer")] if i.embedding_length_per_layer else []),
        *([("experts", f"{i.expert_count}, {opt(i.expert_used_count)} used a token, FFN {opt(i.expert_feed_forward_length)} "
                       f"each; {mib(i.expert_bytes)} ({i.expert_bytes / i.file_size:.0%} of the file)"),
           ("active", f"{count(i.active_parameters)} parameters a token")] if i.expert_count else []),
        ("tokenizer", tokenizer),
        ("vocabulary", opt(i.vocab_size)),
        ("chat template", "yes" if i.chat_template else "none"),
        ("tensors", str(i.tensor_count)),
    ]
    width = max(len(label) for label, _ in rows)
    lines = [f"{label:<{width}}  {value}" for label, value in rows]
    for n, q in enumerate(i.quant_mix):
        label = "quant mix" if n == 0 else ""
        tensors = f"{q.tensors} tensor" + ("" if q.tensors == 1 else "s")
        lines.append(f"{label:<{width}}  {q.type:<7} {tensors:>12}  {mib(q.bytes):>11}  {q.bits_per_weight:5.2f} bpw")
    return "\n".join(lines)


def by_layer(value: int | list[int] | None, pattern: str | None) -> str:
    """A count a file gives once or per layer: one value where the layers agree, one for each kind of layer where
    those agree (pattern: layer_pattern's S and G), else the list."""
    if not isinstance(value, list):
        return "?" if value is None else str(value)
    if len(set(value)) == 1:
        return str(value[0])
    if pattern and len(pattern) == len(value):
        kinds = {k: {v for v, p in zip(value, pattern) if p == k} for k in "SG"}
        if all(len(vs) == 1 for vs in kinds.values()):
            return f"{kinds['S'].pop()} sliding, {kinds['G'].pop()} global"
    return ", ".join(map(str, value))


def layer_pattern(pattern: str) -> str:
    """A layer pattern ("SSSSSGSSSSSG") as its shortest repeating unit times its count ("SSSSSG x2"), a pattern that
    does not repeat as it is."""
    for n in range(1, len(pattern) // 2 + 1):
        if len(pattern) % n == 0 and pattern[:n] * (len(pattern) // n) == pattern:
            return f"{pattern[:n]} x{len(pattern) // n}"
    return pattern


def mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"
