"""A reply as content blocks in order, as Anthropic's Messages API and OpenAI's Responses API give it: a block of
reasoning or of answer text runs until the other kind or a tool call comes; each tool call is a block of its own.
Both APIs stream a block as its start, its deltas and its stop, and put the whole blocks in their replies.
"""
from dataclasses import dataclass

from app.server import Reply
from app.tool_calls import ToolCall


@dataclass
class Block:
    kind: str                    # "reasoning", "text" or "call"
    index: int                   # its place among the reply's blocks
    text: str = ""               # its text so far (a call's: its arguments)
    call: ToolCall | None = None


async def reply_blocks(reply: Reply):
    """("start" | "delta" | "stop", block, the delta's text) as the reply streams; reply.stats is set at its end.
    A call comes whole (tool_calls.py), so its arguments are one delta."""
    block, count = None, 0
    async for reasoning, answer, calls in reply.pieces():
        for kind, text in (("reasoning", reasoning), ("text", answer)):
            if not text:
                continue
            if block is None or block.kind != kind:
                if block is not None:
                    yield "stop", block, ""
                block, count = Block(kind, count), count + 1
                yield "start", block, ""
            block.text += text
            yield "delta", block, text
        for call in calls:
            if block is not None:
                yield "stop", block, ""
            block, count = Block("call", count, "", call), count + 1
            yield "start", block, ""
            block.text = call.arguments
            yield "delta", block, call.arguments
            yield "stop", block, ""
            block = None
    if block is not None:
        yield "stop", block, ""


async def whole_blocks(reply: Reply) -> list[Block]:
    """The reply's blocks once it is complete."""
    return [block async for event, block, _ in reply_blocks(reply) if event == "stop"]
