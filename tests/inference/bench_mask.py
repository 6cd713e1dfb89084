"""Per-token cost of a JSON schema's token mask at a Qwen3-sized vocabulary (151,936 tokens), on this CPU.

The vocabulary is SmolLM2's 49,152 tokens and, to Qwen3's size, pairs of them joined (a real 150k BPE vocabulary's
tokens are mostly such joins). A compact JSON document that the schema accepts is fed token by token (SmolLM2's
tokens); each step's mask is timed, and so is what our sampler adds (bits to bools, the masked logits).

    python tests/inference/bench_mask.py                       # llguidance, in the project's venv
    python tests/inference/bench_mask.py --dump /tmp/vocab.pkl  # the vocabulary and tokens, for another engine's venv
    python tests/inference/bench_mask.py --engine xgrammar --load /tmp/vocab.pkl
    python tests/inference/bench_mask.py --model F.gguf --device cuda  # a reply's tok/s, constrained vs free
"""
import argparse
import json
import pickle
import statistics
import sys
import time
from pathlib import Path

import numpy as np

N_VOCAB = 151_936
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "languages", "address"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
                         "languages": {"type": "array", "items": {"type": "string", "enum": ["en", "fr", "de"]}},
                         "address": {"type": "object", "required": ["city"], "properties": {
                             "city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[A-Z0-9 ]{2,8}$"}}}}}
DOCUMENT = {"name": "Ada Lovelace, Countess of Lovelace", "age": 36, "languages": ["en", "fr"],
            "address": {"city": "London", "zip": "W1 4AB"}}


def vocabulary() -> tuple[list[bytes], int, list[int], object]:
    """(token bytes, eos id, the document's token ids, encode(bytes) -> ids) from SmolLM2's tokenizer, grown to
    N_VOCAB (its tokenizer never makes the joined tokens, as a real one makes few of them)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from models.gguf import open_gguf
    from models.packaged import smollm2_path
    from models.tokenizer import Tokenizer
    tok = Tokenizer(open_gguf(smollm2_path()).metadata)
    pieces = [b"\xff" + tok.tokens[i].encode() if tok.control[i] else tok.token_to_piece(i)
              for i in range(tok.vocab_size)]
    seen, rng = set(pieces), np.random.default_rng(0)
    normal = [p for p in pieces if p and not p.startswith(b"\xff")]
    while len(pieces) < N_VOCAB:
        a, b = rng.integers(len(normal), size=2)
        joined = normal[a] + normal[b]
        if joined not in seen:
            seen.add(joined)
            pieces.append(joined)
    ids = tok.encode(json.dumps(DOCUMENT, separators=(",", ":")), add_special=False)
    return pieces, min(tok.eog_ids), ids, lambda text: tok.encode(text.decode(errors="replace"), add_special=False)


def bench_llguidance(pieces, eos, ids, encode):
    import llguidance

    class Wrapped:
        tokens, eos_token_id, bos_token_id, special_token_ids = pieces, eos, None, []

        def __call__(self, text):  # llguidance tokenizes the bytes a grammar forces (without it: no mask)
            return encode(text)

    t = time.perf_counter()
    vocab = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Wrapped()), eos_token=eos)
    setup = time.perf_counter() - t
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, overrides={"whitespace_flexible": False})
    t = time.perf_counter()
    matcher = llguidance.LLMatcher(vocab, grammar)
    compile_s = time.perf_counter() - t
    bits = np.zeros((len(pieces) + 31) // 32, np.int32)

    def step(token):
        matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        assert bits[token // 32] >> (token % 32) & 1, f"token {token} masked out"
        assert matcher.consume_token(token), matcher.get_error()
        return bits
    return setup, compile_s, step


def bench_xgrammar(pieces, eos, ids, encode):
    import types
    def stand_in(name):  # a type that no real object is an instance of: dtypes, Tensor, tokenizer classes...
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {"__init__": lambda self, *args, **kwargs: None})
    for module in ("torch", "transformers"):  # xgrammar imports both (2+ GB with torch's CUDA wheels), unused here
        if module not in sys.modules:
            sys.modules[module] = types.ModuleType(module)
            sys.modules[module].__getattr__ = stand_in
    sys.modules["torch"].cuda = types.SimpleNamespace(is_available=lambda: False)
    import xgrammar
    t = time.perf_counter()
    info = xgrammar.TokenizerInfo(pieces, xgrammar.VocabType.RAW, stop_token_ids=[eos])
    compiler = xgrammar.GrammarCompiler(info)
    setup = time.perf_counter() - t
    t = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False, separators=(",", ":"))
    matcher = xgrammar.GrammarMatcher(compiled)
    compile_s = time.perf_counter() - t
    bits = np.zeros((1, (len(pieces) + 31) // 32), np.int32)

    def step(token):
        matcher.fill_next_token_bitmask(bits)
        assert bits[0, token // 32] >> (token % 32) & 1, f"token {token} masked out"
        assert matcher.accept_token(token)
        return bits[0]
    return setup, compile_s, step


def bench_replies(model: Path, device: str, runs: int, n: int) -> None:
    """Decode tok/s of n-token replies to one prompt, free and constrained by SCHEMA, alternated runs times (after
    one of each, which captures their steps): the mask's cost per token as a user's request pays it. Greedy, so a
    model of random weights repeats itself inside the schema's strings rather than ending early."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from inference import load
    from inference.grammar import Constraint, json_schema_grammar
    engine = load(model, device=device, ctx=1024)
    constraint = Constraint(json_schema_grammar(SCHEMA))
    ask = "Describe a person as JSON: name, age, languages and address."
    prompt = [{"role": "user", "content": ask}] if engine.chat_template else ask
    rates = {"free": [], "constrained": []}
    for r in range(runs + 1):
        for kind, c in (("free", None), ("constrained", constraint)):
            *_, stats = engine.generate(prompt, max_tokens=n, temperature=0, constraint=c)
            if r:
                rates[kind].append(stats.generation_tok_s)
            print(f"{kind}: {stats.generated_tokens} tokens, {stats.generation_tok_s:.1f} tok/s ({stats.finish_reason})"
                  + ("" if r else " (warm-up)"), flush=True)
    free, constrained = statistics.median(rates["free"]), statistics.median(rates["constrained"])
    print(f"{model.name} on {device}: free {free:.1f} tok/s, constrained {constrained:.1f} tok/s (medians of {runs}): "
          f"{100 * (free / constrained - 1):.1f}% more time a token constrained")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="llguidance", choices=["llguidance", "xgrammar"])
    ap.add_argument("--dump", type=Path)
    ap.add_argument("--load", type=Path)
    ap.add_argument("--model", type=Path, help="time replies of this model instead (bench_replies)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("-n", type=int, default=128, help="tokens a reply")
    args = ap.parse_args()
    if args.model:
        bench_replies(args.model, args.device, args.runs, args.n)
        return
    if args.load:
        (pieces, eos, ids), encode = pickle.loads(args.load.read_bytes()), None
    else:
        pieces, eos, ids, encode = vocabulary()
    if args.dump:
        args.dump.write_bytes(pickle.dumps((pieces, eos, ids)))
        return
    bench = {"llguidance": bench_llguidance, "xgrammar": bench_xgrammar}[args.engine]
    setup, compile_s, step = bench(pieces, eos, ids, encode)
    logits = np.random.default_rng(0).standard_normal(len(pieces)).astype(np.float32)
    masks, applies = [], []
    for token in ids:
        t = time.perf_counter()
        bits = step(token)
        t1 = time.perf_counter()
        allowed = np.unpackbits(bits.view(np.uint8), bitorder="little")[:len(pieces)].view(bool)
        np.where(allowed, logits, -np.inf)
        t2 = time.perf_counter()
        masks.append(t1 - t)
        applies.append(t2 - t1)
    ms = sorted(1e3 * m for m in masks)
    print(f"{args.engine}: vocab {len(pieces)}, {len(ids)} tokens; vocabulary setup {setup:.2f} s, schema compile "
          f"{1e3 * compile_s:.1f} ms; mask + consume per token: median {statistics.median(ms):.3f} ms, "
          f"p90 {ms[int(0.9 * len(ms))]:.3f} ms, max {ms[-1]:.3f} ms, mean {statistics.mean(ms):.3f} ms; "
          f"applying it (bits to bools, masked logits): median {1e3 * statistics.median(applies):.3f} ms")


if __name__ == "__main__":
    main()
