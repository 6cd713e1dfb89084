"""Request bodies of the OpenAI and Ollama APIs, checked and turned into one GenRequest for the engine worker.

Every field we read is checked for type and range; a field we cannot honour (logprobs, OpenAI's additive
penalties...) is refused by name when it asks for something, and accepted at its no-op value, which many
clients send anyway. Fields we do not know are ignored, as OpenAI's and Ollama's servers do.
"""
import json
from dataclasses import dataclass, field

from app.reasoning import LEVELS
from app.tool_calls import new_call_id
from inference.grammar import GrammarError, json_schema_grammar

ROLES = ("system", "user", "assistant", "tool")


class ApiError(Exception):
    """A request the server answers with an error: status, one clear message, OpenAI's type, code and param (the
    field at fault, where OpenAI's API names it)."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param


def bad(message: str, code: str | None = None) -> ApiError:
    return ApiError(400, message, code=code)


@dataclass
class ToolRequest:
    tools: list[dict]      # OpenAI's shape: {"type": "function", "function": {"name", "description", "parameters"}}
    choice: str = "auto"   # auto, required, or a tool's name ("none" makes no ToolRequest)
    parallel: bool = True  # False: the first call only


@dataclass
class GenRequest:
    model: str | None                     # the name asked for; None: the loaded model
    prompt: list[dict] | str | list[int] | None  # messages (chat template), text or token ids; None: load only
    stream: bool = False
    max_tokens: int | None = None         # None: until the context is full
    sampling: dict = field(default_factory=dict)  # Engine.generate's names: temperature, top_k, top_p, ...
    stop: tuple[str, ...] = ()
    ctx: int | None = None                # the least context wanted (Ollama's num_ctx)
    template_vars: dict = field(default_factory=dict)  # e.g. enable_thinking, reasoning_effort
    include_usage: bool = False
    tools: ToolRequest | None = None    # None: no tools for the template, no tool calls parsed
    grammar: str | None = None          # structured output: the answer follows it (inference/grammar.py)
    count_only: bool = False            # only count the prompt's tokens (Anthropic's count_tokens)


_KINDS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
          dict: "an object", type(None): "null"}


def json_type(value) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def get(body: dict, key: str, kind: type, default=None, where: str = ""):
    """body[key] checked to be of kind (an integer is a number; a boolean is neither); absent or null: default."""
    value = body.get(key)
    if value is None:
        return default
    ok = isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok, value = True, float(value)
    if not ok:
        raise bad(f"'{where}{key}' must be {_KINDS[kind]} (got {json_type(value)})")
    return value


def number(body: dict, key: str, low: float, high: float, where: str = "") -> float | None:
    value = get(body, key, float, where=where)
    if value is not None and not low <= value <= high:
        raise bad(f"'{where}{key}' must be between {low:g} and {high:g} (got {value:g})")
    return value


def refuse(key: str, what: str) -> ApiError:
    return bad(f"'{key}' is not supported by this server ({what})", code="unsupported_parameter")


def messages(body: dict, allow_empty: bool = False) -> list[dict]:
    """The conversation as the chat template takes it: [{"role", "content": str}], text parts joined."""
    items = get(body, "messages", list)
    if items is None:
        raise bad("'messages' is required: a list of {\"role\", \"content\"} objects")
    if not items and not allow_empty:
        raise bad("'messages' must hold at least one message")
    out = []
    for i, m in enumerate(items):
        where = f"messages[{i}]."
        if not isinstance(m, dict):
            raise bad(f"'messages[{i}]' must be an object with \"role\" and \"content\" (got {json_type(m)})")
        role = get(m, "role", str, where=where)
        if role == "developer":  # OpenAI's newer name for the system role
            role = "system"
        if role not in ROLES:
            shown = "missing" if role is None else f"'{role}'"
            raise bad(f"'{where}role' must be one of {', '.join(ROLES)} (got {shown})")
        if m.get("images"):
            raise refuse(f"{where}images", "the models it runs read text only")
        message = {"role": role, "content": _content(m, where, required=role != "assistant")}
        if role == "assistant":  # its reasoning sent back: OpenAI's (llama.cpp's) name, or Ollama's
            message = with_reasoning(message, get(m, "reasoning_content", str, where=where)
                                     or get(m, "thinking", str, where=where))
        out.append(history_message(m, message, where, out))
    return out


def system_first(messages: list[dict]) -> list[dict]:
    """messages with one system message, first, as chat templates take it (Qwen3.5's refuses any other): those that
    open the conversation joined, a paragraph each (Codex's instructions, then its developer message), later ones
    as user messages where they stand (Codex's developer notes, Claude Code's system reminders between turns), so
    that the prompt's beginning, and the KV cache of it, stays the same from turn to turn."""
    n = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
    head = [{"role": "system", "content": "\n\n".join(m["content"] for m in messages[:n])}] if n > 1 else messages[:n]
    return head + [m | {"role": "user"} if m["role"] == "system" else m for m in messages[n:]]


def with_reasoning(message: dict, reasoning: str | None) -> dict:
    """An assistant message with the reasoning sent back with it, as the chat templates read it (app/reasoning.py)."""
    return message | {"reasoning_content": reasoning} if reasoning else message


def _content(m: dict, where: str, required: bool) -> str:
    content = m.get("content")
    if content is None and not required:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI's content parts: text only
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad(f"'{where}content[{j}]' must be a text part {{\"type\": \"text\", \"text\": ...}}: "
                          "this server reads text only")
            texts.append(part["text"])
        return "".join(texts)
    raise bad(f"'{where}content' must be a string or a list of text parts (got {json_type(content)})")


def stop_strings(value, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(value)
    raise bad(f"'{key}' must be a string or a list of strings")


def sampling(body: dict, where: str = "") -> dict:
    """temperature, top_p and the llama.cpp extensions top_k, min_p, repeat_penalty, where given."""
    out = {"temperature": number(body, "temperature", 0, 2, where), "top_p": number(body, "top_p", 0, 1, where),
           "min_p": number(body, "min_p", 0, 1, where), "repeat_penalty": number(body, "repeat_penalty", 0.01, 10, where),
           "top_k": get(body, "top_k", int, where=where), "seed": get(body, "seed", int, where=where)}
    if out["top_k"] is not None and out["top_k"] < 0:
        raise bad(f"'{where}top_k' must be 0 (off) or more (got {out['top_k']})")
    return {k: v for k, v in out.items() if v is not None}


def _no_additive_penalties(body: dict, where: str = "") -> None:
    for key in ("presence_penalty", "frequency_penalty"):
        if number(body, key, -2, 2, where):
            raise refuse(f"{where}{key}", "use 'repeat_penalty', llama.cpp's multiplicative one, e.g. 1.1")


def positive(value: int | None, key: str) -> int | None:
    if value is not None and value < 1:
        raise bad(f"'{key}' must be at least 1 (got {value})")
    return value


def _openai_common(body: dict) -> dict:
    """What chat and completions share: model, stream, limits, sampling; refuses what we cannot do."""
    _no_additive_penalties(body)
    if get(body, "n", int, 1) != 1:
        raise refuse("n", "one choice per request")
    if body.get("logprobs") or body.get("top_logprobs"):
        raise refuse("logprobs", "no log probabilities")
    if body.get("logit_bias"):
        raise refuse("logit_bias", "no logit bias")
    max_tokens = get(body, "max_completion_tokens", int)
    key = "max_completion_tokens" if max_tokens is not None else "max_tokens"
    max_tokens = positive(max_tokens if max_tokens is not None else get(body, "max_tokens", int), key)
    stream_options = get(body, "stream_options", dict, {})
    return dict(model=get(body, "model", str), stream=get(body, "stream", bool, False), max_tokens=max_tokens,
                sampling=sampling(body), stop=stop_strings(body.get("stop"), "stop"),
                include_usage=get(stream_options, "include_usage", bool, False, where="stream_options."))


def openai_chat(body: dict) -> GenRequest:
    if body.get("functions"):
        raise refuse("functions", "send them as 'tools', OpenAI's current name")
    effort = get(body, "reasoning_effort", str)
    if effort is not None and effort not in LEVELS:
        raise bad(f"'reasoning_effort' must be one of {', '.join(LEVELS)} (got '{effort}')")
    tools, grammar = tool_request(body, openai=True), response_format(get(body, "response_format", dict, {}))
    if tools and grammar:
        raise refuse("response_format", "with 'tools' only when \"tool_choice\" is \"none\"")
    return GenRequest(prompt=messages(body), template_vars={} if effort is None else {"reasoning_effort": effort},
                      tools=tools, grammar=grammar, **_openai_common(body))


def response_format(value: dict) -> str | None:
    """The grammar of OpenAI's response_format: json_object (any JSON object), json_schema (its schema), text: None."""
    kind = get(value, "type", str, "text", where="response_format.")
    if kind == "text":
        return None
    if kind == "json_object":
        return json_schema_grammar()
    if kind != "json_schema":
        raise bad(f"'response_format.type' must be \"text\", \"json_object\" or \"json_schema\" (got '{kind}')")
    spec = get(value, "json_schema", dict, where="response_format.")
    if spec is None:
        raise bad("'response_format.json_schema' is required: {\"name\": ..., \"schema\": {...}}")
    return schema_grammar(get(spec, "schema", dict, {"type": "object"}, where="response_format.json_schema."),
                          "response_format.json_schema.schema")


def schema_grammar(schema: dict, key: str) -> str:
    try:
        return json_schema_grammar(schema)
    except GrammarError as e:
        raise bad(f"'{key}' cannot be enforced: {e}", code="invalid_json_schema") from None


def openai_completion(body: dict) -> GenRequest:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    token_ids = isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    if not isinstance(prompt, str) and not (token_ids and prompt):
        raise bad("'prompt' must be a string or a list of token ids (one prompt per request)")
    if get(body, "echo", bool, False):
        raise refuse("echo", "the reply comes without its prompt")
    if body.get("suffix"):
        raise refuse("suffix", "no fill-in-the-middle")
    if get(body, "best_of", int, 1) != 1:
        raise refuse("best_of", "one choice per request")
    return GenRequest(prompt=prompt, grammar=response_format(get(body, "response_format", dict, {})),
                      **_openai_common(body))  # response_format as llama.cpp's server takes it here too


# Ollama: options by its names. Those that only tune speed or memory are ignored, as the engine decides them.
_OLLAMA_NO_OP = {"mirostat": 0, "typical_p": 1.0, "tfs_z": 1.0}


def _ollama_common(body: dict) -> dict:
    options = get(body, "options", dict, {})
    where = "options."
    _no_additive_penalties(options, where)
    for key, no_op in _OLLAMA_NO_OP.items():
        if get(options, key, float, no_op, where) != no_op:
            raise refuse(where + key, "the samplers are llama.cpp's top_k, top_p, min_p and temperature")
    num_predict = get(options, "num_predict", int, where=where)
    if num_predict is not None and num_predict < 1 and num_predict not in (-1, -2):
        raise bad(f"'options.num_predict' must be at least 1, or -1 (no limit) (got {num_predict})")
    num_ctx = positive(get(options, "num_ctx", int, where=where), "options.num_ctx")
    think = body.get("think")
    if think is not None and not (isinstance(think, bool) or think in LEVELS):
        shown = f"'{think}'" if isinstance(think, str) else json_type(think)
        raise bad(f"'think' must be true, false or one of {', '.join(LEVELS)} (got {shown})")
    return dict(model=get(body, "model", str), stream=get(body, "stream", bool, True),
                max_tokens=num_predict if num_predict is not None and num_predict > 0 else None,
                sampling=sampling(options, where), stop=stop_strings(options.get("stop"), "options.stop"),
                ctx=num_ctx, grammar=ollama_format(body.get("format")),
                template_vars={} if think is None else {"enable_thinking": think is not False}
                | ({"reasoning_effort": think} if isinstance(think, str) else {}))


def ollama_format(value) -> str | None:
    """The grammar of Ollama's format: "json" (any JSON object) or a JSON schema; absent or "": None."""
    if value is None or value == "":
        return None
    if value == "json":
        return json_schema_grammar()
    if not isinstance(value, dict):
        raise bad(f"'format' must be \"json\" or a JSON schema object (got {json_type(value)})")
    return schema_grammar(value, "format")


def ollama_chat(body: dict) -> GenRequest:
    conversation, tools = messages(body, allow_empty=True), tool_request(body, openai=False)
    common = _ollama_common(body)
    if tools and common["grammar"]:
        raise refuse("format", "with 'tools' the reply may be a call or text")
    return GenRequest(prompt=conversation or None, tools=tools, **common)  # no messages: load the model


def ollama_generate(body: dict) -> GenRequest:
    prompt, system = get(body, "prompt", str, ""), get(body, "system", str)
    if body.get("images"):
        raise refuse("images", "the models it runs read text only")
    if body.get("suffix"):
        raise refuse("suffix", "no fill-in-the-middle")
    if body.get("template"):
        raise refuse("template", "the model's own chat template is used")
    if body.get("tools"):
        raise refuse("tools", "tools go to /api/chat")
    common = _ollama_common(body)
    if not prompt:
        return GenRequest(prompt=None, **common)  # Ollama's way to load a model
    if get(body, "raw", bool, False):
        if system:
            raise bad("'system' needs the chat template: it cannot go with \"raw\": true")
        return GenRequest(prompt=prompt, **common)
    conversation = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return GenRequest(prompt=conversation, **common)


def tool_request(body: dict, openai: bool) -> ToolRequest | None:
    """The request's tools, or None: no tools, or tool_choice "none" (the template is then given none)."""
    given = get(body, "tools", list)
    if not given:
        return None
    tools = []
    for i, tool in enumerate(given):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type", "function") != "function" \
                or not isinstance(function.get("name"), str) or not function["name"]:
            raise bad(f"'tools[{i}]' must be {{\"type\": \"function\", \"function\": {{\"name\": ..., "
                      "\"parameters\": {...}}}")
        if not isinstance(function.get("parameters", {}), dict):
            raise bad(f"'tools[{i}].function.parameters' must be a JSON schema object")
        # both optional in OpenAI's API, but templates read them (Hermes and gpt-oss fail without them)
        defaults = {"description": "", "parameters": {"type": "object", "properties": {}}}
        tools.append({"type": "function", "function": function | {k: v for k, v in defaults.items()
                                                                   if k not in function}})
    names = [t["function"]["name"] for t in tools]
    choice = body.get("tool_choice", "auto") if openai else "auto"  # Ollama has no tool_choice
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if isinstance(choice.get("function"), dict) else None
        if name not in names:
            raise bad(f"'tool_choice' names the function '{name}', which is not in 'tools' ({', '.join(names)})")
        choice = name
    elif choice not in ("auto", "none", "required"):
        raise bad("'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                  "\"function\": {\"name\": ...}}")
    if choice == "none":
        return None
    return ToolRequest(tools, choice, get(body, "parallel_tool_calls", bool, True) if openai else True)


def history_message(m: dict, out: dict, where: str, earlier: list[dict]) -> dict:
    """out (role and content) with the tool fields a template reads: an assistant's tool_calls, their arguments as
    objects (as templates render them), and a tool result's tool_call_id and name, matched to the call it answers
    (Ollama's messages carry no ids: a result answers the earliest call not yet answered)."""
    calls = m.get("tool_calls")
    if calls and out["role"] == "assistant":
        if not isinstance(calls, list):
            raise bad(f"'{where}tool_calls' must be an array")
        out["tool_calls"] = [_call(c, f"{where}tool_calls[{j}]") for j, c in enumerate(calls)]
    elif out["role"] == "tool":
        answered = {x["tool_call_id"] for x in earlier if x["role"] == "tool"}
        pending = [c for x in earlier for c in x.get("tool_calls", ()) if c["id"] not in answered]
        call_id = get(m, "tool_call_id", str, where=where)
        call = next((c for c in pending if c["id"] == call_id), None) if call_id else (pending or [None])[0]
        name = get(m, "tool_name", str, where=where) or get(m, "name", str, where=where)
        out["tool_call_id"] = call_id or (call["id"] if call else "")
        out["name"] = name or (call["function"]["name"] if call else "")
    return out


def _call(c, where: str) -> dict:
    function = c.get("function") if isinstance(c, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise bad(f"'{where}' must be {{\"function\": {{\"name\": ..., \"arguments\": ...}}}}")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):  # OpenAI sends a JSON string; templates want the object
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise bad(f"'{where}.function.arguments' is not valid JSON") from None
    if not isinstance(arguments, dict):
        raise bad(f"'{where}.function.arguments' must be a JSON object")
    return template_call(c.get("id") if isinstance(c.get("id"), str) else new_call_id(), function["name"], arguments)


def template_call(call_id: str, name: str, arguments: dict) -> dict:
    """A tool call in an assistant message as the chat templates read it: its arguments an object."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_result(call_id: str, content: str, earlier: list[dict], where: str) -> dict:
    """A tool's result as the templates read it, answering the call with call_id in earlier's assistant messages;
    none with that id is a 400 naming where (Anthropic's and the Responses API's results must answer a call)."""
    call = next((c for m in earlier for c in m.get("tool_calls", ()) if c["id"] == call_id), None)
    if call is None:
        raise bad(f"'{where}' is '{call_id}', but no tool call before it has that id")
    return {"role": "tool", "content": content, "tool_call_id": call_id, "name": call["function"]["name"]}


def flat_tools(body: dict, schema_key: str, choice, parallel: bool) -> ToolRequest | None:
    """The ToolRequest of tools in the flat shape Anthropic's API and the Responses API send them
    ({"name", "description", schema_key: {...}}), with tool_choice already in OpenAI chat's terms."""
    tools = []
    for i, tool in enumerate(get(body, "tools", list, [])):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or not tool["name"]:
            raise bad(f"'tools[{i}]' must be an object with a \"name\" and \"{schema_key}\"")
        schema = get(tool, schema_key, dict, {"type": "object", "properties": {}}, where=f"tools[{i}].")
        tools.append({"type": "function", "function": {"name": tool["name"], "parameters": schema,
                                                       "description": get(tool, "description", str, "",
                                                                          where=f"tools[{i}].")}})
    return tool_request({"tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel}, openai=True)
