"""tool_choice "required" or a named function enforced: the grammar of a reply that is only tool calls, written as
the template's format writes them, each call's arguments held to its tool's parameters schema.

Formats with a grammar here: Hermes / Qwen (<tool_call>{"name", "arguments"}</tool_call>), Llama 3.x's bare
{"name", "parameters"}, and the generic {"tool_calls": [...]} of a template that takes no tools. The others
(Mistral, Qwen3-Coder XML, harmony) are still only asked for in the prompt (tool_prompt.py).
"""
import json

from app.server_schema import ToolRequest, bad
from app.tool_calls import BareJsonFormat, Format, HermesFormat
from inference.grammar import JSON_OPTIONS, GrammarError, closed, lark_grammar


def tool_call_grammar(fmt: Format, request: ToolRequest, template_takes_tools: bool) -> str | None:
    """The grammar of a reply of calls to request's tools (the named one alone where tool_choice names one), or
    None where fmt has none here. A tool whose parameters cannot be compiled is an ApiError (400) naming it."""
    tools = [t["function"] for t in request.tools if request.choice in ("required", t["function"]["name"])]
    if isinstance(fmt, HermesFormat):
        more = ' ("\\n" call)*' if request.parallel else ""
        lark = (f'start: call{more}\ncall: "<tool_call>\\n" body "\\n</tool_call>"\n'
                f'body: {_json(_any_call(tools, "arguments"))}')
    elif isinstance(fmt, BareJsonFormat) and template_takes_tools:  # Llama 3.x: one call a reply
        lark = f"start: {_json(_any_call(tools, 'parameters'))}"
    elif isinstance(fmt, BareJsonFormat):  # the generic note's shape (tool_prompt.GENERIC_NOTE)
        calls = {"type": "array", "items": _any_call(tools, "arguments"), "minItems": 1}
        if not request.parallel:
            calls["maxItems"] = 1
        lark = "start: " + _json({"type": "object", "properties": {"tool_calls": calls}, "required": ["tool_calls"],
                                  "additionalProperties": False})
    else:
        return None
    try:
        return lark_grammar(lark)
    except GrammarError as e:
        raise bad(f"'tools' cannot be enforced as tool_choice \"{request.choice}\" asks: {e}",
                  code="invalid_json_schema") from None


def _any_call(tools: list[dict], arguments_key: str) -> dict:
    """A call to any of tools: {"name": its name, arguments_key: its parameters}."""
    return {"anyOf": [{"type": "object", "additionalProperties": False, "required": ["name", arguments_key],
                       "properties": {"name": {"const": t["name"]}, arguments_key: closed(t["parameters"])}}
                      for t in tools]}


def _json(schema: dict) -> str:
    """llguidance's Lark inlining of a JSON schema, compact as inference.grammar's JSON."""
    return "%json " + json.dumps(schema | {"x-guidance": JSON_OPTIONS})
