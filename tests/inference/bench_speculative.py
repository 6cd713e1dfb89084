"""Speculative decoding's speed: what a forward of n tokens costs against a one-token step, and a greedy reply with
speculation against the same reply without it.

    python tests/inference/bench_speculative.py [MODEL] [--reps 5] [-n 128]                 # prompt lookup, a code edit
    python tests/inference/bench_speculative.py MODEL --device cuda --spec mtp --synth 0.7  # 70% of drafts kept

--synth F: llama.cpp's synthetic acceptance (llama-server --spec-synth-rates F,F^2,..., benchmarking only): each draft
is kept with probability F while those before it were, whatever the model says, and the model's own token follows the
kept ones; every step drafts --spec-k tokens (--spec auto: as many as its running rate says). The reply's text is
then not the model's, but each step does the work of a real one (the verify step, the rewind of what it rejected, the
drafter's catch-up on what it kept), so the reply's speed is that of a reply whose drafts agree at that rate: random
weights, whose drafts agree with nothing, measure it so, and llama.cpp's server measures its own the same way
(tests/inference/bench_llamacpp_spec.py). With --temperature T > 0 (sampled replies, both of them) a kept run is drawn
the same way, and each row the rule would read still gets its distribution (speculative.accepted_tokens' host work),
the token after the run drawn from the model's.
--spec mtp: drafts from the file's MTP block; auto: the block as --spec auto takes it (its costs measured, dropped
where it cannot pay); ngram (the default): prompt lookup. MODEL defaults to the default model
(the packaged SmolLM2).
The step costs are verify steps of 1 to 5 tokens (engine._verify: captured on the GPU), each rewound to its first
token as a step that kept no draft is, against the plain decode step (the GPU's graph) of a greedy reply. Replies
alternate (plain, speculative, plain, ...) so that both see the same load; the load average is printed beside each.
"""
import argparse
import os
import statistics
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from inference import load, speculative  # noqa: E402
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


@contextmanager
def synthetic_acceptance(rate: float, seed: int = 0, fixed_length: bool = True):
    """Greedy speculative replies under --synth rate (llama.cpp's server_sample_and_accept_synth, server-context.cpp):
    the drafts kept are a run of draws below rate, the token after them the model's argmax there; fixed_length:
    DraftLength held at k_max, as llama.cpp drafts its n_max under --spec-draft-p-min 0 (else its own choice, as
    --spec auto's)."""
    rng = np.random.default_rng(seed)

    def kept_run(n_drafts: int) -> int:
        kept = 0
        while kept < n_drafts and rng.random() < rate:
            kept += 1
        return kept

    def kept_tokens(argmax: np.ndarray, drafts: list[int]) -> list[int]:
        kept = kept_run(len(drafts))
        return drafts[:kept] + [int(argmax[kept])]

    def kept_sampled(logits, history, draft, params, rng_) -> list[int]:
        kept = kept_run(len(draft.tokens))
        for i in range(kept):  # the rows the rule reads before it keeps each draft
            speculative.distribution(logits[i], params, speculative._recent(history + draft.tokens[:i]))
        ids, p = speculative.distribution(logits[kept], params, speculative._recent(history + draft.tokens[:kept]))
        return draft.tokens[:kept] + [speculative._draw(ids, p, rng_)]

    with (mock.patch.object(speculative, "greedy_tokens", kept_tokens),
          mock.patch.object(speculative, "accepted_tokens", kept_sampled),
          mock.patch.object(speculative.DraftLength, "__call__", lambda self: self.k_max) if fixed_length
          else nullcontext()):
        yield


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model", nargs="?")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("-n", type=int, default=128)
    p.add_argument("--device", default="cpu")
    # auto: the file's MTP block as --spec auto takes it (measured costs; dropped where it cannot pay), each step's
    # draft length its own
    p.add_argument("--spec", choices=("ngram", "mtp", "auto"), default="ngram")
    p.add_argument("--synth", type=float, metavar="F", help="synthetic acceptance: each draft kept with prob. F")
    p.add_argument("--spec-k", type=int, default=3)
    p.add_argument("--temperature", type=float, default=0.0, help="of both replies (default 0: greedy)")
    args = p.parse_args()
    engine = load(args.model, device=args.device, ctx=2048, spec="off" if args.spec == "ngram" else args.spec,
                  spec_k=args.spec_k)
    spec, engine.speculation = engine.speculation or Speculation("ngram", PromptLookup(), args.spec_k), None
    engine.warm_up()
    prompt = EDIT if engine.chat_template else EDIT[0]["content"]  # tests/synth_gguf.py's files have no template
    print(f"{engine.device}, load average {os.getloadavg()[0]:.2f}")
    costs, plain = step_costs(engine, args.reps)
    print("plain decode step: " + " ".join(f"{t * 1e3:.2f}" for t in plain) + " ms")
    for n, times in costs.items():  # against the best round's plain step: the first one's reply captures its graph
        print(f"verify step of {n} tokens: " + " ".join(f"{t * 1e3:.2f}" for t in times) + " ms"
              f" | {np.median(times) / min(plain):.2f}x a plain step")
    name = spec.kind if args.synth is None else f"{spec.kind}, {args.synth:.0%} kept (synthetic)"
    for speculation in (None, spec):  # the first reply of each captures what it runs (the GPU's graphs): not timed
        engine.reset()
        engine.speculation = speculation
        with synthetic_acceptance(args.synth, 0, args.spec != "auto") if speculation and args.synth is not None \
                else nullcontext():
            list(engine.generate(prompt, max_tokens=16, temperature=args.temperature, seed=0, stop=()))
    texts = {}
    for rep in range(args.reps):
        for label, speculation in (("plain", None), (name, spec)):
            engine.reset()
            engine.speculation = speculation
            with synthetic_acceptance(args.synth, rep, args.spec != "auto") if speculation and args.synth is not None \
                    else nullcontext():
                *pieces, stats = engine.generate(prompt, max_tokens=args.n, temperature=args.temperature,
                                                 seed=rep, stop=())
            texts.setdefault(label, "".join(pieces))
            print(f"{rep} {label}: {stats.generated_tokens} tokens, {stats.generation_tok_s:.1f} tok/s, drafted "
                  f"{stats.drafted}, accepted {stats.accepted} | load average {os.getloadavg()[0]:.2f}", flush=True)
    engine.speculation = None
    if args.synth is None and args.temperature <= 0:  # a synthetic acceptance's reply is not the model's
        print("the same text:", len(set(texts.values())) == 1)


if __name__ == "__main__":
    main()
