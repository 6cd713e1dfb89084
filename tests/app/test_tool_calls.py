"""Tool calls found in replies as each model family writes them (the shapes of llama.cpp's tests/test-chat.cpp and of
the families' own chat templates), whole and streamed in pieces cut at every place: the stream gives the same text
and calls as the whole reply."""
import json
from pathlib import Path

import pytest

from app.gemma4_split import split_gemma4
from app.harmony_split import split_harmony
from app.think_split import split_thinking
from app.tool_calls import (BareJsonFormat, Gemma4Format, HarmonyFormat, HermesFormat, MistralFormat, ToolCallSplitter,
                            XmlFormat, format_for, split_tool_calls)

TEMPLATES = Path(__file__).parent / "templates"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}
PYTHON = {"type": "function", "function": {"name": "python", "description": "Runs Python code", "parameters": {
    "type": "object", "properties": {"code": {"type": "string"}}}}}
TOOLS = [WEATHER, PYTHON]
PARIS = ("get_weather", {"city": "Paris"})
ROME = ("get_weather", {"city": "Rome", "days": 3})
GEMMA4_AFTER_THOUGHT = ('<|channel>thought\nI\'m\nthinking<channel|><|tool_call>call:get_time{city:<|"|>Paris<|"|>}'
                        "<tool_call|>")

# (format, reply, text, [(name, arguments)])
REPLIES = [
    (HermesFormat, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', "", [PARIS]),
    (HermesFormat, '<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": '
     '{"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 3}}'
     '\n</tool_call>', "<think>\nThe user wants the weather.\n</think>", [PARIS, ROME]),
    (HermesFormat, 'Let me look that up.\n<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}'
     '\n</tool_call>', "Let me look that up.", [PARIS]),  # arguments as a JSON string, as some models write them
    (HermesFormat, "<think>\nI should call the tool.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
     "{\"city\": \"Paris\"}}\n</tool_call>", "<think>\nI should call the tool.", [PARIS]),  # in an unclosed think
    (XmlFormat, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
     "", [PARIS]),
    (XmlFormat, "I'll check both.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
     "</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
     "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>", "I'll check both.", [PARIS, ROME]),
    (XmlFormat, "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>", "",
     [PARIS]),  # Qwen3-Coder leaving out the opening <tool_call>
    (XmlFormat, "<tool_call>\n<function=python>\n<parameter=code>\ndef hello():\n    print(\"Hello, world!\")\n\nhello()"
     "\n</parameter>\n</function>\n</tool_call>", "",
     [("python", {"code": "def hello():\n    print(\"Hello, world!\")\n\nhello()"})]),
    (XmlFormat, "The user wants Paris.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
     "</parameter>\n</function>\n</tool_call>", "The user wants Paris.\n</think>", [PARIS]),  # Qwen3.5, think opened
    (XmlFormat, "The user wants Paris.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
     "</function>\n</tool_call>", "The user wants Paris.", [PARIS]),  # Qwen3.5 calling before its </think>
    (XmlFormat, "See #include <functional> and <function_ref>.", "See #include <functional> and <function_ref>.", []),
    (BareJsonFormat, '{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS]),  # Llama 3.x
    (BareJsonFormat, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS]),
    (BareJsonFormat, 'Let me check.\n\n{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_weather", '
     '"parameters": {"city": "Rome", "days": 3}}', "Let me check.", [PARIS, ROME]),
    (BareJsonFormat, '{"type": "function", "name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS]),
    (BareJsonFormat, '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", '
     '"arguments": {"city": "Rome", "days": 3}}]}', "", [PARIS, ROME]),  # the generic fallback's shape
    (BareJsonFormat, 'Use {"name": "Bob", "parameters": {}} as the body; {"a": [1, {"b": 2}]}.',
     'Use {"name": "Bob", "parameters": {}} as the body; {"a": [1, {"b": 2}]}.', []),  # JSON that is no known tool
    (MistralFormat, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abc123xyz"}, '
     '{"name": "get_weather", "arguments": {"city": "Rome", "days": 3}, "id": "def456uvw"}]', "", [PARIS, ROME]),
    (MistralFormat, '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_weather[ARGS]{"city": "Rome", '
     '"days": 3}', "", [PARIS, ROME]),  # Devstral, Magistral
    (MistralFormat, 'Checking.[TOOL_CALLS]get_weather[CALL_ID]abc123xyz[ARGS]{"city": "Paris"}', "Checking.", [PARIS]),
    (HarmonyFormat, '<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary '
     'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}', "<|channel|>analysis<|message|>Need the "
     "weather.<|end|>", [PARIS]),
    (HarmonyFormat, ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}', "", [PARIS]),
    (HarmonyFormat, '<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant to=functions.get_weather'
     '<|channel|>commentary<|message|>{"city": "Paris"}<|call|>', "<|channel|>analysis<|message|>Need it.<|end|>",
     [PARIS]),
    (HarmonyFormat, "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is "
     "sunny.", "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny.",
     []),
] + [(Gemma4Format, reply, text, calls) for reply, text, calls in [  # llama.cpp's tests/test-chat.cpp, its Gemma 4 cases
    ('<|tool_call>call:get_time{city:<|"|>London<|"|>}<tool_call|>', "", [("get_time", {"city": "London"})]),
    ('<|tool_call>call:get_time{city:<|"|>San Francisco<|"|>}<tool_call|>', "",
     [("get_time", {"city": "San Francisco"})]),
    ("<|tool_call>call:empty_args{}<tool_call|>", "", [("empty_args", {})]),
    ('Hello, world!\nWhat\'s up?<|tool_call>call:get_time{city:<|"|>Paris<|"|>}<tool_call|>', "Hello, world!\nWhat's up?",
     [("get_time", {"city": "Paris"})]),
    (GEMMA4_AFTER_THOUGHT, "<|channel>thought\nI'm\nthinking<channel|>", [("get_time", {"city": "Paris"})]),
    ('<|tool_call>call:get_time{city:<|"|>London<|"|>}<tool_call|><|tool_call>call:get_weather{city:<|"|>Paris<|"|>}'
     "<tool_call|>", "", [("get_time", {"city": "London"}), ("get_weather", {"city": "Paris"})]),
    ("<|tool_call>call:special_function{arg1:42}<tool_call|>", "", [("special_function", {"arg1": 42})]),
    ("<|tool_call>call:special_function{arg1:-7}<tool_call|>", "", [("special_function", {"arg1": -7})]),
    ("<|tool_call>call:amount{orig:3.14}<tool_call|>", "", [("amount", {"orig": 3.14})]),
    ("<|tool_call>call:toggle{enabled:true}<tool_call|>", "", [("toggle", {"enabled": True})]),
    ("<|tool_call>call:toggle{enabled:false}<tool_call|>", "", [("toggle", {"enabled": False})]),
    ("<|tool_call>call:set_nullable{value:null}<tool_call|>", "", [("set_nullable", {"value": None})]),
    ('<|tool_call>call:todo_list{todos:[<|"|>buy milk<|"|>,<|"|>walk dog<|"|>]}<tool_call|>', "",
     [("todo_list", {"todos": ["buy milk", "walk dog"]})]),
    ('<|tool_call>call:set_config{config:{theme:<|"|>dark<|"|>,count:3}}<tool_call|>', "",
     [("set_config", {"config": {"theme": "dark", "count": 3}})]),
    ("<|tool_call>call:todo_list{todos:[]}<tool_call|>", "", [("todo_list", {"todos": []})]),
    ("<|tool_call>call:set_config{config:{}}<tool_call|>", "", [("set_config", {"config": {}})]),
    ("<|tool_call>call:amount{orig:1.5e10}<tool_call|>", "", [("amount", {"orig": 1.5e10})]),
]] + [  # ours: a string is taken as written, its quote alone ends it (JSON's quotes, escapes, markup and all)
    (Gemma4Format, '<|tool_call>call:python{code:<|"|>print("a\\tb", {1: [2]})<tool_call|><|"|>}<tool_call|>\n\nDone.',
     "Done.", [("python", {"code": 'print("a\\tb", {1: [2]})<tool_call|>'})]),
    (Gemma4Format, "Use <|tool_call> for calls.", "Use <|tool_call> for calls.", []),
]
MALFORMED = [  # returned as text, as written
    (HermesFormat, '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>'),  # bad JSON
    (HermesFormat, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'),  # never closed
    (HermesFormat, "<think>\nMaybe <tool_call>\n{\"name\": \"get_weather\""),  # cut in an unclosed think
    (XmlFormat, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>"),
    (XmlFormat, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis"),
    (BareJsonFormat, '{"name": "get_weather", "parameters": {"city": "Par'),
    (BareJsonFormat, '<|python_tag|>brave_search.call(query="weather in Paris")'),  # a built-in tool: not ours
    (MistralFormat, "[TOOL_CALLS] sorry, I cannot."),
    (MistralFormat, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"'),
    (HarmonyFormat, "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": "),
    (Gemma4Format, "<|tool_call>call:get_weather{city:Paris}<tool_call|>"),  # a string without its quotes
    (Gemma4Format, '<|tool_call>call:get_weather{city:<|"|>Paris}<tool_call|>'),  # a quote never closed
    (Gemma4Format, '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>'),  # a call never closed
    (Gemma4Format, '<|tool_call>call:get_weather{"city": "Paris"}<tool_call|>'),  # JSON
    (Gemma4Format, '<|tool_call>get_weather{city:<|"|>Paris<|"|>}<tool_call|>'),  # no call:
    (Gemma4Format, '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>} and more<tool_call|>'),
]


def calls_of(calls) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


def streamed(fmt, pieces: list[str]) -> tuple[str, list]:
    s = ToolCallSplitter(fmt)
    text, calls = [], []
    for i, piece in enumerate(pieces + [""]):
        t, c = s.feed(piece, final=i == len(pieces))
        text.append(t)
        calls += c
    return "".join(text), calls_of(calls)


def every_cut(text: str) -> list[list[str]]:
    """text whole, one character a piece, cut in two at every place, and in three around every place."""
    return [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))] + [
        [text[:i], text[i:i + 3], text[i + 3:]] for i in range(1, len(text) - 3)]


@pytest.mark.parametrize("fmt, reply, text, calls", REPLIES, ids=[f"{r[0].__name__}-{i}" for i, r in enumerate(REPLIES)])
def test_each_family_parses_its_replies_whole_and_at_every_cut(fmt, reply, text, calls):
    parser = fmt(TOOLS)
    whole_text, whole_calls = split_tool_calls(parser, reply)
    assert (whole_text, calls_of(whole_calls)) == (text, calls)
    for pieces in every_cut(reply):
        assert streamed(parser, pieces) == (text, calls), pieces


@pytest.mark.parametrize("fmt, reply", MALFORMED, ids=[f"{r[0].__name__}-{i}" for i, r in enumerate(MALFORMED)])
def test_a_malformed_call_is_returned_as_text(fmt, reply):
    for pieces in every_cut(reply):
        assert streamed(fmt(TOOLS), pieces) == (reply, []), pieces


def test_thinking_stays_apart_from_the_calls():
    """The calls come out first; the text around them then splits into reasoning and answer (think_split)."""
    text, calls = split_tool_calls(HermesFormat(TOOLS), REPLIES[1][1])
    assert split_thinking(text) == ("The user wants the weather.\n", "") and calls_of(calls) == [PARIS, ROME]
    text, calls = split_tool_calls(HermesFormat(TOOLS), REPLIES[3][1])  # the call was inside an unclosed <think>
    assert split_thinking(text) == ("I should call the tool.", "") and calls_of(calls) == [PARIS]


def test_a_harmony_call_leaves_its_analysis_as_reasoning():
    """gpt-oss: the call is taken out of the commentary channel, and what is left still splits by its channels."""
    reply = ('<|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant<|channel|>commentary '
             'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>')
    text, calls = split_tool_calls(HarmonyFormat(TOOLS), reply)
    assert split_harmony(text) == ("The user wants the weather.", "") and calls_of(calls) == [PARIS]


def test_a_gemma4_call_nested_past_pythons_stack_is_text():
    reply = "<|tool_call>call:get_weather{city:" + "[" * 5000 + "<tool_call|>"
    assert split_tool_calls(Gemma4Format(TOOLS), reply) == (reply, [])


def test_a_gemma4_call_after_its_thought_leaves_the_thought_as_reasoning():
    """Gemma 4 thinks in its thought channel, then calls: the calls come out, the channel splits as llama.cpp's
    test-chat.cpp expects (reasoning "I'm\\nthinking", no content)."""
    text, calls = split_tool_calls(Gemma4Format(TOOLS), GEMMA4_AFTER_THOUGHT)
    assert split_gemma4(text) == ("I'm\nthinking", "") and calls_of(calls) == [("get_time", {"city": "Paris"})]


def test_text_is_held_back_only_while_it_could_become_a_call():
    s = ToolCallSplitter(HermesFormat(TOOLS))
    assert s.feed("The answer is 4. <tool") == ("The answer is 4.", [])  # white space waits for what follows
    assert s.feed("box>") == (" <toolbox>", [])
    s = ToolCallSplitter(HarmonyFormat(TOOLS))
    assert s.feed("<|channel|>analysis") == ("", [])  # a header that may still name a recipient
    assert s.feed("<|message|>Thinking") == ("<|channel|>analysis<|message|>Thinking", [])
    s = ToolCallSplitter(Gemma4Format(TOOLS))
    assert s.feed("It is <|tool") == ("It is", [])
    assert s.feed('_call>call:get_weather{city:<|"|>Paris <tool_call|>') == ("", [])  # the quote is open
    assert calls_of(s.feed('<|"|>}<tool_call|>')[1]) == [("get_weather", {"city": "Paris <tool_call|>"})]


def test_arguments_are_typed_by_the_tools_schema():
    reply = ("<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n<parameter=days>\n3\n"
             "</parameter>\n<parameter=extra>\n{\"a\": 1}\n</parameter>\n</function>\n</tool_call>")
    _, calls = split_tool_calls(XmlFormat(TOOLS), reply)
    assert json.loads(calls[0].arguments) == {"city": "42", "days": 3, "extra": "{\"a\": 1}"}  # undeclared: text


def test_ids_are_fresh_and_mistral_shaped():
    _, calls = split_tool_calls(HermesFormat(TOOLS), REPLIES[1][1])
    assert len({c.id for c in calls}) == 2 and all(len(c.id) == 9 and c.id.isalnum() for c in calls)


@pytest.mark.parametrize("template, fmt", [
    ("Qwen-Qwen3-0.6B", HermesFormat), ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", HermesFormat),
    ("Qwen3-Coder", XmlFormat), ("../../models/templates/Qwen3.5-4B", XmlFormat),
    ("meta-llama-Llama-3.1-8B-Instruct", BareJsonFormat), ("mistralai-Mistral-Nemo-Instruct-2407", MistralFormat),
    ("Mistral-Small-3.2-24B-Instruct-2506", MistralFormat), ("openai-gpt-oss-120b", HarmonyFormat),
    ("../../models/templates/google-gemma-4-31B-it", Gemma4Format)])
def test_the_format_is_picked_from_the_template(template, fmt):
    assert type(format_for((TEMPLATES / f"{template}.jinja").read_text(), TOOLS)) is fmt
