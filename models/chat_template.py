"""Chat prompts from the Jinja template a GGUF file carries (tokenizer.chat_template), or a named built-in one.

A template is code from whoever made the file, so it runs in jinja2's ImmutableSandboxedEnvironment
(what transformers and llama-cpp-python use, CVE-2024-34359) with three more bounds, because the sandbox
stops escapes, not work:
- time: a trace function on the rendering thread checks a deadline on every line the compiled template
  runs, so even `{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}`, which calls nothing, is
  stopped. A thread or process we could kill would also work, but a tracer needs no second interpreter
  and costs a few milliseconds on real templates.
- size: output is generated in chunks and stopped past MAX_OUTPUT_CHARS.
- work in one C call, which no tracer can stop: sequence repetition past the output limit, powers past
  MAX_POWER_BITS, and integer arguments of calls and filters above MAX_INT_ARGUMENT (`'x'.center(10**10)`,
  `x|indent(10**9)`) are refused before they run.
"""
import functools
import json
import sys
import time
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.meta
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from models.errors import UserError

MAX_RENDER_SECONDS = 2.0
MAX_OUTPUT_CHARS = 4_000_000  # ~1M tokens: more than any context
MAX_INT_ARGUMENT = 100_000    # jinja's sandbox caps range() at the same size
MAX_POWER_BITS = 1_000_000


class ChatTemplateError(UserError, ValueError):
    pass


# llama.cpp's built-in formats (llama_chat_apply_template), as Jinja. Like llama.cpp they write no BOS:
# the tokenizer adds it.
BUILTIN_TEMPLATES = {
    "chatml": (
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    ),
    "llama3": (
        "{% for message in messages %}"
        "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
        "{{ message['content'] | trim(ascii_space) }}<|eot_id|>"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
    ),
    # Gemma has no system role: system text goes at the top of the next user turn
    "gemma": (
        "{% set ns = namespace(system='') %}"
        "{% for message in messages %}"
        "{% if message['role'] == 'system' %}{% set ns.system = ns.system + message['content'] | trim(ascii_space) %}"
        "{% else %}"
        "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
        "{{ '<start_of_turn>' + role + '\\n' }}"
        "{% if ns.system and role != 'model' %}{{ ns.system + '\\n\\n' }}{% set ns.system = '' %}{% endif %}"
        "{{ message['content'] | trim(ascii_space) }}{{ '<end_of_turn>\\n' }}"
        "{% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
    ),
    # llama.cpp's mistral-v3: [INST] turns, assistant replies trimmed and closed with </s>
    "mistral": (
        "{% set ns = namespace(inside=false) %}"
        "{% for message in messages %}"
        "{% if not ns.inside %}{{ '[INST] ' }}{% set ns.inside = true %}{% endif %}"
        "{% if message['role'] == 'system' %}{{ message['content'] + '\\n\\n' }}"
        "{% elif message['role'] == 'user' %}{{ message['content'] + '[/INST]' }}"
        "{% else %}{{ ' ' + message['content'] | trim(ascii_space) + '</s>' }}{% set ns.inside = false %}"
        "{% endif %}"
        "{% endfor %}"
    ),
}
ASCII_SPACE = " \t\n\r\v\f"  # what C's isspace trims in llama.cpp's built-ins
GEMMA4_CHANNEL = ("<|channel>", "<channel|>")  # Gemma 4's reasoning opens and closes with these control tokens
GEMMA4_TURN = ("<|turn>model\n", "<turn|>\n")  # a Gemma 4 reply's turn opens and closes so


class RenderLimit(Exception):
    """A bound on time, size or integer arguments was hit."""


class _IgnoreGenerationTags(jinja2.ext.Extension):
    """transformers' {% generation %} marks assistant text for training masks; rendering ignores it."""
    tags = {"generation"}

    def parse(self, parser):
        parser.stream.skip(1)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _check_ints(values):
    for v in values:
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_INT_ARGUMENT:
            raise RenderLimit(f"an integer argument of {v} is above the limit of {MAX_INT_ARGUMENT:,}")


def _bounded_filter(f):
    """f with its arguments (not the filtered value) held to MAX_INT_ARGUMENT."""
    first_argument = 2 if hasattr(f, "jinja_pass_arg") else 1  # after the context/environment and the value

    @functools.wraps(f)  # keeps jinja's pass_context/pass_environment marks
    def bounded(*args, **kwargs):
        _check_ints(args[first_argument:])
        _check_ints(kwargs.values())
        return f(*args, **kwargs)
    return bounded


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """transformers' tojson: unicode kept as is, which is how the templates' authors saw it."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message):
    raise ChatTemplateError(f"the chat template refused the conversation: {message}")


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class _Sandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**"})

    def __init__(self):
        super().__init__(trim_blocks=True, lstrip_blocks=True,
                         extensions=[jinja2.ext.loopcontrols, _IgnoreGenerationTags])
        self.filters["tojson"] = _tojson
        self.filters = {name: _bounded_filter(f) for name, f in self.filters.items()}
        self.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, ascii_space=ASCII_SPACE)

    def unsafe_undefined(self, obj, attribute):
        # the stock sandbox returns an Undefined that only fails when used; an escape attempt is an error at once
        raise SecurityError(f"access to attribute '{attribute}' of a '{type(obj).__name__}' object is unsafe")

    def call_binop(self, context, operator, left, right):
        if operator == "*":
            sequence, count = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(sequence, (str, list, tuple)) and isinstance(count, int) \
                    and len(sequence) * count > MAX_OUTPUT_CHARS:
                raise RenderLimit(f"a repetition would pass the output limit of {MAX_OUTPUT_CHARS:,} characters")
        if operator == "**" and isinstance(left, int) and isinstance(right, int) \
                and abs(left).bit_length() * right > MAX_POWER_BITS:
            raise RenderLimit(f"a power would have more than {MAX_POWER_BITS:,} bits")
        return super().call_binop(context, operator, left, right)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's signature)
        _check_ints(args)
        _check_ints(kwargs.values())
        return super().call(__context, __obj, *args, **kwargs)


def _deadline_tracer(seconds: float):
    deadline = time.monotonic() + seconds

    def trace(frame, event, arg):
        if time.monotonic() > deadline:
            raise RenderLimit(f"it ran longer than {seconds:g} s")
        return trace
    return trace


class ChatTemplate:
    """A compiled chat template; render() turns a conversation into the prompt text."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", name: str = "the file's template"):
        self.source, self.bos_token, self.eos_token, self.name = source, bos_token, eos_token, name
        try:
            sandbox = _Sandbox()
            tree = sandbox.parse(source)
            self._template = sandbox.from_string(tree)
            self.variables = frozenset(jinja2.meta.find_undeclared_variables(tree))  # the names it reads
        except TemplateError as e:
            raise ChatTemplateError(f"{name} is not valid Jinja: {e}") from None

    @property
    def speaks_harmony(self) -> bool:
        return speaks_harmony(self.source)

    @property
    def reply_format(self) -> str:
        return reply_format(self.source)

    @property
    def reply_markup(self) -> tuple[str, ...]:
        """The control tokens a reply's split reads, shown as text (llama.cpp's preserved tokens): Gemma 4's
        channel markers. gpt-oss's are user-defined tokens, shown anyway."""
        return GEMMA4_CHANNEL if self.reply_format == "gemma4" else ()

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **variables) -> str:
        """messages: [{"role": "system"|"user"|"assistant", "content": str}, ...]. variables: extra names the
        template may use (tools, documents...)."""
        if reads_tool_responses(self.source):
            messages = gemma4_tool_responses(messages)
        context = dict(messages=messages, bos_token=self.bos_token, eos_token=self.eos_token,
                       add_generation_prompt=add_generation_prompt, **variables)
        chunks, size = [], 0
        previous = sys.gettrace()
        sys.settrace(_deadline_tracer(MAX_RENDER_SECONDS))
        try:
            for chunk in self._template.generate(**context):
                size += len(chunk)
                if size > MAX_OUTPUT_CHARS:
                    raise RenderLimit(f"it wrote more than {MAX_OUTPUT_CHARS:,} characters")
                chunks.append(chunk)
        except RenderLimit as e:
            raise ChatTemplateError(f"{self.name} was stopped: {e}") from None
        except SecurityError as e:
            raise ChatTemplateError(f"{self.name} tried to leave the sandbox: {e}") from None
        except ChatTemplateError:
            raise
        except (TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError,
                ZeroDivisionError, RecursionError) as e:
            raise ChatTemplateError(f"{self.name} failed: {type(e).__name__}: {e}") from None
        finally:
            sys.settrace(previous)
        text = "".join(chunks)
        if add_generation_prompt and self.reply_format == "gemma4" and text.endswith(GEMMA4_TURN[1]):
            # Gemma 4's template closes a model turn that had text beside its tool calls and their results, and
            # then opens no reply: llama.cpp's gemma4 handler opens it (common_chat_params_init_gemma4)
            text += GEMMA4_TURN[0]
        return text


def reads_tool_responses(source: str) -> bool:
    """Whether a template is one of Gemma 4's first ones, which take a tool's results from the model turn that
    called it (tool_responses) and render a message of role tool as a turn of its own: its tool calls written
    ('<|tool_call>call:'), but not the OpenAI-style messages of the templates after them. llama.cpp tells them
    apart the same way (common/chat.cpp)."""
    return "'<|tool_call>call:'" in source and "{#- OpenAI Chat Completions:" not in source


def gemma4_tool_responses(messages: list[dict]) -> list[dict]:
    """messages with each assistant message that calls tools, the tool messages after it and a final assistant
    message of text alone made one assistant message: its tool_calls, tool_responses ({"name": the call's function,
    or the result's tool_call_id, "response": the result, parsed where it is JSON}), content and reasoning_content,
    as llama.cpp's convert_tool_responses_gemma4 gives Gemma 4's first templates (common/parsers/gemma4.cpp)."""
    out, i = [], 0
    while i < len(messages):
        m = messages[i]
        if m.get("role") != "assistant" or not isinstance(m.get("tool_calls"), list) or not m["tool_calls"]:
            out.append(m)
            i += 1
            continue
        turn = {"role": "assistant", "tool_calls": list(m["tool_calls"])}
        if isinstance(m.get("reasoning_content"), str):
            turn["reasoning_content"] = m["reasoning_content"]
        responses, i = [], i + 1
        while i < len(messages) and messages[i].get("role") == "tool":
            result = messages[i]
            response = result.get("content")
            if isinstance(response, str):
                try:
                    response = json.loads(response)
                except ValueError:
                    pass
            call = turn["tool_calls"][len(responses)] if len(responses) < len(turn["tool_calls"]) else {}
            name = (call.get("function") or {}).get("name") or result.get("tool_call_id") or ""
            responses.append({"name": name, "response": response})
            i += 1
        if responses:
            turn["tool_responses"] = responses
        if i < len(messages) and messages[i].get("role") == "assistant" and not messages[i].get("tool_calls") \
                and messages[i].get("content"):
            turn["content"] = messages[i]["content"]
            i += 1
        out.append(turn)
    return out


def speaks_harmony(source: str) -> bool:
    """Whether a template's source is gpt-oss's harmony format, whose replies come in channels (analysis,
    commentary, final); llama.cpp tells it so too."""
    return "<|channel|>" in source


def reply_format(source: str) -> str:
    """How a reply marks its reasoning under a template: "harmony" (gpt-oss's channels), "gemma4" (Gemma 4's
    <|channel>thought ... <channel|>) or "think" (<think> tags, or no reasoning)."""
    if speaks_harmony(source):
        return "harmony"
    return "gemma4" if GEMMA4_CHANNEL[0] in source else "think"


def _token_text(metadata: dict, key: str) -> str:
    tokens, token_id = metadata.get("tokenizer.ggml.tokens"), metadata.get(key)
    if isinstance(tokens, list) and isinstance(token_id, int) and 0 <= token_id < len(tokens):
        return tokens[token_id]
    return ""


def load_chat_template(metadata: dict, name: str | None = None) -> ChatTemplate | None:
    """The template to chat with: the built-in `name` if given (e.g. from --chat-template), else the file's
    tokenizer.chat_template, else None: the model is used for plain completion."""
    bos = _token_text(metadata, "tokenizer.ggml.bos_token_id")
    eos = _token_text(metadata, "tokenizer.ggml.eos_token_id")
    if name is not None:
        if name not in BUILTIN_TEMPLATES:
            raise ChatTemplateError(f"unknown chat template '{name}'; built-in: {', '.join(BUILTIN_TEMPLATES)}")
        return ChatTemplate(BUILTIN_TEMPLATES[name], bos, eos, name=f"the built-in '{name}' template")
    source = metadata.get("tokenizer.chat_template")
    if not isinstance(source, str) or not source.strip():
        return None
    return ChatTemplate(source, bos, eos)
