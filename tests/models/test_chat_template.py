"""Chat templates against llama-cpp-python's Jinja2 formatter and llama.cpp's built-in formats, and the
sandbox and bounds that keep a hostile template from escaping or running forever."""
import ctypes
import time

import llama_cpp
import pytest
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

import models.chat_template as chat_template
from models.chat_template import BUILTIN_TEMPLATES, ChatTemplate, ChatTemplateError, load_chat_template
from models.gguf import open_gguf

CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"},
     {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "  padded\n"}, {"role": "assistant", "content": " 4 \n"},
     {"role": "user", "content": "Ünïcödé 你好 👩‍👩‍👧 <|im_end|> {{ not jinja }}"}],
]


def llama_cpp_builtin(name: str, messages: list[dict], add_assistant: bool) -> str:
    chat = (llama_cpp.llama_chat_message * len(messages))(
        *[llama_cpp.llama_chat_message(role=m["role"].encode(), content=m["content"].encode()) for m in messages])
    buf = ctypes.create_string_buffer(1 << 16)
    n = llama_cpp.llama_chat_apply_template(name.encode(), chat, len(messages), add_assistant, buf, len(buf))
    assert 0 <= n <= len(buf)
    return buf.raw[:n].decode()


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_smollm2_prompt_equals_llama_cpp_python(smollm2, messages, add_generation_prompt):
    metadata = open_gguf(smollm2).metadata
    template = load_chat_template(metadata)
    reference = Jinja2ChatFormatter(metadata["tokenizer.chat_template"], eos_token="<|im_end|>",
                                    bos_token="<|im_start|>", add_generation_prompt=add_generation_prompt)
    assert template.render(messages, add_generation_prompt) == reference(messages=messages).prompt
    assert template.render(messages).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("name, llama_cpp_name", [("chatml", "chatml"), ("llama3", "llama3"), ("gemma", "gemma"),
                                                   ("mistral", "mistral-v3")])
@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_builtin_templates_equal_llama_cpp(name, llama_cpp_name, messages, add_generation_prompt):
    rendered = ChatTemplate(BUILTIN_TEMPLATES[name]).render(messages, add_generation_prompt)
    assert rendered == llama_cpp_builtin(llama_cpp_name, messages, add_generation_prompt)


def test_model_without_template_is_plain_completion_unless_a_builtin_is_named(gemma3):
    metadata = open_gguf(gemma3).metadata
    assert load_chat_template(metadata) is None
    gemma = load_chat_template(metadata, name="gemma")
    assert gemma.bos_token == "<bos>" and gemma.eos_token == "<eos>"
    assert gemma.render([{"role": "user", "content": "Hi"}]) == \
        "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    with pytest.raises(ChatTemplateError, match="unknown chat template 'vicuna'; built-in: chatml, llama3, gemma"):
        load_chat_template(metadata, name="vicuna")


def test_what_real_templates_use():
    source = ("{{ bos_token }}{% for m in messages %}{% if loop.index0 > 1 %}{% break %}{% endif %}"
              "{% if m['role'] == 'system' %}{% continue %}{% endif %}[{{ m['role'] }}|{{ m['content'] | tojson }}]"
              "{% endfor %}{{ strftime_now('%Y') | length }}{{ eos_token }}{% if add_generation_prompt %}>{% endif %}"
              "{% generation %}kept{% endgeneration %}")
    out = ChatTemplate(source, "<s>", "</s>").render(CONVERSATIONS[1] + CONVERSATIONS[2])
    assert out == '<s>[user|"Hi!"]4</s>>kept'
    with pytest.raises(ChatTemplateError, match="refused the conversation: roles must alternate"):
        ChatTemplate("{{ raise_exception('roles must alternate') }}").render(CONVERSATIONS[0])


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ ''.__class__ }}",
    "{{ cycler.__init__.__globals__.os.system('echo pwned') }}",
    "{{ messages.append({'role': 'user'}) }}",
    "{{ (messages|first).update(role='x') }}",
    "{{ self._TemplateReference__context }}",
])
def test_escape_attempts_are_refused(source):
    with pytest.raises(ChatTemplateError, match="tried to leave the sandbox"):
        ChatTemplate(source).render(CONVERSATIONS[0])


@pytest.mark.parametrize("source, message", [
    ("{% set r = range(100000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}", "ran longer than"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}",
     "ran longer than|wrote more"),
    ("{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}", "wrote more than"),
    ("{{ 'x' * 10**10 }}", "output limit"),
    ("{{ 10 ** 100000000 }}", "bits"),
    ("{{ (10 ** 100000) ** 100000 }}", "bits"),
    ("{{ 'x'.center(10**10) }}", "above the limit"),
    ("{{ 'x' | center(1000000000) }}", "above the limit"),
    ("{{ ('x' * 90000) * 90000 }}", "output limit"),
    ("{{ range(10**9) | list }}", "above the limit"),
])
def test_runaway_templates_are_stopped_quickly(monkeypatch, source, message):
    monkeypatch.setattr(chat_template, "MAX_RENDER_SECONDS", 0.3)
    start = time.monotonic()
    with pytest.raises(ChatTemplateError, match=message):
        ChatTemplate(source).render(CONVERSATIONS[0])
    assert time.monotonic() - start < 3


def test_ordinary_big_numbers_still_render():
    assert ChatTemplate("{{ 1000000 | abs }} {{ 123456 * 1000 }} {{ 2 ** 64 }}").render([]) == \
        "1000000 123456000 18446744073709551616"


def test_broken_templates_are_clear_errors():
    with pytest.raises(ChatTemplateError, match="is not valid Jinja"):
        ChatTemplate("{% for %}")
    with pytest.raises(ChatTemplateError, match="failed: UndefinedError"):
        ChatTemplate("{{ nothing.here }}").render(CONVERSATIONS[0])


QWEN35_CONVERSATIONS = CONVERSATIONS[:2] + [
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4"},
     {"role": "user", "content": "And 3+3?"}],
]


@pytest.mark.parametrize("messages", QWEN35_CONVERSATIONS)
@pytest.mark.parametrize("thinking", [None, False])
def test_qwen35_template_renders_as_llama_cpp_python(messages, thinking):
    """Qwen3.5's template (llama.cpp's models/templates/Qwen3.5-4B.jinja, copied here): thinking on by default (the
    prompt ends in <think>), enable_thinking=false closes it at once, earlier replies lose their reasoning."""
    from pathlib import Path
    source = (Path(__file__).parent / "templates" / "Qwen3.5-4B.jinja").read_text()
    extra = {} if thinking is None else {"enable_thinking": thinking}
    ours = ChatTemplate(source, "", "<|im_end|>").render(messages, **extra)
    reference = Jinja2ChatFormatter(source, eos_token="<|im_end|>", bos_token="", add_generation_prompt=True)
    assert ours == reference(messages=messages, **extra).prompt
    assert ours.endswith("<think>\n" if thinking is None else "<think>\n\n</think>\n\n")


GPT_OSS = [  # a system prompt, two turns, and the reasoning of the first reply (which the template leaves out)
    {"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4", "thinking": "Add them."}, {"role": "user", "content": "And 3+3?"}]


@pytest.mark.parametrize("effort", [None, "low", "high"])
def test_gpt_oss_harmony_template_renders_as_llama_cpp_python(effort):
    """gpt-oss's template (llama.cpp's models/templates/openai-gpt-oss-120b.jinja at 0c1e570, copied here): the
    reasoning effort in the system message (medium unless given), the system prompt as the developer's
    instructions, earlier replies' reasoning left out, the reply opened with <|start|>assistant."""
    from datetime import date
    from pathlib import Path
    source = (Path(__file__).parent / "templates" / "openai-gpt-oss-120b.jinja").read_text()
    template = ChatTemplate(source, "<|startoftext|>", "<|return|>")
    extra = {} if effort is None else {"reasoning_effort": effort}
    ours = template.render(GPT_OSS, **extra)
    reference = Jinja2ChatFormatter(source, eos_token="<|return|>", bos_token="<|startoftext|>",
                                    add_generation_prompt=True)
    assert ours == reference(messages=GPT_OSS, **extra).prompt
    assert ours == (
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        f"Knowledge cutoff: 2024-06\nCurrent date: {date.today():%Y-%m-%d}\n\nReasoning: {effort or 'medium'}\n\n"
        "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"
        "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>"
        "<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant<|channel|>final<|message|>4<|end|>"
        "<|start|>user<|message|>And 3+3?<|end|><|start|>assistant")
    assert template.speaks_harmony and "reasoning_effort" in template.variables


def test_which_templates_speak_harmony_and_take_a_reasoning_effort():
    from pathlib import Path
    qwen35 = ChatTemplate((Path(__file__).parent / "templates" / "Qwen3.5-4B.jinja").read_text())
    assert not qwen35.speaks_harmony and "reasoning_effort" not in qwen35.variables
    assert "enable_thinking" in qwen35.variables
    assert not any(ChatTemplate(t).speaks_harmony for t in BUILTIN_TEMPLATES.values())


GEMMA4 = [  # a system prompt, two turns, the first reply with its reasoning (which the template leaves out)
    {"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4", "reasoning_content": "Add them."}, {"role": "user", "content": "And 3+3?"}]


@pytest.mark.parametrize("messages", [GEMMA4, GEMMA4[1:], CONVERSATIONS[2]])
@pytest.mark.parametrize("thinking", [None, True])
def test_gemma4_template_renders_as_llama_cpp_python(messages, thinking):
    """Gemma 4's template (llama.cpp's models/templates/google-gemma-4-31B-it.jinja, copied here): the system prompt
    in a system turn (with <|think|> at its top when thinking is asked for, a system turn of its own then), turns
    as <|turn>role ... <turn|>, earlier replies without their reasoning, and the reply opened with an empty thought
    channel unless thinking is on."""
    from pathlib import Path
    source = (Path(__file__).parent / "templates" / "google-gemma-4-31B-it.jinja").read_text()
    template = ChatTemplate(source, "<bos>", "<turn|>")
    extra = {} if thinking is None else {"enable_thinking": thinking}
    ours = template.render(messages, **extra)
    reference = Jinja2ChatFormatter(source, eos_token="<turn|>", bos_token="<bos>", add_generation_prompt=True)
    assert ours == reference(messages=messages, **extra).prompt
    assert ours.startswith("<bos><|turn>system\n<|think|>\n" if thinking else "<bos><|turn>")
    assert ours.endswith("<|turn>model\n" if thinking else "<|turn>model\n<|channel>thought\n<channel|>")
    assert "Add them" not in ours and "enable_thinking" in template.variables
    if messages is GEMMA4 and not thinking:
        assert ours.startswith("<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nWhat is 2+2?<turn|>\n")


@pytest.mark.parametrize("text", ["Let me check.", ""])
def test_gemma4_reply_after_tool_results_as_llama_cpp(text):
    """llama.cpp's test-chat.cpp (its tests of PR 21760): after a model turn with text beside its tool call, and the
    call's result, the template closes the turn and opens none; llama.cpp opens the reply (only when asked to).
    Without the text the reply goes on in the same turn, right after the result, as the template leaves it."""
    from pathlib import Path
    template = ChatTemplate((Path(__file__).parent / "templates" / "google-gemma-4-31B-it.jinja").read_text(),
                            "<bos>", "<turn|>")
    tools = [{"type": "function", "function": {"name": "special_function", "description": "I'm special", "parameters": {
        "type": "object", "properties": {"arg1": {"type": "integer", "description": "The arg."}}, "required": ["arg1"]}}}]
    call = {"id": "c0", "type": "function", "function": {"name": "special_function", "arguments": {"arg1": 1}}}
    messages = [{"role": "user", "content": "Hey there!"}, {"role": "assistant", "content": text, "tool_calls": [call]},
                {"role": "tool", "content": '{"r":"ok"}', "tool_call_id": "c0", "name": "special_function"}]
    opened = template.render(messages, tools=tools)
    assert "<|tool_call>call:special_function{arg1:1}<tool_call|><|tool_response>response:special_function{value:" \
           '<|"|>{"r":"ok"}<|"|>}<tool_response|>' in opened
    assert opened.endswith("Let me check.<turn|>\n<|turn>model\n" if text else "<tool_response|>")
    assert not template.render(messages, add_generation_prompt=False, tools=tools).endswith("<|turn>model\n")


GEMMA4_CALL = {"id": "c0", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}


@pytest.mark.parametrize("messages,rendered", [
    ([{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [GEMMA4_CALL]},
      {"role": "tool", "tool_call_id": "c0", "content": '{"temp": 21, "unit": "C"}'}],
     "<bos><|turn>user\nWeather in Paris?<turn|>\n<|turn>model\n<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}"
     "<tool_call|><|tool_response>response:get_weather{temp:21,unit:<|\"|>C<|\"|>}<tool_response|>"
     "<|channel>thought\n<channel|>"),
    ([{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "tool_calls": [GEMMA4_CALL]},
      {"role": "tool", "tool_call_id": "c0", "content": "sunny"},
      {"role": "tool", "tool_call_id": "c9", "content": "[1]"},
      {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Thanks"}],
     "<bos><|turn>user\nWeather in Paris?<turn|>\n<|turn>model\n<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}"
     "<tool_call|><|tool_response>response:get_weather{value:<|\"|>sunny<|\"|>}<tool_response|><|tool_response>"
     "response:c9{value:[1]}<tool_response|>Sunny.<turn|>\n<|turn>user\nThanks<turn|>\n<|turn>model\n"
     "<|channel>thought\n<channel|>"),
])
def test_gemma4_first_template_reads_tool_results_from_the_model_turn(messages, rendered):
    """Gemma 4's first template (llama.cpp's models/templates/gemma4.jinja, copied here) takes a tool's results from
    the model turn that called it (tool_responses), as llama.cpp's convert_tool_responses_gemma4 hands them to it: the
    call, its results (parsed where JSON; named by their call, else by tool_call_id) and the reply that follows in
    one turn; after results alone the reply goes on in that turn. The template after it (google-gemma-4-31B-it)
    reads role tool messages itself and gets them as they are. Planted: without the conversion the results render as
    a turn of role tool and these fail."""
    from pathlib import Path
    first = (Path(__file__).parent / "templates" / "gemma4.jinja").read_text()
    assert chat_template.reads_tool_responses(first)
    assert not chat_template.reads_tool_responses(
        (Path(__file__).parent / "templates" / "google-gemma-4-31B-it.jinja").read_text())
    assert ChatTemplate(first, "<bos>", "<turn|>").render(messages) == rendered
