"""One message of a chat: who said it, the text as Markdown, and for a reply its speed and token counts; a
reasoning model's thinking (<think> text, gpt-oss's analysis channel) folded above its answer (t shows it).

A streaming reply shows its finished paragraphs as Markdown and the paragraph being written under them as plain
text, which moves into the Markdown once a blank line ends it (or the reply ends). A frame then redraws one Static
instead of re-parsing and rebuilding the Markdown's last block: about a quarter less UI work a frame, time that a
2-core machine otherwise takes from the engine (BENCHMARKS.md, session 10)."""
import re

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Collapsible, Label, Markdown, Static

from app.store import Message
from app.reply_split import reply_splitter, split_reply

CODE_BLOCK = re.compile(r"```[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)

STATE_NOTES = {"stopped": "stopped", "interrupted": "interrupted: the app was closed mid-reply",
               "error": "failed"}


def stats_line(stats: dict | None, state: str) -> str:
    """`12 tokens · 41.3 tok/s · prompt 35 tokens` plus how the reply ended when it did not end normally."""
    parts = []
    if stats:
        parts.append(f"{stats['generated_tokens']} tokens")
        if stats.get("generation_tok_s"):
            parts.append(f"{stats['generation_tok_s']:.1f} tok/s")
        parts.append(f"prompt {stats['prompt_tokens']} tokens")
        if stats.get("finish_reason") in ("length", "context full"):
            parts.append(f"ended: {stats['finish_reason']}")
    if state in STATE_NOTES:
        parts.append(STATE_NOTES[state])
    return " · ".join(parts)


def thinking_title(reasoning: str) -> str:
    return f"Thinking · {len(reasoning.split())} words (t)"


def last_code_block(text: str) -> str | None:
    blocks = CODE_BLOCK.findall(text)
    return blocks[-1] if blocks else None


class MessageView(Vertical, can_focus=True):
    """Focus a message (Tab or click) to copy it or its last code block."""

    BINDINGS = [
        Binding("c", "copy", "Copy message"),
        Binding("k", "copy_code", "Copy code block"),
        Binding("t", "toggle_thinking", "Show thinking"),
    ]

    def __init__(self, message: Message, author: str):
        super().__init__(classes=message.role)
        self.message = message
        self.author = author
        self._split = None  # the splitter of a streaming reply
        self.reply_format = "think"  # how a streaming reply's template marks reasoning (ChatTemplate.reply_format)
        self._tail: Static | None = None  # a streaming reply's unfinished paragraph, as plain text
        self.reasoning, self.answer = split_reply(message.content) if message.role == "assistant" else (
            "", message.content)
        self._in_markdown = len(self.answer)  # of the answer, how much the Markdown shows

    def compose(self) -> ComposeResult:
        yield Label(self.author, classes="author")
        with Collapsible(title=thinking_title(self.reasoning), collapsed=True,
                         classes="thinking" if self.reasoning else "thinking -empty"):
            yield Static(self.reasoning, classes="reasoning")
        yield Markdown(self.answer)
        line = stats_line(self.message.stats, self.message.state)
        yield Static(line, classes="stats" if line else "stats -empty")

    async def append(self, text: str) -> None:
        """Stream text onto the end of the reply: reasoning into the folded part, the answer's finished paragraphs
        onto the end of the Markdown (without re-rendering what is there), the rest under it."""
        self.message.content += text
        if self._split is None:
            self._split = reply_splitter(self.reply_format)
        await self._show(*self._split.feed(text))

    async def _show(self, reasoning: str, answer: str) -> None:
        if reasoning:
            self.reasoning += reasoning
            self.query_one(".reasoning", Static).update(self.reasoning)
            folded = self.query_one(Collapsible)
            folded.title = thinking_title(self.reasoning)
            folded.remove_class("-empty")
        if answer:
            self.answer += answer
            cut = self.answer.rfind("\n\n")
            await self._show_answer(cut + 2 if cut >= 0 else 0)

    async def _show_answer(self, end: int) -> None:
        """The answer up to `end` in the Markdown, the rest in the tail."""
        if end > self._in_markdown:
            await self.query_one(Markdown).append(self.answer[self._in_markdown:end])
            self._in_markdown = end
        if self._tail is None:
            self._tail = Static(markup=False, classes="tail")
            await self.mount(self._tail, after=self.query_one(Markdown))
        self._tail.set_class(self._in_markdown > 0, "-below")
        self._tail.update(self.answer[end:])

    async def finish(self, message: Message) -> None:
        if self._split is not None:
            await self._show(*self._split.feed("", final=True))
            self._split = None
        if self._tail is not None:
            await self._show_answer(len(self.answer))
            await self._tail.remove()
            self._tail = None
        self.message = message
        reasoning, answer = split_reply(message.content)
        if (reasoning, answer) != (self.reasoning, self.answer):  # the prompt had opened <think> (R1 distills)
            self.reasoning, self.answer = reasoning, answer
            self.query_one(".reasoning", Static).update(reasoning)
            self.query_one(Collapsible).title = thinking_title(reasoning)
            self.query_one(Collapsible).set_class(not reasoning, "-empty")
            await self.query_one(Markdown).update(answer)
        line = stats_line(message.stats, message.state)
        self.query_one(".stats", Static).update(line)
        self.query_one(".stats", Static).set_class(not line, "-empty")

    def action_toggle_thinking(self) -> None:
        if not self.reasoning:
            self.notify("This message has no thinking", severity="warning")
            return
        folded = self.query_one(Collapsible)
        folded.collapsed = not folded.collapsed

    def action_copy(self) -> None:
        self.app.copy_to_clipboard(self.answer)
        self.notify("Message copied to the clipboard")

    def action_copy_code(self) -> None:
        code = last_code_block(self.answer)
        if code is None:
            self.notify("This message has no code block", severity="warning")
            return
        self.app.copy_to_clipboard(code)
        self.notify("Code block copied to the clipboard")
