"""Reasoning sent back in the history, in each route's own field (OpenAI's reasoning_content, Ollama's thinking,
Anthropic's thinking blocks, the Responses API's reasoning items), reaches the real chat templates of Qwen3.5 and
gpt-oss as llama.cpp hands it over: the server's prompt equals plain jinja2's rendering (tests/app/test_tool_prompt's
oracle) of the conversation written as the templates' own documentation passes it (reasoning_content; gpt-oss:
thinking, a tool-call turn without its content)."""
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.server_anthropic_schema import anthropic_request
from app.server_responses_schema import responses_request
from app.server_schema import ollama_chat, openai_chat
from app.server_worker import prompt_ids
from models.chat_template import ChatTemplate
from tests.app.test_tool_prompt import oracle

TEMPLATES = {name: (Path(__file__).parents[1] / "models" / "templates" / f"{name}.jinja").read_text()
             for name in ("Qwen3.5-4B", "openai-gpt-oss-120b")}
EARLIER, NOW = "The user greets me; greet back.", "The user wants the weather in Paris: call get_weather."
CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}


def canonical(template: str) -> list[dict]:
    """The conversation as the template's makers pass it: an earlier turn's reasoning, then this turn's with its
    tool call and result."""
    harmony = template == "openai-gpt-oss-120b"
    key = "thinking" if harmony else "reasoning_content"
    calling = {"role": "assistant", key: NOW, "tool_calls": [{"id": "call00001", "type": "function",
                                                             "function": CALL}]}
    return [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!", key: EARLIER},
            {"role": "user", "content": "Weather in Paris?"},
            calling | ({} if harmony else {"content": ""}),  # llama.cpp drops a harmony call's content
            {"role": "tool", "tool_call_id": "call00001", "content": "18 C, sunny"}]


OPENAI = {"messages": [
    {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!", "reasoning_content": EARLIER},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "reasoning_content": NOW, "tool_calls": [
        {"id": "call00001", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call00001", "content": "18 C, sunny"}]}
OLLAMA = {"model": "m", "messages": [
    {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!", "thinking": EARLIER},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "thinking": NOW, "tool_calls": [{"function": CALL}]},
    {"role": "tool", "content": "18 C, sunny", "tool_name": "get_weather"}]}
ANTHROPIC = {"max_tokens": 64, "messages": [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": EARLIER, "signature": ""},
                                      {"type": "text", "text": "Hello!"}]},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": NOW, "signature": ""},
                                      {"type": "tool_use", "id": "call00001", "name": "get_weather",
                                       "input": {"city": "Paris"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call00001", "content": "18 C, sunny"}]}]}


def reasoning_item(text: str) -> dict:
    return {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


RESPONSES = {"input": [
    {"role": "user", "content": "Hi"}, reasoning_item(EARLIER),
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
    {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]}, reasoning_item(NOW),
    {"type": "function_call", "call_id": "call00001", "name": "get_weather", "arguments": '{"city": "Paris"}'},
    {"type": "function_call_output", "call_id": "call00001", "output": "18 C, sunny"}]}
ROUTES = {"openai": lambda: openai_chat(OPENAI), "ollama": lambda: ollama_chat(OLLAMA),
          "anthropic": lambda: anthropic_request(ANTHROPIC), "responses": lambda: responses_request(RESPONSES)}


def server_prompt(template: str, request) -> str:
    """The prompt the server's worker makes of request for a model with template (a token a character)."""
    engine = SimpleNamespace(chat_template=ChatTemplate(TEMPLATES[template], "<s>", "</s>"), n_ctx=100_000,
                             tokenizer=SimpleNamespace(encode_prompt=lambda text: [ord(c) for c in text]))
    return "".join(map(chr, prompt_ids(engine, request)[0]))


@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize("route", ROUTES)
def test_reasoning_sent_back_renders_as_the_template_means(template, route):
    prompt = server_prompt(template, ROUTES[route]())
    assert prompt == oracle(TEMPLATES[template], canonical(template))
    assert NOW in prompt  # the tool-calling turn's reasoning is kept by both templates
    assert EARLIER not in prompt  # the earlier turn's they leave out: the template's choice, not ours


def test_an_assistant_message_with_text_and_calls_keeps_its_text_for_qwen_and_gives_gpt_oss_its_thinking():
    body = json.loads(json.dumps(OPENAI))
    body["messages"][3]["content"] = "Let me check."
    qwen = server_prompt("Qwen3.5-4B", openai_chat(body))
    assert f"<think>\n{NOW}\n</think>\n\nLet me check.\n\n<tool_call>" in qwen
    oss = server_prompt("openai-gpt-oss-120b", openai_chat(body))  # the template refuses content and thinking both
    assert f"<|channel|>analysis<|message|>{NOW}<|end|>" in oss and "Let me check." not in oss
