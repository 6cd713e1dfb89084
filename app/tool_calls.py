"""Tool calls in a model's reply, found by the format its chat template speaks (one parser per family, picked
from the template's text, as llama.cpp picks them), as the reply streams.

A call goes out once it is closed and parses, so a malformed one (bad JSON, a tag never closed) is still returned
as text: its arguments therefore come in one piece, not as fragments. Text that could still become a call
(`<tool_c`) is held back until decided, as think_split holds its tags. Calls are found wherever they are: after
prose, inside an unclosed <think> (the text around them goes on to the reasoning/answer split), several in a row.
"""
import json
import re
import secrets
import string
from dataclasses import dataclass

_JSON = json.JSONDecoder()


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object's text, as OpenAI's API carries it
    id: str


def new_call_id() -> str:
    """Nine letters and digits: the Mistral templates refuse any other id in the history, the others take any."""
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))


def _arguments(value) -> dict | None:
    """A call's arguments as an object: given as one, or as a JSON string of one (as some models write them)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


def _json_values(text: str) -> list | None:
    """The JSON values text holds one after another (white space between them), or None if it holds anything else."""
    values, at = [], 0
    while (at := len(text) - len(text[at:].lstrip())) < len(text):
        try:
            value, at = _JSON.raw_decode(text, at)
        except ValueError:
            return None
        values.append(value)
    return values


def _named_call(obj) -> tuple[str, dict] | None:
    """(name, arguments) of {"name": ..., "arguments": {...}} (Llama writes "parameters"; OpenAI's shape nests them
    in "function"), else None."""
    if isinstance(obj, dict) and isinstance(obj.get("function"), dict):
        obj = obj["function"]
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    key = next((k for k in ("arguments", "parameters") if k in obj), None)
    arguments = _arguments(obj[key]) if key else {}
    return None if arguments is None else (obj["name"], arguments)


def _partial_tag(text: str, tags) -> int:
    """Where the longest end of text that could still become one of tags begins (len(text): none)."""
    for start in range(max(0, len(text) - max(map(len, tags)) + 1), len(text)):
        if any(t.startswith(text[start:]) for t in tags):
            return start
    return len(text)


class Format:
    """A family's calls: find() where the earliest begins, close() where it ends, parse() it (ToolCallSplitter)."""

    def __init__(self, tools: list[dict]):
        self.tools = tools  # OpenAI's shape: {"type": "function", "function": {"name", "parameters"...}}


class TaggedFormat(Format):
    """Calls between an opening and a closing tag. Subclasses set OPEN (tag -> its closing tag) and parse."""
    OPEN: dict[str, str] = {}

    def find(self, text: str, at_start: bool) -> tuple[int, int] | None:
        """(where a call's head starts, where its body starts; -1: not yet known), or None: no call in text."""
        hits = [(text.find(tag), tag) for tag in self.OPEN if tag in text]
        if hits:
            at, tag = min(hits)
            return at, at + len(tag)
        partial = _partial_tag(text, self.OPEN)
        return (partial, -1) if partial < len(text) else None

    def close(self, head: str, body: str, final: bool) -> tuple[int, int] | None:
        """(end of the body, end of the call) in body, or None while the call is open."""
        end = self.OPEN[head]
        at = body.find(end)
        return None if at < 0 else (at, at + len(end))

    def parse(self, head: str, body: str) -> list[tuple[str, dict]] | None:
        raise NotImplementedError


class HermesFormat(TaggedFormat):
    """Qwen2.5 / Qwen3 / Hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call>."""
    OPEN = {"<tool_call>": "</tool_call>"}

    def parse(self, head, body):
        values = _json_values(body)
        calls = [_named_call(v) for v in values or []]
        return calls if calls and None not in calls else None


class XmlFormat(TaggedFormat):
    """Qwen3-Coder / Qwen3.5: <tool_call><function=NAME><parameter=P>value</parameter></function></tool_call>,
    each value typed by the tool's JSON schema (text stays text). Qwen3-Coder may leave out the first <tool_call>."""
    OPEN = {"<tool_call>": "</tool_call>", "<function=": "</function>"}
    FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*", re.S)
    PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>\s*", re.S)

    def close(self, head, body, final):
        found = super().close(head, body, final)
        if found is None or head == "<tool_call>":
            return found
        # after </function>: a </tool_call> the model wrote without its opening goes with the call
        rest = body[found[1]:]
        stripped = rest.lstrip()
        if stripped.startswith("</tool_call>"):
            return found[0] + len("</function>"), found[1] + len(rest) - len(stripped) + len("</tool_call>")
        if not final and "</tool_call>".startswith(stripped):
            return None  # white space so far, or the start of the tag
        return found[0] + len("</function>"), found[1]

    def parse(self, head, body):
        if head == "<function=":
            body = head + body
        calls, at = [], 0
        while at < len(body):
            m = self.FUNCTION.match(body, at)
            arguments = m and self._arguments(m.group(1).strip(), m.group(2))
            if arguments is None:
                return None
            calls.append((m.group(1).strip(), arguments))
            at = m.end()
        return calls or None

    def _arguments(self, name: str, text: str) -> dict | None:
        schema = next((t["function"].get("parameters") or {} for t in self.tools if t["function"]["name"] == name), {})
        properties = schema.get("properties") or {}
        arguments, at = {}, 0
        while at < len(text.rstrip()):
            m = self.PARAMETER.match(text, at)
            if m is None:
                return None
            key = m.group(1).strip()
            arguments[key] = _typed(m.group(2), properties.get(key) or {})
            at = m.end()
        return arguments


# Python's spelling of JSON's literals: the XML templates write a value that is no object or list with `| string`,
# so the models learnt True, False and None (llama.cpp's parser reads them too)
PYTHON_LITERALS = {"True": True, "False": False, "None": None}


def _typed(text: str, schema: dict):
    """A parameter's text as its schema's type says: a string stays text, anything else is read as JSON where it
    parses (a number, true, an object...) or as a Python literal (True), else kept as text."""
    kinds = schema.get("type", "string")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "string" in kinds:
        return text
    try:
        return json.loads(text)
    except ValueError:
        return PYTHON_LITERALS.get(text.strip(), text)


class BareJsonFormat(Format):
    """A call as a bare JSON object, anywhere in the reply: Llama 3.x's {"name": ..., "parameters": {...}} (also
    after <|python_tag|>), and the generic fallback's {"tool_calls": [...]} / {"name": ..., "arguments": ...}.
    Only a known tool's name makes an object a call: JSON in an answer stays text."""
    KEYS = ('{"name":', '{"type":"function"', '{"tool_calls":', '{"tool_call":')
    PYTHON_TAG = "<|python_tag|>"

    def find(self, text, at_start):
        for at in (i for i, c in enumerate(text) if c in "{<"):
            if text.startswith(self.PYTHON_TAG, at):
                return at, at + len(self.PYTHON_TAG)
            if text[at] == "<":
                if self.PYTHON_TAG.startswith(text[at:]):
                    return at, -1
                continue
            compact = re.sub(r"\s+", "", text[at:at + 64])
            if any(compact.startswith(k) for k in self.KEYS):
                return at, at
            if any(k.startswith(compact) for k in self.KEYS) and len(text) - at < 64:
                return at, -1  # "{", '{"na': could still become a call
        return None

    def close(self, head, body, final):
        try:
            _, end = _JSON.raw_decode(body, len(body) - len(body.lstrip()))
        except ValueError:
            return (len(body), len(body)) if final else None  # not yet whole; at the end: text
        rest = body[end:].lstrip()
        if rest.startswith(";"):  # Llama 3.2's separator between calls goes with the call
            return end, len(body) - len(rest) + 1
        return (end, end) if rest or final else None

    def names(self) -> set[str]:
        return {t["function"]["name"] for t in self.tools}

    def parse(self, head, body):
        try:
            value = json.loads(body)
        except ValueError:
            return None
        items = [value]
        if isinstance(value, dict) and ("tool_calls" in value or "tool_call" in value):
            items = value.get("tool_calls", [value.get("tool_call")])
        calls = [_named_call(v) for v in items] if isinstance(items, list) else [None]
        if not calls or None in calls or any(name not in self.names() for name, _ in calls):
            return None
        return calls


class MistralFormat(Format):
    """[TOOL_CALLS] then a JSON list of calls (Mistral Nemo, Small 3.1) or NAME[ARGS]{...} (Devstral, Small 3.2:
    NAME[CALL_ID]id[ARGS]{...}); one [TOOL_CALLS] per call in the newer form. Both are parsed whatever the
    template; `named`: the template writes the newer form (the one a reply is held to, tool_grammar.py)."""
    TAG = "[TOOL_CALLS]"

    def __init__(self, tools: list[dict], named: bool = False):
        super().__init__(tools)
        self.named = named
    NAMED = re.compile(r"\s*([^\[\s{]+)(?:\[CALL_ID\][A-Za-z0-9]+)?\[ARGS\]")
    NAMING = re.compile(r"\s*[^\[\s{]*(?:\[[A-Z_]*\]?[A-Za-z0-9]*)*")  # what NAMED's text looks like until it is whole

    def find(self, text, at_start):
        at = text.find(self.TAG)
        if at >= 0:
            return at, at + len(self.TAG)
        partial = _partial_tag(text, [self.TAG])
        return (partial, -1) if partial < len(text) else None

    def close(self, head, body, final):
        m = self.NAMED.match(body)
        if m is None and not body.lstrip().startswith("["):
            naming = self.NAMING.match(body).end()
            if naming == len(body) and not final:
                return None  # "get_wea", "get_weather[AR": wait
            return naming, naming  # not a call: text up to where it stopped looking like one
        start = m.end() if m else 0
        try:
            _, end = _JSON.raw_decode(body, start + len(body[start:]) - len(body[start:].lstrip()))
        except ValueError:
            return (len(body), len(body)) if final else None
        return end, end

    def parse(self, head, body):
        m = self.NAMED.match(body)
        values = _json_values(body[m.end():] if m else body)
        if not values or len(values) != 1:
            return None
        if m:
            arguments = _arguments(values[0])
            return None if arguments is None else [(m.group(1), arguments)]
        calls = [_named_call(v) for v in values[0]] if isinstance(values[0], list) else [None]
        return calls if calls and None not in calls else None


class HarmonyFormat(Format):
    """gpt-oss: a message to functions.NAME, the recipient in its channel header or in its role header:
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>
    <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>
    The reply's first message has no <|start|>assistant (the prompt ends with it). <|call|> ends the generation,
    so a call's JSON may simply end the text."""
    HEADS = ("<|start|>", "<|channel|>")
    HEADER = re.compile(r"(?:<\|start\|>assistant)?(?: to=functions\.([^\s<]+))?\s*<\|channel\|>(?:commentary|analysis)"
                        r"(?: to=functions\.([^\s<]+))?\s*(?:<\|constrain\|>)?[\w-]*\s*<\|message\|>")
    ENDS = ("<|call|>", "<|end|>")
    MAX_HEADER = 256

    def find(self, text, at_start):
        starts = [i for i in range(len(text)) if text.startswith(self.HEADS, i)]
        if at_start and text.startswith(" to=") or at_start and " to=".startswith(text):
            starts.insert(0, 0)
        for at in starts:
            header_end = text.find("<|message|>", at, at + self.MAX_HEADER)
            if header_end < 0:
                if len(text) - at < self.MAX_HEADER:
                    return at, -1
                continue
            header = text[at:header_end + len("<|message|>")]
            m = self.HEADER.fullmatch(header if not header.startswith(" to=") else "<|start|>assistant" + header)
            if m and (m.group(1) or m.group(2)):
                return at, header_end + len("<|message|>")
        partial = _partial_tag(text, self.HEADS)
        return (partial, -1) if partial < len(text) else None

    def close(self, head, body, final):
        try:
            _, end = _JSON.raw_decode(body, len(body) - len(body.lstrip()))
        except ValueError:
            return (len(body), len(body)) if final else None
        rest = body[end:]
        for tag in self.ENDS:
            if rest.startswith(tag):
                return end, end + len(tag)
        if not final and any(t.startswith(rest) for t in self.ENDS):
            return None
        return end, end

    def parse(self, head, body):
        m = self.HEADER.fullmatch(head if not head.startswith(" to=") else "<|start|>assistant" + head)
        values = _json_values(body)
        arguments = _arguments(values[0]) if values and len(values) == 1 else None
        return None if arguments is None else [(m.group(1) or m.group(2), arguments)]


GEMMA4_QUOTE = '<|"|>'
GEMMA4_LITERALS = {"true": True, "false": False, "null": None}
JSON_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?")
GEMMA4_KEY = re.compile(r"([^:}]+):")  # llama.cpp's gemma4-dict-key: anything up to the colon


class Gemma4Format(TaggedFormat):
    """Gemma 4: <|tool_call>call:NAME{key:value,...}<tool_call|>, one tag per call, several in a row. Its arguments
    are no JSON: keys bare, strings between <|"|> quotes (taken as written: no escapes), numbers, true, false and
    null as JSON writes them, objects {k:v,...} and lists [v,...] nested; read as llama.cpp's gemma4 parser reads
    them (common/chat.cpp's gemma4 rules, and gemma4_to_json), white space around them let pass."""
    OPEN = {"<|tool_call>": "<tool_call|>"}
    CALL = re.compile(r"call:([^\s{]+)\{")

    def close(self, head, body, final):
        at = 0  # the closing tag inside a string is the string's (llama.cpp reads a string up to its quote)
        while (end := body.find("<tool_call|>", at)) >= 0:
            quote = body.find(GEMMA4_QUOTE, at, end)
            if quote < 0:
                return end, end + len("<tool_call|>")
            at = body.find(GEMMA4_QUOTE, quote + len(GEMMA4_QUOTE))
            if at < 0:
                return None  # inside a string still
            at += len(GEMMA4_QUOTE)
        return None

    def parse(self, head, body):
        m = self.CALL.match(body)
        if m is None:
            return None
        try:
            arguments, end = _gemma4_items(body, m.end(), "}")
        except (ValueError, RecursionError):  # RecursionError: [[[[... deeper than Python's stack
            return None
        return None if body[end:].strip() else [(m.group(1), arguments)]


def _after_space(text: str, at: int) -> int:
    return len(text) - len(text[at:].lstrip())


def _gemma4_value(text: str, at: int):
    """(the Gemma 4 value at text[at:] after white space, where it ends); ValueError where there is none."""
    at = _after_space(text, at)
    if text.startswith(GEMMA4_QUOTE, at):
        end = text.find(GEMMA4_QUOTE, at + len(GEMMA4_QUOTE))
        if end < 0:
            raise ValueError("a string never closed")
        return text[at + len(GEMMA4_QUOTE):end], end + len(GEMMA4_QUOTE)
    if text.startswith(("{", "["), at):
        return _gemma4_items(text, at + 1, "}" if text[at] == "{" else "]")
    word = next((w for w in GEMMA4_LITERALS if text.startswith(w, at)), None)
    if word:
        return GEMMA4_LITERALS[word], at + len(word)
    if m := JSON_NUMBER.match(text, at):
        return json.loads(m.group()), m.end()
    raise ValueError(f"no value at {text[at:at + 20]!r}")


def _gemma4_items(text: str, at: int, close: str):
    """(the object (close "}") or list (close "]") whose items start at text[at:], where it ends)."""
    items = {} if close == "}" else []
    at = _after_space(text, at)
    if text.startswith(close, at):
        return items, at + 1
    while True:
        if close == "}":
            m = GEMMA4_KEY.match(text, at)
            if m is None:
                raise ValueError("an object's key without its colon")
            items[m.group(1).strip()], at = _gemma4_value(text, m.end())
        else:
            value, at = _gemma4_value(text, at)
            items.append(value)
        at = _after_space(text, at)
        if text.startswith(close, at):
            return items, at + 1
        if not text.startswith(",", at):
            raise ValueError(f"neither ',' nor '{close}' after an item")
        at = _after_space(text, at + 1)


def format_for(template_source: str, tools: list[dict]) -> Format:
    """The parser for the tool-call format a chat template speaks, by the marks in its text."""
    if "<|channel|>" in template_source:
        return HarmonyFormat(tools)
    if "<|tool_call>" in template_source:
        return Gemma4Format(tools)
    if "[TOOL_CALLS]" in template_source:
        return MistralFormat(tools, named="[ARGS]" in template_source)
    if "<tool_call>" in template_source and "<function=" in template_source:
        return XmlFormat(tools)
    if "<tool_call>" in template_source:
        return HermesFormat(tools)
    return BareJsonFormat(tools)  # Llama 3.x (<|python_tag|>, bare JSON) and the generic fallback


class ToolCallSplitter:
    """A streamed reply split into its text and its tool calls. feed(piece) -> (text, calls) that piece completes;
    feed("", final=True) at the end. White space around calls is dropped, but for one run of it between texts."""

    def __init__(self, fmt):
        self.fmt = fmt
        self.held = ""        # text not yet decided
        self.head = None      # the open call's head, while inside one
        self.space = ""       # white space at the end of the text given out, held until more text follows
        self.at_start = True  # nothing given out yet
        self.found = False    # a call came: trailing white space is dropped
        self.trim = False     # just after a call: leading white space is dropped

    def feed(self, text: str, final: bool = False) -> tuple[str, list[ToolCall]]:
        self.held += text
        out, calls = [], []
        while True:
            if self.head is None:
                found = self.fmt.find(self.held, self.at_start)
                if found is None or (found[1] < 0 and final):
                    out.append(self._text(self.held))
                    self.held = ""
                    break
                start, body = found
                out.append(self._text(self.held[:start]))
                if body < 0:  # undecided: wait for more
                    self.held = self.held[start:]
                    break
                self.head, self.held = self.held[start:body], self.held[body:]
            closed = self.fmt.close(self.head, self.held, final)
            if closed is None and not final:
                break
            body_end, end = closed or (len(self.held), len(self.held))
            parsed = self.fmt.parse(self.head, self.held[:body_end]) if closed else None
            if parsed is None:  # malformed or never closed: the model's text, as it wrote it
                out.append(self._text(self.head + self.held[:end]))
            else:
                calls += [ToolCall(name, json.dumps(arguments, ensure_ascii=False), new_call_id())
                          for name, arguments in parsed]
                self.found = self.trim = True
                self.at_start = False
            self.head, self.held = None, self.held[end:]
            if not self.held and not final:
                break
        if final and not self.found:
            out.append(self.space)
            self.space = ""
        return "".join(out), calls

    def _text(self, text: str) -> str:
        """text given out, less white space at its end (held until the next text shows whether a call follows)."""
        if self.trim:
            text = text.lstrip()
            self.trim = not text
        if not text:
            return ""
        self.at_start = False
        text, self.space = self.space + text, ""
        body = text.rstrip()
        self.space = text[len(body):]
        return body


def split_tool_calls(fmt, text: str) -> tuple[str, list[ToolCall]]:
    """(text, calls) of a whole reply."""
    return ToolCallSplitter(fmt).feed(text, final=True)
