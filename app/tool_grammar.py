"""tool_choice "required" or a named function enforced: the grammar of a reply that is only tool calls, written as
the template's format writes them, each call's arguments held to its tool's parameters schema.

Formats: Hermes / Qwen (<tool_call>{"name", "arguments"}</tool_call>), Llama 3.x's bare {"name", "parameters"}, the
generic {"tool_calls": [...]} of a template that takes no tools, Mistral ([TOOL_CALLS]NAME[ARGS]{...} or
[TOOL_CALLS][{...}], as the template writes them), Qwen3-Coder / Qwen3.5 XML (<function=NAME><parameter=P>),
gpt-oss harmony (its free analysis first, as llama.cpp's grammar lets it, then the commentary channel's call), and
Gemma 4 (<|tool_call>call:NAME{key:value,...}<tool_call|>, its arguments in its own syntax, held to the schema).
A tag that is a control token of the vocabulary ([TOOL_CALLS], [ARGS]) is written in the grammar as that token:
only the token itself matches it, not its text spelled in pieces.
"""
import json

from app.server_schema import ToolRequest, bad
from app.tool_calls import (GEMMA4_QUOTE, BareJsonFormat, Format, Gemma4Format, HarmonyFormat, HermesFormat,
                            MistralFormat, XmlFormat)
from inference.grammar import JSON_OPTIONS, GrammarError, closed, lark_grammar


def tool_call_grammar(fmt: Format, request: ToolRequest, template_takes_tools: bool, tokenizer) -> str:
    """The grammar of a reply of calls to request's tools (the named one alone where tool_choice names one) in fmt.
    tokenizer: the model's (its vocab and control marks). A tool whose parameters cannot be compiled, or a format
    with no grammar here, is an ApiError (400) saying so: never a silently unconstrained reply."""
    tools = [t["function"] for t in request.tools if request.choice in ("required", t["function"]["name"])]
    more = ' ("\\n" call)*' if request.parallel else ""  # parallel: more calls, a line apart
    try:
        if isinstance(fmt, HermesFormat):
            lark = (f'start: call{more}\ncall: "<tool_call>\\n" body "\\n</tool_call>"\n'
                    f'body: {_json(_any_call(tools, "arguments"))}')
        elif isinstance(fmt, BareJsonFormat) and template_takes_tools:  # Llama 3.x: one call a reply
            lark = f"start: {_json(_any_call(tools, 'parameters'))}"
        elif isinstance(fmt, BareJsonFormat):  # the generic note's shape (tool_prompt.GENERIC_NOTE)
            lark = "start: " + _json({"type": "object", "properties": {"tool_calls": _calls(tools, request.parallel)},
                                      "required": ["tool_calls"], "additionalProperties": False})
        elif isinstance(fmt, MistralFormat):
            lark = _mistral(tools, fmt.named, request.parallel, _Tags(tokenizer))
        elif isinstance(fmt, XmlFormat):
            lark = _xml(tools, more)
        elif isinstance(fmt, HarmonyFormat):  # one call a reply: <|call|> ends the generation
            lark = _harmony(tools, _Tags(tokenizer))
        elif isinstance(fmt, Gemma4Format):
            lark = _Gemma4Grammar(_Tags(tokenizer)).lark(tools, request.parallel)
        else:
            raise GrammarError(f"no grammar for the tool calls of {type(fmt).__name__}")
        return lark_grammar(lark)
    except GrammarError as e:
        raise bad(f"'tools' cannot be enforced as tool_choice \"{request.choice}\" asks: {e}",
                  code="invalid_json_schema") from None


class _Tags:
    """A tag as the grammar writes it: the control token it is in the vocabulary (<[id]>), else its text."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, text: str) -> str:
        i = self.token(text)
        return _text(text) if i is None else f"<[{i}]>"

    def token(self, text: str) -> int | None:
        """The control token that text is, if it is one."""
        i = self.tokenizer.vocab.get(text)
        return i if i is not None and self.tokenizer.control[i] else None


def _text(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # a Lark string: JSON's escapes


def _any_call(tools: list[dict], arguments_key: str) -> dict:
    """A call to any of tools: {"name": its name, arguments_key: its parameters}."""
    return {"anyOf": [{"type": "object", "additionalProperties": False, "required": ["name", arguments_key],
                       "properties": {"name": {"const": t["name"]}, arguments_key: closed(t["parameters"])}}
                      for t in tools]}


def _calls(tools: list[dict], parallel: bool) -> dict:
    """A JSON list of calls: one, or one or more."""
    return {"type": "array", "items": _any_call(tools, "arguments"), "minItems": 1} | ({} if parallel else
                                                                                       {"maxItems": 1})


def _json(schema: dict) -> str:
    """llguidance's Lark inlining of a JSON schema, compact as inference.grammar's JSON."""
    return "%json " + json.dumps(schema | {"x-guidance": JSON_OPTIONS})


def _mistral(tools: list[dict], named: bool, parallel: bool, tag: _Tags) -> str:
    if not named:  # Nemo, Small 3.1: [TOOL_CALLS][{"name", "arguments"}, ...]
        return f'start: {tag("[TOOL_CALLS]")} {_json(_calls(tools, parallel))}'
    calls = " | ".join(f'{_text(t["name"])} {tag("[ARGS]")} {_json(closed(t["parameters"]))}' for t in tools)
    return f'start: call{"+" if parallel else ""}\ncall: {tag("[TOOL_CALLS]")} ({calls})'


def _xml(tools: list[dict], more: str) -> str:
    """<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>, as the
    Qwen3.5 and Qwen3-Coder templates write a call: the tool's properties in the schema's order, its required ones
    always. A string's value is free text up to the parameter's end tag (XmlFormat reads it as text) within its
    minLength and maxLength, an enum of strings one of them, a boolean True or False as the templates write it, any
    other value JSON of its schema."""
    rules = [f'start: call{more}', "call: " + " | ".join(f"f{i}" for i in range(len(tools)))]
    for i, t in enumerate(tools):
        schema = t["parameters"]
        properties = schema.get("properties") or {}
        if schema.get("type", "object") != "object" or not isinstance(properties, dict):
            raise GrammarError(f"the tool {t['name']}'s parameters are not an object, which XML calls are made of")
        required = set(schema.get("required") or ())
        params = []
        for j, (name, spec) in enumerate(properties.items()):
            params.append(f"f{i}p{j}" + ("" if name in required else "?"))
            head = _text(f"<parameter={name}>\n")
            rules.append(f"f{i}p{j}: {head} {_xml_value(f'f{i}v{j}', spec, rules)}")
        head = _text("<tool_call>\n<function=" + t["name"] + ">\n")
        rules.append(f'f{i}: {head} {" ".join(params)} "</function>\\n</tool_call>"')
    return "\n".join(rules)


END_PARAMETER = "\n</parameter>\n"


def _xml_value(rule: str, spec, rules: list[str]) -> str:
    """The grammar of one parameter's value and end tag (rules gains the value's own rule where it needs one)."""
    spec = spec if isinstance(spec, dict) else {}
    kinds = spec.get("type", "string")
    if kinds == "boolean":  # as the templates write it (tool_calls.PYTHON_LITERALS)
        return f'("True" | "False") {_text(END_PARAMETER)}'
    if "string" not in (kinds if isinstance(kinds, list) else [kinds]):
        return f"{_json(closed(spec))} {_text(END_PARAMETER)}"
    if isinstance(spec.get("enum"), list) and all(isinstance(v, str) for v in spec["enum"]):
        return f'({" | ".join(_text(v) for v in spec["enum"])}) {_text(END_PARAMETER)}'
    low, high = spec.get("minLength", 0), spec.get("maxLength", "")  # free text, up to the first end tag
    rules.append(f"{rule}[suffix={_text(END_PARAMETER)}]: /(.|\\n){{{low},{high}}}/")
    return rule


def _harmony(tools: list[dict], tag: _Tags) -> str:
    """Messages to no one in the analysis or commentary channel (free text up to <|end|>, each followed by the next
    message's <|start|>assistant), then the call in the commentary channel, as gpt-oss's template writes one:
    <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}"""
    channel, message, start = tag("<|channel|>"), tag("<|message|>"), tag("<|start|>")
    calls = " | ".join(f'{_text(" to=functions." + t["name"] + " ")} {tag("<|constrain|>")} "json" {message} '
                       f'{_json(closed(t["parameters"]))}' for t in tools)
    return "\n".join([f'start: (note {start} "assistant")* {channel} "commentary" ({calls})',
                      f'note: {channel} ("analysis" | "commentary") {message} text',
                      f'text[suffix={_text("<|end|>")}]: /(.|\\n)*/'])


class _Gemma4Grammar:
    """<|tool_call>call:NAME{key:value,...}<tool_call|> as Gemma 4 writes a call, calls back to back where parallel.
    The arguments are held to the tool's parameters in Gemma 4's syntax: an object's keys in the order its template
    writes them (sorted as Jinja's dictsort sorts: case aside), the required ones always, no others; a string free
    text between <|"|> quotes within its minLength and maxLength (its pattern and format not held, as in _xml), or
    one of its enum; a number, integer, boolean or null JSON of its schema (Gemma 4 writes them as JSON does); a
    list's items by their schema, within minItems and maxItems; anyOf, oneOf and lists of types as alternatives. A
    value of no schema is any Gemma 4 value, as llama.cpp's grammar allows for every argument."""

    def __init__(self, tag: _Tags):
        self.tag, self.quote = tag, tag(GEMMA4_QUOTE)
        # a string's text ends at the quote token, which no text matches; a quote spelled as text ends it as XML's
        self.quoted = tag.token(GEMMA4_QUOTE) is not None
        self.rules: list[str] = []

    def lark(self, tools: list[dict], parallel: bool) -> str:
        for t in tools:
            if t["parameters"].get("type", "object") != "object":
                raise GrammarError(f"the tool {t['name']}'s parameters are not an object, which calls are made of")
        calls = " | ".join(f'{_text("call:" + t["name"])} {self.object(t["parameters"])}' for t in tools)
        head = [f'start: call{"+" if parallel else ""}',
                f'call: {self.tag("<|tool_call>")} ({calls}) {self.tag("<tool_call|>")}']
        return "\n".join(head + self.rules)

    def value(self, spec) -> str:
        """The grammar of a value held to spec (rules gains what it needs)."""
        if not isinstance(spec, dict) or not spec:
            return self.any()
        if {"$ref", "allOf", "not"} & spec.keys():
            raise GrammarError(f"$ref, allOf and not cannot be held in Gemma 4's calls here: {json.dumps(spec)}")
        if "const" in spec or "enum" in spec:
            values = [spec["const"]] if "const" in spec else spec["enum"]
            return "(" + " | ".join(map(self.literal, values)) + ")"
        if "anyOf" in spec or "oneOf" in spec:
            return "(" + " | ".join(self.value(s) for s in spec.get("anyOf", spec.get("oneOf"))) + ")"
        kinds = spec.get("type")
        if isinstance(kinds, list):
            return "(" + " | ".join(self.value(spec | {"type": k}) for k in kinds) + ")"
        if kinds == "string":
            return self.string(spec.get("minLength", 0), spec.get("maxLength", ""))
        if kinds in ("number", "integer", "boolean", "null"):
            return _json(spec)
        if kinds == "object":
            return self.object(spec)
        if kinds == "array":
            return self.list(self.value(spec.get("items")), spec.get("minItems", 0), spec.get("maxItems"))
        if kinds is None:
            return self.any()
        raise GrammarError(f"Invalid type: {kinds}")

    def literal(self, value) -> str:
        if isinstance(value, str):
            return f"{self.quote} {_text(value)} {self.quote}"
        if isinstance(value, (dict, list)):
            raise GrammarError(f"an enum of objects or lists cannot be held in Gemma 4's calls here: {value}")
        return _text(json.dumps(value))

    def string(self, low: int, high) -> str:
        rule = f"g4_text{len(self.rules)}"
        if self.quoted:
            self.rules.append(f"{rule}: /(.|\\n){{{low},{high}}}/")
            return f"{self.quote} {rule} {self.quote}"
        self.rules.append(f"{rule}[suffix={_text(GEMMA4_QUOTE)}]: /(.|\\n){{{low},{high}}}/")
        return f"{self.quote} {rule}"

    def object(self, spec: dict) -> str:
        properties = spec.get("properties")
        if not isinstance(properties, dict):  # any object
            self.any()
            return "g4_object"
        names = sorted(properties, key=str.lower)
        required = set(spec.get("required") or ())
        items = [f'{_text(name + ":")} {self.value(properties[name])}' for name in names]

        def after(i):  # the items from i on, after one was written: each with its comma
            return " ".join(f'("," {item})' + ("" if name in required else "?")
                            for name, item in zip(names[i:], items[i:]))

        def first(i):  # the items from i on, none written yet, at least one
            whole = f"{items[i]} {after(i + 1)}"
            return whole if names[i] in required or i + 1 == len(names) else f"({whole} | {first(i + 1)})"
        body = "" if not names else first(0) if required & set(names) else f"({first(0)})?"
        return f'"{{" {body} "}}"'

    def list(self, item: str, low: int, high) -> str:
        """[item,...] of low to high items (None: no bound)."""
        if high == 0:
            return '"[" "]"'
        items = f'{item} ("," {item}){{{max(low - 1, 0)},{"" if high is None else high - 1}}}'
        return f'"[" {items} "]"' if low else f'"[" ({items})? "]"'

    def any(self) -> str:
        """Any Gemma 4 value, as llama.cpp's gemma4-value: its rules written once."""
        if not any(r.startswith("g4_any:") for r in self.rules):
            self.rules += ["g4_any: g4_string | g4_object | g4_list | "
                           + _json({"type": ["number", "boolean", "null"]}),
                           "g4_string: " + self.string(0, ""),
                           'g4_object: "{" (g4_key g4_any ("," g4_key g4_any)*)? "}"',
                           'g4_key: /[^:}]+/ ":"',
                           'g4_list: "[" (g4_any ("," g4_any)*)? "]"']
        return "g4_any"
