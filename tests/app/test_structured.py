"""Where the grammar starts in a reply, by the chat template (app/structured.py), and the tool-call grammars of
tool_choice "required" / a named function (app/tool_grammar.py) against replies written as each format writes them
(the Mistral, XML and harmony ones: test_tool_grammar.py)."""
import json

import pytest

from app.server_schema import ApiError, ToolRequest
from app.structured import HARMONY_FINAL, answer_constraint
from app.tool_calls import BareJsonFormat, HermesFormat, split_tool_calls
from app.tool_grammar import tool_call_grammar
from inference.grammar import Constraint, Guide, vocabulary
from models.chat_template import ChatTemplate
from models.gguf import open_gguf
from models.tokenizer import Tokenizer
from tests.app.test_tool_calls import TEMPLATES, TOOLS


@pytest.mark.parametrize("template, thinks, after, think", [
    (None, False, "", ""),                                             # plain text
    ("Qwen-Qwen3-0.6B.jinja", False, "</think>", "<think>"),            # Qwen3 may open <think> itself
    ("Qwen-Qwen3-0.6B.jinja", True, "</think>", ""),                    # a prompt that ends inside <think>
    ("openai-gpt-oss-120b.jinja", False, HARMONY_FINAL, ""),            # harmony: the final channel
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", False, "", ""),         # no thinking
    ("../../models/templates/google-gemma-4-31B-it.jinja", False, "<channel|>", "<|channel>"),  # Gemma 4's thought
])
def test_the_grammar_starts_where_the_answer_does(template, thinks, after, think):
    chat = ChatTemplate((TEMPLATES / template).read_text()) if template else None
    assert answer_constraint("G", chat, thinks) == Constraint("G", after=after, think=think)


@pytest.fixture(scope="module")
def vocab(smollm2):
    return vocabulary(Tokenizer(open_gguf(smollm2).metadata))


def follows(vocab, grammar: str, text: str) -> bool:
    """Whether text, token by token, is a whole reply of grammar (it may end there)."""
    guide = Guide(vocab, Constraint(grammar))
    for token in vocab.tokenizer.encode(text, add_special=False):
        assert guide.mask()[token], f"{vocab.tokenizer.token_to_piece(token)!r} refused in {text!r}"
        guide.accept(token)
    return bool(guide.mask()[sorted(vocab.tokenizer.eog_ids)].any())


CALL = {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}


@pytest.mark.parametrize("fmt, takes_tools, text", [
    (HermesFormat, True, f'<tool_call>\n{json.dumps(CALL, separators=(",", ":"))}\n</tool_call>'),
    (HermesFormat, True, '<tool_call>\n{"name":"python","arguments":{"code":"1+1"}}\n</tool_call>\n'
                         f'<tool_call>\n{json.dumps(CALL, separators=(",", ":"))}\n</tool_call>'),
    (BareJsonFormat, True, '{"name":"get_weather","parameters":{"city":"Rome"}}'),
    (BareJsonFormat, False, '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Rome"}}]}'),
])
def test_tool_call_grammars_take_the_formats_calls(vocab, fmt, takes_tools, text):
    grammar = tool_call_grammar(fmt(TOOLS), ToolRequest(TOOLS, "required"), takes_tools, vocab.tokenizer)
    assert follows(vocab, grammar, text)
    assert split_tool_calls(fmt(TOOLS), text)[1]  # and the parser finds the calls in it


def test_a_named_choice_allows_that_tool_alone(vocab):
    grammar = tool_call_grammar(HermesFormat(TOOLS), ToolRequest(TOOLS, "python", parallel=False), True,
                                vocab.tokenizer)
    with pytest.raises(AssertionError, match="refused"):
        follows(vocab, grammar, '<tool_call>\n{"name":"get_weather","arguments":{"city":"Rome"}}\n</tool_call>')


def test_bad_parameters_are_a_400(vocab):
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "strng"}}}]
    with pytest.raises(ApiError, match="'tools' cannot be enforced .* Invalid type: strng"):
        tool_call_grammar(HermesFormat(bad), ToolRequest(bad, "required"), True, vocab.tokenizer)
