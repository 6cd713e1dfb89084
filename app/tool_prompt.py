"""A request's tools shown to the model: the chat template's `tools` variable, as llama.cpp's --jinja and
transformers pass it, or a system note where the template takes none.

tool_choice "required" or a named function is asked for in the prompt (a system note; a named choice also
shows the model that tool alone) and enforced by constrained decoding (tool_grammar.py).
"""
import json

from app.server_schema import ToolRequest

# A template that takes no tools (it never names the variable) gets them in a system note with the JSON shape
# that the generic parser (tool_calls.BareJsonFormat) reads.
GENERIC_NOTE = ("You can call these tools:\n{tools}\nTo call tools, reply with only this JSON and nothing else: "
                '{{"tool_calls": [{{"name": "<tool name>", "arguments": {{<arguments as the tool\'s parameters '
                "say>}}}}]}}")


def with_tools(messages: list[dict], request: ToolRequest, template_source: str) -> tuple[list[dict], dict]:
    """(messages, template variables) that show the model its tools; a note in the system message where the
    template takes no tools, or where tool_choice asks for a call."""
    tools = request.tools
    if request.choice not in ("auto", "required"):
        tools = [t for t in tools if t["function"]["name"] == request.choice]
    notes = []
    if "tools" not in template_source:
        notes.append(GENERIC_NOTE.format(tools="\n".join(json.dumps(t["function"], ensure_ascii=False)
                                                          for t in tools)))
    if request.choice == "required":
        notes.append("Answer by calling one or more of the tools.")
    elif request.choice != "auto":
        notes.append(f"Answer by calling the tool {request.choice}.")
    if notes:
        note = "\n\n".join(notes)
        if messages and messages[0]["role"] == "system":
            messages = [messages[0] | {"content": messages[0]["content"] + "\n\n" + note}] + messages[1:]
        else:
            messages = [{"role": "system", "content": note}] + messages
    return messages, {"tools": tools}
