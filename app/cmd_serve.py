"""`gguf-chat serve [MODEL]`: the model behind OpenAI's, Ollama's and Anthropic's HTTP APIs, for editors, agents,
Open WebUI and scripts. One engine answers one request at a time, in order of arrival (app/server_worker.py)."""
import os
import sys

from app.device_args import add_device_args, load_options
from app.warm_up import add_no_warmup_arg, warm_up
from models.errors import UserError

API_KEY_ENV = "GGUF_CHAT_API_KEY"


class ServeError(UserError):
    pass


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve a model over OpenAI's, Ollama's and Anthropic's HTTP APIs")
    p.add_argument("model", nargs="?", help="a .gguf path, owner/repo[:QUANT] or a pulled name (default: the configured "
                   "default model); requests may name any pulled model, which then loads in its place")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0: a free one, printed at start)")
    p.add_argument("--ctx", type=int, default=None, help="context size in tokens (default: the model's, capped to memory)")
    p.add_argument("--api-key", metavar="KEY", default=os.environ.get(API_KEY_ENV),
                   help=f"require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on every route but /health "
                   f"(default: ${API_KEY_ENV})")
    p.add_argument("--max-queue", type=int, default=16, metavar="N",
                   help="requests that may wait for the engine; more are answered 503 (default 16)")
    add_device_args(p)
    add_no_warmup_arg(p)
    p.set_defaults(func=run)


def build_app(worker, api_key: str | None):
    from starlette.applications import Starlette  # noqa: PLC0415
    from starlette.exceptions import HTTPException  # noqa: PLC0415
    from starlette.routing import Route  # noqa: PLC0415

    from app import server, server_anthropic, server_ollama, server_openai, server_responses  # noqa: PLC0415
    from app.server_schema import ApiError  # noqa: PLC0415
    routes = [
        Route("/health", server.health), Route("/metrics", server.metrics),
        Route("/v1/chat/completions", server_openai.chat_completions, methods=["POST"]),
        Route("/v1/completions", server_openai.completions, methods=["POST"]),
        Route("/v1/models", server_openai.models),
        Route("/v1/responses", server_responses.responses, methods=["POST"]),
        Route("/v1/messages", server_anthropic.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", server_anthropic.count_tokens, methods=["POST"]),
        Route("/api/chat", server_ollama.chat, methods=["POST"]),
        Route("/api/generate", server_ollama.generate, methods=["POST"]),
        Route("/api/tags", server_ollama.tags), Route("/api/show", server_ollama.show, methods=["POST"]),
        Route("/api/version", server_ollama.version),
    ]
    app = Starlette(routes=routes, exception_handlers={ApiError: server.on_api_error,
                                                       HTTPException: server.on_http_error, Exception: server.on_bug})
    app.state.worker = worker
    app.state.responses = server_responses.ResponseStore()  # for the Responses API's previous_response_id
    return server.ApiKey(app, api_key) if api_key else app


def run(args) -> int:
    import socket  # noqa: PLC0415

    import uvicorn  # noqa: PLC0415

    from app.progress import DownloadBar  # noqa: PLC0415
    from app.server_worker import EngineWorker  # noqa: PLC0415
    from inference import load  # noqa: PLC0415  (heavy: numba, the model)
    if args.max_queue < 1:
        raise ServeError(f"--max-queue must be at least 1 (got {args.max_queue})")
    try:  # before the model loads, so that a port in use says so at once
        sock = socket.create_server((args.host, args.port))
    except OSError as e:
        raise ServeError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    host, port = sock.getsockname()[:2]
    worker = EngineWorker(args.model, load, load_options(args), args.ctx, args.max_queue)
    # loaded and warmed up before the server says it is up: the first request at full speed
    worker.start(DownloadBar(), (lambda e: None) if args.no_warmup else
                 lambda e: warm_up(e, lambda text: print(text, file=sys.stderr, flush=True)))
    engine = worker.engine
    print(f"gguf-chat serve: {engine.path.name} ({engine.device}, context {engine.n_ctx}) on http://{host}:{port}"
          f"  OpenAI: http://{host}:{port}/v1  Ollama and Anthropic: http://{host}:{port}"
          + ("  (API key required)" if args.api_key else ""), file=sys.stderr, flush=True)
    config = uvicorn.Config(build_app(worker, args.api_key), log_level="info", timeout_graceful_shutdown=2)
    uvicorn.Server(config).run(sockets=[sock])
    return 0
