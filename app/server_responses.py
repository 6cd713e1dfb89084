"""OpenAI's Responses API: POST /v1/responses, what Codex CLI sends. A reply is output items in order: reasoning
(its text as reasoning_text content; we write no summary), message (output_text) and function_call (call_id, name,
arguments). A stream is the Responses API's server-sent events, each with its sequence_number: response.created and
response.in_progress; per item output_item.added, content_part.added, the text's deltas and done
(response.output_text.*, response.reasoning_text.*), content_part.done, output_item.done (a call:
function_call_arguments.delta and .done); then response.completed, or response.incomplete at max_output_tokens.
An error once the stream began is response.failed.

A response is kept (unless the request says `store: false`) for a later request that continues it by
`previous_response_id`, as Codex-style clients chain turns: the last MAX_STORED responses' conversations, in memory,
the oldest evicted first; an unknown or evicted id is OpenAI's 400 previous_response_not_found.
"""
import itertools
import json
import time
import uuid
from collections import OrderedDict

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from app.reply_blocks import Block, reply_blocks, whole_blocks
from app.server import Reply, read_json, start_reply
from app.server_responses_schema import conversation_items, responses_request
from app.server_schema import ApiError, get

MAX_STORED = 256  # responses kept for previous_response_id; items are shared between a chain's entries, not copied

ID_PREFIX = {"reasoning": "rs", "text": "msg", "call": "fc"}
TEXT_EVENTS = {"reasoning": "response.reasoning_text", "text": "response.output_text"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def part(block: Block, done: bool) -> dict:
    """A reasoning or message item's one content part: empty as it is added, whole when done."""
    text = block.text if done else ""
    if block.kind == "reasoning":
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def output_item(block: Block, item_id: str, done: bool) -> dict:
    status = "completed" if done else "in_progress"
    if block.kind == "call":
        return {"id": item_id, "type": "function_call", "status": status, "call_id": block.call.id,
                "name": block.call.name, "arguments": block.call.arguments if done else ""}
    content = [part(block, done=True)] if done else []
    if block.kind == "reasoning":
        return {"id": item_id, "type": "reasoning", "status": status, "summary": [], "content": content}
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def usage(reply: Reply) -> dict:
    prompt, generated = reply.started.prompt_tokens, reply.stats.generated_tokens
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": prompt - reply.stats.prompt_tokens},
            "output_tokens": generated, "output_tokens_details": {"reasoning_tokens": 0},  # not counted apart
            "total_tokens": prompt + generated}


def final_status(reply: Reply) -> str:
    """completed, or incomplete where the reply ran out of tokens (max_output_tokens or the context)."""
    return "completed" if reply.calls or reply.stats.finish_reason == "stop" else "incomplete"


class ResponseStore:
    """The conversations (input items, then output items) of the last `size` responses, by response id."""

    def __init__(self, size: int = MAX_STORED):
        self.size, self.items = size, OrderedDict()

    def put(self, response_id: str, items: list[dict]) -> None:
        self.items[response_id] = items
        while len(self.items) > self.size:
            self.items.popitem(last=False)

    def get(self, response_id: str) -> list[dict]:
        if response_id not in self.items:
            raise ApiError(400, f"Previous response with id '{response_id}' not found.",
                           code="previous_response_not_found", param="previous_response_id")
        return self.items[response_id]


class Response:
    """One response's object as the API gives it at each stage: the request's settings echoed, the output so far.
    done(output) keeps its conversation in store (None: not kept)."""

    def __init__(self, body: dict, reply: Reply, previous: str | None, items: list[dict], store: ResponseStore | None):
        self.body, self.reply, self.previous, self.items, self.store = body, reply, previous, items, store
        self.id, self.created = new_id("resp"), int(time.time())

    def done(self, output: list[dict]) -> None:
        if self.store is not None:
            self.store.put(self.id, self.items + output)

    def object(self, status: str, output: list[dict], usage: dict | None = None) -> dict:
        b = self.body
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "instructions": b.get("instructions"), "max_output_tokens": b.get("max_output_tokens"),
                "model": self.reply.model, "output": output, "parallel_tool_calls": b.get("parallel_tool_calls", True),
                "previous_response_id": self.previous,
                "reasoning": b.get("reasoning") or {"effort": None, "summary": None}, "store": self.store is not None,
                "temperature": b.get("temperature"), "top_p": b.get("top_p"),
                "text": b.get("text") or {"format": {"type": "text"}}, "tool_choice": b.get("tool_choice", "auto"),
                "tools": b.get("tools") or [], "truncation": "disabled", "usage": usage,
                "metadata": b.get("metadata") or {}}


async def responses(request: Request):
    body = await read_json(request)
    store: ResponseStore = request.app.state.responses
    previous = get(body, "previous_response_id", str)
    earlier = store.get(previous) if previous else []
    r = responses_request(body, earlier)
    reply = await start_reply(request, r)
    response = Response(body, reply, previous, conversation_items(body, earlier),
                        store if get(body, "store", bool, True) else None)
    if r.stream:
        return StreamingResponse(events(response), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    output = [output_item(b, new_id(ID_PREFIX[b.kind]), done=True) for b in await whole_blocks(reply)]
    response.done(output)
    return JSONResponse(response.object(final_status(reply), output, usage(reply)))


def block_events(kind: str, block: Block, text: str, item_id: str) -> list[dict]:
    """The events of one step of a block (reply_blocks), without their sequence numbers."""
    at = {"item_id": item_id, "output_index": block.index}
    call = block.kind == "call"
    if kind == "start":
        added = [{"type": "response.output_item.added", "output_index": block.index,
                  "item": output_item(block, item_id, done=False)}]
        return added + ([] if call else [{"type": "response.content_part.added", **at, "content_index": 0,
                                          "part": part(block, done=False)}])
    if kind == "delta":
        if call:
            return [{"type": "response.function_call_arguments.delta", **at, "delta": text}]
        logprobs = {"logprobs": []} if block.kind == "text" else {}
        return [{"type": TEXT_EVENTS[block.kind] + ".delta", **at, "content_index": 0, "delta": text, **logprobs}]
    done = {"type": "response.output_item.done", "output_index": block.index, "item": output_item(block, item_id, True)}
    if call:
        return [{"type": "response.function_call_arguments.done", **at, "name": block.call.name,
                 "arguments": block.call.arguments}, done]
    logprobs = {"logprobs": []} if block.kind == "text" else {}
    return [{"type": TEXT_EVENTS[block.kind] + ".done", **at, "content_index": 0, "text": block.text, **logprobs},
            {"type": "response.content_part.done", **at, "content_index": 0, "part": part(block, done=True)}, done]


async def events(response: Response):
    sequence = itertools.count()

    def event(data: dict) -> str:
        data["sequence_number"] = next(sequence)
        return f"event: {data['type']}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    yield event({"type": "response.created", "response": response.object("in_progress", [])})
    yield event({"type": "response.in_progress", "response": response.object("in_progress", [])})
    ids, output = {}, []
    try:
        async for kind, block, text in reply_blocks(response.reply):
            item_id = ids.setdefault(block.index, new_id(ID_PREFIX[block.kind]))
            for data in block_events(kind, block, text, item_id):
                if data["type"] == "response.output_item.done":
                    output.append(data["item"])
                yield event(data)
    except ApiError as e:
        failed = response.object("failed", output) | {"error": {"code": e.code or e.type, "message": e.message}}
        yield event({"type": "response.failed", "response": failed})
        return
    status = final_status(response.reply)
    response.done(output)
    yield event({"type": f"response.{status}", "response": response.object(status, output, usage(response.reply))})
