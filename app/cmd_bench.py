"""`gguf-chat bench MODEL -p 128 -n 64`: prompt and generation speed, like llama-bench.

With --compare-llamacpp the same tests run on llama.cpp's CPU build (llama-cpp-python) in the same process,
so the two rows are measured under the same load.
"""
import json
import statistics
import sys
import time
from pathlib import Path

from app.device_args import add_device_args, load_options, speculation_summary
from models.errors import UserError


class BenchError(UserError):
    pass


def register(sub) -> None:
    p = sub.add_parser("bench", help="measure prompt and generation speed (tok/s)")
    p.add_argument("model", help="a .gguf path, owner/repo[:QUANT] or a pulled name")
    p.add_argument("-p", "--n-prompt", type=int, default=128, help="prompt tokens of the pp test (default 128)")
    p.add_argument("-n", "--n-gen", type=int, default=64, help="generated tokens of the tg test (default 64)")
    p.add_argument("-r", "--repetitions", type=int, default=3, help="runs of each test (default 3)")
    p.add_argument("-d", "--depth", type=int, default=0, help="tokens already in the context (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    add_device_args(p)
    p.add_argument("--compare-llamacpp", action="store_true", help="also run llama.cpp (llama-cpp-python) on the CPU")
    p.add_argument("--threads", type=int, default=2, help="llama.cpp threads (default 2)")
    p.set_defaults(func=run)


def _random_prompts(n_vocab: int, n: int, count: int, seed: int = 0) -> list[list[int]]:
    """Distinct random token sequences, so no run reuses another's cache."""
    import numpy as np  # noqa: PLC0415  (heavy: only when a bench runs)
    rng = np.random.default_rng(seed)
    return [rng.integers(100, min(n_vocab, 30000), n).tolist() for _ in range(count)]


def bench_ours(engine, n_prompt: int, n_gen: int, reps: int, depth: int = 0,
               drafts: list | None = None) -> dict[str, list[float]]:
    """pp: n_prompt new tokens after depth cached ones; tg: n_gen decode steps after depth (+4) tokens. Each
    test runs once more first, untimed, as llama-bench warms up each test: what a first run pays once (JIT,
    graph capture, cuBLAS, pinned host memory for the recurrent state's checkpoints) is not in the figures.
    drafts: gets (drafted, accepted) of each timed tg run (speculative decoding)."""
    pp, tg = [], []
    vocab = engine.config.n_vocab
    # each run from an empty context, as llama-bench clears its memory between runs: no run's checkpoints hold
    # host memory that the next must take anew (a prompt's end still copies the recurrent state to the host)
    for i, (context, ids) in enumerate(zip(_random_prompts(vocab, depth, reps + 1, seed=2),
                                           _random_prompts(vocab, n_prompt, reps + 1))):
        engine.reset()
        if depth:
            list(engine.generate(context, max_tokens=1, temperature=0))  # cached, so only ids are timed
        stats = list(engine.generate(context + ids, max_tokens=1, temperature=0))[-1]
        pp += [stats.prompt_tok_s] if i else []
    for i, ids in enumerate(_random_prompts(vocab, depth + 4, reps + 1, seed=1)):
        engine.reset()
        # sampled, not greedy, so a random prompt rarely ends at once; the first token comes from the
        # prompt's logits, so n tokens are n - 1 decode steps, which is what is counted (one more where an
        # end-of-generation token, not counted in generated_tokens, ended it)
        stats = list(engine.generate(ids, max_tokens=n_gen + 1, temperature=1.0, seed=i))[-1]
        tg += [(stats.generated_tokens - 1 + (stats.finish_reason == "stop")) / stats.generation_seconds] if i else []
        if i and drafts is not None:
            drafts.append((stats.drafted, stats.accepted))
    at = f" @ d{depth}" if depth else ""
    return {f"pp{n_prompt}{at}": pp, f"tg{n_gen}{at}": tg}


def llamacpp_way(path: Path) -> bool:
    """Whether llama.cpp runs this model with its extra buffer types (AMX, repacked weights: as fast as it goes),
    probed in a child process, as its AMX path kills the process on some VMs; without them, said on stderr, where
    they fail; a BenchError where llama.cpp fails either way."""
    from app.llamacpp_peer import probe  # noqa: PLC0415
    try:
        import llama_cpp  # noqa: F401, PLC0415
    except ImportError:
        raise BenchError("--compare-llamacpp needs llama-cpp-python: pip install llama-cpp-python") from None
    why = probe(path, extra_buffer_types=True)
    if not why:
        return True
    why_not = probe(path, extra_buffer_types=False)
    if why_not:
        raise BenchError(f"llama.cpp cannot run {path.name} here ({why_not})")
    print(f"llama.cpp: its extra buffer types (AMX, repacked weights) fail on this machine ({why}): measured "
          "without them", file=sys.stderr)
    return False


def bench_llamacpp(path: Path, n_vocab: int, n_prompt: int, n_gen: int, reps: int, threads: int) -> dict:
    from app.llamacpp_peer import llama  # noqa: PLC0415
    llm = llama(path, extra_buffer_types=llamacpp_way(path), n_ctx=n_prompt + n_gen + 8, n_batch=max(n_prompt, 8),
                n_threads=threads, n_threads_batch=threads, verbose=False)
    pp, tg = [], []
    prompts = _random_prompts(n_vocab, n_prompt, reps + 1)
    llm.eval(prompts[-1][:8])  # warm up
    for ids in prompts[:reps]:
        llm.reset()
        t = time.perf_counter()
        llm.eval(ids)
        pp.append(n_prompt / (time.perf_counter() - t))
    for ids in _random_prompts(n_vocab, n_gen + 1, reps, seed=1):
        llm.reset()
        llm.eval(ids[:1])
        t = time.perf_counter()
        for token in ids[1:]:  # one decode step per token, as llama-bench's tg test
            llm.eval([token])
        tg.append(n_gen / (time.perf_counter() - t))
    llm.close()
    return {f"pp{n_prompt}": pp, f"tg{n_gen}": tg}


def _row(model: str, engine: str, test: str, rates: list[float]) -> str:
    spread = statistics.stdev(rates) if len(rates) > 1 else 0.0
    return f"| {model} | {engine} | {test} | {statistics.mean(rates):.2f} ± {spread:.2f} |"


def run(args) -> int:
    from app.progress import DownloadBar  # noqa: PLC0415
    from inference import load  # noqa: PLC0415
    if args.n_prompt < 1 or args.n_gen < 1 or args.repetitions < 1 or args.depth < 0:
        raise BenchError("-p, -n and -r must be at least 1, and -d at least 0")
    if args.compare_llamacpp and args.depth:
        raise BenchError("--compare-llamacpp measures without --depth")
    engine = load(args.model, ctx=args.depth + max(args.n_prompt, 4) + args.n_gen + 8, progress=DownloadBar(),
                  **load_options(args))
    name = engine.path.name
    k, n = engine.placement.n_gpu_layers, engine.config.n_layers
    share = f" (GPU share {engine.gpu_share.share:.2f})" if engine.gpu_share else ""
    if engine.gpu_share:
        print(engine.gpu_share.describe(), file=sys.stderr)  # the share, its pinned memory and its ring
    ours = f"gguf-chat {engine.device}" + (f" {k}/{n} layers{share}" if 0 < k < n else "") + \
        (" no-graph" if args.no_graph and engine.device == "cuda" else "")
    spec = engine.speculation
    ours += f" spec {spec.kind} k{spec.k_max}" if spec else ""
    drafts = []
    results = [(ours, test, rates) for test, rates in
               bench_ours(engine, args.n_prompt, args.n_gen, args.repetitions, args.depth, drafts).items()]
    drafted, accepted = (sum(d[0] for d in drafts), sum(d[1] for d in drafts))
    if spec:  # random prompts: what the drafts of a real reply would be kept is not measured here
        print(f"speculative ({spec.kind}) in tg: {speculation_summary(drafted, accepted)}", file=sys.stderr)
    if args.compare_llamacpp:
        results += [(f"llama.cpp cpu {args.threads}t", test, rates) for test, rates in
                    bench_llamacpp(engine.path, engine.config.n_vocab, args.n_prompt, args.n_gen,
                                   args.repetitions, args.threads).items()]
    if args.json:
        print(json.dumps({"model": name, "results": [
            {"engine": who, "test": test, "tok_s": statistics.mean(rates), "runs": rates}
            for who, test, rates in results]} | ({"drafted": drafted, "accepted": accepted} if spec else {})))
        return 0
    print("| model | engine | test | t/s |")
    print("| --- | --- | --- | ---: |")
    for who, test, rates in results:
        print(_row(name, who, test, rates))
    return 0
