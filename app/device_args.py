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


def add_expert_args(p) -> None:
    """Where a mixture of experts keeps its experts (run, chat, bench, serve and info --plan)."""
    p.add_argument("--cpu-moe", action="store_true",
                   help="a model with experts: keep every layer's experts in host memory, the rest on the GPU")
    p.add_argument("--n-cpu-moe", metavar="N",
                   help="a model with experts: keep the experts of the first N layers in host memory (default: as "
                        "few as make the model fit in VRAM, before any whole layer moves to the CPU)")


def load_options(args) -> dict:
    """The keyword arguments of inference.load for these flags (bad values raise a UserError)."""
    from inference.placement import (  # noqa: PLC0415
        DEFAULT_GPU_SHARE, parse_cpu_moe, parse_gpu_layers, parse_gpu_share, parse_vram_budget)

    return {"device": args.device, "gpu_layers": parse_gpu_layers(args.gpu_layers),
            "vram_budget": parse_vram_budget(args.vram_budget) if args.vram_budget else None,
            "cuda_graph": not args.no_graph, "cpu_moe": parse_cpu_moe(args.cpu_moe, args.n_cpu_moe),
            "gpu_share": DEFAULT_GPU_SHARE if args.gpu_share is None else parse_gpu_share(args.gpu_share)}
