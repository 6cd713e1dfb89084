"""What the server's routes share: reading a JSON body within limits, a request's reply as it streams from the
engine worker, the API key, and errors as JSON with one clear message (OpenAI's shape, Ollama's under /api/,
Anthropic's under /v1/messages), never a traceback.
"""
import asyncio
import hmac
import json
import sys

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse

from app.server_schema import ApiError, GenRequest
from app.server_worker import END, Job, Started, find_model, is_chat
from app.reply_split import reply_splitter
from app.tool_calls import ToolCallSplitter
from models.errors import UserError

MAX_BODY_BYTES = 8 * 2**20  # a full 128k-token context is ~0.5 MB of text


async def read_json(request: Request) -> dict:
    """The body as a JSON object: 413 past MAX_BODY_BYTES (declared or sent), 400 if it is not one."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise ApiError(413, f"the body is {int(declared):,} bytes; the limit is {MAX_BODY_BYTES:,}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise ApiError(413, f"the body is over the limit of {MAX_BODY_BYTES:,} bytes")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError; RecursionError: [[[[...
        raise ApiError(400, f"the body is not valid JSON: {str(e)[:200]}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object")
    return data


class Reply:
    """One request's generation as the worker sends it: (reasoning, answer, tool calls) pieces, then stats."""

    def __init__(self, job: Job, model: str, watcher: asyncio.Task):
        self.job, self.model, self._watcher = job, model, watcher
        self.chat = is_chat(job.request)  # else plain text
        self.started: Started | None = None
        self.stats = None  # the GenerationStats, once the reply is complete
        self.calls = 0     # tool calls given out

    async def pieces(self):
        """(reasoning, answer, tool calls) as the reply streams (a plain completion's reasoning is always empty, and
        only a request with tools has calls: found first, the text around them then split into reasoning and
        answer); self.stats is set at its end. Leaving early cancels the generation."""
        split = reply_splitter(self.started.reply_format, self.started.thinks) if self.chat else None
        tool_format, tools = self.started.tool_format, self.job.request.tools
        calls = ToolCallSplitter(tool_format) if tool_format else None
        try:
            while (item := await self.job.items.get()) is not END:
                if isinstance(item, BaseException):
                    raise as_api_error(item)
                final = not isinstance(item, str)
                text, found = calls.feed("" if final else item, final) if calls else ("" if final else item, [])
                if found and not tools.parallel:
                    found = found[:1] if self.calls == 0 else []  # parallel_tool_calls false: the first call only
                self.calls += len(found)
                reasoning, answer = split.feed(text, final=final) if split else ("", text)
                if reasoning or answer or found:
                    yield reasoning, answer, found
                if final:
                    self.stats = item
            if self.stats is None:  # cancelled: its client left
                raise ApiError(499, "the client closed the request")
        finally:
            self.close()

    async def text(self) -> tuple[str, str, list]:
        """(reasoning, answer, tool calls) of the whole reply."""
        reasoning, answer, calls = [], [], []
        async for r, a, c in self.pieces():
            reasoning.append(r)
            answer.append(a)
            calls += c
        return "".join(reasoning), "".join(answer), calls

    def close(self) -> None:
        self.job.cancelled.set()  # a no-op once the worker is done with it
        self._watcher.cancel()


async def start_reply(request: Request, r: GenRequest) -> Reply:
    """Queue the request and wait until its prompt is ready: errors until then are the response's status."""
    worker = request.app.state.worker
    model, path = find_model(r.model, worker)  # or 404
    job = Job(r, path, asyncio.get_running_loop())
    worker.submit(job)  # or 503
    reply = Reply(job, model, asyncio.create_task(_cancel_on_disconnect(request, job)))
    try:
        first = await job.items.get()
        if not isinstance(first, Started):
            raise as_api_error(first)
    except BaseException:  # an error, or this handler cancelled: the job goes too
        reply.close()
        raise
    reply.started = first
    return reply


async def _cancel_on_disconnect(request: Request, job: Job) -> None:
    """The client left (its body was read already, so the next message says so): stop its job."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancelled.set()


def as_api_error(item) -> ApiError:
    if isinstance(item, ApiError):
        return item
    if item is END:  # the client left while its request waited; nobody reads this
        return ApiError(499, "the client closed the request")
    if isinstance(item, UserError):
        return ApiError(400, str(item), code=getattr(item, "code", None))
    return ApiError(500, f"the engine failed: {type(item).__name__}: {item}", type="server_error")


def finish_reason(stats) -> str:
    return "stop" if stats.finish_reason == "stop" else "length"  # "context full" is a length too


# Anthropic's error types by HTTP status (its API answers an overloaded server 529; ours says 503, as elsewhere)
ANTHROPIC_ERRORS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def anthropic_error(status: int, message: str) -> dict:
    kind = ANTHROPIC_ERRORS.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_response(request: Request, status: int, message: str, type: str = "invalid_request_error",
                   code: str | None = None, param: str | None = None) -> JSONResponse:
    if request.url.path.startswith("/api/"):  # Ollama's shape, which its clients read
        return JSONResponse({"error": message}, status)
    if request.url.path.startswith("/v1/messages"):
        return JSONResponse(anthropic_error(status, message), status)
    return JSONResponse({"error": {"message": message, "type": type, "param": param, "code": code}}, status)


async def on_api_error(request: Request, e: ApiError):
    return error_response(request, e.status, e.message, e.type, e.code, e.param)


async def on_http_error(request: Request, e: HTTPException):
    message = f"no route {request.method} {request.url.path}" if e.status_code in (404, 405) else str(e.detail)
    return error_response(request, e.status_code, message, code="not_found" if e.status_code == 404 else None)


async def on_bug(request: Request, e: Exception):
    print(f"gguf-chat serve: {request.method} {request.url.path} failed", file=sys.stderr)  # uvicorn logs the rest
    return error_response(request, 500, f"internal error: {type(e).__name__}", type="server_error")


class ApiKey:
    """ASGI middleware: every route but /health wants `Authorization: Bearer KEY` or, as Anthropic's clients send it,
    `x-api-key: KEY`; compared in constant time."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] != "/health":
            headers = dict(scope["headers"])
            bearer, x_api_key = headers.get(b"authorization", b""), headers.get(b"x-api-key", b"")
            if not (hmac.compare_digest(bearer, b"Bearer " + self.key) or hmac.compare_digest(x_api_key, self.key)):
                response = error_response(Request(scope), 401, "a valid API key is required: send the header "
                                          "'Authorization: Bearer KEY' or 'x-api-key: KEY'", code="invalid_api_key")
                return await response(scope, receive, send)
        await self.app(scope, receive, send)


async def health(request: Request):
    return JSONResponse({"status": "ok"})


async def metrics(request: Request):
    """Prometheus text: counts since the start, and what the queue holds now."""
    worker = request.app.state.worker
    c = worker.counters
    lines = [f"gguf_chat_requests_total {c['requests']}", f"gguf_chat_requests_cancelled_total {c['cancelled']}",
             f"gguf_chat_requests_rejected_total {c['rejected']}", f"gguf_chat_prompt_tokens_total {c['prompt_tokens']}",
             f"gguf_chat_generated_tokens_total {c['generated_tokens']}",
             f"gguf_chat_prompt_seconds_total {c['prompt_seconds']:.6f}",
             f"gguf_chat_generation_seconds_total {c['generation_seconds']:.6f}",
             f"gguf_chat_requests_waiting {worker.waiting}", f"gguf_chat_busy {int(worker.busy)}"]
    return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")
