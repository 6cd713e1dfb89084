"""OpenAI's Responses API (/v1/responses) through the real server (routes, queue, worker) and the real `openai`
client (responses.create, responses.stream): the scripted Qwen3 engine of test_serve_tools for exact replies
(reasoning, function calls), SmolLM2 on the CPU for the real engine and structured output; raw HTTP for the events as
sent."""
import json

import httpx
import jsonschema
import openai
import pytest

from app.server_responses import ResponseStore
from app.server_responses_schema import responses_request
from app.server_schema import ApiError
from tests.app.in_process_server import serving_on_cpu, serving_one
from tests.app.test_serve_json import PERSON
from tests.app.test_reasoning_history import server_prompt
from tests.app.test_serve_tools import KEPT, MODEL, ScriptedEngine

KEY = "test-key-responses"
TOOLS = [{"type": "function", "name": "get_weather", "description": "Get the current weather in a given city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NO_TOOLS_REPLY = "I cannot look that up."  # the script's reply when no tools were given
SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with serving_one(tmp_path_factory.mktemp("responses"), MODEL, ScriptedEngine, KEY) as served:
        yield served


@pytest.fixture(scope="module")
def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served[0] + "/v1", api_key=KEY, max_retries=0, timeout=30)


def sse(url: str, body: dict) -> list[dict]:
    """The events of a streamed response as sent, each checked to name its type in both lines and to come with the
    next sequence number."""
    events = []
    with httpx.stream("POST", url + "/v1/responses", json=body | {"stream": True}, timeout=30,
                      headers={"Authorization": f"Bearer {KEY}"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for chunk in r.read().decode().split("\n\n"):
            if chunk.strip():
                name, data = chunk.split("\n")
                events.append(json.loads(data.removeprefix("data: ")))
                assert name == "event: " + events[-1]["type"] and events[-1]["sequence_number"] == len(events) - 1
    return events


def test_plain_response(client, served):
    r = client.responses.create(model=MODEL, input="Hello", instructions="Be brief.")
    assert r.object == "response" and r.id.startswith("resp_") and r.status == "completed" and r.model == MODEL
    [message] = r.output
    assert message.type == "message" and message.role == "assistant" and message.status == "completed"
    assert [(c.type, c.text) for c in message.content] == [("output_text", NO_TOOLS_REPLY)]
    assert r.output_text == NO_TOOLS_REPLY
    prompt = served[1].prompts[-1][0]
    assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>")
    assert (r.usage.input_tokens, r.usage.output_tokens) == (len(prompt), 8)  # a character a token; 3 a piece
    assert r.usage.total_tokens == len(prompt) + 8


def test_streamed_response_is_the_apis_event_sequence(client, served):
    events = sse(served[0], {"model": MODEL, "input": "Hello"})
    types = [e["type"] for e in events]
    n = types.count("response.output_text.delta")
    assert types == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added"] + ["response.output_text.delta"] * n + [
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"] and n > 1
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    item_id = events[2]["item"]["id"]
    assert all(e["item_id"] == item_id for e in events[3:-2]) and events[-2]["item"]["id"] == item_id
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == NO_TOOLS_REPLY
    assert events[-1]["response"]["output"] == [events[-2]["item"]] and events[-1]["response"]["usage"]

    with client.responses.stream(model=MODEL, input="Hello") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == NO_TOOLS_REPLY and final.status == "completed"
    seen = [e.type for e in client.responses.create(model=MODEL, input="Hello", stream=True)]
    assert seen == types[:4] + ["response.output_text.delta"] * n + types[-4:]


def test_function_call_round_trip(client, served):
    r = client.responses.create(model=MODEL, input=ASK, tools=TOOLS)
    reasoning, call = r.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_") and reasoning.summary == []
    assert [(c.type, c.text) for c in reasoning.content] == [("reasoning_text", "The user wants the weather.\n")]
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id and call.id.startswith("fc_")
    assert json.loads(call.arguments) == {"city": "Paris"} and r.status == "completed"

    history = ASK + r.output + [{"type": "function_call_output", "call_id": call.call_id, "output": "18 C, sunny"}]
    r = client.responses.create(model=MODEL, input=history, tools=TOOLS)
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == "The user has the result.\n"
    assert r.output_text == "It is 18 C and sunny in Paris."
    prompt = served[1].prompts[-1][0]  # the call and its output went back through the template
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\n18 C, sunny\n</tool_response>" in prompt and KEPT in prompt  # its reasoning too


def test_function_call_round_trip_streamed(client, served):
    events = sse(served[0], {"model": MODEL, "input": ASK, "tools": TOOLS})
    types = [t for i, t in enumerate(e["type"] for e in events) if i == 0 or t != events[i - 1]["type"]]  # a run: one
    assert types == ["response.created", "response.in_progress",
                     "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
                     "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
                     "response.output_item.added", "response.function_call_arguments.delta",
                     "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert [i["type"] for i in added] == ["reasoning", "function_call"] and added[1]["arguments"] == ""
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.done"] == [0, 1]

    with client.responses.stream(model=MODEL, input=ASK, tools=TOOLS) as stream:
        r = stream.get_final_response()
    call = r.output[1]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    history = ASK + [{"type": "function_call", "call_id": call.call_id, "name": call.name,
                      "arguments": call.arguments},
                     {"type": "function_call_output", "call_id": call.call_id, "output": "18 C, sunny"}]
    with client.responses.stream(model=MODEL, input=history, tools=TOOLS) as stream:
        assert "".join(e.delta for e in stream if e.type == "response.output_text.delta") == \
            "It is 18 C and sunny in Paris."


def test_tool_choice_and_parallel_tool_calls(client, served):
    r = client.responses.create(model=MODEL, input=ASK, tools=TOOLS, tool_choice="none")
    assert r.output_text == NO_TOOLS_REPLY and "<tools>" not in served[1].prompts[-1][0]
    r = client.responses.create(model=MODEL, input=ASK, tools=TOOLS, tool_choice="required")
    assert r.output[-1].type == "function_call" and "Answer by calling one or more" in served[1].prompts[-1][0]
    r = client.responses.create(model=MODEL, input=ASK, tools=TOOLS,
                                tool_choice={"type": "function", "name": "get_weather"})
    assert r.output[-1].name == "get_weather" and "Answer by calling the tool get_weather." in served[1].prompts[-1][0]
    both = [{"role": "user", "content": [{"type": "input_text", "text": "The weather in Paris and in Rome?"}]}]
    r = client.responses.create(model=MODEL, input=both, tools=TOOLS)
    assert [json.loads(o.arguments)["city"] for o in r.output if o.type == "function_call"] == ["Paris", "Rome"]
    r = client.responses.create(model=MODEL, input=both, tools=TOOLS, parallel_tool_calls=False)
    assert [json.loads(o.arguments)["city"] for o in r.output if o.type == "function_call"] == ["Paris"]


def test_max_output_tokens_makes_an_incomplete_response(client, served):
    r = client.responses.create(model=MODEL, input="Hello", max_output_tokens=2)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text == "I cann" and r.usage.output_tokens == 2
    events = sse(served[0], {"model": MODEL, "input": "Hello", "max_output_tokens": 2})
    assert events[-1]["type"] == "response.incomplete" and events[-1]["response"]["status"] == "incomplete"


def test_previous_response_id_continues_a_stored_response(client, served):
    """A tool round trip chained as Codex-style clients chain it: the second request sends only the call's output;
    the prompt is the one of the whole conversation sent at once (test_function_call_round_trip)."""
    first = client.responses.create(model=MODEL, input=ASK, tools=TOOLS)
    assert first.store is True and first.previous_response_id is None
    call = first.output[1]
    output = [{"type": "function_call_output", "call_id": call.call_id, "output": "18 C, sunny"}]
    r = client.responses.create(model=MODEL, previous_response_id=first.id, input=output, tools=TOOLS)
    assert r.output_text == "It is 18 C and sunny in Paris." and r.previous_response_id == first.id
    chained = served[1].prompts[-1][0]
    client.responses.create(model=MODEL, input=ASK + first.output + output, tools=TOOLS)
    assert chained == served[1].prompts[-1][0] and KEPT in chained
    events = sse(served[0], {"model": MODEL, "previous_response_id": r.id, "input": "And in Rome?", "tools": TOOLS})
    done = events[-1]["response"]
    assert done["status"] == "completed" and done["previous_response_id"] == r.id
    assert "It is 18 C and sunny in Paris.<|im_end|>\n<|im_start|>user\nAnd in Rome?" in served[1].prompts[-1][0]
    streamed = client.responses.create(model=MODEL, previous_response_id=done["id"], input="Thanks!")  # kept too
    assert "<|im_start|>user\nAnd in Rome?" in served[1].prompts[-1][0] and streamed.status == "completed"


def test_an_unknown_or_unstored_previous_response_is_openais_400(client):
    r = client.responses.create(model=MODEL, input="Hello", store=False)
    assert r.store is False
    for unknown in (r.id, "resp_123"):
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model=MODEL, input="Hello", previous_response_id=unknown)
        assert e.value.body == {"message": f"Previous response with id '{unknown}' not found.",
                                "type": "invalid_request_error", "param": "previous_response_id",
                                "code": "previous_response_not_found"}


def test_the_store_keeps_the_last_responses():
    store = ResponseStore(size=2)
    for response_id in ("resp_a", "resp_b", "resp_c"):
        store.put(response_id, [{"role": "user", "content": response_id}])
    assert store.get("resp_c") == [{"role": "user", "content": "resp_c"}] and store.get("resp_b")
    with pytest.raises(ApiError, match="Previous response with id 'resp_a' not found."):
        store.get("resp_a")  # the oldest, evicted


# A Codex CLI turn as it sends one to a local model (codex-rs's Responses request: its instructions, a developer
# message, the environment as a user message, function tools only, store false, streamed)
CODEX = {"model": MODEL, "instructions": "You are Codex, a coding agent.", "input": [
    {"type": "message", "role": "developer",
     "content": [{"type": "input_text", "text": "<permissions>sandboxed</permissions>"}]},
    {"type": "message", "role": "user",
     "content": [{"type": "input_text", "text": "<environment_context>\n  <cwd>/repo</cwd>\n</environment_context>"}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is the weather in Paris?"}]}],
    "tools": [{"type": "function", "name": "get_weather", "description": "The weather in a city", "strict": False,
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                              "additionalProperties": False}}],
    "tool_choice": "auto", "parallel_tool_calls": False, "reasoning": None, "store": False, "stream": True,
    "include": [], "prompt_cache_key": "0197c0de", "text": {"verbosity": "low"}}


def test_a_codex_turn_and_its_tool_round_trip(served):
    events = sse(served[0], CODEX)
    assert events[-1]["type"] == "response.completed"  # what Codex waits for, else it retries
    items = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [i["type"] for i in items] == ["reasoning", "function_call"]
    prompt = served[1].prompts[-1][0]
    assert prompt.startswith("<|im_start|>system\nYou are Codex, a coding agent.\n\n<permissions>sandboxed"
                             "</permissions>")  # one system message, as templates take it
    codex_echo = [items[0] | {"encrypted_content": None}, items[1]]  # Codex sends the items back as it got them
    output = {"type": "function_call_output", "call_id": items[1]["call_id"], "output": "18 C, sunny"}
    events = sse(served[0], CODEX | {"input": CODEX["input"] + codex_echo + [output]})
    assert events[-1]["response"]["output"][-1]["content"][0]["text"] == "It is 18 C and sunny in Paris."
    assert KEPT in served[1].prompts[-1][0]
    # Qwen3.5's template refuses a system message after the first one: Codex's first turn renders
    assert "<permissions>sandboxed</permissions>" in server_prompt("Qwen3.5-4B", responses_request(CODEX))


def test_an_engine_failure_mid_stream_is_response_failed(served):
    events = sse(served[0], {"model": MODEL, "input": "FAIL"})
    assert events[-1]["type"] == "response.failed" and events[-2]["type"] == "response.output_text.delta"
    assert events[-1]["response"]["error"] == {"code": "server_error",
                                              "message": "the engine failed: RuntimeError: scripted failure"}


def test_bad_input_is_a_400_in_openais_error_shape(client):
    def refused(**kw) -> str:
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model=MODEL, **kw)
        assert e.value.status_code == 400 and e.value.body["type"] == "invalid_request_error"
        return e.value.body["message"]

    assert refused(input=ASK + [{"type": "function_call_output", "call_id": "nope", "output": "18 C"}]) == \
        "'input[1].call_id' is 'nope', but no tool call before it has that id"
    assert refused(input=[{"type": "computer_call_output", "call_id": "x"}]).startswith(
        "'input[0].type' is 'computer_call_output': this server takes message, function_call")
    assert "read text only" in refused(input=[{"role": "user", "content": [
        {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}])
    assert "function tools only" in refused(input="Hello", tools=[{"type": "web_search"}])
    assert "'input' is required" in refused(input=[])
    assert "'text.format.type' must be" in refused(input="Hello", text={"format": {"type": "yaml"}})
    assert "reasoning effort 'low' is not supported by this model" in refused(input="Hello",
                                                                            reasoning={"effort": "low"})
    assert "is not valid JSON" in refused(input=ASK + [{"type": "function_call", "call_id": "c1", "name": "f",
                                                        "arguments": "{oops"}])


@pytest.fixture(scope="module")
def smol(smollm2, tmp_path_factory):
    with serving_on_cpu(smollm2, tmp_path_factory.mktemp("hub"), None) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="anything", max_retries=0, timeout=120)


def test_real_engine_answers_as_on_the_chat_route(smol):
    """SmolLM2 greedy: the same text through the Responses API, streamed or not, as through the chat route."""
    question = "What is the capital of France?"
    r = smol.responses.create(model=SMOL, input=question, max_output_tokens=12, temperature=0)
    expected = smol.chat.completions.create(model=SMOL, max_tokens=12, temperature=0, messages=[
        {"role": "user", "content": question}]).choices[0]
    assert r.output_text == expected.message.content and r.output_text.strip()
    assert r.status == ("incomplete" if expected.finish_reason == "length" else "completed")
    with smol.responses.stream(model=SMOL, input=question, max_output_tokens=12, temperature=0) as stream:
        assert "".join(e.delta for e in stream if e.type == "response.output_text.delta") == r.output_text


def test_real_engine_json_schema(smol):
    r = smol.responses.create(model=SMOL, input="Describe a person as JSON: name, age and mood.", temperature=1.0,
                              max_output_tokens=48, text={"format": {"type": "json_schema", "name": "person",
                                                                     "schema": PERSON, "strict": True}})
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), PERSON)
    with pytest.raises(openai.BadRequestError, match="cannot be enforced"):
        smol.responses.create(model=SMOL, input="Hi", text={"format": {"type": "json_schema", "name": "x",
                                                                       "schema": {"type": "nonsense"}}})
