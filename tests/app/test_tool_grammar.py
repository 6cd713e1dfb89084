"""tool_choice "required" / a named function in the Mistral, Qwen3.5 XML, gpt-oss harmony and Gemma 4 formats
(app/tool_grammar.py): replies sampled at temperature 1 from flat logits under the grammar's mask, over a real
vocabulary (SmolLM2's, with each format's tags added as the models' files mark them), always hold a call of an
allowed name whose arguments validate with jsonschema, and that the format's parser reads; Qwen3.5's and Gemma 4's
own templates render the parsed calls back to the very text sampled."""
import json

import jsonschema
import numpy as np
import pytest

from app.server_schema import ApiError, ToolRequest
from app.tool_calls import Format, Gemma4Format, format_for, split_tool_calls
from app.tool_grammar import tool_call_grammar
from inference.grammar import Constraint, Guide, vocabulary
from models.chat_template import ChatTemplate
from models.gguf import open_gguf
from models.tokenizer import CONTROL, USER_DEFINED, Tokenizer
from tests.app.test_tool_calls import TEMPLATES

QWEN35 = TEMPLATES.parents[1] / "models" / "templates" / "Qwen3.5-4B.jinja"
GEMMA4 = TEMPLATES.parents[1] / "models" / "templates" / "google-gemma-4-31B-it.jinja"
# JSON strings and numbers bounded, so that JSON sampled at random closes (free text is closed by FreeTextModel)
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "required": ["city"], "properties": {
                                                "city": {"type": "string", "maxLength": 12},
                                                "days": {"type": "integer", "minimum": 1, "maximum": 14}}}}}
CONVERT = {"type": "function", "function": {"name": "convert", "description": "Converts a temperature",
                                            "parameters": {"type": "object", "required": ["unit", "degrees"],
                                                           "properties": {"unit": {"enum": ["C", "F"]},
                                                                          "degrees": {"type": "integer",
                                                                                      "minimum": 0,
                                                                                      "maximum": 999},
                                                                          "exact": {"type": "boolean"}}}}}
TOOLS = [WEATHER, CONVERT]
# where each format's free text ends (harmony's analysis; an XML string parameter; a Gemma 4 string, by its quote token)
FORMATS = {"Mistral-Small-3.2-24B-Instruct-2506": None, "mistralai-Mistral-Nemo-Instruct-2407": None,
           "Qwen3.5-4B": "\n</parameter>\n", "openai-gpt-oss-120b": "<|end|>", "google-gemma-4-31B-it": '<|"|>'}
OWN = {"Qwen3.5-4B": QWEN35, "google-gemma-4-31B-it": GEMMA4}  # templates in tests/models/templates


@pytest.fixture(scope="module")
def tokenizer(smollm2) -> Tokenizer:
    """SmolLM2's vocabulary with the tags of the formats as single tokens, marked as the models' files mark them:
    Mistral's, harmony's and Gemma 4's control, Qwen's <tool_call> user-defined (our tokenizer shows harmony's as
    text)."""
    metadata = dict(open_gguf(smollm2).metadata)
    tags = {"[TOOL_CALLS]": CONTROL, "[ARGS]": CONTROL, "[CALL_ID]": CONTROL, "<tool_call>": USER_DEFINED,
            "</tool_call>": USER_DEFINED, **dict.fromkeys(["<|start|>", "<|channel|>", "<|message|>", "<|constrain|>",
                                                           "<|end|>", "<|call|>", "<|return|>", "<|tool_call>",
                                                           "<tool_call|>", '<|"|>'], CONTROL)}
    metadata["tokenizer.ggml.tokens"] = list(metadata["tokenizer.ggml.tokens"]) + list(tags)
    metadata["tokenizer.ggml.token_type"] = list(metadata["tokenizer.ggml.token_type"]) + list(tags.values())
    return Tokenizer(metadata)


class FreeTextModel:
    """A model with random weights, whose logits are near flat: each token drawn uniformly among those the grammar
    allows (temperature 1 over equal logits), but that after 8 tokens of free text ends it by writing `close`, as a
    model ends its thinking: the grammar, not the model, makes everything else a call."""

    def __init__(self, tokenizer: Tokenizer, close: str | int | None, seed: int):
        self.rng, self.n_vocab = np.random.default_rng(seed), tokenizer.vocab_size
        self.close = [close] if isinstance(close, int) else tokenizer.encode(close, add_special=False,
                                                                             parse_special=False) if close else []
        self.free, self.closing = 0, []

    def draw(self, allowed: np.ndarray) -> int:
        choices = np.flatnonzero(allowed)
        self.free = self.free + 1 if len(choices) > self.n_vocab // 2 else 0
        if self.free > 8 and not self.closing:
            self.closing = list(self.close)
        if self.closing and allowed[self.closing[0]]:
            return self.closing.pop(0)
        self.closing = []
        return int(self.rng.choice(choices))


def sampled(tokenizer: Tokenizer, grammar: str, close: str | int | None, seed: int, limit: int = 400) -> str:
    """A reply drawn at temperature 1 under grammar, whole (its end of generation drawn)."""
    guide, model, ids = Guide(vocabulary(tokenizer), Constraint(grammar)), FreeTextModel(tokenizer, close, seed), []
    while len(ids) < limit:
        token = model.draw(guide.mask())
        if token in tokenizer.eog_ids:
            return tokenizer.decode(ids, special=True)
        guide.accept(token)
        ids.append(token)
    raise AssertionError(f"no end after {limit} tokens: {tokenizer.decode(ids, special=True)!r}")


@pytest.mark.parametrize("template", FORMATS)
@pytest.mark.parametrize("choice", ["required", "convert"])
def test_required_and_named_give_calls_at_temperature_1(tokenizer, template, choice):
    path = OWN.get(template, TEMPLATES / f"{template}.jinja")
    fmt = format_for(path.read_text(), TOOLS)
    grammar = tool_call_grammar(fmt, ToolRequest(TOOLS, choice), True, tokenizer)
    names = {"get_weather", "convert"} if choice == "required" else {"convert"}
    close = tokenizer.vocab[FORMATS[template]] if template == "google-gemma-4-31B-it" else FORMATS[template]
    seen = set()
    for seed in range(12):
        reply = sampled(tokenizer, grammar, close, seed)
        text, calls = split_tool_calls(fmt, reply)
        assert calls, reply
        for call in calls:
            tool = next(t["function"] for t in TOOLS if t["function"]["name"] == call.name)
            assert call.name in names
            jsonschema.validate(json.loads(call.arguments), tool["parameters"])
            seen.add(call.name)
        if template in OWN:  # the template writes the calls read from the reply as the reply wrote them
            assert not text
            message = {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": c.name, "arguments": json.loads(c.arguments)}}
                for c in calls]}
            rendered = ChatTemplate(path.read_text()).render([{"role": "user", "content": "Hi"}, message])
            assert reply in rendered
    assert seen == names  # sampled: both tools come under "required"


def test_a_named_choice_allows_that_tool_alone_and_tags_are_tokens(tokenizer):
    fmt = format_for((TEMPLATES / "Mistral-Small-3.2-24B-Instruct-2506.jinja").read_text(), TOOLS)
    grammar = tool_call_grammar(fmt, ToolRequest(TOOLS, "get_weather", parallel=False), True, tokenizer)
    guide = Guide(vocabulary(tokenizer), Constraint(grammar))
    assert np.flatnonzero(guide.mask()).tolist() == [tokenizer.vocab["[TOOL_CALLS]"]]  # not "[" of its text
    guide.accept(tokenizer.vocab["[TOOL_CALLS]"])
    for token in tokenizer.encode("convert", add_special=False):
        if not guide.mask()[token]:
            break
        guide.accept(token)
    else:
        raise AssertionError("the grammar took a call to convert")


def takes(tokenizer: Tokenizer, grammar: str, reply: str) -> bool:
    """Whether grammar allows reply (its tags as their tokens), token by token, and is complete at its end."""
    guide = Guide(vocabulary(tokenizer), Constraint(grammar))
    for token in tokenizer.encode(reply, add_special=False, parse_special=True):
        if not guide.mask()[token]:
            return False
        guide.accept(token)
    return guide.matcher.is_accepting()


def test_gemma4_values_of_no_schema_take_any_gemma4_value(tokenizer):
    """Where the schema says nothing (an object of no properties, a list of no items) any Gemma 4 value goes, as
    llama.cpp's grammar lets any go for every argument; what it says still holds: required keys, maxItems, no
    undeclared keys, and the tags are tokens (the reply opens with <|tool_call>, not "<" of its text)."""
    note = {"type": "function", "function": {"name": "note", "parameters": {
        "type": "object", "required": ["meta"], "properties": {"meta": {"type": "object"},
                                                               "tags": {"type": "array", "maxItems": 2}}}}}
    grammar = tool_call_grammar(format_for(GEMMA4.read_text(), [note]), ToolRequest([note], "required"), True,
                                tokenizer)
    assert np.flatnonzero(Guide(vocabulary(tokenizer), Constraint(grammar)).mask()).tolist() == [
        tokenizer.vocab["<|tool_call>"]]
    reply = '<|tool_call>call:note{meta:{a:[1,<|"|>x, y<|"|>,{b:null}],c:true},tags:[{},-2.5e3]}<tool_call|>'
    assert takes(tokenizer, grammar, reply)
    assert split_tool_calls(Gemma4Format([note]), reply)[1][0].arguments == \
        '{"meta": {"a": [1, "x, y", {"b": null}], "c": true}, "tags": [{}, -2500.0]}'
    for wrong in ("call:note{tags:[]}", "call:note{meta:{},tags:[1,2,3]}", "call:note{meta:{},more:1}",
                  'call:note{meta:{a:"x"}}'):  # no meta, 3 tags, an undeclared key, a JSON string
        wrong = f"<|tool_call>{wrong}<tool_call|>"
        assert not takes(tokenizer, grammar, wrong), wrong


def test_what_cannot_be_enforced_is_a_400(tokenizer):
    with pytest.raises(ApiError, match="no grammar for the tool calls of Format") as e:
        tool_call_grammar(Format(TOOLS), ToolRequest(TOOLS, "required"), True, tokenizer)
    assert e.value.status == 400
    listed = [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]
    with pytest.raises(ApiError, match="the tool f's parameters are not an object"):
        tool_call_grammar(format_for(QWEN35.read_text(), listed), ToolRequest(listed, "required"), True, tokenizer)
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "strng"}}}]
    for template in ("openai-gpt-oss-120b", "Mistral-Small-3.2-24B-Instruct-2506"):
        with pytest.raises(ApiError, match="Invalid type: strng"):
            tool_call_grammar(format_for((TEMPLATES / f"{template}.jinja").read_text(), bad),
                              ToolRequest(bad, "required"), True, tokenizer)
    for spec, error in (({"type": "strng"}, "Invalid type: strng"),
                        ({"$ref": "#/$defs/a"}, "cannot be held in Gemma 4's calls")):
        bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                             "properties": {"a": spec}}}}]
        with pytest.raises(ApiError, match=error):
            tool_call_grammar(format_for(GEMMA4.read_text(), bad), ToolRequest(bad, "required"), True, tokenizer)
