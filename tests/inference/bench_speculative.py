"""Speculative decoding on this CPU: what a verify step of n tokens costs against a one-token step, and a greedy
reply to a code-editing prompt with prompt lookup (--spec ngram) against the same reply without it.

    python tests/inference/bench_speculative.py [MODEL] [--reps 5] [-n 128]

MODEL defaults to the default model (the packaged SmolLM2); attention layers only (the step costs run the same
positions again, which a recurrent state cannot). Replies alternate (plain, ngram, plain, ...) so that both see the same load;
the load average is printed beside each run (other work shares the cores).
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from inference import load  # noqa: E402
from inference.speculative import PromptLookup, Speculation  # noqa: E402

CODE = '''def moving_average(values, window):
    result = []
    for i in range(len(values) - window + 1):
        chunk = values[i:i + window]
        result.append(sum(chunk) / window)
    return result
'''
EDIT = [{"role": "user", "content": "Rename the variable `chunk` to `segment` in this Python function and show the "
                                    "whole function:\n\n" + CODE}]


def step_costs(engine, reps: int) -> dict[int, list[float]]:
    """Median seconds of a forward of n = 1..5 tokens after a 300-token context, reps rounds of n alternated."""
    ids = engine.tokenizer.encode("Hello, world. Hello again, world. " * 40)[:300]
    engine.reset()
    list(engine.generate(ids, max_tokens=1, temperature=0))
    out = {}
    for _ in range(reps):
        for n in range(1, 6):
            times = []
            for _ in range(15):
                t = time.perf_counter()
                engine._run(ids[:n], len(ids), all_logits=n > 1)  # the same positions each time: a step, not a reply
                times.append(time.perf_counter() - t)
            out.setdefault(n, []).append(statistics.median(times))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model", nargs="?")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("-n", type=int, default=128)
    args = p.parse_args()
    engine = load(args.model, device="cpu", ctx=2048)
    engine.warm_up()
    print(f"load average {os.getloadavg()[0]:.2f}")
    costs = step_costs(engine, args.reps)
    for n, times in costs.items():
        print(f"forward of {n} tokens: " + " ".join(f"{t * 1e3:.1f}" for t in times) + " ms"
              f" | {np.median(times) / np.median(costs[1]):.2f}x one")
    texts = {}
    for rep in range(args.reps):
        for name, spec in (("plain", None), ("ngram", Speculation("ngram", PromptLookup(), 3))):
            engine.reset()
            engine.speculation = spec
            *pieces, stats = engine.generate(EDIT, max_tokens=args.n, temperature=0)
            texts.setdefault(name, "".join(pieces))
            print(f"{rep} {name}: {stats.generated_tokens} tokens, {stats.generation_tok_s:.1f} tok/s, drafted "
                  f"{stats.drafted}, accepted {stats.accepted} | load average {os.getloadavg()[0]:.2f}", flush=True)
    engine.speculation = None
    print("the same text:", texts["plain"] == texts["ngram"])


if __name__ == "__main__":
    main()
