"""Constrained decoding: a grammar (a JSON schema, or Lark text that may hold JSON schemas) compiled by llguidance
against the model's vocabulary, giving the tokens allowed at each step of a reply.

llguidance takes the vocabulary as raw token bytes (control tokens as 0xFF + their text, as llama.cpp hands them
over), so our own GGUF tokenizer feeds it directly. Its mask for one step costs ~0.1 ms at a 150k vocabulary on
2 cores (BENCHMARKS.md), well under a CPU decode step.
"""
from dataclasses import dataclass
from functools import cache, lru_cache

import numpy as np

from models.errors import UserError
from models.tokenizer import Tokenizer

# JSON without free whitespace between its tokens: a model sampled at temperature 1 cannot pad a reply with
# newlines until max_tokens, and a small model stays on the compact form it was constrained to
JSON_OPTIONS = {"whitespace_flexible": False}


@cache
def _llguidance():
    """llguidance, imported with the first grammar: ~130 ms that a run, chat or server start without structured
    output does not pay (every start imports this module through the engine)."""
    import llguidance  # noqa: PLC0415
    return llguidance


class GrammarError(UserError, ValueError):
    """A schema or grammar the engine cannot compile; the message says why."""


def json_schema_grammar(schema: dict | None = None) -> str:
    """The grammar of JSON that validates against schema (None: any JSON object), checked to compile."""
    if schema is None:
        schema = {"type": "object"}
    if not isinstance(schema, dict):
        raise GrammarError("a JSON schema must be an object")
    try:
        grammar = _llguidance().LLMatcher.grammar_from_json_schema(closed(schema), overrides=JSON_OPTIONS)
    except ValueError as e:
        raise GrammarError(f"the JSON schema cannot be compiled: {e}") from None
    return checked(grammar, "the JSON schema")


DATA_KEYWORDS = ("const", "enum", "default", "examples")  # their values are JSON data, not schemas


def closed(schema):
    """schema with additionalProperties false in each object schema that names its properties and says nothing of
    others, as llama.cpp's grammars read such schemas: JSON valid by it is valid by schema, and a sampled model
    cannot wander off into keys of its own (agents' tool schemas seldom close their objects)."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: v if k in DATA_KEYWORDS else closed(v) for k, v in schema.items()}
    if isinstance(schema.get("properties"), dict) and not {"additionalProperties", "patternProperties"} & schema.keys():
        out["additionalProperties"] = False
    return out


def lark_grammar(lark: str) -> str:
    """The grammar of a Lark text (llguidance's dialect: `%json {schema}` inlines a JSON schema), checked."""
    return checked(_llguidance().LLMatcher.grammar_from_lark(lark), "the grammar")


def checked(grammar: str, what: str) -> str:
    error = _llguidance().LLMatcher.validate_grammar(grammar, None)
    if error:
        raise GrammarError(f"{what} cannot be compiled: {' '.join(error.split())}")  # on one line
    return grammar


@dataclass(frozen=True)
class Constraint:
    """What Engine.generate constrains a reply to. The grammar holds from the first token, except in a reasoning
    model's thinking: `after` is the text that ends it (the grammar starts on the token after it); `think` the text
    that opens it where the reply may or may not think (the first token is then that or the grammar's)."""
    grammar: str
    after: str = ""   # e.g. "</think>", harmony's "<|channel|>final<|message|>"; "": no thinking first
    think: str = ""   # e.g. "<think>": the reply may open its thinking with it (a prompt not already inside)


class Vocabulary:
    """The model's tokens as llguidance takes them; built once per tokenizer, by the first constrained reply
    (0.2 s at SmolLM2's 49k tokens; 2-3 s at 152k on 2 cores)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.n_vocab = tokenizer.vocab_size
        self.ll = _llguidance().LLTokenizer(_llguidance().TokenizerWrapper(_Wrapped(tokenizer)),
                                         eos_token=sorted(tokenizer.eog_ids))

    def token_id(self, text: str) -> int | None:
        """The id of a token whose whole text is text, or None."""
        return self.tokenizer.vocab.get(text)


class _Wrapped:
    """Our tokenizer in the shape _llguidance().TokenizerWrapper reads."""

    def __init__(self, tokenizer: Tokenizer):
        control = tokenizer.control
        self.tokens = [b"\xff" + tokenizer.tokens[i].encode() if control[i] else tokenizer.token_to_piece(i)
                       for i in range(tokenizer.vocab_size)]
        self.eos_token_id = min(tokenizer.eog_ids) if tokenizer.eog_ids else tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        self.special_token_ids = [int(i) for i in np.flatnonzero(control)]
        self._tokenizer = tokenizer

    def __call__(self, text: bytes) -> list[int]:  # the bytes a grammar forces, inside the reply
        return self._tokenizer.encode_continuation(text.decode("utf-8", errors="replace"))


@lru_cache(maxsize=2)
def vocabulary(tokenizer: Tokenizer) -> Vocabulary:
    return Vocabulary(tokenizer)


class Guide:
    """One reply's grammar state: mask() before each token is sampled, accept(token) after. Free (mask None)
    while the reply thinks; then only tokens the grammar allows, and end of generation once it is complete."""

    def __init__(self, vocab: Vocabulary, constraint: Constraint):
        self.matcher = _llguidance().LLMatcher(vocab.ll, constraint.grammar)
        if self.matcher.is_error():
            raise GrammarError(f"the grammar cannot be compiled: {' '.join(self.matcher.get_error().split())}")
        self.vocab = vocab
        self.after = constraint.after.encode()
        self.think_id = vocab.token_id(constraint.think) if constraint.think else None
        if constraint.think:  # the reply may open its thinking, if the opening is one token
            self.state = "may think" if self.think_id is not None else "grammar"
        else:
            self.state = "thinking" if self.after else "grammar"
        self._tail = b""  # the reply's last bytes while it thinks, to find `after` in
        self._bits = np.zeros((vocab.n_vocab + 31) // 32, np.int32)

    def mask(self) -> np.ndarray | None:
        """Which tokens may come next: bool [n_vocab], or None: any."""
        if self.state == "thinking":
            return None
        self.mask_bits(self._bits)
        return np.unpackbits(self._bits.view(np.uint8), bitorder="little")[:self.vocab.n_vocab].view(bool)

    def mask_bits(self, bits: np.ndarray) -> None:
        """The same as 32-bit words (token i: bit i % 32 of word i // 32) written into bits[:ceil(n_vocab / 32)]
        (the GPU's sampler reads them): every token's bit set while the reply thinks."""
        words = bits[:len(self._bits)].view(np.uint32)
        if self.state == "thinking":
            words.fill(0xFFFFFFFF)
            return
        self.matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        if self.state == "may think":
            words[self.think_id // 32] |= np.uint32(1 << (self.think_id % 32))

    def accept(self, token: int) -> None:
        """The token sampled; one the grammar did not allow (a mask left out) is the engine's fault: RuntimeError."""
        if self.state == "may think":
            self.state = "thinking" if token == self.think_id else "grammar"
        if self.state == "thinking":
            self._tail = (self._tail + self.vocab.tokenizer.token_to_piece(token, special=True))[-len(self.after):]
            if self._tail == self.after:
                self.state = "grammar"
        elif not self.matcher.consume_token(token) or self.matcher.is_error():
            raise RuntimeError(f"token {token} is outside the grammar: {self.matcher.get_error().splitlines()[0]}")
