"""Structured output through the real server (routes, queue, worker, engine) with SmolLM2 on the CPU and the real
`openai` and `ollama` clients: JSON that validates every time, also at temperature 1; a schema that cannot be
enforced is a 400; tool_choice "required" gives a call. The server runs in this process (uvicorn on a thread)."""
import json

import jsonschema
import ollama
import openai
import pytest

from tests.app.in_process_server import serving_on_cpu
from tests.app.test_run import assert_one_line_error, gguf_chat
from tests.app.test_tool_calls import TOOLS

KEY = "test-key-json"
MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "mood"],
          "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0,
                                                                              "maximum": 120},
                         "mood": {"enum": ["happy", "sad", "curious"]}}}
ASK = [{"role": "user", "content": "Describe a person as JSON: name, age and mood."}]


@pytest.fixture(scope="module")
def served(smollm2, tmp_path_factory):
    with serving_on_cpu(smollm2, tmp_path_factory.mktemp("hub"), KEY) as url:
        yield url


@pytest.fixture(scope="module")
def oai(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def oll(served) -> ollama.Client:
    return ollama.Client(host=served, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)


def person_format(schema=PERSON) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}


def test_json_schema_at_temperature_1_is_valid_50_times_in_50(oai):
    # the schema bounds the JSON (12 characters of name, an age to 120, an enum) well below max_tokens, so every
    # reply closes: one cut at max_tokens would come back unfinished with finish_reason "length" (as OpenAI does)
    replies = set()
    for seed in range(50):
        r = oai.chat.completions.create(model=MODEL, messages=ASK, temperature=1.0, top_p=1.0, seed=seed,
                                        extra_body={"top_k": 0, "min_p": 0.0},  # the whole distribution
                                        max_tokens=48, response_format=person_format()).choices[0]
        assert r.finish_reason == "stop", r.message.content
        jsonschema.validate(json.loads(r.message.content), PERSON)
        replies.add(r.message.content)
    assert len(replies) > 10  # sampled, not one greedy answer


def test_streamed_json_schema(oai):
    chunks = oai.chat.completions.create(model=MODEL, messages=ASK, temperature=1.0, seed=7, max_tokens=48,
                                         stream=True, response_format=person_format())
    jsonschema.validate(json.loads("".join(c.choices[0].delta.content or "" for c in chunks)), PERSON)


def test_json_object_mode(oai):
    r = oai.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=120,
                                    response_format={"type": "json_object"}).choices[0]
    assert r.finish_reason == "stop" and isinstance(json.loads(r.message.content), dict)


def test_plain_completion_takes_response_format_too(oai):
    r = oai.completions.create(model=MODEL, prompt="A person:", temperature=1.0, seed=2, max_tokens=48,
                               extra_body={"response_format": person_format()}).choices[0]
    assert r.finish_reason == "stop"
    jsonschema.validate(json.loads(r.text), PERSON)


def test_max_tokens_before_the_json_closes_is_length_and_unfinished(oai):
    r = oai.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=3,
                                    response_format=person_format()).choices[0]
    assert r.finish_reason == "length" and r.message.content.startswith("{")
    with pytest.raises(ValueError):
        json.loads(r.message.content)


def test_a_schema_that_cannot_be_enforced_is_a_400(oai):
    with pytest.raises(openai.BadRequestError, match="'response_format.json_schema.schema' cannot be enforced: "
                                                     ".*Invalid type: strng") as e:
        oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8,
                                    response_format=person_format({"type": "strng"}))
    assert e.value.status_code == 400
    with pytest.raises(openai.BadRequestError, match="look-around"):
        oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, response_format=person_format(
            {"type": "string", "pattern": "(?<=a)b"}))
    with pytest.raises(openai.BadRequestError, match="'response_format.type' must be"):
        oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, response_format={"type": "yaml"})


def test_ollama_format_schema_and_json(oll):
    r = oll.chat(model=MODEL, messages=ASK, format=PERSON, options={"temperature": 1.0, "seed": 3, "num_predict": 48})
    jsonschema.validate(json.loads(r.message.content), PERSON)
    r = oll.generate(model=MODEL, prompt='Reply with a JSON object whose key "ok" is true.', format="json",
                     stream=False,
                     options={"temperature": 0, "num_predict": 120})
    assert r.done_reason == "stop" and isinstance(json.loads(r.response), dict)
    with pytest.raises(ollama.ResponseError, match="'format' cannot be enforced") as e:
        oll.chat(model=MODEL, messages=ASK, format={"type": "object", "properties": {"a": {"$ref": "#/nope"}}})
    assert e.value.status_code == 400


def test_tool_choice_required_and_named_yield_a_call(oai):
    weather = TOOLS[0]["function"]
    for choice in ("required", {"type": "function", "function": {"name": weather["name"]}}):
        r = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}],
                                        tools=TOOLS, tool_choice=choice, temperature=0, max_tokens=64).choices[0]
        assert r.finish_reason == "tool_calls", r.message.content
        call = r.message.tool_calls[0].function
        names = {t["function"]["name"] for t in TOOLS} if choice == "required" else {weather["name"]}
        assert call.name in names
        tool = next(t["function"] for t in TOOLS if t["function"]["name"] == call.name)
        jsonschema.validate(json.loads(call.arguments), tool["parameters"])


def test_run_json_schema(smollm2, tmp_path):
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    r = gguf_chat("run", smollm2, "-p", "Describe a person.", "--json-schema", schema, "--temperature", "1",
                  "--seed", "5", "-n", "48", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    jsonschema.validate(json.loads(r.stdout), PERSON)
    (tmp_path / "bad.json").write_text('{"type": "strng"}')
    assert_one_line_error(gguf_chat("run", smollm2, "-p", "x", "--json-schema", tmp_path / "bad.json"),
                          "bad.json", "Invalid type: strng")
    (tmp_path / "broken.json").write_text("{nope")
    assert_one_line_error(gguf_chat("run", smollm2, "-p", "x", "--json-schema", tmp_path / "broken.json"),
                          "broken.json is not valid JSON")
