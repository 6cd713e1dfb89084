"""The real server (routes, queue, worker) on a thread of the test process, on a free port of 127.0.0.1: what the
real openai and ollama clients talk to in tests whose engine is scripted, or shared with the test itself."""
import contextlib
import socket
import threading
import time
from pathlib import Path

import huggingface_hub.constants
import pytest
import uvicorn

from app.cmd_serve import build_app
from app.server_worker import EngineWorker
from inference import load
from tests.models.test_tokenizer import write_vocab_only


@contextlib.contextmanager
def serving(worker, key: str | None):
    """Start worker (an EngineWorker) and a server over it with API key `key`; yield the server's base URL; stop the
    server on leaving."""
    worker.start(None, lambda engine: None)
    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(build_app(worker, key), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)


@contextlib.contextmanager
def serving_scripted(vocab: Path, path: Path, source: str, engine):
    """(base URL, engine) of a server on a free port of 127.0.0.1 whose one model is engine (a scripted one); path:
    a file for the catalog and /api/show, vocab's vocabulary (a real file's) with the template source, no weights."""
    write_vocab_only(vocab, path, tokenizer__chat_template=source)
    with serving(EngineWorker(str(path), lambda *a, **k: engine, {}, None, 4), None) as url:
        yield url, engine


@contextlib.contextmanager
def no_pulled_models(hub: Path):
    """The Hub cache at hub (an empty folder): the servers' model lists hold only the model they were started on."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
        yield


@contextlib.contextmanager
def serving_one(home: Path, model: str, make_engine, key: str | None):
    """A server whose one model, home/model (a stub file), is the engine make_engine(path) builds, with no pulled
    models beside it; yields (base URL, engine)."""
    path = home / model
    path.write_bytes(b"GGUF")
    engine = make_engine(path)
    worker = EngineWorker(str(path), lambda model, ctx, progress=None, **options: engine, {}, None, 4)
    with no_pulled_models(home / "hub"), serving(worker, key) as url:
        yield url, engine


@contextlib.contextmanager
def serving_on_cpu(model: Path, hub: Path, key: str | None):
    """A server of the real engine on model, on the CPU with a 512-token context, with no pulled models beside it;
    yields its base URL."""
    with no_pulled_models(hub), serving(EngineWorker(str(model), load, {"device": "cpu"}, 512, 4), key) as url:
        yield url
