"""Ollama's API: POST /api/chat and /api/generate (NDJSON streaming unless "stream": false), GET /api/tags,
POST /api/show, GET /api/version. Durations in nanoseconds, as Ollama writes them; reasoning goes to `thinking`,
tool calls to `message.tool_calls` (their arguments an object, as Ollama gives them).
"""
import functools
import json
import time
from datetime import datetime, timezone
from importlib.metadata import version as package_version
from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from app.server import Reply, finish_reason, read_json, start_reply
from app.server_schema import ApiError, get, ollama_chat, ollama_generate
from app.server_worker import catalog, find_model
from models.chat_template import reply_format


def now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def durations(reply: Reply, t0: float) -> dict:
    s, ns = reply.stats, 1e9
    return {"done_reason": finish_reason(s), "total_duration": int((time.perf_counter() - t0) * ns),
            "load_duration": int(reply.started.load_seconds * ns), "prompt_eval_count": s.prompt_tokens,
            "prompt_eval_duration": int(s.prompt_seconds * ns), "eval_count": s.generated_tokens,
            "eval_duration": int(s.generation_seconds * ns)}


def chat_part(reasoning: str, answer: str, calls=()) -> dict:
    return {"message": {"role": "assistant", "content": answer} | ({"thinking": reasoning} if reasoning else {}) | (
        {"tool_calls": [{"function": {"name": c.name, "arguments": json.loads(c.arguments)}} for c in calls]}
        if calls else {})}


def generate_part(reasoning: str, answer: str, calls=()) -> dict:
    return {"response": answer} | ({"thinking": reasoning} if reasoning else {})


async def chat(request: Request):
    return await _reply(request, ollama_chat(await read_json(request)), chat_part)


async def generate(request: Request):
    return await _reply(request, ollama_generate(await read_json(request)), generate_part)


async def _reply(request: Request, r, part):
    """The reply as NDJSON lines, or one object with "stream": false; part() shapes a piece of text."""
    t0 = time.perf_counter()
    reply = await start_reply(request, r)
    if r.prompt is None:  # a request with no prompt loads the model, as Ollama's do
        reply.close()
        return JSONResponse({"model": reply.model, "created_at": now(), "done": True, "done_reason": "load"}
                            | part("", ""))
    if not r.stream:
        reasoning, answer, calls = await reply.text()
        return JSONResponse({"model": reply.model, "created_at": now()} | part(reasoning, answer, calls)
                            | {"done": True} | durations(reply, t0))

    async def lines():
        try:
            async for reasoning, answer, calls in reply.pieces():
                yield json.dumps({"model": reply.model, "created_at": now()} | part(reasoning, answer, calls)
                                 | {"done": False}, ensure_ascii=False) + "\n"
        except ApiError as e:
            yield json.dumps({"error": e.message}) + "\n"
            return
        yield json.dumps({"model": reply.model, "created_at": now()} | part("", "") | {"done": True}
                         | durations(reply, t0)) + "\n"
    return StreamingResponse(lines(), media_type="application/x-ndjson")


@functools.lru_cache(maxsize=64)
def describe(path: Path) -> tuple[dict, dict, str]:
    """(details, model_info, chat template) from a model file's header, as /api/show and /api/tags give them."""
    from models.gguf import open_gguf  # noqa: PLC0415
    from models.hub_files import quant_label  # noqa: PLC0415
    from models.model_info import summarize  # noqa: PLC0415
    with open_gguf(path) as model:
        info = summarize(model)
        template = model.metadata.get("tokenizer.chat_template") or ""
    n = info.parameters
    details = {"format": "gguf", "family": info.architecture or "", "families": [info.architecture or ""],
               "parameter_size": f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M",
               "quantization_level": quant_label(path.name) or (info.quant_mix[0].type if info.quant_mix else "")}
    model_info = {"general.architecture": info.architecture, "general.parameter_count": n,
                  f"{info.architecture}.context_length": info.context_length}
    return details, model_info, template if isinstance(template, str) else ""


def _digest(path: Path) -> str:
    """The sha256 a pulled file's blob is named by (huggingface_hub's cache), else empty."""
    blob = path.resolve().name
    return blob if len(blob) == 64 and all(c in "0123456789abcdef" for c in blob) else ""


async def tags(request: Request):
    models = []
    for names, path in catalog(request.app.state.worker):
        stat = path.stat()
        modified = datetime.fromtimestamp(stat.st_mtime, timezone.utc).isoformat().replace("+00:00", "Z")
        models.append({"name": names[0], "model": names[0], "modified_at": modified, "size": stat.st_size,
                       "digest": _digest(path), "details": describe(path)[0]})
    return JSONResponse({"models": models})


async def show(request: Request):
    body = await read_json(request)
    name = get(body, "model", str) or get(body, "name", str)
    if not name:
        raise ApiError(400, "'model' is required: the name of a model (see /api/tags)")
    _, path = find_model(name, request.app.state.worker)  # or 404
    details, model_info, template = describe(path)
    capabilities = ["completion"] + (["thinking"] if "<think>" in template or reply_format(template) != "think" else [])
    return JSONResponse({"modelfile": "", "parameters": "", "template": template, "details": details,
                         "model_info": model_info, "capabilities": capabilities})


async def version(request: Request):
    return JSONResponse({"version": package_version("gguf-chat")})
