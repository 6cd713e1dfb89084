"""A gpt-oss reply through `run` and through the server's routes, read by OpenAI's, Ollama's and Anthropic's own
clients: the analysis channel on stderr / in `reasoning_content` / `thinking` / a thinking block / a reasoning item,
the final channel as the answer, and the reasoning
effort in the prompt's system message. No file here makes a real model write harmony, so `run` and the server (in
this process, on a real socket) run a scripted engine (tests/app/scripted_engine.py).
"""
import json

import anthropic
import ollama
import openai
import pytest

import inference
from app.cli import main
from tests.app.in_process_server import serving_scripted
from tests.app.scripted_engine import ANSWER, REASONING, TEMPLATE, ScriptedEngine

QUESTION = [{"role": "user", "content": "What is 2+2?"}]


def test_run_prints_the_final_channel_on_stdout_and_the_analysis_on_stderr(tmp_path, monkeypatch, capsys):
    engine = ScriptedEngine(tmp_path / "gpt-oss-20b-mxfp4.gguf")
    monkeypatch.setattr(inference, "load", lambda *a, **k: engine)
    assert main(["run", "gpt-oss", "-p", "What is 2+2?", "--reasoning-effort", "high"]) == 0
    out = capsys.readouterr()
    assert out.out == ANSWER + "\n" and out.err == REASONING + "\n"  # stderr is no terminal here: not dimmed
    assert engine.reasoning_line() == "Reasoning: high"
    assert main(["run", "gpt-oss", "-p", "What is 2+2?", "--json", "--reasoning-effort", "low"]) == 0
    reply = json.loads(capsys.readouterr().out)
    assert (reply["thinking"], reply["text"]) == (REASONING, ANSWER) and engine.reasoning_line() == "Reasoning: low"
    assert main(["run", "gpt-oss", "-p", "What is 2+2?", "--hide-thinking"]) == 0
    assert capsys.readouterr() == (ANSWER + "\n", "") and engine.reasoning_line() == "Reasoning: medium"


@pytest.fixture(scope="module")
def served(tmp_path_factory, smollm2):
    """(base URL, engine) of a server on a free port of 127.0.0.1."""
    path = tmp_path_factory.mktemp("oss") / "gpt-oss-20b-mxfp4.gguf"
    with serving_scripted(smollm2, path, TEMPLATE, ScriptedEngine(path)) as served:
        yield served


@pytest.fixture(scope="module")
def oai(served):
    return openai.OpenAI(base_url=served[0] + "/v1", api_key="none", max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def oll(served):
    return ollama.Client(host=served[0], timeout=30)


def test_openai_gets_the_analysis_as_reasoning_content_and_the_effort_reaches_the_template(served, oai):
    _, engine = served
    r = oai.chat.completions.create(model="gpt-oss-20b-mxfp4.gguf", messages=QUESTION, reasoning_effort="high")
    assert r.choices[0].message.content == ANSWER and r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.model_dump()["reasoning_content"] == REASONING
    assert engine.reasoning_line() == "Reasoning: high"
    chunks = list(oai.chat.completions.create(model="gpt-oss-20b-mxfp4.gguf", messages=QUESTION, stream=True))
    deltas = [c.choices[0].delta.model_dump() for c in chunks if c.choices]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == REASONING
    assert "".join(d.get("content") or "" for d in deltas) == ANSWER
    assert engine.reasoning_line() == "Reasoning: medium"  # the template's own default
    with pytest.raises(openai.BadRequestError, match="'reasoning_effort' must be one of low, medium, high"):
        oai.chat.completions.create(model="gpt-oss-20b-mxfp4.gguf", messages=QUESTION, reasoning_effort="minimal")


def test_tool_choice_required_holds_the_reply_from_its_analysis_on_and_bad_parameters_are_a_400(served, oai):
    _, engine = served
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    oai.chat.completions.create(model="gpt-oss-20b-mxfp4.gguf", messages=QUESTION, tools=[tool], tool_choice="required")
    assert engine.constraint is not None and engine.constraint.after == ""  # not only its final channel
    tool["function"]["parameters"] = {"type": "strng"}
    with pytest.raises(openai.BadRequestError, match="'tools' cannot be enforced .*Invalid type: strng"):
        oai.chat.completions.create(model="gpt-oss-20b-mxfp4.gguf", messages=QUESTION, tools=[tool],
                                    tool_choice={"type": "function", "function": {"name": "get_weather"}})


def test_ollama_gets_the_analysis_as_thinking_and_think_levels_reach_the_template(served, oll):
    _, engine = served
    r = oll.chat(model="gpt-oss-20b-mxfp4.gguf", messages=QUESTION, think="low")
    assert (r.message.thinking, r.message.content) == (REASONING, ANSWER)
    assert engine.reasoning_line() == "Reasoning: low"
    parts = list(oll.generate(model="gpt-oss-20b-mxfp4.gguf", prompt="What is 2+2?", think=True, stream=True))
    assert "".join(p.thinking or "" for p in parts) == REASONING and "".join(p.response for p in parts) == ANSWER
    assert engine.reasoning_line() == "Reasoning: medium"
    with pytest.raises(ollama.ResponseError, match="'think' must be true, false or one of low, medium, high"):
        oll.chat(model="gpt-oss-20b-mxfp4.gguf", messages=QUESTION, think="max")
    assert "thinking" in oll.show("gpt-oss-20b-mxfp4.gguf").capabilities  # what clients read to offer think


def test_anthropic_gets_the_analysis_as_a_thinking_block(served):
    client = anthropic.Anthropic(base_url=served[0], api_key="none", max_retries=0, timeout=30)
    r = client.messages.create(model="gpt-oss-20b-mxfp4.gguf", max_tokens=256, messages=QUESTION)
    assert [b.type for b in r.content] == ["thinking", "text"] and r.stop_reason == "end_turn"
    assert (r.content[0].thinking, r.content[1].text) == (REASONING, ANSWER)
    with client.messages.stream(model="gpt-oss-20b-mxfp4.gguf", max_tokens=256, messages=QUESTION) as stream:
        thinking = "".join(e.delta.thinking for e in stream
                           if e.type == "content_block_delta" and e.delta.type == "thinking_delta")
        final = stream.get_final_message()
    assert thinking == REASONING and final.content[1].text == ANSWER


def test_responses_get_the_analysis_as_a_reasoning_item_and_the_effort_reaches_the_template(served, oai):
    _, engine = served
    r = oai.responses.create(model="gpt-oss-20b-mxfp4.gguf", input="What is 2+2?", reasoning={"effort": "high"})
    reasoning, message = r.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == REASONING
    assert message.type == "message" and r.output_text == ANSWER and engine.reasoning_line() == "Reasoning: high"
    with oai.responses.stream(model="gpt-oss-20b-mxfp4.gguf", input="What is 2+2?") as stream:
        assert "".join(e.delta for e in stream if e.type == "response.reasoning_text.delta") == REASONING
        assert stream.get_final_response().output_text == ANSWER
