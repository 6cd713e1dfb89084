"""Prompt and generation speed of the engine, as llama-bench measures it (pp512 / tg128):

    python -m inference.bench_engine MODEL.gguf [--device cuda] [--prompt 512] [--gen 128] [--depth 0]

prompt: a fresh context of --prompt random tokens, processed in the engine's chunks. generate: --gen greedy
tokens after a prompt of max(1, --depth) tokens, each a decode step (on the GPU: the captured graph, then the same step
eagerly). Prints the median of --reps runs after one warm-up run.
"""
import argparse
import statistics
import time

import numpy as np

from inference import load
from inference.sampling import SamplingParams


def _sync(engine) -> None:
    if engine._decode is not None:
        engine._decode.wait()


def prompt_seconds(engine, ids: list[int]) -> float:
    engine._cached = []
    t = time.perf_counter()
    engine._prefill(ids, all_logits=False)
    _sync(engine)
    return time.perf_counter() - t


def generate_seconds(engine, prompt: list[int], n: int, decode) -> float:
    """Seconds for n decode steps after the prompt (greedy; the first token's sampling excluded)."""
    engine._cached = []
    logits = engine._prefill(prompt, all_logits=False)
    params = SamplingParams(temperature=0)
    if decode is None:
        tokens = engine._host_tokens(logits, params, None, prompt)
    else:
        tokens = decode.tokens(logits, params, None, prompt)
    next(tokens)
    t = time.perf_counter()
    for i in range(n):
        engine._cached.append(0)  # the host path reads the position from the cache's length
        next(tokens)
    return time.perf_counter() - t


def median_of(f, reps: int) -> float:
    f()  # warm-up: compilation, the graph's capture
    return statistics.median(f() for _ in range(reps))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--depth", type=int, default=0, help="tokens in the context before generating")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    t = time.perf_counter()
    engine = load(args.model, device=args.device, ctx=max(args.prompt, args.depth) + args.gen + 16)
    print(f"{args.model}: loaded in {time.perf_counter() - t:.1f} s on {args.device}", flush=True)
    ids = np.random.default_rng(0).integers(3, engine.config.n_vocab, max(args.prompt, args.depth, 1)).tolist()
    context = ids[:max(1, args.depth)]
    ids = ids[:args.prompt]
    pp = args.prompt / median_of(lambda: prompt_seconds(engine, ids), args.reps)
    print(f"prompt {args.prompt}: {pp:.1f} tok/s", flush=True)
    if engine._decode is None:
        tg = args.gen / median_of(lambda: generate_seconds(engine, context, args.gen, None), args.reps)
        print(f"generate {args.gen} after {len(context)}: {tg:.1f} tok/s", flush=True)
        return
    from inference.cuda_graph import DecodeStep  # noqa: PLC0415
    eager = DecodeStep(engine._be, engine.config, engine._weights, use_graph=False)
    for name, decode in (("graph", engine._decode), ("eager", eager)):
        tg = args.gen / median_of(lambda: generate_seconds(engine, context, args.gen, decode), args.reps)
        print(f"generate {args.gen} after {len(context)} ({name}): {tg:.1f} tok/s", flush=True)


if __name__ == "__main__":
    main()
