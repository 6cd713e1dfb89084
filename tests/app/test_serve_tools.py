"""Tool calls through the real server (routes, queue, worker) and the real `openai` and `ollama` clients. Test
models with random weights never write a tool call, so the engine here is a scripted one, loaded through the
worker's `load` (the seam test_server_prompt uses too): Qwen3's real chat template and a reply chosen by what the
rendered prompt asks, streamed a few characters at a time, as the engine streams its pieces."""
import json
from pathlib import Path
from types import SimpleNamespace

import ollama
import openai
import pytest

from inference.engine import GenerationStats, StopScanner
from models.chat_template import ChatTemplate
from tests.app.in_process_server import serving_one
from tests.app.test_tool_calls import TEMPLATES, TOOLS

KEY = "test-key-tools"
MODEL = "scripted-qwen3.gguf"
CALL = '<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{}"}}}}\n</tool_call>'
THINKING = "<think>\nThe user wants the weather.\n</think>\n\n"
KEPT = THINKING + "<tool_call>"  # the call's reasoning, sent back, in the next prompt (Qwen3 keeps this turn's)


def script(prompt: str) -> str:
    """The reply to a rendered prompt: a call while the last turn asks for the weather and tools were given, the
    answer once the tool's result came back."""
    last = prompt[prompt.rindex("<|im_start|>user"):]
    if "<tool_response>" in last:
        return THINKING.replace("wants the weather", "has the result") + "It is 18 C and sunny in Paris."
    if "<tools>" not in prompt:
        return "I cannot look that up."
    if "broken" in last:
        return '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>'
    if "Rome" in last:
        return THINKING + CALL.format("Paris") + "\n" + CALL.format("Rome")
    return THINKING + CALL.format("Paris")


class ScriptedEngine:
    def __init__(self, path: Path):
        self.path, self.n_ctx, self.config = path, 8192, SimpleNamespace(n_ctx_train=8192)
        self.chat_template = ChatTemplate((TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text())
        self.tokenizer = SimpleNamespace(encode_prompt=lambda text: [ord(c) for c in text])  # a token a character
        self.prompts = []  # (prompt text, special) of each request

    def generate(self, ids, max_tokens, stop, cancelled, special=False, **sampling):
        """The script's reply in 3-character pieces, a piece a token: cut at max_tokens and at a stop string, as the
        engine cuts it (its StopScanner); a prompt that says FAIL fails after its first piece, as a broken engine."""
        prompt = "".join(map(chr, ids))
        self.prompts.append((prompt, special))
        self.sampling = sampling  # the last request's
        reply = script(prompt)
        pieces = [reply[i:i + 3] for i in range(0, len(reply), 3)]
        scanner, stopped = StopScanner(stop), None
        for n, piece in enumerate(pieces[:max_tokens], 1):
            if n == 2 and "FAIL" in prompt:
                raise RuntimeError("scripted failure")
            shown, stopped = scanner.feed(piece)
            if shown:
                yield shown
            if stopped:
                break
        if not stopped and (tail := scanner.feed("", final=True)[0]):
            yield tail
        finish = "stop" if stopped or n == len(pieces) else "length"
        yield GenerationStats(len(ids), 0.01, n, 0.01, finish, len(ids) + n, stopped)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with serving_one(tmp_path_factory.mktemp("tools"), MODEL, ScriptedEngine, KEY) as served:
        yield served


@pytest.fixture(scope="module")
def oai(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served[0] + "/v1", api_key=KEY, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def oll(served) -> ollama.Client:
    return ollama.Client(host=served[0], headers={"Authorization": f"Bearer {KEY}"}, timeout=30)


ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def streamed(chunks) -> tuple[str, str, list[dict], str, list]:
    """(content, reasoning, calls, finish_reason, each call's deltas) of a chat stream, as a client puts it together."""
    content, reasoning, calls, deltas, finish = [], [], {}, {}, None
    for chunk in chunks:
        choice = chunk.choices[0]
        content.append(choice.delta.content or "")
        reasoning.append((choice.delta.model_extra or {}).get("reasoning_content") or "")
        for d in choice.delta.tool_calls or []:
            deltas.setdefault(d.index, []).append(d)
            call = calls.setdefault(d.index, {"id": d.id, "name": d.function.name, "arguments": ""})
            call["arguments"] += d.function.arguments or ""
        finish = choice.finish_reason or finish
    return "".join(content), "".join(reasoning), [calls[i] for i in sorted(calls)], finish, deltas


def test_openai_tool_round_trip(oai, served):
    r = oai.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS)
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and message.content is None
    assert message.model_extra["reasoning_content"] == "The user wants the weather.\n"  # thinking stays apart
    [call] = message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert served[1].prompts[-1][1]  # the engine wrote control tokens as text for the parser

    history = ASK + [message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}]
    r = oai.chat.completions.create(model=MODEL, messages=history, tools=TOOLS)
    assert r.choices[0].message.content == "It is 18 C and sunny in Paris." and r.choices[0].finish_reason == "stop"
    prompt = served[1].prompts[-1][0]  # the call and its result went back through the template
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\n18 C, sunny\n</tool_response>" in prompt and KEPT in prompt


def test_openai_tool_round_trip_streamed(oai):
    content, reasoning, calls, finish, deltas = streamed(
        oai.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, stream=True))
    assert (content, reasoning, finish) == ("", "The user wants the weather.\n", "tool_calls")
    [call] = calls
    first, *rest = deltas[0]  # id, type and name first, then the arguments
    assert first.id == call["id"] and first.type == "function" and first.function.name == "get_weather"
    assert rest and all(d.id is None and d.function.name is None for d in rest)
    assert json.loads(call["arguments"]) == {"city": "Paris"}

    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": "18 C, sunny"}]
    content, reasoning, calls, finish, _ = streamed(
        oai.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, stream=True))
    assert (content, calls, finish) == ("It is 18 C and sunny in Paris.", [], "stop")
    assert reasoning == "The user has the result.\n"


def test_parallel_calls_and_parallel_tool_calls_false(oai):
    both = [{"role": "user", "content": "The weather in Paris and in Rome?"}]
    r = oai.chat.completions.create(model=MODEL, messages=both, tools=TOOLS)
    assert [json.loads(c.function.arguments)["city"] for c in r.choices[0].message.tool_calls] == ["Paris", "Rome"]
    assert len({c.id for c in r.choices[0].message.tool_calls}) == 2
    _, _, calls, _, _ = streamed(oai.chat.completions.create(model=MODEL, messages=both, tools=TOOLS, stream=True))
    assert [json.loads(c["arguments"])["city"] for c in calls] == ["Paris", "Rome"]
    r = oai.chat.completions.create(model=MODEL, messages=both, tools=TOOLS, parallel_tool_calls=False)
    assert [json.loads(c.function.arguments)["city"] for c in r.choices[0].message.tool_calls] == ["Paris"]


def test_tool_choice_none_required_and_named(oai, served):
    r = oai.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none")
    assert r.choices[0].message.content == "I cannot look that up." and not r.choices[0].message.tool_calls
    assert served[1].prompts[-1] == (served[1].prompts[-1][0], False)  # no tools: no parser, no control text
    r = oai.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required")
    assert r.choices[0].message.tool_calls and "Answer by calling one or more of the tools." in served[1].prompts[-1][0]
    r = oai.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                    tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert '"name": "python"' not in served[1].prompts[-1][0]
    with pytest.raises(openai.BadRequestError, match="names the function 'nope', which is not in 'tools'"):
        oai.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                    tool_choice={"type": "function", "function": {"name": "nope"}})


def test_a_malformed_call_comes_back_as_text(oai):
    broken = [{"role": "user", "content": "Try the broken one for Paris."}]
    r = oai.chat.completions.create(model=MODEL, messages=broken, tools=TOOLS)
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls
    assert r.choices[0].message.content == script("<tools><|im_start|>user broken")
    content, _, calls, finish, _ = streamed(
        oai.chat.completions.create(model=MODEL, messages=broken, tools=TOOLS, stream=True))
    assert (content, calls, finish) == (r.choices[0].message.content, [], "stop")


def test_ollama_tool_round_trip(oll, served):
    r = oll.chat(model=MODEL, messages=ASK, tools=TOOLS)
    [call] = r.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    assert r.message.thinking == "The user wants the weather.\n" and r.message.content == "" and r.done
    streamed_calls = [c for part in oll.chat(model=MODEL, messages=ASK, tools=TOOLS, stream=True)
                      for c in part.message.tool_calls or []]
    assert [(c.function.name, c.function.arguments) for c in streamed_calls] == [("get_weather", {"city": "Paris"})]
    history = ASK + [r.message, {"role": "tool", "content": "18 C, sunny", "tool_name": "get_weather"}]
    r = oll.chat(model=MODEL, messages=history, tools=TOOLS)
    assert r.message.content == "It is 18 C and sunny in Paris." and not r.message.tool_calls
    assert "<tool_response>\n18 C, sunny\n</tool_response>" in served[1].prompts[-1][0]
    assert KEPT in served[1].prompts[-1][0]  # its thinking went back
