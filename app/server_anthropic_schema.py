"""Anthropic's Messages API request (POST /v1/messages and /v1/messages/count_tokens) checked and turned into the
server's GenRequest: content blocks into the chat template's messages, `tool_use` / `tool_result` blocks into its
tool calls and results, `tools` and `tool_choice` into a ToolRequest, `output_config.format` into the grammar.

Thinking blocks sent back go to the template as the message's reasoning (app/reasoning.py); system messages
between turns (Claude Code's reminders) as user messages where they stand (server_schema.system_first); Claude
Code's billing line, a system block that changes every request, is left out. Images and documents are refused by
name; a block type we do not know is a 400 naming it. Fields we do not know (metadata, cache_control...) are
ignored, as on the other routes.
"""
from app.server_schema import (GenRequest, bad, flat_tools, get, json_type, positive, refuse, sampling,
                               schema_grammar, stop_strings, system_first, template_call, tool_result,
                               with_reasoning)

THINKING = ("enabled", "adaptive", "between_tools", "disabled")
TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}  # Anthropic's names -> OpenAI's
BILLING = "x-anthropic-billing-header:"  # the system block Claude Code opens with, for Anthropic's billing


def anthropic_request(body: dict, count_only: bool = False) -> GenRequest:
    """A /v1/messages body; count_only: a count_tokens body, which has no max_tokens."""
    max_tokens = positive(get(body, "max_tokens", int), "max_tokens")
    if max_tokens is None and not count_only:
        raise bad("'max_tokens' is required: the most tokens the reply may have")
    conversation = system_first(system_messages(body.get("system")) + messages(get(body, "messages", list)))
    tools = anthropic_tools(body)
    grammar = output_format(get(get(body, "output_config", dict, {}), "format", dict, where="output_config."))
    if tools and grammar:
        raise refuse("output_config.format", "with 'tools' only when \"tool_choice\" is {\"type\": \"none\"}")
    return GenRequest(model=get(body, "model", str), prompt=conversation, stream=get(body, "stream", bool, False),
                      max_tokens=max_tokens, sampling=sampling(body),
                      stop=stop_strings(body.get("stop_sequences"), "stop_sequences"),
                      template_vars=thinking_vars(get(body, "thinking", dict)), tools=tools, grammar=grammar,
                      count_only=count_only)


def system_messages(system) -> list[dict]:
    """`system` as a string or a list of text blocks: the conversation's system message, if it says anything."""
    if system is None:
        return []
    if not isinstance(system, str | list):
        raise bad(f"'system' must be a string or a list of text blocks (got {json_type(system)})")
    if isinstance(system, list):  # Claude Code's billing line changes every request: kept, no prompt is reused
        system = [b for b in system if not (isinstance(b, dict) and str(b.get("text")).startswith(BILLING))]
    text = system if isinstance(system, str) else _text(system, "system")
    return [{"role": "system", "content": text}] if text else []


def messages(items: list | None) -> list[dict]:
    """Anthropic's messages as the chat template takes them: a user message's tool_result blocks become tool
    messages (before its text, as Anthropic wants them first), an assistant message's tool_use blocks its
    tool_calls; a system message (Anthropic's mid-conversation instructions) its text."""
    if items is None:
        raise bad("'messages' is required: a list of {\"role\", \"content\"} objects")
    if not items:
        raise bad("'messages' must hold at least one message")
    out = []
    for i, m in enumerate(items):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(f"'{where}' must be an object with \"role\" and \"content\" (got {json_type(m)})")
        role, content = get(m, "role", str, where=where + "."), m.get("content")
        if role not in ("user", "assistant", "system"):
            raise bad(f"'{where}.role' must be \"user\", \"assistant\" or \"system\" (got "
                      f"{'missing' if role is None else role})")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if not isinstance(content, list):
            raise bad(f"'{where}.content' must be a string or a list of content blocks (got {json_type(content)})")
        if role == "system":  # between turns, as Claude Code sends its reminders
            out.append({"role": "system", "content": _text(content, where + ".content")})
        else:
            out += _user(content, where, out) if role == "user" else [_assistant(content, where)]
    if items[-1].get("role") == "assistant":
        raise bad("the last message is the assistant's: this server does not continue a prefilled reply (the reply "
                  "is a new turn); end with a user message")
    return out


def _block(block, where: str) -> str:
    """A content block's type; images and documents refused, as the models this server runs read text only."""
    kind = block.get("type") if isinstance(block, dict) else None
    if not isinstance(kind, str):
        raise bad(f"'{where}' must be a content block: an object with a \"type\"")
    if kind in ("image", "document", "search_result"):
        raise refuse(where, f"a block of type '{kind}': the models this server runs read text only")
    return kind


def _text(blocks: list, where: str) -> str:
    """Text blocks' text, a blank line between blocks (Claude Code sends a reminder and the prompt as two)."""
    texts = []
    for j, block in enumerate(blocks):
        kind = _block(block, f"{where}[{j}]")
        if kind != "text" or not isinstance(block.get("text"), str):
            raise bad(f"'{where}[{j}]' must be a text block {{\"type\": \"text\", \"text\": ...}} (got type '{kind}')")
        texts.append(block["text"])
    return "\n\n".join(texts)


def _user(blocks: list, where: str, earlier: list[dict]) -> list[dict]:
    results, texts = [], []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = _block(block, at)
        if kind == "tool_result":
            call_id = get(block, "tool_use_id", str, where=at + ".")
            if call_id is None:
                raise bad(f"'{at}.tool_use_id' is required: the id of the tool_use block it answers")
            content = block.get("content", "")
            if isinstance(content, list):
                content = _text(content, at + ".content")
            if not isinstance(content, str):
                raise bad(f"'{at}.content' must be a string or a list of text blocks (got {json_type(content)})")
            results.append(tool_result(call_id, content, earlier, at + ".tool_use_id"))
        elif kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        else:
            raise bad(f"'{at}' has type '{kind}': a user message holds text and tool_result blocks")
    return results + ([{"role": "user", "content": "\n\n".join(texts)}] if texts else [])


def _assistant(blocks: list, where: str) -> dict:
    texts, calls, thinking = [], [], []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = _block(block, at)
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            call_id, name = get(block, "id", str, where=at + "."), get(block, "name", str, where=at + ".")
            if not call_id or not name:
                raise bad(f"'{at}' must have the \"id\" and \"name\" of its call")
            calls.append(template_call(call_id, name, get(block, "input", dict, {}, where=at + ".")))
        elif kind == "thinking":
            thinking.append(get(block, "thinking", str, "", where=at + "."))
        elif kind != "redacted_thinking":  # redacted: Anthropic's encrypted thinking, which no model here can read
            raise bad(f"'{at}' has type '{kind}': an assistant message holds text, thinking and tool_use blocks")
    message = {"role": "assistant", "content": "\n\n".join(texts)} | ({"tool_calls": calls} if calls else {})
    return with_reasoning(message, "\n\n".join(t for t in thinking if t))


def anthropic_tools(body: dict):
    """tools ({"name", "description", "input_schema"}) and tool_choice as a ToolRequest (None: no tools, or
    tool_choice none). Anthropic's server tools (web search, its bash and editor) are not ours to run."""
    for i, tool in enumerate(get(body, "tools", list, [])):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind not in (None, "custom"):
            raise refuse(f"tools[{i}]", f"'{kind}' is one of Anthropic's server tools; send your own tool "
                         "with \"name\", \"description\" and \"input_schema\"")
    choice = get(body, "tool_choice", dict, {"type": "auto"})
    kind = choice.get("type")
    if kind == "tool":
        name = get(choice, "name", str, where="tool_choice.")
        mapped = {"type": "function", "function": {"name": name}}
    elif kind in TOOL_CHOICES:
        mapped = TOOL_CHOICES[kind]
    else:
        raise bad("'tool_choice.type' must be \"auto\", \"any\", \"tool\" or \"none\"")
    parallel = not get(choice, "disable_parallel_tool_use", bool, False, where="tool_choice.")
    return flat_tools(body, "input_schema", mapped, parallel)


def thinking_vars(thinking: dict | None) -> dict:
    """`thinking` as the template variable the other routes set (Ollama's think): disabled turns it off where the
    template can (Qwen3); budget_tokens is accepted but not enforced: max_tokens bounds thinking and answer."""
    if thinking is None:
        return {}
    kind = thinking.get("type")
    if kind not in THINKING:
        raise bad(f"'thinking.type' must be one of {', '.join(THINKING)}")
    return {"enable_thinking": kind != "disabled"}


def output_format(value: dict | None) -> str | None:
    """Anthropic's structured output, {"type": "json_schema", "schema": {...}}, as the grammar of the answer."""
    if value is None:
        return None
    if value.get("type") != "json_schema":
        raise bad("'output_config.format.type' must be \"json_schema\"")
    return schema_grammar(get(value, "schema", dict, {"type": "object"}, where="output_config.format."),
                          "output_config.format.schema")
