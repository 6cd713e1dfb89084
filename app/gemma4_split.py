"""A streamed Gemma 4 reply split into its reasoning and its answer, as llama.cpp's Gemma 4 parser splits it
(common/parsers/gemma4.cpp). With thinking on (the template's enable_thinking), the reply opens its reasoning in a
thought channel and closes it before the answer:

    <|channel>thought\nLet me add them.<channel|>Four.

With thinking off, the prompt ends with an empty thought (`<|channel>thought\n<channel|>`) and the reply is answer.
The model may add an empty thought later on, or a stray `<channel|>`: markup, shown nowhere. A channel not named
thought is dropped as llama.cpp's parser drops an empty one. Markup cut across pieces is held back until decided.
"""
from app.think_split import partial_tag
from models.chat_template import GEMMA4_CHANNEL

OPEN, CLOSE = GEMMA4_CHANNEL
THOUGHT = "thought"


class Gemma4Splitter:
    def __init__(self):
        self.state = "answer"  # answer | channel (its name comes next) | reasoning
        self.held = ""
        self.trim = False  # white space just after "thought" and after a closed thought is dropped

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        """(reasoning, answer) that text completes; final: the reply ended, nothing is held back."""
        self.held += text
        out = {"reasoning": [], "answer": []}
        while self.held:
            if self.state == "channel":
                if self.held.startswith(THOUGHT):
                    self.state, self.held, self.trim = "reasoning", self.held[len(THOUGHT):], True
                elif THOUGHT.startswith(self.held) and not final:
                    break
                else:
                    self.state = "answer"  # an empty channel, or one of another name: its marker dropped
                continue
            tags = (OPEN, CLOSE) if self.state == "answer" else (CLOSE,)
            found = [(at, tag) for tag in tags if (at := self.held.find(tag)) >= 0]
            if found:
                at, tag = min(found)
                out[self.state].append(self._take(self.held[:at]))
                self.held = self.held[at + len(tag):]
                if tag == OPEN:
                    self.state = "channel"
                elif self.state == "reasoning":  # the thought closed (a stray <channel|> in the answer is dropped)
                    self.state, self.trim = "answer", True
                continue
            keep = 0 if final else max(partial_tag(self.held, tag) for tag in tags)
            out[self.state].append(self._take(self.held[:len(self.held) - keep]))
            self.held = self.held[len(self.held) - keep:]
            break
        return "".join(out["reasoning"]), "".join(out["answer"])

    def _take(self, text: str) -> str:
        if self.trim:
            text = text.lstrip()
            self.trim = not text  # until some text came
        return text


def split_gemma4(text: str) -> tuple[str, str]:
    """(reasoning, answer) of a whole Gemma 4 reply."""
    return Gemma4Splitter().feed(text, final=True)
