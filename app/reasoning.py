"""A reasoning effort (low, medium, high) for the chat template, as llama.cpp passes it: the template variable
`reasoning_effort`, which gpt-oss's harmony template writes into its system message (`Reasoning: high`; medium
when not given). A template that reads no such variable cannot honour one, so asking is refused, as Ollama refuses
a think level for a model that is not gpt-oss.

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
