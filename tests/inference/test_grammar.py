"""The grammar engine's mask over our own tokenizer's vocabulary (SmolLM2's), the sampler that applies it, and the
grammar starting after a reasoning model's thinking."""
import json

import numpy as np
import pytest

from inference.grammar import Constraint, GrammarError, Guide, closed, json_schema_grammar, lark_grammar, vocabulary
from inference.sampling import Sampler, SamplingParams
from models.gguf import open_gguf
from models.tokenizer import Tokenizer

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


@pytest.fixture(scope="module")
def tok(smollm2) -> Tokenizer:
    return Tokenizer(open_gguf(smollm2).metadata)


def feed(guide: Guide, tok: Tokenizer, text: str) -> list:
    """Accept text's tokens one by one; the mask before each (None: free)."""
    masks = []
    for token in tok.encode(text, add_special=False):
        masks.append(guide.mask())
        guide.accept(token)
    return masks


def test_the_mask_allows_the_schemas_json_and_then_only_the_end(tok):
    guide = Guide(vocabulary(tok), Constraint(json_schema_grammar(SCHEMA)))
    masks = feed(guide, tok, '{"n":42}')
    assert all(m is not None and m.dtype == bool and m.shape == (tok.vocab_size,) for m in masks)
    assert masks[0].sum() < 10  # '{"n":' is forced
    end = guide.mask()
    assert set(np.flatnonzero(end)) == set(tok.eog_ids)


def test_the_gpus_mask_words_are_the_hosts_mask(tok):
    """mask_bits, the words the GPU's sampler reads (token i: bit i % 32 of word i // 32), hold the same tokens as
    mask() at each step, into a buffer longer than the vocabulary's words (a model's n_vocab may be padded), and
    every token while the reply thinks."""
    guide = Guide(vocabulary(tok), Constraint(json_schema_grammar(SCHEMA), after="</think>"))
    n_words = (tok.vocab_size + 31) // 32
    words = np.zeros(n_words + 2, np.uint32)
    for text in ("ok </think>", '{"n":42}'):
        for token in tok.encode(text, add_special=False):
            guide.mask_bits(words)
            unpacked = np.unpackbits(words.view(np.uint8), bitorder="little").view(bool)
            mask = guide.mask()
            assert np.array_equal(unpacked[:tok.vocab_size], np.ones(tok.vocab_size, bool) if mask is None else mask)
            assert not words[n_words:].any() and unpacked[token]
            guide.accept(token)


def test_a_sentencepiece_vocabulary_with_a_space_prefix_gets_the_forced_bytes_themselves():
    """An SPM vocabulary that prefixes a text with its space (llama 2 style, and tests' synthetic files): the bytes a
    grammar forces are tokenized without that prefix, so the first mask of a JSON reply allows '{' itself (a byte
    token here) and each token the masks allow is accepted. With the prefix, '{' was tokenized as the bytes of
    " {" and the mask allowed the first byte of the space's encoding (0xE2), which the grammar then refused."""
    from tests.inference.synthetic import spm_vocab
    spm = Tokenizer(spm_vocab())
    assert spm.add_space_prefix and spm.encode("{", add_special=False)[0] != spm.vocab["<0x7B>"]
    guide = Guide(vocabulary(spm), Constraint(json_schema_grammar(SCHEMA)))
    assert set(np.flatnonzero(guide.mask())) == {spm.vocab["<0x7B>"]}
    for _ in range(6):  # the forced '{"n":' a byte at a time, then a digit
        guide.accept(int(np.flatnonzero(guide.mask())[0]))


def test_a_token_outside_the_grammar_is_refused(tok):
    guide = Guide(vocabulary(tok), Constraint(json_schema_grammar(SCHEMA)))
    with pytest.raises(RuntimeError, match="outside the grammar"):
        feed(guide, tok, '{"m":1}')


def test_the_grammar_starts_after_the_thinking(tok):
    guide = Guide(vocabulary(tok), Constraint(json_schema_grammar(SCHEMA), after="</think>"))
    masks = feed(guide, tok, "Let me think </thi nk> about it.</think>")  # </think> in several tokens here
    assert all(m is None for m in masks)
    assert guide.mask() is not None and guide.mask().sum() < 10


def test_a_reply_that_may_think_starts_at_once_without_a_think_token(tok):
    guide = Guide(vocabulary(tok), Constraint(json_schema_grammar(SCHEMA), after="</think>", think="<think>"))
    assert "<think>" not in tok.vocab and guide.mask() is not None  # SmolLM2 has no such token: JSON at once


def test_schemas_that_cannot_compile_say_why():
    with pytest.raises(GrammarError, match="Invalid type: strng"):
        json_schema_grammar({"type": "strng"})
    with pytest.raises(GrammarError, match="look-around, including look-ahead"):
        json_schema_grammar({"type": "string", "pattern": "(?<=a)b"})
    with pytest.raises(GrammarError, match="must be an object"):
        json_schema_grammar([1])
    with pytest.raises(GrammarError, match="the grammar cannot be compiled"):
        lark_grammar("start: nothing_defined")


def test_closed_leaves_out_unnamed_properties_only_where_the_schema_is_silent():
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {}}},
                                               "c": {"type": "object", "additionalProperties": True,
                                                     "properties": {}}},
              "$defs": {"d": {"properties": {"e": {}}, "patternProperties": {"x": {}}}},
              "const": {"properties": {}}}
    out = closed(schema)
    assert out["additionalProperties"] is False and out["properties"]["a"]["additionalProperties"] is False
    assert out["properties"]["c"]["additionalProperties"] is True and "additionalProperties" not in out["$defs"]["d"]
    assert out["const"] == {"properties": {}} and "additionalProperties" not in schema  # data kept; no mutation


def test_the_sampler_draws_only_allowed_tokens():
    logits = np.arange(100, dtype=np.float32)
    allowed = np.zeros(100, bool)
    allowed[[3, 7, 50]] = True
    assert Sampler(SamplingParams(temperature=0))(logits, [], allowed) == 50
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0), seed=0)
    drawn = {sampler(np.zeros(100, np.float32), [], allowed) for _ in range(200)}
    assert drawn == {3, 7, 50}


def test_json_from_the_mask_alone_parses(tok):
    """Random logits, sampled at temperature 1 under the mask: whatever the model, the text is the schema's."""
    rng = np.random.default_rng(0)
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0), seed=1)
    schema = {"type": "object", "properties": {"k": {"enum": ["x", "y"]}, "v": {"type": "boolean"}},
              "required": ["k", "v"]}
    for _ in range(5):
        guide, ids = Guide(vocabulary(tok), Constraint(json_schema_grammar(schema))), []
        while (token := sampler(rng.standard_normal(tok.vocab_size).astype(np.float32), ids, guide.mask())) \
                not in tok.eog_ids:
            guide.accept(token)
            ids.append(token)
        assert set(json.loads(tok.decode(ids))) == {"k", "v"}
