"""Structured output: a JSON schema (OpenAI's response_format, Ollama's format, `run --json-schema`) as the grammar
the engine decodes the answer by, starting where a reasoning model's answer starts, so that its thinking stays free
and the JSON lands in the answer.

A reply that reaches max_tokens before its JSON closes ends unfinished with finish_reason "length", as OpenAI's
API returns it: only a reply that ends with "stop" is whole JSON.
"""
import json
from pathlib import Path

from inference.grammar import Constraint, GrammarError, json_schema_grammar
from models.chat_template import GEMMA4_CHANNEL
from models.errors import UserError

HARMONY_FINAL = "<|channel|>final<|message|>"  # gpt-oss's answer starts after this header


def answer_constraint(grammar: str, template, thinks: bool) -> Constraint:
    """grammar held on the answer: after gpt-oss's analysis (its final channel), after the thought a Gemma 4 reply
    may open with, after </think> where the prompt ends inside <think>, and where the template knows <think> tags,
    after a <think>...</think> the reply may open with (or at once if it does not). template: the ChatTemplate that
    rendered the prompt (None: plain text)."""
    if template is not None and template.speaks_harmony:
        return Constraint(grammar, after=HARMONY_FINAL)
    if template is not None and template.reply_format == "gemma4":  # a thought the reply may open (thinking on)
        return Constraint(grammar, after=GEMMA4_CHANNEL[1], think=GEMMA4_CHANNEL[0])
    if thinks:
        return Constraint(grammar, after="</think>")
    if template is not None and "</think>" in template.source:
        return Constraint(grammar, after="</think>", think="<think>")
    return Constraint(grammar)


class SchemaFileError(UserError):
    pass


def schema_file_grammar(path: str) -> str:
    """The grammar of `run --json-schema FILE`; any problem with the file is one line."""
    try:
        schema = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise SchemaFileError(f"cannot read the JSON schema {path}: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise SchemaFileError(f"{path} is not valid JSON: {e}") from None
    try:
        return json_schema_grammar(schema)
    except GrammarError as e:
        raise SchemaFileError(f"{path}: {e}") from None
