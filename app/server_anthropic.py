"""Anthropic's Messages API: POST /v1/messages and POST /v1/messages/count_tokens, what Claude Code and Anthropic's
SDKs send. A reply is content blocks (thinking, text, tool_use) with a stop_reason and usage. A stream is Anthropic's
server-sent events: message_start; each block as content_block_start, content_block_delta (thinking_delta,
text_delta, input_json_delta) and content_block_stop, a ping after the first start; message_delta (stop_reason,
usage); message_stop. An error once the stream began is an `error` event in Anthropic's error shape.
"""
import json
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from app.reply_blocks import Block, reply_blocks, whole_blocks
from app.server import Reply, anthropic_error, read_json, start_reply
from app.server_anthropic_schema import anthropic_request
from app.server_schema import ApiError

DELTAS = {"reasoning": ("thinking_delta", "thinking"), "text": ("text_delta", "text"),
          "call": ("input_json_delta", "partial_json")}  # a block's kind: its delta's type and field


def content_block(block: Block, whole: bool) -> dict:
    """A block as a reply's content holds it (whole), or as content_block_start opens it. We have no signature to
    give a thinking block: it is empty, and a client sending it back is fine (thinking is not re-read)."""
    if block.kind == "reasoning":
        return {"type": "thinking", "thinking": block.text if whole else "", "signature": ""}
    if block.kind == "text":
        return {"type": "text", "text": block.text if whole else ""}
    return {"type": "tool_use", "id": block.call.id, "name": block.call.name,
            "input": json.loads(block.call.arguments) if whole else {}}


def stop_reason(reply: Reply) -> str:
    if reply.calls:
        return "tool_use"
    if reply.stats.stop_string is not None:
        return "stop_sequence"
    return {"stop": "end_turn", "context full": "model_context_window_exceeded"}.get(reply.stats.finish_reason,
                                                                                     "max_tokens")


def usage(reply: Reply, output_tokens: int) -> dict:
    return {"input_tokens": reply.started.prompt_tokens, "output_tokens": output_tokens}


def message(reply: Reply, message_id: str) -> dict:
    """The message's fields that come before its content (all of them in message_start)."""
    return {"id": message_id, "type": "message", "role": "assistant", "model": reply.model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": usage(reply, 0)}


async def messages(request: Request):
    r = anthropic_request(await read_json(request))
    reply = await start_reply(request, r)
    message_id = f"msg_{uuid.uuid4().hex[:24]}"
    if r.stream:
        return StreamingResponse(events(reply, message_id), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    blocks = await whole_blocks(reply) or [Block("text", 0)]  # as Anthropic's, never without content
    return JSONResponse(message(reply, message_id) | {
        "content": [content_block(b, whole=True) for b in blocks], "stop_reason": stop_reason(reply),
        "stop_sequence": reply.stats.stop_string, "usage": usage(reply, reply.stats.generated_tokens)})


def event(data: dict) -> str:
    return f"event: {data['type']}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def block_events(kind: str, block: Block, text: str):
    if kind == "start":
        yield event({"type": "content_block_start", "index": block.index,
                     "content_block": content_block(block, whole=False)})
        if block.index == 0:
            yield event({"type": "ping"})
    elif kind == "delta":
        delta, field = DELTAS[block.kind]
        yield event({"type": "content_block_delta", "index": block.index, "delta": {"type": delta, field: text}})
    else:
        yield event({"type": "content_block_stop", "index": block.index})


async def events(reply: Reply, message_id: str):
    yield event({"type": "message_start", "message": message(reply, message_id)})
    blocks = 0
    try:
        async for kind, block, text in reply_blocks(reply):
            for e in block_events(kind, block, text):
                yield e
            blocks = block.index + 1
    except ApiError as e:
        yield event(anthropic_error(e.status, e.message))
        return
    if not blocks:  # as Anthropic's, never without content
        for kind in ("start", "stop"):
            for e in block_events(kind, Block("text", 0), ""):
                yield e
    yield event({"type": "message_delta", "delta": {"stop_reason": stop_reason(reply),
                                                    "stop_sequence": reply.stats.stop_string},
                 "usage": usage(reply, reply.stats.generated_tokens)})
    yield event({"type": "message_stop"})


async def count_tokens(request: Request):
    """The prompt's tokens as the model's chat template renders the request (tools included), through the queue:
    the engine's tokenizer is the worker's."""
    reply = await start_reply(request, anthropic_request(await read_json(request), count_only=True))
    reply.close()
    return JSONResponse({"input_tokens": reply.started.prompt_tokens})
