"""`gguf-chat serve` as its users reach it: a real server process on 127.0.0.1, driven by OpenAI's and Ollama's
own client packages (and raw HTTP for what a client library would never send). One server for the module."""
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from tests.app.test_run import ROOT, assert_one_line_error, gguf_chat

pytestmark = pytest.mark.usefixtures("cli_kernels_cached")  # replies compared across processes

KEY = "test-key-4c1d"
AUTH = {"Authorization": f"Bearer {KEY}"}
SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA = "tester/gemma-3-270m-GGUF:q4_k_m"  # as pulled into the module's Hub cache
CTX = 512
QUESTION = "What is the capital of France?"


@dataclass
class Server:
    url: str
    port: int
    process: subprocess.Popen
    log: Path

    def metric(self, name: str) -> float:
        text = httpx.get(self.url + "/metrics", headers=AUTH).text
        return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))

    def wait_idle(self, timeout: float = 30) -> float:
        """Seconds until the engine is free and nothing waits."""
        t = time.perf_counter()
        while self.metric("gguf_chat_busy") or self.metric("gguf_chat_requests_waiting"):
            assert time.perf_counter() - t < timeout, "the engine stayed busy"
            time.sleep(0.01)
        return time.perf_counter() - t


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory, gemma3) -> Path:
    """A Hugging Face cache holding Gemma 3 as if pulled: a second model a request can ask for."""
    cache = tmp_path_factory.mktemp("hub")
    repo = cache / "models--tester--gemma-3-270m-GGUF"
    (repo / "snapshots" / "0123abcd").mkdir(parents=True)
    (repo / "snapshots" / "0123abcd" / gemma3.name).symlink_to(gemma3)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    return cache


def hub_env(hub_cache: Path) -> dict:
    return {k: v for k, v in os.environ.items() if k != "GGUF_CHAT_API_KEY"} | {
        "HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1"}


def start_server(model: Path, hub_cache: Path, log: Path) -> Server:
    with open(log, "w") as out:
        p = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", str(model), "--port", "0", "--ctx", str(CTX),
                              "--device", "cpu", "--max-queue", "8", "--api-key", KEY],
                             stdout=out, stderr=out, cwd=ROOT, env=hub_env(hub_cache))
    deadline = time.monotonic() + 180
    while not (m := re.search(r"on http://127\.0\.0\.1:(\d+)", log.read_text())):
        assert p.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    port = int(m.group(1))
    return Server(f"http://127.0.0.1:{port}", port, p, log)


@pytest.fixture(scope="module")
def server(smollm2, hub_cache, tmp_path_factory):
    s = start_server(smollm2, hub_cache, tmp_path_factory.mktemp("serve") / "server.log")
    yield s
    s.process.terminate()
    s.process.wait(timeout=30)


@pytest.fixture(scope="module")
def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def oll(server) -> ollama.Client:
    return ollama.Client(host=server.url, headers=AUTH, timeout=120)


@pytest.fixture(scope="module")
def http(server) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers=AUTH, timeout=120)


@pytest.fixture(scope="module")
def run_answer(smollm2) -> dict:
    """`gguf-chat run`'s greedy reply to QUESTION (12 tokens at most), with its stats."""
    r = gguf_chat("run", smollm2, "--json", "-n", "12", "--temperature", "0", "--ctx", CTX, "-p", QUESTION)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def ask(oai, content: str, max_tokens: int = 12, **kw):
    return oai.chat.completions.create(model=SMOL, messages=[{"role": "user", "content": content}],
                                       max_tokens=max_tokens, **{"temperature": 0} | kw)


def test_openai_chat_equals_run_and_streams_the_same_text(oai, run_answer):
    r = ask(oai, QUESTION)
    assert r.choices[0].message.content == run_answer["text"] and run_answer["text"].strip()
    stats = run_answer["stats"]
    assert r.choices[0].finish_reason == ("stop" if stats["finish_reason"] == "stop" else "length")
    assert r.usage.completion_tokens == stats["generated_tokens"]
    assert r.usage.prompt_tokens == stats["prompt_tokens"]  # run's context was empty: it processed all of it
    assert r.model_extra["timings"]["predicted_per_second"] > 0

    chunks = list(ask(oai, QUESTION, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == run_answer["text"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == r.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_openai_completions_equal_run_raw_and_models_lists_the_loaded_one(oai, smollm2):
    ran = gguf_chat("run", smollm2, "--raw", "--json", "-n", "10", "--temperature", "0", "--ctx", CTX,
                    "-p", "Monday, Tuesday,")
    expected = json.loads(ran.stdout)["text"]
    r = oai.completions.create(model=SMOL, prompt="Monday, Tuesday,", max_tokens=10, temperature=0)
    assert r.choices[0].text == expected and r.usage.completion_tokens == 10 and r.choices[0].finish_reason == "length"
    streamed = oai.completions.create(model=SMOL, prompt="Monday, Tuesday,", max_tokens=10, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == expected
    assert [m.id for m in oai.models.list()][0] == SMOL


def test_ollama_chat_generate_list_show(oll, run_answer):
    options = {"num_predict": 12, "temperature": 0}
    messages = [{"role": "user", "content": QUESTION}]
    r = oll.chat(model=SMOL, messages=messages, options=options)
    assert r.message.content == run_answer["text"] and r.done and r.eval_count == run_answer["stats"]["generated_tokens"]
    assert "".join(c.message.content for c in oll.chat(model=SMOL, messages=messages, options=options,
                                                        stream=True)) == run_answer["text"]
    generated = oll.generate(model=SMOL, prompt=QUESTION, options=options)  # through the chat template, as Ollama's
    assert generated.response == run_answer["text"] and generated.prompt_eval_duration > 0
    assert "".join(c.response for c in oll.generate(model=SMOL, prompt=QUESTION, options=options,
                                                    stream=True)) == run_answer["text"]
    assert [m.model for m in oll.list().models] == [SMOL, GEMMA]
    assert oll.generate(model=SMOL).done_reason == "load"  # no prompt: Ollama's way to load a model
    shown = oll.show(SMOL)
    assert shown.details.family == "llama" and shown.details.quantization_level == "Q4_1"
    assert "<|im_start|>" in shown.template


def test_seed_and_stop_reach_the_sampler(oai, oll, run_answer):
    sampled = [ask(oai, QUESTION, temperature=1.0, top_p=1, seed=7, extra_body={"min_p": 0, "top_k": 0}).choices[0].message.content
               for _ in range(2)]
    assert sampled[0] == sampled[1] and sampled[0] != run_answer["text"]
    text = run_answer["text"]
    stop = text[len(text) // 2:len(text) // 2 + 3]
    r = ask(oai, QUESTION, stop=[stop])
    assert r.choices[0].message.content == text[:text.index(stop)] and r.choices[0].finish_reason == "stop"
    r = oll.chat(model=SMOL, messages=[{"role": "user", "content": QUESTION}],
                 options={"num_predict": 12, "temperature": 0, "stop": [stop]})
    assert r.message.content == text[:text.index(stop)] and r.done_reason == "stop"


def test_tools_reach_the_real_engine(oai, oll):
    """SmolLM2's template takes no tools: they go in a system note, and its reply (text: a 135M model calls
    nothing) comes back as text. tests/app/test_serve_tools.py has the tool round trips."""
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    history = [{"role": "user", "content": QUESTION},
               {"role": "assistant", "tool_calls": [{"id": "abc123xyz", "type": "function", "function": {
                   "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "abc123xyz", "content": "18 C"}]
    r = oai.chat.completions.create(model=SMOL, messages=history, tools=[weather], max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.content
    assert r.usage.prompt_tokens > 100  # the note with the tools
    chunks = list(oai.chat.completions.create(model=SMOL, messages=history, tools=[weather], max_tokens=8,
                                              temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == r.choices[0].message.content
    r = oll.chat(model=SMOL, messages=history[:1], tools=[weather], options={"num_predict": 4, "temperature": 0})
    assert r.done and r.message.content


def test_a_continued_conversation_reuses_the_cache(oai):
    first = ask(oai, QUESTION)
    history = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": first.choices[0].message.content},
               {"role": "user", "content": "And of Germany?"}]
    second = oai.chat.completions.create(model=SMOL, messages=history, max_tokens=8, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    assert second.model_extra["timings"]["prompt_n"] < second.usage.prompt_tokens - first.usage.prompt_tokens + 8


PROMPTS = [f"Write one sentence about {topic}." for topic in
           ("cats", "the sea", "bread", "winter", "music", "trains", "gold", "rain")]


def test_eight_streaming_clients_get_their_own_answers(server, oai):
    expected = {p: ask(oai, p, 10).choices[0].message.content for p in PROMPTS}
    assert len(set(expected.values())) == len(PROMPTS)  # so that a mixed-up stream could not pass
    results = []

    def client(i: int):
        c = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
        for j in range(5):
            prompt = PROMPTS[(i + j) % len(PROMPTS)]
            try:
                chunks = ask(c, prompt, 10, stream=True)
                results.append((prompt, 200, "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)))
            except openai.APIStatusError as e:
                results.append((prompt, e.status_code, e.message))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300 - (time.perf_counter() - t0))
    assert not any(t.is_alive() for t in threads), "the load test ran out of time"
    assert len(results) == 40
    for prompt, status, text in results:
        assert (status, text) == (200, expected[prompt]) or (status == 503 and "busy" in text), (prompt, status, text)
    assert sum(status == 200 for _, status, _ in results) >= 8
    assert ask(oai, QUESTION).choices[0].message.content  # still serving


def post_raw(server: Server, path: str, body: dict) -> socket.socket:
    """A request sent whole on its own connection, not read: the client holds it open until it closes it."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json"
              f"\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


COUNTING = {"prompt": "1, 2, 3, 4, 5,", "max_tokens": 2000, "temperature": 0}  # runs until the context is full


def test_a_client_that_leaves_frees_the_engine_at_once(server, oai):
    cancelled = server.metric("gguf_chat_requests_cancelled_total")
    stream = oai.completions.create(model=SMOL, stream=True, **COUNTING)
    pieces = [next(stream).choices[0].text for _ in range(3)]
    assert "".join(pieces).strip()
    stream.close()
    assert server.wait_idle() < 2.0  # the whole reply would take several seconds more
    assert server.metric("gguf_chat_requests_cancelled_total") == cancelled + 1
    # the same for a request that is not streamed: the client gives up waiting
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=COUNTING, headers=AUTH, timeout=1.0)
    assert server.wait_idle() < 2.0
    assert server.metric("gguf_chat_requests_cancelled_total") == cancelled + 2


def test_a_client_that_leaves_during_its_prompt_stops_it_between_chunks(server, oai):
    """A prompt of two chunks (256 tokens each on the CPU) whose client gives up during the first: the engine
    stops before the second, so the same prompt again finds at most the first chunk cached (without the stop,
    all of it but its last token)."""
    prompt = "Other: " + " ".join(f"item {i}," for i in range(90))  # ~450 tokens, no prefix cached
    server.wait_idle()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}, headers=AUTH, timeout=0.2)
    server.wait_idle()
    again = oai.completions.create(model=SMOL, prompt=prompt, max_tokens=1)
    assert 300 < again.usage.prompt_tokens < 512
    assert again.usage.prompt_tokens_details.cached_tokens <= 256, again.usage


def test_a_full_queue_answers_503_and_the_server_recovers(server, http):
    running = post_raw(server, "/v1/completions", COUNTING | {"stream": True})
    while not server.metric("gguf_chat_busy"):
        time.sleep(0.01)
    waiting = [post_raw(server, "/v1/completions", COUNTING) for _ in range(8)]
    while server.metric("gguf_chat_requests_waiting") < 8:
        time.sleep(0.01)
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 503
    assert r.json()["error"]["message"] == "the server is busy: 8 requests are already waiting; try again later"
    for s in [running] + waiting:
        s.close()
    assert server.wait_idle() < 5.0
    assert http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2}).status_code == 200


def test_a_pulled_model_loads_on_demand_and_the_first_comes_back(oll, oai, gemma3, run_answer):
    ran = gguf_chat("run", gemma3, "--raw", "--json", "-n", "6", "--temperature", "0", "--ctx", CTX,
                    "-p", "The capital of France is")
    r = oll.generate(model=GEMMA, prompt="The capital of France is", raw=True,
                     options={"num_predict": 6, "temperature": 0})
    assert r.response == json.loads(ran.stdout)["text"] and r.load_duration > 0
    assert [m.id for m in oai.models.list()][:2] == [GEMMA, SMOL]  # the loaded one first
    with pytest.raises(openai.BadRequestError, match="no chat template"):
        oai.chat.completions.create(model=GEMMA, messages=[{"role": "user", "content": "hi"}])
    assert ask(oai, QUESTION).choices[0].message.content == run_answer["text"]  # SmolLM2 loaded again


def test_removing_the_loaded_model_leaves_the_lists_answering_and_it_still_serves(smollm2, tmp_path):
    """`gguf-chat rm` of the model a server has loaded: the lists leave it out (as Ollama's does) instead of a 500,
    and a request that names no model is still answered from memory."""
    cache = tmp_path / "hub"
    repo = cache / "models--tester--SmolLM2-GGUF"
    blob = repo / "blobs" / ("ab" * 32)
    blob.parent.mkdir(parents=True)
    blob.write_bytes(smollm2.read_bytes())  # a blob of its own: rm deletes it
    (repo / "snapshots" / "0123abcd").mkdir(parents=True)
    pulled = repo / "snapshots" / "0123abcd" / SMOL
    pulled.symlink_to(blob)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    s = start_server(pulled, cache, tmp_path / "server.log")
    try:
        http = httpx.Client(base_url=s.url, headers=AUTH, timeout=120)
        assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["tester/SmolLM2-GGUF:Q4_1"]
        removed = subprocess.run([sys.executable, "-m", "app.cli", "rm", "tester/SmolLM2-GGUF"], cwd=ROOT,
                                 env=hub_env(cache), capture_output=True, text=True, timeout=60)
        assert removed.returncode == 0 and not blob.exists(), removed.stderr
        for route, key in (("/v1/models", "data"), ("/api/tags", "models")):
            r = http.get(route)
            assert r.status_code == 200 and r.json()[key] == [], (route, r.text)
        r = http.post("/v1/completions", json={"prompt": "The capital of France is", "max_tokens": 4})
        assert r.status_code == 200 and r.json()["choices"][0]["text"], r.text
        r = http.post("/v1/completions", json={"model": "tester/SmolLM2-GGUF", "prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 404 and "available: none" in r.json()["error"]["message"], r.text
    finally:
        s.process.terminate()
        s.process.wait(timeout=30)
    assert "Traceback" not in s.log.read_text()


USER = [{"role": "user", "content": "hi"}]
BAD_INPUT = [  # (route, body, status, the error message or its start)
    ("/v1/chat/completions", b"{not json", 400, "the body is not valid JSON: Expecting property name"),
    ("/v1/chat/completions", b"[" * 100_000, 400, "the body is not valid JSON"),
    ("/v1/chat/completions", b"[1, 2]", 400, "the body must be a JSON object"),
    ("/v1/chat/completions", b"\xff\xfe{}", 400, "the body is not valid JSON"),
    ("/v1/chat/completions", {}, 400, "'messages' is required"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "'messages' must be an array (got a string)"),
    ("/v1/chat/completions", {"messages": []}, 400, "'messages' must hold at least one message"),
    ("/v1/chat/completions", {"messages": ["hi"]}, 400, "'messages[0]' must be an object"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 400,
     "'messages[0].role' must be one of system, user, assistant, tool (got 'wizard')"),
    ("/v1/chat/completions", {"messages": [{"content": "hi"}]}, 400, "'messages[0].role' must be one of"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400,
     "'messages[0].content' must be a string or a list of text parts (got an integer)"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, 400, "'messages[0].content[0]' must be a text"),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": -5}, 400, "'max_tokens' must be at least 1 (got -5)"),
    ("/v1/chat/completions", {"messages": USER, "max_completion_tokens": 0}, 400,
     "'max_completion_tokens' must be at least 1 (got 0)"),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": "ten"}, 400,
     "'max_tokens' must be an integer (got a string)"),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": True}, 400, "'max_tokens' must be an integer (got a boolean)"),
    ("/v1/chat/completions", {"messages": USER, "temperature": 3}, 400, "'temperature' must be between 0 and 2 (got 3)"),
    ("/v1/chat/completions", {"messages": USER, "stream": "yes"}, 400, "'stream' must be a boolean (got a string)"),
    ("/v1/chat/completions", {"messages": USER, "stop": 5}, 400, "'stop' must be a string or a list of strings"),
    ("/v1/chat/completions", {"messages": USER, "presence_penalty": 0.5}, 400,
     "'presence_penalty' is not supported by this server (use 'repeat_penalty'"),
    ("/v1/chat/completions", {"messages": USER, "frequency_penalty": 1}, 400, "'frequency_penalty' is not supported"),
    ("/v1/chat/completions", {"messages": USER, "n": 2}, 400, "'n' is not supported by this server"),
    ("/v1/chat/completions", {"messages": USER, "tools": [{"type": "function"}]}, 400,
     "'tools[0]' must be {\"type\": \"function\", \"function\": {\"name\": ..."),
    ("/api/generate", {"model": SMOL, "prompt": "hi", "tools": [{"type": "function"}]}, 400,
     "'tools' is not supported by this server (tools go to /api/chat)"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 600}]}, 400,
     f"the prompt is 631 tokens but the context holds {CTX}"),
    ("/v1/chat/completions", {"model": "nope", "messages": USER}, 404,
     f"model 'nope' not found; available: {SMOL}, {GEMMA}"),
    ("/v1/chat/completions", {"messages": USER, "reasoning_effort": "max"}, 400,
     "'reasoning_effort' must be one of low, medium, high (got 'max')"),
    ("/v1/chat/completions", {"messages": USER, "reasoning_effort": "high"}, 400,  # SmolLM2's template takes none
     "reasoning effort 'high' is not supported by this model: its chat template takes no reasoning effort"),
    ("/v1/completions", {"prompt": 5}, 400, "'prompt' must be a string or a list of token ids"),
    ("/v1/completions", {"prompt": ["a", "b"]}, 400, "'prompt' must be a string or a list of token ids"),
    ("/v1/completions", {"prompt": "hi", "echo": True}, 400, "'echo' is not supported"),
    ("/api/chat", {"model": SMOL, "messages": USER, "options": {"num_predict": -5}}, 400,
     "'options.num_predict' must be at least 1, or -1 (no limit) (got -5)"),
    ("/api/chat", {"model": SMOL, "messages": USER, "options": {"temperature": "hot"}}, 400,
     "'options.temperature' must be a number (got a string)"),
    ("/api/chat", {"model": SMOL, "messages": USER, "options": {"mirostat": 2}}, 400, "'options.mirostat' is not supported"),
    ("/api/chat", {"model": SMOL, "messages": [{"role": "robot", "content": "hi"}]}, 400,
     "'messages[0].role' must be one of system, user, assistant, tool (got 'robot')"),
    ("/api/chat", {"model": SMOL, "messages": USER, "think": "max"}, 400,
     "'think' must be true, false or one of low, medium, high (got 'max')"),
    ("/api/chat", {"model": SMOL, "messages": USER, "think": "high"}, 400, "reasoning effort 'high' is not supported"),
    ("/api/generate", {"model": SMOL, "prompt": "hi", "options": []}, 400, "'options' must be an object (got an array)"),
    ("/api/generate", {"model": SMOL, "prompt": "hi", "format": "yaml"}, 400,
     "'format' must be \"json\" or a JSON schema object (got a string)"),
    ("/api/chat", {"model": SMOL, "messages": USER, "format": "json", "tools": [{"function": {"name": "f"}}]}, 400,
     "'format' is not supported by this server (with 'tools' the reply may be a call or text)"),
    ("/v1/chat/completions", {"messages": USER, "response_format": {"type": "json_object"},
                              "tools": [{"type": "function", "function": {"name": "f"}}]}, 400,
     "'response_format' is not supported by this server (with 'tools' only when \"tool_choice\" is \"none\")"),
    ("/api/generate", {"model": "nope", "prompt": "hi"}, 404, "model 'nope' not found"),
    ("/api/show", {"model": "nope"}, 404, "model 'nope' not found"),
]


@pytest.mark.parametrize("route, body, status, message", BAD_INPUT)
def test_bad_input_is_a_clear_error(http, route, body, status, message):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = http.post(route, content=content, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    text = error if route.startswith("/api/") else error["message"]  # Ollama's shape under /api/, else OpenAI's
    assert text.startswith(message), text
    if not route.startswith("/api/"):
        assert error["type"] in ("invalid_request_error", "server_error")


def test_the_prompt_too_long_error_carries_openais_code(http):
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "word " * 600}]})
    assert r.json()["error"]["code"] == "context_length_exceeded"


def test_the_api_key_guards_every_route_but_health(server):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = httpx.post(server.url + "/v1/chat/completions", json={"messages": USER}, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert "Authorization: Bearer KEY" in r.json()["error"]["message"]
        r = httpx.get(server.url + "/api/tags", headers=headers)
        assert r.status_code == 401 and "API key" in r.json()["error"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()


def test_routes_and_methods_that_do_not_exist(http):
    r = http.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["message"] == "no route GET /v1/nothing"
    r = http.get("/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["message"] == "no route GET /v1/chat/completions"


def test_bodies_over_the_limit_are_413(server, http):
    r = http.post("/v1/chat/completions", content=b" " * (9 * 2**20), headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["message"] == "the body is 9,437,184 bytes; the limit is 8,388,608"
    r = http.post("/v1/chat/completions", content=(b" " * 2**20 for _ in range(9)))  # chunked: no length declared
    assert r.status_code == 413 and r.json()["error"]["message"] == "the body is over the limit of 8,388,608 bytes"
    s = socket.create_connection(("127.0.0.1", server.port))  # declares a huge body: refused before it is sent
    s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {KEY}\r\n"
              f"Content-Length: {10**12}\r\n\r\n".encode())
    answer = b""
    while not answer.endswith(b"}}") and (chunk := s.recv(4096)):
        answer += chunk
    s.close()
    assert answer.startswith(b"HTTP/1.1 413") and b"the body is 1,000,000,000,000 bytes" in answer


def test_half_requests_and_garbage_do_not_hurt_the_server(server, oai):
    for raw in (b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n{\"mess",
                b"POST /v1/chat/comp", b"\x16\x03\x01 not http at all\r\n\r\n", b"GET / HTTP/1.1\r\nHost"):
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(raw)
        s.close()  # and vanishes
    assert httpx.get(server.url + "/health").status_code == 200
    assert ask(oai, QUESTION, 3).choices[0].message.content


def test_ollamas_num_ctx_reloads_the_model_with_a_larger_context(oll):
    long = "word " * 600  # 631 tokens with the template: more than the server's --ctx 512
    r = oll.generate(model=SMOL, prompt=long, options={"num_ctx": 1024, "num_predict": 2})
    assert r.load_duration > 0 and r.prompt_eval_count >= 631
    r = oll.generate(model=SMOL, prompt=long, options={"num_ctx": 700, "num_predict": 2})  # fits: no reload
    assert r.load_duration == 0


def test_command_line_errors_are_one_line(server, smollm2):
    assert_one_line_error(gguf_chat("serve", smollm2, "--port", server.port), "cannot listen on 127.0.0.1:",
                          "Address already in use")
    assert_one_line_error(gguf_chat("serve", smollm2, "--max-queue", "0"), "--max-queue must be at least 1")


def test_no_traceback_reached_the_log(server):
    """After everything above: the server is up and wrote no traceback (nor sent one: the errors are JSON)."""
    assert server.process.poll() is None
    assert "Traceback" not in server.log.read_text(), server.log.read_text()[-3000:]
