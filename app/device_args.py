"""The flags that say where a model runs, shared by run, chat and bench, and what they mean to inference.load."""


def add_device_args(p) -> None:
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="where to run (default auto: cuda when CuPy sees a GPU)")
    p.add_argument("--gpu-layers", "-ngl", default="auto", metavar="N",
                   help="how many of the last layers run on the GPU, the rest on the CPU (default auto: all that fit)")
    p.add_argument("--vram-budget", metavar="GB", help="use at most this much VRAM, as on a smaller card (e.g. 6, 6.5GiB)")
    add_expert_args(p)
    p.add_argument("--gpu-share", metavar="F",
                   help="with layers on the CPU: the fraction of their weights the GPU multiplies each token, streamed "
                        "over PCIe from pinned host memory (default 0.4; 0: off)")
    p.add_argument("--no-graph", action="store_true", help="GPU: run each decode step eagerly, not as a CUDA graph")
    add_spec_args(p)


def add_spec_args(p) -> None:
    """Speculative decoding (inference/speculative.py)."""
    p.add_argument("--spec", default="auto", choices=["auto", "draft", "mtp", "ngram", "off"],
                   help="speculative decoding: draft tokens and check them in one step (default auto: with --draft "
                        "when one is given, else with the model's own MTP block where its file has one and it pays "
                        "(CPU: measured before the first reply), else off; mtp: that block (Qwen3.5); ngram: drafts "
                        "copied from the prompt and reply, pays where the reply quotes them)")
    p.add_argument("--spec-k", type=int, default=None, metavar="N",
                   help="at most N drafts a step (default 3: a CPU step of up to 4 tokens costs about one token's)")
    p.add_argument("--draft", metavar="MODEL",
                   help="a small model with the same vocabulary that drafts for the model (--spec draft)")


def add_expert_args(p) -> None:
    """Where a mixture of experts keeps its experts (run, chat, bench, serve and info --plan)."""
    p.add_argument("--cpu-moe", action="store_true",
                   help="a model with experts: keep every layer's experts in host memory, the rest on the GPU")
    p.add_argument("--n-cpu-moe", metavar="N",
                   help="a model with experts: keep the experts of the first N layers in host memory (default: as "
                        "few as make the model fit in VRAM, before any whole layer moves to the CPU)")


def load_options(args) -> dict:
    """The keyword arguments of inference.load for these flags (bad values raise a UserError)."""
    from inference.speculative import SPEC_K, check_spec_options  # noqa: PLC0415
    from inference.placement import (  # noqa: PLC0415
        DEFAULT_GPU_SHARE, parse_cpu_moe, parse_gpu_layers, parse_gpu_share, parse_vram_budget)

    spec_k = SPEC_K if args.spec_k is None else args.spec_k
    check_spec_options(args.spec, spec_k, args.draft)
    return {"device": args.device, "gpu_layers": parse_gpu_layers(args.gpu_layers),
            "vram_budget": parse_vram_budget(args.vram_budget) if args.vram_budget else None,
            "cuda_graph": not args.no_graph, "cpu_moe": parse_cpu_moe(args.cpu_moe, args.n_cpu_moe),
            "gpu_share": DEFAULT_GPU_SHARE if args.gpu_share is None else parse_gpu_share(args.gpu_share),
            "spec": args.spec, "spec_k": spec_k, "draft": args.draft}


def speculation_summary(drafted: int, accepted: int) -> str:
    """The drafts checked and kept, for run --verbose and bench."""
    return f"{drafted} drafted, {accepted} accepted" + (f" ({accepted / drafted:.0%})" if drafted else "")
