"""Speculative decoding's speed: what a forward of n tokens costs against a one-token step, and a greedy reply with
speculation against the same reply without it.

    python tests/inference/bench_speculative.py [MODEL] [--reps 5] [-n 128]      # prompt lookup, a code edit
    python tests/inference/bench_speculative.py MODEL --device cuda --replay 0.7  # forced acceptance

--replay F: drafts replayed from the model's own greedy reply (as its verify steps give it: replayed_reply), each
right with probability F (random weights keep no real drafts; this is the issue's forced-acceptance mode). MODEL
defaults to the default model (the packaged SmolLM2).
The step costs are verify steps of 1 to 5 tokens (engine._verify: captured on the GPU), each rewound to its first
token as a step that kept no draft is, against the plain decode step (the GPU's graph) of a greedy reply. Replies
alternate (plain, speculative, plain, ...) so that both see the same load; the load average is printed beside each.
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
from tests.inference.test_speculative import Replay  # noqa: E402

CODE = '''def moving_average(values, window):
    result = []
    for i in range(len(values) - window + 1):
        chunk = values[i:i + window]
        result.append(sum(chunk) / window)
    return result
'''
EDIT = [{"role": "user", "content": "Rename the variable `chunk` to `segment` in this Python function and show the "
                                    "whole function:\n\n" + CODE}]


def step_costs(engine, reps: int) -> tuple[dict[int, list[float]], list[float]]:
    """({n: median seconds of a verify step of n = 1..5 tokens a round}, seconds of a plain decode step a round) after
    a 300-token context, reps rounds of n alternated. Each verify step goes on one position from the last and is
    rewound to its first token; the logits come back to the host, as a reply's do."""
    ids = engine.tokenizer.encode("Hello, world. Hello again, world. " * 40)[:300]
    out, plain = {}, []
    for _ in range(reps):
        engine.reset()
        *_, stats = engine.generate(ids, max_tokens=65, temperature=0, stop=())
        plain.append(1 / stats.generation_tok_s)
        engine.reset()
        list(engine.generate(ids, max_tokens=1, temperature=0))
        engine.speculation = Speculation("ngram", PromptLookup(), 4)  # steps of up to 5 tokens, captured on the GPU
        pos = len(ids)
        for n in range(1, 6):
            times = []
            for _ in range(15):
                t = time.perf_counter()
                engine._verify((ids * 2)[pos % 300:pos % 300 + n], pos)
                times.append(time.perf_counter() - t)
                engine._rewind_states(pos + 1)
                pos += 1
            out.setdefault(n, []).append(statistics.median(times))
        engine.speculation = None
    return out, plain


def replayed_reply(engine, prompt, n: int, k: int) -> list[int]:
    """The context of a greedy reply of n tokens as speculative decoding gives it when every draft is kept: the plain
    reply replayed as drafts, then that reply replayed, until it repeats (at most 4 rounds). On the GPU a verify
    step's matmuls add in another order than a decode step's, and random weights are full of near-ties, so the plain
    reply and the speculative one part within tens of tokens: drafts replayed from the plain one then go wrong from
    there on and measure nothing."""
    engine.reset()
    list(engine.generate(prompt, max_tokens=n, temperature=0))
    recorded = list(engine._cached)
    for _ in range(4):
        engine.reset()
        engine.speculation = Speculation("replay", Replay(recorded), k)
        list(engine.generate(prompt, max_tokens=n, temperature=0))
        engine.speculation = None
        if engine._cached == recorded:
            break
        recorded = list(engine._cached)
    return recorded


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model", nargs="?")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("-n", type=int, default=128)
    p.add_argument("--device", default="cpu")
    p.add_argument("--replay", type=float, metavar="F", help="forced acceptance: replayed drafts right with prob. F")
    p.add_argument("--spec-k", type=int, default=3)
    args = p.parse_args()
    engine = load(args.model, device=args.device, ctx=2048)
    engine.warm_up()
    prompt = EDIT if engine.chat_template else EDIT[0]["content"]  # tests/synth_gguf.py's files have no template
    print(f"{engine.device}, load average {os.getloadavg()[0]:.2f}")
    costs, plain = step_costs(engine, args.reps)
    print("plain decode step: " + " ".join(f"{t * 1e3:.2f}" for t in plain) + " ms")
    for n, times in costs.items():  # against the best round's plain step: the first one's reply captures its graph
        print(f"verify step of {n} tokens: " + " ".join(f"{t * 1e3:.2f}" for t in times) + " ms"
              f" | {np.median(times) / min(plain):.2f}x a plain step")
    if args.replay is None:
        drafter, name, recorded = PromptLookup(), "ngram", None
    else:
        recorded = replayed_reply(engine, prompt, args.n + 1, args.spec_k)
        drafter, name = Replay(recorded, args.replay), f"replay {args.replay}"
    texts, replayed = {}, []
    for rep in range(args.reps):
        for name, spec in (("plain", None), (name, Speculation(name, drafter, args.spec_k))):
            engine.reset()
            engine.speculation = spec
            *pieces, stats = engine.generate(prompt, max_tokens=args.n, temperature=0)
            texts.setdefault(name, "".join(pieces))
            if spec and recorded:
                replayed.append(engine._cached == recorded[:len(engine._cached)])
            print(f"{rep} {name}: {stats.generated_tokens} tokens, {stats.generation_tok_s:.1f} tok/s, drafted "
                  f"{stats.drafted}, accepted {stats.accepted} | load average {os.getloadavg()[0]:.2f}", flush=True)
    engine.speculation = None
    print("the same text:", len(set(texts.values())) == 1)
    if recorded:  # the drafts measured what they should only where the replies stayed on the recorded one
        print("each speculative reply the replayed one:", all(replayed))


if __name__ == "__main__":
    main()
