"""OpenAI's API: POST /v1/chat/completions, POST /v1/completions, GET /v1/models.

Replies carry `usage` and, as llama-server's do, `timings` (prompt and generation tok/s); reasoning goes to
`reasoning_content`; tool calls to `tool_calls` (finish_reason "tool_calls"). A stream is server-sent events ending
in `data: [DONE]`; a tool call streams as OpenAI's do: its index, id, type and name, then its arguments.
"""
import json
import time
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from app.server import Reply, finish_reason, read_json, start_reply
from app.server_schema import ApiError, openai_chat, openai_completion
from app.server_worker import catalog


def usage(reply: Reply) -> dict:
    prompt, generated = reply.started.prompt_tokens, reply.stats.generated_tokens
    return {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated,
            "prompt_tokens_details": {"cached_tokens": prompt - reply.stats.prompt_tokens}}


def timings(reply: Reply) -> dict:
    """llama-server's timings: cache_n tokens of the prompt came from the KV cache, prompt_n were processed;
    draft_n drafts checked, draft_n_accepted of them kept (speculative decoding)."""
    s = reply.stats
    return {"cache_n": reply.started.prompt_tokens - s.prompt_tokens, "prompt_n": s.prompt_tokens,
            "prompt_ms": s.prompt_seconds * 1e3, "prompt_per_second": s.prompt_tok_s,
            "predicted_n": s.generated_tokens, "predicted_ms": s.generation_seconds * 1e3,
            "predicted_per_second": s.generation_tok_s} | (
        {"draft_n": s.drafted, "draft_n_accepted": s.accepted} if s.drafted else {})  # as llama-server's


def chat_finish_reason(reply: Reply) -> str:
    return "tool_calls" if reply.calls else finish_reason(reply.stats)


def tool_call(call, index: int) -> dict:
    return {"index": index, "id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def event(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def chat_completions(request: Request):
    r = openai_chat(await read_json(request))
    reply = await start_reply(request, r)
    head = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": reply.model}
    if r.stream:
        return sse(chat_chunks(reply, head | {"object": "chat.completion.chunk"}, r.include_usage))
    reasoning, answer, calls = await reply.text()
    message = {"role": "assistant", "content": answer or (None if calls else "")} | (
        {"reasoning_content": reasoning} if reasoning else {}) | (
        {"tool_calls": [tool_call(c, i) for i, c in enumerate(calls)]} if calls else {})
    return JSONResponse(head | {"object": "chat.completion", "choices": [
        {"index": 0, "message": message, "logprobs": None, "finish_reason": chat_finish_reason(reply)}],
        "usage": usage(reply), "timings": timings(reply)})


async def chat_chunks(reply: Reply, head: dict, include_usage: bool):
    yield event(head | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                     "finish_reason": None}]})
    index = 0
    async for reasoning, answer, calls in reply.pieces():
        if reasoning or answer:
            delta = ({"reasoning_content": reasoning} if reasoning else {}) | ({"content": answer} if answer else {})
            yield event(head | {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
        for call in calls:  # its name first, then its arguments, as OpenAI streams them
            opening = tool_call(call, index)
            opening["function"]["arguments"] = ""
            for part in (opening, {"index": index, "function": {"arguments": call.arguments}}):
                yield event(head | {"choices": [{"index": 0, "delta": {"tool_calls": [part]}, "finish_reason": None}]})
            index += 1
    yield event(head | {"choices": [{"index": 0, "delta": {}, "finish_reason": chat_finish_reason(reply)}],
                        "timings": timings(reply)})
    if include_usage:
        yield event(head | {"choices": [], "usage": usage(reply)})


async def completions(request: Request):
    r = openai_completion(await read_json(request))
    reply = await start_reply(request, r)
    head = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time()),
            "model": reply.model}
    if r.stream:
        return sse(completion_chunks(reply, head, r.include_usage))
    _, text, _ = await reply.text()
    return JSONResponse(head | {"choices": [{"index": 0, "text": text, "logprobs": None,
                                             "finish_reason": finish_reason(reply.stats)}],
                                "usage": usage(reply), "timings": timings(reply)})


async def completion_chunks(reply: Reply, head: dict, include_usage: bool):
    async for reasoning, answer, _ in reply.pieces():
        yield event(head | {"choices": [{"index": 0, "text": answer, "logprobs": None,
                                         "finish_reason": None}]})
    yield event(head | {"choices": [{"index": 0, "text": "", "logprobs": None,
                                     "finish_reason": finish_reason(reply.stats)}], "timings": timings(reply)})
    if include_usage:
        yield event(head | {"choices": [], "usage": usage(reply)})


def sse(chunks) -> StreamingResponse:
    """Server-sent events ending in [DONE]; an error after the stream began is sent as a last event."""
    async def events():
        try:
            async for chunk in chunks:
                yield chunk
        except ApiError as e:
            yield event({"error": {"message": e.message, "type": e.type, "param": None, "code": e.code}})
            return
        yield "data: [DONE]\n\n"
    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def models(request: Request):
    worker = request.app.state.worker
    return JSONResponse({"object": "list", "data": [
        {"id": names[0], "object": "model", "created": int(path.stat().st_mtime), "owned_by": "gguf-chat"}
        for names, path in catalog(worker)]})
