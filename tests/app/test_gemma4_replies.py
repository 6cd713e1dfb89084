"""A Gemma 4 reply through `run` and through the server's routes, read by OpenAI's, Ollama's and Anthropic's own
clients: the thought channel on stderr / in `reasoning_content` / `thinking` / a thinking block, the rest as the
answer, and thinking switched on or off in the prompt as llama.cpp switches it (enable_thinking; on by default). The
prompts are held to llama-cpp-python's rendering of Gemma 4's real template (llama.cpp's
models/templates/google-gemma-4-31B-it.jinja). No file here makes a real model write Gemma 4's channels, so `run`
and the server run a scripted engine (tests/app/scripted_engine.py). A fault planted once (thinking left to the
template's default, off) failed the prompt checks of run and the OpenAI route. Its tool calls come to OpenAI's and
Ollama's clients as tool_calls, and go back with their results through the template; a fault planted once (no
Gemma 4 parser picked for the template) failed both tool tests.
"""
import json
from pathlib import Path

import anthropic
import ollama
import openai
import pytest
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

import inference
from app.cli import main
from models.chat_template import ChatTemplate
from tests.app.in_process_server import serving_scripted
from tests.app.scripted_engine import ScriptedEngine

SOURCE = (Path(__file__).parents[1] / "models" / "templates" / "google-gemma-4-31B-it.jinja").read_text()
BOS, EOS = "<bos>", "<turn|>"
REASONING, ANSWER = "The user asks 2+2. Simple: 4.", "2 + 2 = **4**."
REPLY = f"<|channel>thought\n{REASONING}<channel|>{ANSWER}"
QUESTION = [{"role": "user", "content": "What is 2+2?"}]
CONVERSATION = [  # a system prompt and two turns, the first reply with its reasoning
    {"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4", "reasoning_content": "Add them."}, {"role": "user", "content": "And 3+3?"}]


def llama_cpp_prompt(messages: list[dict], thinking: bool) -> str:
    return Jinja2ChatFormatter(SOURCE, eos_token=EOS, bos_token=BOS, add_generation_prompt=True)(
        messages=messages, enable_thinking=thinking).prompt


def gemma4_engine(path: Path) -> ScriptedEngine:
    return ScriptedEngine(path, ChatTemplate(SOURCE, BOS, EOS), REPLY)


def test_run_prints_the_thought_on_stderr_and_switches_thinking_as_llama_cpp(tmp_path, monkeypatch, capsys):
    engine = gemma4_engine(tmp_path / "gemma-4-31b-it.gguf")
    monkeypatch.setattr(inference, "load", lambda *a, **k: engine)
    assert main(["run", "gemma4", "-p", "What is 2+2?", "--system", "Be brief."]) == 0
    out = capsys.readouterr()
    assert out.out == ANSWER + "\n" and out.err == REASONING + "\n"  # stderr is no terminal here: not dimmed
    asked = [{"role": "system", "content": "Be brief."}] + QUESTION
    assert engine.prompts[-1] == llama_cpp_prompt(asked, True) and "<|think|>" in engine.prompts[-1]
    assert engine.shown == ("<|channel>", "<channel|>")  # the engine shows the markers the split reads
    assert main(["run", "gemma4", "-p", "What is 2+2?", "--json", "--reasoning", "off"]) == 0
    reply = json.loads(capsys.readouterr().out)
    assert (reply["thinking"], reply["text"]) == (REASONING, ANSWER)
    assert engine.prompts[-1] == llama_cpp_prompt(QUESTION, False)
    assert engine.prompts[-1].endswith("<|turn>model\n<|channel>thought\n<channel|>")
    assert main(["run", "gemma4", "-p", "What is 2+2?", "--reasoning-effort", "high"]) == 1
    assert "takes no reasoning effort" in capsys.readouterr().err
    monkeypatch.setattr(inference, "load", lambda *a, **k: ScriptedEngine(tmp_path / "gpt-oss-20b.gguf"))
    assert main(["run", "gpt-oss", "-p", "What is 2+2?", "--reasoning", "off"]) == 1  # gpt-oss always reasons
    assert "has no switch for thinking" in capsys.readouterr().err


@pytest.fixture(scope="module")
def served(tmp_path_factory, smollm2):
    """(base URL, engine) of a server on a free port of 127.0.0.1."""
    path = tmp_path_factory.mktemp("gemma4") / "gemma-4-31b-it.gguf"
    with serving_scripted(smollm2, path, SOURCE, gemma4_engine(path)) as served:
        yield served


def test_openai_gets_the_thought_as_reasoning_content_of_a_conversation_rendered_as_llama_cpp(served):
    url, engine = served
    oai = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)
    r = oai.chat.completions.create(model="gemma-4-31b-it.gguf", messages=CONVERSATION)
    assert r.choices[0].message.content == ANSWER
    assert r.choices[0].message.model_dump()["reasoning_content"] == REASONING
    assert engine.prompts[-1] == llama_cpp_prompt(CONVERSATION, True) and "Add them" not in engine.prompts[-1]
    assert engine.shown == ("<|channel>", "<channel|>")
    chunks = list(oai.chat.completions.create(model="gemma-4-31b-it.gguf", messages=QUESTION, stream=True))
    deltas = [c.choices[0].delta.model_dump() for c in chunks if c.choices]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == REASONING
    assert "".join(d.get("content") or "" for d in deltas) == ANSWER


def test_ollama_gets_the_thought_as_thinking_and_think_false_reaches_the_template(served):
    url, engine = served
    oll = ollama.Client(host=url, timeout=30)
    r = oll.chat(model="gemma-4-31b-it.gguf", messages=QUESTION)
    assert (r.message.thinking, r.message.content) == (REASONING, ANSWER)
    oll.chat(model="gemma-4-31b-it.gguf", messages=QUESTION, think=False)
    assert engine.prompts[-1] == llama_cpp_prompt(QUESTION, False)
    assert "thinking" in oll.show("gemma-4-31b-it.gguf").capabilities


def test_anthropic_gets_the_thought_as_a_thinking_block(served):
    url, engine = served
    client = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0, timeout=30)
    r = client.messages.create(model="gemma-4-31b-it.gguf", max_tokens=256, messages=QUESTION)
    assert [b.type for b in r.content] == ["thinking", "text"]
    assert (r.content[0].thinking, r.content[1].text) == (REASONING, ANSWER)
    client.messages.create(model="gemma-4-31b-it.gguf", max_tokens=256, messages=QUESTION,
                           thinking={"type": "disabled"})
    assert engine.prompts[-1] == llama_cpp_prompt(QUESTION, False)


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "Weather in Paris and Rome?"}]
CALLS = ('<|channel>thought\nThe user wants the weather.<channel|>Checking both.<|tool_call>call:get_weather'
         '{city:<|"|>Paris<|"|>}<tool_call|><|tool_call>call:get_weather{city:<|"|>Rome<|"|>,days:3}<tool_call|>')


def test_openai_gets_gemma4_tool_calls_and_their_results_go_back_through_the_template(served, monkeypatch):
    """The calls come out of the reply as tool_calls, apart from the thought and the text; sent back with their
    results, the template writes them as Gemma 4 reads them and the next reply goes on right after the results."""
    url, engine = served
    oai = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)
    monkeypatch.setattr(engine, "reply", CALLS)
    r = oai.chat.completions.create(model="gemma-4-31b-it.gguf", messages=ASK, tools=[WEATHER])
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and message.content == "Checking both."
    assert message.model_dump()["reasoning_content"] == "The user wants the weather."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome", "days": 3})]
    assert engine.special and "<|tool>declaration:get_weather{" in engine.prompts[-1]
    chunks = list(oai.chat.completions.create(model="gemma-4-31b-it.gguf", messages=ASK, tools=[WEATHER],
                                              stream=True))
    deltas = [d for c in chunks for d in c.choices[0].delta.tool_calls or []]
    assert [(d.index, d.function.name) for d in deltas if d.function.name] == [(0, "get_weather"), (1, "get_weather")]
    assert json.loads("".join(d.function.arguments or "" for d in deltas if d.index == 1)) == {"city": "Rome", "days": 3}

    monkeypatch.setattr(engine, "reply", "It is 18 C in Paris and 15 C in Rome.")
    history = ASK + [message.model_dump(exclude_none=True)] + [
        {"role": "tool", "tool_call_id": c.id, "content": result} for c, result in zip(message.tool_calls,
                                                                                       ["18 C", "15 C"])]
    r = oai.chat.completions.create(model="gemma-4-31b-it.gguf", messages=history, tools=[WEATHER])
    assert r.choices[0].message.content == "It is 18 C in Paris and 15 C in Rome." and not r.choices[0].message.tool_calls
    assert engine.prompts[-1].endswith(
        '<|turn>model\n<|channel>thought\nThe user wants the weather.\n<channel|><|tool_call>call:get_weather'
        '{city:<|"|>Paris<|"|>}<tool_call|><|tool_call>call:get_weather{city:<|"|>Rome<|"|>,days:3}<tool_call|>'
        '<|tool_response>response:get_weather{value:<|"|>18 C<|"|>}<tool_response|><|tool_response>response:'
        'get_weather{value:<|"|>15 C<|"|>}<tool_response|>Checking both.<turn|>\n<|turn>model\n')


def test_ollama_gets_gemma4_tool_calls_with_their_arguments_as_objects(served, monkeypatch):
    url, engine = served
    monkeypatch.setattr(engine, "reply", CALLS)
    r = ollama.Client(host=url, timeout=30).chat(model="gemma-4-31b-it.gguf", messages=ASK, tools=[WEATHER])
    assert (r.message.thinking, r.message.content) == ("The user wants the weather.", "Checking both.")
    assert [(c.function.name, c.function.arguments) for c in r.message.tool_calls] == [
        ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome", "days": 3})]


def test_tool_choice_required_holds_the_gemma4_reply_to_calls_after_its_thought(served, monkeypatch):
    url, engine = served
    monkeypatch.setattr(engine, "reply", CALLS)
    oai = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)
    r = oai.chat.completions.create(model="gemma-4-31b-it.gguf", messages=ASK, tools=[WEATHER], tool_choice="required")
    assert len(r.choices[0].message.tool_calls) == 2
    assert (engine.constraint.think, engine.constraint.after) == ("<|channel>", "<channel|>")  # a thought first
    assert "call:get_weather" in engine.constraint.grammar
