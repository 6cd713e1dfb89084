"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) through the real server (routes, queue,
worker) and the real `anthropic` client: the scripted Qwen3 engine of test_serve_tools for exact replies (thinking,
tool calls, stop sequences), and SmolLM2 on the CPU for the real engine; raw HTTP for what the client hides (the
event order with its pings, a request the client would not send)."""
import json

import anthropic
import httpx
import openai
import pytest

from app.server_anthropic_schema import anthropic_request
from tests.app.in_process_server import serving_on_cpu, serving_one
from tests.app.test_reasoning_history import server_prompt
from tests.app.test_serve_tools import KEPT, MODEL, ScriptedEngine

KEY = "test-key-anthropic"
TOOLS = [{"name": "get_weather", "description": "Get the current weather in a given city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"
HI = [{"role": "user", "content": "Hello"}]
NO_TOOLS_REPLY = "I cannot look that up."  # the script's reply when no tools were given


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with serving_one(tmp_path_factory.mktemp("anthropic"), MODEL, ScriptedEngine, KEY) as served:
        yield served


@pytest.fixture(scope="module")
def client(served) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=served[0], api_key=KEY, max_retries=0, timeout=30)  # sends x-api-key


def sse(url: str, body: dict, headers=None) -> list[dict]:
    """The events of a streamed reply as sent, pings included, each checked to name its type in both lines."""
    events = []
    with httpx.stream("POST", url + "/v1/messages", json=body | {"stream": True}, timeout=30,
                      headers=headers or {"x-api-key": KEY}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for chunk in r.read().decode().split("\n\n"):
            if chunk.strip():
                name, data = chunk.split("\n")
                events.append(json.loads(data.removeprefix("data: ")))
                assert name == "event: " + events[-1]["type"]
    return events


def test_plain_reply(client, served):
    r = client.messages.create(model=MODEL, max_tokens=64, messages=HI,
                               system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}])
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_") and r.model == MODEL
    assert [(b.type, b.text) for b in r.content] == [("text", NO_TOOLS_REPLY)]
    assert r.stop_reason == "end_turn" and r.stop_sequence is None
    prompt = served[1].prompts[-1][0]
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\nBe kind.<|im_end|>\n<|im_start|>user\nHello<|im_end|>")
    assert r.usage.input_tokens == len(prompt) and r.usage.output_tokens == 8  # a character a token; 3 a piece


def claude_code(messages: list[dict], cch: str) -> dict:
    """A request as Claude Code sends it: its billing line (a new cch each request) and its prompt as system blocks
    with cache_control, tools with JSON Schema's $schema, metadata, a large max_tokens, streamed."""
    tool = TOOLS[0] | {"input_schema": TOOLS[0]["input_schema"] | {
        "$schema": "http://json-schema.org/draft-07/schema#", "additionalProperties": False}}
    return dict(model=MODEL, max_tokens=32000, extra_body={"temperature": 1}, metadata={"user_id": "user_abc_1"},
                system=[{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.37; cch={cch};"},
                        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
                tools=[tool], messages=messages)


def test_a_claude_code_round_trip_keeps_the_prompts_beginning(client, served):
    """Claude Code's billing line is left out (it changes every request: no prompt could reuse the cache), and a
    system reminder between turns is a user message where it stands (Qwen3.5's template takes no second system
    message), so that each request's prompt starts with the one before."""
    ask = [{"role": "user", "content": [{"type": "text", "text": ASK[0]["content"],
                                         "cache_control": {"type": "ephemeral"}}]}]
    with client.messages.stream(**claude_code(ask, "fa690")) as stream:
        first = stream.get_final_message()
    assert first.stop_reason == "tool_use"
    before = served[1].prompts[-1][0]
    assert before.startswith("<|im_start|>system\nYou are Claude Code.") and "billing" not in before
    call = first.content[-1]
    history = ask + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                   "content": "18 C, sunny"}]},
                     {"role": "system", "content": "<system-reminder>Be brief.</system-reminder>"}]
    with client.messages.stream(**claude_code(history, "0b1c2")) as stream:
        assert stream.get_final_message().content  # the script calls again: its last user turn is the reminder
    after = served[1].prompts[-1][0]
    assert after.startswith(before)
    assert "<|im_start|>user\n<system-reminder>Be brief.</system-reminder><|im_end|>" in after
    body = claude_code(history, "0b1c2")
    assert "<system-reminder>" in server_prompt("Qwen3.5-4B", anthropic_request(body | body.pop("extra_body")))


def test_streamed_reply_is_anthropics_event_sequence(client, served):
    events = sse(served[0], {"model": MODEL, "max_tokens": 64, "messages": HI})
    types = [e["type"] for e in events]
    n = types.count("content_block_delta")
    assert types == ["message_start", "content_block_start", "ping"] + ["content_block_delta"] * n + [
        "content_block_stop", "message_delta", "message_stop"] and n > 1
    start = events[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    assert events[1]["content_block"] == {"type": "text", "text": ""} and events[1]["index"] == 0
    assert "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta") == NO_TOOLS_REPLY
    assert events[-2]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert events[-2]["usage"]["output_tokens"] == 8

    with client.messages.stream(model=MODEL, max_tokens=64, messages=HI) as stream:
        assert "".join(stream.text_stream) == NO_TOOLS_REPLY
        final = stream.get_final_message()
    assert final.content[0].text == NO_TOOLS_REPLY and final.stop_reason == "end_turn"


def test_tool_round_trip(client, served):
    r = client.messages.create(model=MODEL, max_tokens=256, messages=ASK, tools=TOOLS)
    assert r.stop_reason == "tool_use"
    thinking, call = r.content
    assert thinking.type == "thinking" and thinking.thinking == "The user wants the weather.\n"
    assert call.type == "tool_use" and call.name == "get_weather" and call.input == {"city": "Paris"} and call.id
    assert "<tools>" in served[1].prompts[-1][0] and '"name": "get_weather"' in served[1].prompts[-1][0]

    history = ASK + [{"role": "assistant", "content": r.content},  # the reply's blocks as they came, thinking too
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                   "content": "18 C, sunny"}]}]
    r = client.messages.create(model=MODEL, max_tokens=256, messages=history, tools=TOOLS)
    assert [b.type for b in r.content] == ["thinking", "text"] and r.stop_reason == "end_turn"
    assert r.content[0].thinking == "The user has the result.\n"
    assert r.content[1].text == "It is 18 C and sunny in Paris."
    prompt = served[1].prompts[-1][0]  # the call and its result went back through the template
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\n18 C, sunny\n</tool_response>" in prompt and KEPT in prompt  # its reasoning too


def test_tool_round_trip_streamed(client, served):
    events = sse(served[0], {"model": MODEL, "max_tokens": 256, "messages": ASK, "tools": TOOLS})
    types = [t for i, t in enumerate(e["type"] for e in events) if i == 0 or t != events[i - 1]["type"]]  # a run: one
    assert types == ["message_start", "content_block_start", "ping", "content_block_delta", "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
                     "message_stop"]
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert starts[0] == {"type": "thinking", "thinking": "", "signature": ""}
    assert starts[1]["type"] == "tool_use" and starts[1]["name"] == "get_weather" and starts[1]["input"] == {}
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert {d["type"] for d in deltas} == {"thinking_delta", "input_json_delta"}
    assert [e["index"] for e in events if e["type"] == "content_block_stop"] == [0, 1]
    assert events[-2]["delta"]["stop_reason"] == "tool_use"

    with client.messages.stream(model=MODEL, max_tokens=256, messages=ASK, tools=TOOLS) as stream:
        r = stream.get_final_message()
    thinking, call = r.content
    assert thinking.thinking == "The user wants the weather.\n" and call.input == {"city": "Paris"}
    history = ASK + [{"role": "assistant", "content": r.content},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                   "content": [{"type": "text", "text": "18 C, sunny"}]}]}]
    with client.messages.stream(model=MODEL, max_tokens=256, messages=history, tools=TOOLS) as stream:
        assert "".join(stream.text_stream) == "It is 18 C and sunny in Paris."
        assert stream.get_final_message().content[0].thinking == "The user has the result.\n"


def test_tool_choice(client, served):
    r = client.messages.create(model=MODEL, max_tokens=64, messages=ASK, tools=TOOLS, tool_choice={"type": "none"})
    assert r.content[0].text == NO_TOOLS_REPLY and "<tools>" not in served[1].prompts[-1][0]
    r = client.messages.create(model=MODEL, max_tokens=256, messages=ASK, tools=TOOLS, tool_choice={"type": "any"})
    assert r.stop_reason == "tool_use" and "Answer by calling one or more of the tools." in served[1].prompts[-1][0]
    r = client.messages.create(model=MODEL, max_tokens=256, messages=ASK, tools=TOOLS,
                               tool_choice={"type": "tool", "name": "get_weather"})
    assert r.content[-1].name == "get_weather" and "Answer by calling the tool get_weather." in served[1].prompts[-1][0]
    both = [{"role": "user", "content": "The weather in Paris and in Rome?"}]
    r = client.messages.create(model=MODEL, max_tokens=256, messages=both, tools=TOOLS)
    assert [b.input["city"] for b in r.content if b.type == "tool_use"] == ["Paris", "Rome"]
    r = client.messages.create(model=MODEL, max_tokens=256, messages=both, tools=TOOLS,
                               tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    assert [b.input["city"] for b in r.content if b.type == "tool_use"] == ["Paris"]


def test_stop_sequences_and_max_tokens(client, served):
    r = client.messages.create(model=MODEL, max_tokens=64, messages=HI, stop_sequences=["never", "look"])
    assert r.content[0].text == "I cannot " and (r.stop_reason, r.stop_sequence) == ("stop_sequence", "look")
    events = sse(served[0], {"model": MODEL, "max_tokens": 64, "messages": HI, "stop_sequences": ["look"]})
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "look"}
    r = client.messages.create(model=MODEL, max_tokens=2, messages=HI)
    assert r.content[0].text == "I cann" and r.stop_reason == "max_tokens" and r.usage.output_tokens == 2


def test_thinking_param_reaches_the_template(client, served):
    client.messages.create(model=MODEL, max_tokens=8, messages=HI, thinking={"type": "disabled"})
    assert served[1].prompts[-1][0].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # Qwen3's off switch
    client.messages.create(model=MODEL, max_tokens=8, messages=HI, thinking={"type": "enabled", "budget_tokens": 2048})
    assert served[1].prompts[-1][0].endswith("<|im_start|>assistant\n")


def test_count_tokens(client, served):
    kw = dict(model=MODEL, messages=ASK, tools=TOOLS, system="Be brief.")
    count = client.messages.count_tokens(**kw).input_tokens
    assert count == client.messages.create(max_tokens=256, **kw).usage.input_tokens == len(served[1].prompts[-1][0])
    assert client.messages.count_tokens(model=MODEL, messages=HI).input_tokens < count


def test_bad_input_is_a_4xx_in_anthropics_error_shape(client, served):
    def refused(body: dict, status: int = 400, headers=None) -> str:
        r = httpx.post(served[0] + "/v1/messages", json=body, headers=headers or {"x-api-key": KEY}, timeout=30)
        error = r.json()
        assert r.status_code == status and error["type"] == "error" and set(error["error"]) == {"type", "message"}
        return error["error"]["type"] + ": " + error["error"]["message"]

    assert refused({"model": MODEL, "messages": HI}) == \
        "invalid_request_error: 'max_tokens' is required: the most tokens the reply may have"
    assert "max_tokens" in refused({"model": MODEL, "messages": HI, "max_tokens": 0})
    assert "'messages' is required" in refused({"model": MODEL, "max_tokens": 8})
    assert refused({"model": MODEL, "messages": HI, "max_tokens": 8}, 401, {"x-api-key": "wrong"}).startswith(
        "authentication_error: a valid API key is required")
    assert refused({"model": "nope", "messages": HI, "max_tokens": 8}, 404).startswith("not_found_error: model 'nope'")
    assert "not valid JSON" in httpx.post(served[0] + "/v1/messages", content=b"{", headers={"x-api-key": KEY}).json()[
        "error"]["message"]

    def refused_by_client(**kw) -> str:
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(model=MODEL, max_tokens=8, **kw)
        assert e.value.status_code == 400 and e.value.body["error"]["type"] == "invalid_request_error"
        return e.value.body["error"]["message"]

    assert refused_by_client(messages=ASK + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "abc123xyz", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "not-a-call", "content": "18 C"}]}]) == \
        "'messages[2].content[0].tool_use_id' is 'not-a-call', but no tool call before it has that id"
    assert refused_by_client(messages=[{"role": "user", "content": [{"type": "video", "url": "x"}]}]) == \
        "'messages[0].content[0]' has type 'video': a user message holds text and tool_result blocks"
    assert "the models this server runs read text only" in refused_by_client(messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}])
    assert "does not continue a prefilled reply" in refused_by_client(
        messages=HI + [{"role": "assistant", "content": "Sure"}])
    assert "one of Anthropic's server tools" in refused_by_client(
        messages=HI, tools=[{"type": "web_search_20250305", "name": "web_search"}])
    assert "names the function 'nope'" in refused_by_client(messages=ASK, tools=TOOLS,
                                                             tool_choice={"type": "tool", "name": "nope"})


def test_sampling_reaches_the_engine(client, served):
    client.messages.create(model=MODEL, max_tokens=8, messages=HI,
                           extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 20})  # no longer named by this client
    assert served[1].sampling == {"temperature": 0.5, "top_p": 0.9, "top_k": 20, "constraint": None,
                                  "shown": ()}


def test_an_engine_failure_mid_stream_is_an_error_event(client, served):
    events = sse(served[0], {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "FAIL"}]})
    assert [e["type"] for e in events] == ["message_start", "content_block_start", "ping", "content_block_delta",
                                           "error"]
    assert events[-1]["error"] == {"type": "api_error",
                                   "message": "the engine failed: RuntimeError: scripted failure"}
    with pytest.raises(anthropic.APIStatusError, match="scripted failure"):
        with client.messages.stream(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "FAIL"}]) as s:
            s.get_final_message()


def test_bearer_token_works_too(served):
    bearer = anthropic.Anthropic(base_url=served[0], auth_token=KEY, max_retries=0, timeout=30)  # Authorization
    assert bearer.messages.create(model=MODEL, max_tokens=64, messages=HI).content[0].text == NO_TOOLS_REPLY


@pytest.fixture(scope="module")
def smol(smollm2, tmp_path_factory):
    with serving_on_cpu(smollm2, tmp_path_factory.mktemp("hub"), None) as url:
        yield url


def test_real_engine_answers_as_on_the_openai_route(smol):
    """SmolLM2 greedy: the same text through Anthropic's API, streamed or not, as through OpenAI's chat route."""
    client = anthropic.Anthropic(base_url=smol, api_key="anything", max_retries=0, timeout=120)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    greedy = {"temperature": 0}  # this client version no longer names Anthropic's sampling fields; older ones did
    r = client.messages.create(model=SMOL, max_tokens=12, messages=question, extra_body=greedy)
    oai = openai.OpenAI(base_url=smol + "/v1", api_key="anything", max_retries=0, timeout=120)
    expected = oai.chat.completions.create(model=SMOL, max_tokens=12, temperature=0, messages=question).choices[0]
    assert r.content[0].text == expected.message.content and r.content[0].text.strip()
    assert r.stop_reason == ("max_tokens" if expected.finish_reason == "length" else "end_turn")
    with client.messages.stream(model=SMOL, max_tokens=12, messages=question, extra_body=greedy) as stream:
        assert "".join(stream.text_stream) == r.content[0].text
    assert client.messages.count_tokens(model=SMOL, messages=question).input_tokens == r.usage.input_tokens
