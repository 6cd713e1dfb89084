"""A streamed reply split into its reasoning and its answer, as llama-server does by default: a reply that opens
with <think> (Qwen3), or whose prompt ended with <think> (the DeepSeek-R1 distills), reasons until </think>.
A <think> later in the answer is text like any other. Tags split across pieces are held back until decided.
"""
OPEN, CLOSE = "<think>", "</think>"


def partial_tag(text: str, tag: str) -> int:
    """Length of the longest end of text that begins tag (and could become it)."""
    return max((n for n in range(1, len(tag)) if text.endswith(tag[:n])), default=0)


class ThinkSplitter:
    def __init__(self, prompt_opened: bool = False):
        self.state = "think" if prompt_opened else "start"  # start: the reply has not yet said whether it thinks
        self.held = ""
        self.trim = prompt_opened  # white space just after a tag is dropped ("<think>\n", "</think>\n\n")

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        """(reasoning, answer) that text completes; final: the reply ended, nothing is held back."""
        self.held += text
        reasoning = answer = ""
        if self.state == "start":
            opening = self.held.lstrip()
            if opening.startswith(OPEN):
                self.state, self.held, self.trim = "think", opening[len(OPEN):], True
            elif final or not OPEN.startswith(opening):
                self.state = "answer"
        if self.state == "think":
            at = self.held.find(CLOSE)
            if at >= 0:
                reasoning, self.held = self._take(self.held[:at]), self.held[at + len(CLOSE):]
                self.state, self.trim = "answer", True
            else:
                keep = 0 if final else partial_tag(self.held, CLOSE)
                reasoning, self.held = self._take(self.held[:len(self.held) - keep]), self.held[len(self.held) - keep:]
        if self.state == "answer":
            answer, self.held = self._take(self.held), ""
        return reasoning, answer

    def _take(self, text: str) -> str:
        if self.trim:
            text = text.lstrip()
            self.trim = not text  # until some text came
        return text


def split_thinking(text: str) -> tuple[str, str]:
    """(reasoning, answer) of a whole reply: after an opening <think> (Qwen3) or, where the prompt opened it
    (the R1 distills: the reply has only the closing tag), before </think>."""
    opened = CLOSE in text and not text.lstrip().startswith(OPEN)
    return ThinkSplitter(prompt_opened=opened).feed(text, final=True)
