"""tool_choice "required" / a named function in the Mistral, Qwen3.5 XML and gpt-oss harmony formats
(app/tool_grammar.py): replies sampled at temperature 1 from flat logits under the grammar's mask, over a real
vocabulary (SmolLM2's, with each format's tags added as the models' files mark them), always hold a call of an
allowed name whose arguments validate with jsonschema, and that the format's parser reads; Qwen3.5's own template
renders the parsed calls back to the very text sampled."""
import json

import jsonschema
import numpy as np
import pytest

from app.server_schema import ApiError, ToolRequest
from app.tool_calls import Format, format_for, split_tool_calls
from app.tool_grammar import tool_call_grammar
from inference.grammar import Constraint, Guide, vocabulary
from models.chat_template import ChatTemplate
from models.gguf import open_gguf
from models.tokenizer import CONTROL, USER_DEFINED, Tokenizer
from tests.app.test_tool_calls import TEMPLATES

QWEN35 = TEMPLATES.parents[1] / "models" / "templates" / "Qwen3.5-4B.jinja"
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
# where each format's free text ends (harmony's analysis; an XML string parameter)
FORMATS = {"Mistral-Small-3.2-24B-Instruct-2506": None, "mistralai-Mistral-Nemo-Instruct-2407": None,
           "Qwen3.5-4B": "\n</parameter>\n", "openai-gpt-oss-120b": "<|end|>"}


@pytest.fixture(scope="module")
def tokenizer(smollm2) -> Tokenizer:
    """SmolLM2's vocabulary with the tags of the formats as single tokens, marked as the models' files mark them:
    Mistral's and harmony's control, Qwen's <tool_call> user-defined (our tokenizer shows harmony's as text)."""
    metadata = dict(open_gguf(smollm2).metadata)
    tags = {"[TOOL_CALLS]": CONTROL, "[ARGS]": CONTROL, "[CALL_ID]": CONTROL, "<tool_call>": USER_DEFINED,
            "</tool_call>": USER_DEFINED, **dict.fromkeys(["<|start|>", "<|channel|>", "<|message|>", "<|constrain|>",
                                                           "<|end|>", "<|call|>", "<|return|>"], CONTROL)}
    metadata["tokenizer.ggml.tokens"] = list(metadata["tokenizer.ggml.tokens"]) + list(tags)
    metadata["tokenizer.ggml.token_type"] = list(metadata["tokenizer.ggml.token_type"]) + list(tags.values())
    return Tokenizer(metadata)


class FreeTextModel:
    """A model with random weights, whose logits are near flat: each token drawn uniformly among those the grammar
    allows (temperature 1 over equal logits), but that after 8 tokens of free text ends it by writing `close`, as a
    model ends its thinking: the grammar, not the model, makes everything else a call."""

    def __init__(self, tokenizer: Tokenizer, close: str | None, seed: int):
        self.rng, self.n_vocab = np.random.default_rng(seed), tokenizer.vocab_size
        self.close = tokenizer.encode(close, add_special=False, parse_special=False) if close else []
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


def sampled(tokenizer: Tokenizer, grammar: str, close: str | None, seed: int, limit: int = 400) -> str:
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
    path = QWEN35 if template == "Qwen3.5-4B" else TEMPLATES / f"{template}.jinja"
    fmt = format_for(path.read_text(), TOOLS)
    grammar = tool_call_grammar(fmt, ToolRequest(TOOLS, choice), True, tokenizer)
    names = {"get_weather", "convert"} if choice == "required" else {"convert"}
    seen = set()
    for seed in range(12):
        reply = sampled(tokenizer, grammar, FORMATS[template], seed)
        text, calls = split_tool_calls(fmt, reply)
        assert calls, reply
        for call in calls:
            tool = next(t["function"] for t in TOOLS if t["function"]["name"] == call.name)
            assert call.name in names
            jsonschema.validate(json.loads(call.arguments), tool["parameters"])
            seen.add(call.name)
        if template == "Qwen3.5-4B":  # the template writes the calls read from the reply as the reply wrote them
            assert not text
            message = {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": c.name, "arguments": json.loads(c.arguments)}}
                for c in calls]}
            rendered = ChatTemplate(QWEN35.read_text()).render([{"role": "user", "content": "Hi"}, message])
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
