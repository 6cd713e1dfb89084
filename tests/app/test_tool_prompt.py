"""A request's tools and tool round trip (an assistant's tool_calls, a tool's result) rendered by the real chat
templates of each family, as the server renders them, against plain jinja2 on the same template as the oracle
(what llama.cpp's --jinja and transformers do with it)."""
import json
from datetime import datetime

import jinja2.ext
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.server_schema import ApiError, ollama_chat, openai_chat
from app.tool_prompt import with_tools
from models.chat_template import ChatTemplate
from tests.app.test_tool_calls import TEMPLATES, TOOLS, WEATHER

ROUND_TRIP = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "abc123xyz", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "abc123xyz", "content": "18 C, sunny"},
]
# what each family's template writes for the call and for its result
RENDERED = {
    "Qwen-Qwen3-0.6B": ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
                        "<tool_response>\n18 C, sunny\n</tool_response>"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "<tool_response>\n18 C, sunny\n</tool_response>"),
    "Qwen3-Coder": ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
                    "</tool_call>", "<tool_response>\n18 C, sunny\n</tool_response>"),
    "../../models/templates/Qwen3.5-4B": ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>"
                                         "\n</function>\n</tool_call>", "<tool_response>\n18 C, sunny\n</tool_response>"),
    "meta-llama-Llama-3.1-8B-Instruct": ('{"name": "get_weather", "parameters": {"city": "Paris"}}',
                                         '<|start_header_id|>ipython<|end_header_id|>\n\n"18 C, sunny"'),
    "mistralai-Mistral-Nemo-Instruct-2407": (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abc123xyz"}]',
        '[TOOL_RESULTS]{"content": 18 C, sunny, "call_id": "abc123xyz"}[/TOOL_RESULTS]'),
    "Mistral-Small-3.2-24B-Instruct-2506": ('[TOOL_CALLS]get_weather[CALL_ID]abc123xyz[ARGS]{"city": "Paris"}',
                                            "[TOOL_RESULTS]abc123xyz[TOOL_CONTENT]18 C, sunny[/TOOL_RESULTS]"),
    "openai-gpt-oss-120b": ('<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>'
                            '{"city": "Paris"}<|call|>', "<|start|>functions.get_weather to=assistant<|channel|>"
                            'commentary<|message|>"18 C, sunny"<|end|>'),
}


def oracle(source: str, messages: list[dict], **variables) -> str:
    """Plain jinja2 as transformers sets it up for chat templates."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals.update(raise_exception=lambda m: pytest.fail(m), strftime_now=lambda f: datetime.now().strftime(f))
    return env.from_string(source).render(messages=messages, bos_token="<s>", eos_token="</s>",
                                          add_generation_prompt=True, **variables)


def render(source: str, body: dict) -> tuple[str, list[dict], dict]:
    r = openai_chat(body)
    messages, variables = with_tools(r.prompt, r.tools, source) if r.tools else (r.prompt, {})
    return ChatTemplate(source, "<s>", "</s>").render(messages, **variables), messages, variables


@pytest.mark.parametrize("name", RENDERED)
def test_tools_and_a_round_trip_render_as_the_template_means(name):
    source = (TEMPLATES / f"{name}.jinja").read_text()
    prompt, messages, variables = render(source, {"messages": ROUND_TRIP, "tools": TOOLS})
    assert prompt == oracle(source, messages, **variables)
    call, result = RENDERED[name]
    assert WEATHER["function"]["description"] in prompt  # the tools reached the template
    assert call in prompt and result in prompt and prompt.index(call) < prompt.index(result)


@pytest.mark.parametrize("name", RENDERED)
def test_a_tool_with_a_name_only_renders(name):
    """OpenAI's description and parameters are optional; templates read both."""
    source = (TEMPLATES / f"{name}.jinja").read_text()
    prompt, _, _ = render(source, {"messages": ROUND_TRIP[:2], "tools": [{"type": "function",
                                                                          "function": {"name": "now"}}]})
    assert "now" in prompt


def test_ollamas_history_renders_as_openais():
    """Ollama's calls carry their arguments as an object and no id; its results name their tool."""
    source = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()
    ollama = ROUND_TRIP[:2] + [
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather",
                                                                          "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "18 C, sunny", "tool_name": "get_weather"}]
    r = ollama_chat({"model": "m", "messages": ollama, "tools": TOOLS})
    messages, variables = with_tools(r.prompt, r.tools, source)
    assert messages[3]["tool_call_id"] == messages[2]["tool_calls"][0]["id"]  # matched to the call it answers
    assert ChatTemplate(source).render(messages, **variables) == render(source, {"messages": ROUND_TRIP,
                                                                                 "tools": TOOLS})[0]


def test_tool_choice_none_gives_the_template_no_tools_and_required_or_named_asks_for_a_call():
    source = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()
    user = [{"role": "user", "content": "Weather in Paris?"}]
    assert "<tools>" not in render(source, {"messages": user, "tools": TOOLS, "tool_choice": "none"})[0]
    prompt = render(source, {"messages": user, "tools": TOOLS, "tool_choice": "required"})[0]
    assert "Answer by calling one or more of the tools." in prompt and '"name": "python"' in prompt
    named = {"type": "function", "function": {"name": "get_weather"}}
    prompt = render(source, {"messages": user, "tools": TOOLS, "tool_choice": named})[0]
    assert "Answer by calling the tool get_weather." in prompt and '"name": "python"' not in prompt  # that one only


def test_a_template_without_tools_gets_them_in_a_system_note():
    source = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>"
    prompt = render(source, {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS})[0]
    assert prompt.startswith('<|system|>You can call these tools:\n{"name": "get_weather"')
    assert '{"tool_calls": [{"name": "<tool name>"' in prompt and prompt.endswith("<|user|>hi<|assistant|>")


@pytest.mark.parametrize("body, message", [
    ({"tools": [{"type": "function"}]}, "'tools[0]' must be {\"type\": \"function\""),
    ({"tools": TOOLS, "tool_choice": "always"}, "'tool_choice' must be \"auto\", \"none\", \"required\""),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "'tool_choice' names the function 'nope', which is not in 'tools' (get_weather, python)"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{oops"}}]}]},
     "'messages[0].tool_calls[0].function.arguments' is not valid JSON"),
    ({"functions": [{"name": "f"}]}, "'functions' is not supported by this server (send them as 'tools'"),
])
def test_bad_tools_are_a_clear_error(body, message):
    with pytest.raises(ApiError) as e:
        openai_chat({"messages": [{"role": "user", "content": "hi"}]} | body)
    assert e.value.status == 400 and e.value.message.startswith(message), e.value.message
