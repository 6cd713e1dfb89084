"""A reasoning effort (low, medium, high) for the chat template, as llama.cpp passes it: the template variable
`reasoning_effort`, which gpt-oss's harmony template writes into its system message (`Reasoning: high`; medium
when not given). A template that reads no such variable cannot honour one, so asking is refused, as Ollama refuses
a think level for a model that is not gpt-oss.
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
