"""A streamed gpt-oss reply (the harmony format) split into its reasoning and its answer, as llama.cpp's gpt-oss
parser splits it (common/parsers/gpt-oss.cpp). The prompt ends with `<|start|>assistant`; the reply is messages, each
a header, `<|message|>`, then its text up to `<|end|>` (or `<|return|>` / `<|call|>`, which end the reply; where
`<|end|>` was not rendered, the next `<|start|>` ends it):

    <|channel|>analysis<|message|>Let me think.<|end|><|start|>assistant<|channel|>final<|message|>Four.

`analysis` is reasoning; `final`, and `commentary` addressed to no one (a preamble for the user), are the answer; a
message with a recipient (` to=functions.NAME`: a tool call) is text of neither. Text where a header should be (a
model that does not speak harmony) is answer from there on. Markup cut across pieces is held back until decided.
"""
import re

from app.think_split import partial_tag

MESSAGE = "<|message|>"
ENDS = ("<|end|>", "<|return|>", "<|call|>", "<|start|>")
# how a header begins: the reply's first after the prompt's `<|start|>assistant`, the next ones with their own
OPENINGS = ("<|channel|>", " to=", "<|start|>")
CHANNEL = re.compile(r"<\|channel\|>(\w+)")
RECIPIENT = re.compile(r" to=([^\s<]+)")
MAX_HEADER = 256  # characters without a `<|message|>`: not a header after all, shown as text


def route(header: str) -> str:
    """Where a message's text goes, from its header: "reasoning", "answer" or "none" (a tool call). gpt-oss-20b
    sometimes writes a stray `<|channel|>commentary to=assistant` before the real channel: the last channel counts,
    and `to=assistant` is no recipient."""
    recipient = RECIPIENT.search(header)
    if recipient and recipient.group(1) != "assistant":
        return "none"
    channels = CHANNEL.findall(header)
    return "reasoning" if channels and channels[-1] == "analysis" else "answer"


class HarmonySplitter:
    def __init__(self):
        self.state = "start"  # start (of a message) | header | reasoning | answer | none | plain (no harmony)
        self.held = ""

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        """(reasoning, answer) that text completes; final: the reply ended, nothing is held back."""
        self.held += text
        out = {"reasoning": [], "answer": [], "none": []}
        while self.held:
            if self.state == "start":
                if self.held.startswith(OPENINGS):
                    self.state = "header"
                elif final or not any(o.startswith(self.held) for o in OPENINGS):
                    self.state = "plain"
                else:
                    break
            if self.state == "plain":
                out["answer"].append(self.held)
                self.held = ""
            elif self.state == "header":
                at = self.held.find(MESSAGE)
                if at >= 0:
                    self.state, self.held = route(self.held[:at]), self.held[at + len(MESSAGE):]
                elif len(self.held) > MAX_HEADER:
                    self.state = "plain"
                else:
                    if final:
                        self.held = ""  # a header cut off: markup, no text
                    break
            else:
                found = [(at, end) for end in ENDS if (at := self.held.find(end)) >= 0]
                if found:
                    at, end = min(found)
                    out[self.state].append(self.held[:at])
                    self.state, self.held = "start", self.held[at + (0 if end == "<|start|>" else len(end)):]
                else:
                    keep = 0 if final else max(partial_tag(self.held, end) for end in ENDS)
                    out[self.state].append(self.held[:len(self.held) - keep])
                    self.held = self.held[len(self.held) - keep:]
                    break
        return "".join(out["reasoning"]), "".join(out["answer"])


def split_harmony(text: str) -> tuple[str, str]:
    """(reasoning, answer) of a whole harmony reply."""
    return HarmonySplitter().feed(text, final=True)
