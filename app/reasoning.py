"""Thinking on or off, and a reasoning effort (low, medium, high), for the chat template, as llama.cpp passes them.

On or off is the template variable `enable_thinking`, which llama.cpp always gives (its --reasoning auto: on where the
template has the switch): Gemma 4's template thinks only when given it, Qwen3's unless given false. A reasoning
effort is the variable `reasoning_effort`, which gpt-oss's harmony template writes into its system message
(`Reasoning: high`; medium when not given). A template that reads no such variable cannot honour one, so asking is
refused, as Ollama refuses a think level for a model that is not gpt-oss.

Reasoning sent back in the history (the server's routes each have their own field for it) goes to the template as
llama.cpp hands it over: `reasoning_content` on an assistant message (Qwen3 / Qwen3.5's templates keep that of the
turns since the last user message), copied to `thinking` for gpt-oss (its template shows the analysis of a turn
with tool calls). Which turns' reasoning the model sees is the template's choice.
"""
from models.errors import UserError

LEVELS = ("low", "medium", "high")


class ReasoningEffortError(UserError, ValueError):
    pass


def check_level(effort: str | None) -> None:
    """--reasoning-effort's value, before a model loads."""
    if effort is not None and effort not in LEVELS:
        raise ReasoningEffortError(f"--reasoning-effort takes {', '.join(LEVELS)} (got '{effort}')")


def thinking_vars(template, reasoning: str | None = None) -> dict:
    """enable_thinking for template (a ChatTemplate or None): reasoning "on", "off" (--reasoning), or None: on where
    the template has the switch, as llama.cpp's default."""
    switch = template is not None and "enable_thinking" in template.variables
    if reasoning is not None and not switch:
        raise ReasoningEffortError(f"--reasoning {reasoning} is not supported by this model: its chat template has no "
                                   "switch for thinking (enable_thinking, as Gemma 4's and Qwen3's have)")
    return {"enable_thinking": reasoning != "off"} if switch else {}


def effort_vars(template, effort: str | None) -> dict:
    """The template variables that ask template (a ChatTemplate or None) for effort (None: its default)."""
    if effort is None:
        return {}
    check_level(effort)
    if template is None or "reasoning_effort" not in template.variables:
        raise ReasoningEffortError(f"reasoning effort '{effort}' is not supported by this model: its chat template "
                                   "takes no reasoning effort (gpt-oss's harmony template does)")
    return {"reasoning_effort": effort}


def history_reasoning(template, messages: list[dict]) -> list[dict]:
    """messages with their assistants' reasoning_content where template (a ChatTemplate) reads it: gpt-oss's as
    `thinking`, in place of a tool-call message's text, as llama.cpp's gpt-oss chat format passes it (the
    template refuses both in one message)."""
    if not template.speaks_harmony:
        return messages
    out = []
    for m in messages:
        if m.get("reasoning_content"):
            m = m | {"thinking": m["reasoning_content"]}
            if m.get("tool_calls"):
                m.pop("content", None)
        out.append(m)
    return out
