"""OpenAI's Responses API request (POST /v1/responses, what Codex CLI sends) checked and turned into the server's
GenRequest: `instructions` and `input` (a string, or items: messages, function_call, function_call_output,
reasoning) into the chat template's messages, function tools in their flat shape into a ToolRequest, `text.format`
into the grammar.

A response's conversation is kept in memory for a later request's `previous_response_id` (app/server_responses.py);
Reasoning items sent back go to the template as the reasoning of the assistant turn
that follows them (app/reasoning.py). Fields we do not know (include, metadata, prompt_cache_key...) are ignored.
"""
import json

from app.reasoning import LEVELS
from app.server_schema import (GenRequest, bad, flat_tools, get, json_type, positive, refuse, sampling,
                               schema_grammar, system_first, template_call, tool_result, with_reasoning)
from inference.grammar import json_schema_grammar

ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
TEXT_PARTS = ("input_text", "output_text", "refusal")  # refusal: an assistant part that says why it would not


def responses_request(body: dict, earlier: list[dict] = ()) -> GenRequest:
    """body's request; earlier: the items of the response it continues (previous_response_id), before its input."""
    if get(body, "background", bool, False):
        raise refuse("background", "a reply is answered while the request waits, or streamed")
    if get(body, "top_logprobs", int, 0):
        raise refuse("top_logprobs", "no log probabilities")
    instructions = get(body, "instructions", str)
    conversation = system_first(([{"role": "system", "content": instructions}] if instructions else []) +
                                input_messages(conversation_items(body, list(earlier)), len(earlier)))
    tools = responses_tools(body)
    grammar = text_format(get(get(body, "text", dict, {}), "format", dict, where="text."))
    if tools and grammar:
        raise refuse("text.format", "with 'tools' only when \"tool_choice\" is \"none\"")
    effort = get(get(body, "reasoning", dict, {}), "effort", str, where="reasoning.")
    if effort is not None and effort not in LEVELS:
        raise bad(f"'reasoning.effort' must be one of {', '.join(LEVELS)} (got '{effort}')")
    return GenRequest(model=get(body, "model", str), prompt=conversation, stream=get(body, "stream", bool, False),
                      max_tokens=positive(get(body, "max_output_tokens", int), "max_output_tokens"),
                      sampling=sampling(body), template_vars={} if effort is None else {"reasoning_effort": effort},
                      tools=tools, grammar=grammar)


def conversation_items(body: dict, earlier: list[dict]) -> list[dict]:
    """The conversation's items: earlier ones (those of the previous response, input and output, where the request
    continues one), then `input`'s (a string is one user message)."""
    value = body.get("input")
    if isinstance(value, str):
        return earlier + [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad("'input' is required: a string, or a list of items (messages, function calls and their outputs)")
    return earlier + value


def input_messages(value: list, earlier: int = 0) -> list[dict]:
    """Items as the chat template's messages: a function_call joins the assistant message before it (as one turn
    with text and calls), a function_call_output answers a call made before it. earlier: how many items come from
    a previous response (an error names the request's own item)."""
    out, reasoning = [], []  # reasoning: the items' text, for the assistant turn they come before
    for i, item in enumerate(value):
        where = f"input[{i - earlier}]"
        if not isinstance(item, dict):
            raise bad(f"'{where}' must be an item object (got {json_type(item)})")
        kind = get(item, "type", str, "message", where=where + ".")
        if kind == "message":
            role = ROLES.get(item.get("role"))
            if role is None:
                raise bad(f"'{where}.role' must be one of {', '.join(ROLES)}")
            message = {"role": role, "content": _text(item.get("content"), where + ".content")}
            out.append(with_reasoning(message, "\n\n".join(reasoning)) if role == "assistant" else message)
            reasoning = []
        elif kind == "function_call":
            if not (out and out[-1]["role"] == "assistant"):  # calls join the assistant's message before them
                out.append({"role": "assistant", "content": ""})
            turn = out[-1]
            out[-1] = with_reasoning(turn, "\n\n".join([turn.get("reasoning_content") or ""] + reasoning).strip())
            out[-1].setdefault("tool_calls", []).append(_call(item, where))
            reasoning = []
        elif kind == "function_call_output":
            call_id = get(item, "call_id", str, where=where + ".")
            if not call_id:
                raise bad(f"'{where}.call_id' is required: the call_id of the function_call it answers")
            out.append(tool_result(call_id, _text(item.get("output"), where + ".output"), out, where + ".call_id"))
        elif kind == "item_reference":
            raise refuse(where, "an item_reference needs stored items: send the item itself")
        elif kind == "reasoning":
            reasoning += _reasoning(item, where)
        else:
            raise bad(f"'{where}.type' is '{kind}': this server takes message, function_call, function_call_output "
                      "and reasoning items")
    return out


def _reasoning(item: dict, where: str) -> list[str]:
    """A reasoning item's text: its reasoning_text content (what this server sends), else its summary; an
    encrypted_content alone (OpenAI's own models') is nothing a model here can read."""
    parts = get(item, "content", list, where=where + ".") or get(item, "summary", list, [], where=where + ".")
    texts = [p.get("text") for p in parts if isinstance(p, dict)]
    if not all(isinstance(t, str) for t in texts) or len(texts) != len(parts):
        raise bad(f"'{where}' must hold text parts: {{\"type\": \"reasoning_text\", \"text\": ...}}")
    return [t for t in texts if t]


def _text(content, where: str) -> str:
    """A string, or content parts' text (input_text, output_text, refusal); images, files and audio refused."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(f"'{where}' must be a string or a list of content parts (got {json_type(content)})")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_image", "input_file", "input_audio"):
            raise refuse(f"{where}[{j}]", f"a part of type '{kind}': the models this server runs read text only")
        text = part.get("refusal" if kind == "refusal" else "text") if kind in TEXT_PARTS else None
        if not isinstance(text, str):
            raise bad(f"'{where}[{j}]' must be a text part {{\"type\": \"input_text\", \"text\": ...}}")
        texts.append(text)
    return "".join(texts)  # as the chat route joins its text parts


def _call(item: dict, where: str) -> dict:
    call_id, name = get(item, "call_id", str, where=where + "."), get(item, "name", str, where=where + ".")
    if not call_id or not name:
        raise bad(f"'{where}' must have the \"call_id\" and \"name\" of its call")
    try:
        arguments = json.loads(get(item, "arguments", str, "{}", where=where + ".") or "{}")
    except ValueError:
        raise bad(f"'{where}.arguments' is not valid JSON") from None
    if not isinstance(arguments, dict):
        raise bad(f"'{where}.arguments' must be a JSON object")
    return template_call(call_id, name, arguments)


def responses_tools(body: dict):
    """Function tools ({"type": "function", "name", "description", "parameters"}) and tool_choice as a ToolRequest
    (None: no tools, or tool_choice none). OpenAI's hosted tools (web search, file search...) are not ours to run."""
    for i, tool in enumerate(get(body, "tools", list, [])):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise refuse(f"tools[{i}]", f"a tool of type '{kind}': this server calls function tools only")
    choice = body.get("tool_choice", "auto")
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise bad("'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                      "\"name\": ...}")
        choice = {"type": "function", "function": {"name": choice["name"]}}  # as OpenAI's chat names it
    return flat_tools(body, "parameters", choice, get(body, "parallel_tool_calls", bool, True))


def text_format(value: dict | None) -> str | None:
    """text.format: text (None), json_object (any JSON object) or json_schema ({"name", "schema"}, flat)."""
    kind = get(value or {}, "type", str, "text", where="text.format.")
    if kind == "text":
        return None
    if kind == "json_object":
        return json_schema_grammar()
    if kind != "json_schema":
        raise bad(f"'text.format.type' must be \"text\", \"json_object\" or \"json_schema\" (got '{kind}')")
    return schema_grammar(get(value, "schema", dict, {"type": "object"}, where="text.format."), "text.format.schema")
