"""The server's one engine, run by one worker thread that takes requests in order of arrival from a bounded queue.

A request's handler (a coroutine) submits a Job and reads what the worker sends back through the job's asyncio
queue: Started, then text pieces, then the GenerationStats, then END; or an exception. The engine is not
thread-safe and needs no lock: only the worker touches it. A handler whose client left cancels its job; the
worker checks between pieces and closes the generator, which stops the generation.
"""
import asyncio
import gc
import queue
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from app.reasoning import effort_vars, history_reasoning, thinking_vars
from app.server_schema import ApiError, GenRequest
from app.structured import answer_constraint
from app.tool_calls import Format, HarmonyFormat, format_for
from app.tool_grammar import tool_call_grammar
from app.tool_prompt import with_tools
from inference.grammar import Constraint
from models.errors import UserError

END = object()  # after the last item of a job


class PromptError(UserError):
    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code


@dataclass
class Started:
    """Sent once the prompt is tokenized and fits: from here on the reply streams."""
    prompt_tokens: int    # all of the prompt (the cache may already hold a prefix of it)
    thinks: bool          # the prompt ended inside <think>: the reply starts with reasoning
    load_seconds: float   # loading the model for this request (0 if it was loaded)
    reply_format: str = "think"  # how the chat template marks reasoning (ChatTemplate.reply_format): the reply's split
    tool_format: Format | None = None  # the parser of the template's tool calls; None: the request has no tools


@dataclass
class Job:
    request: GenRequest
    path: Path                          # the model file to run it on
    loop: asyncio.AbstractEventLoop
    items: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def send(self, item) -> None:
        """From the worker thread: hand an item to the request's coroutine."""
        try:
            self.loop.call_soon_threadsafe(self.items.put_nowait, item)
        except RuntimeError:  # the event loop closed: the server is shutting down
            self.cancelled.set()


class EngineWorker:
    """start(...) loads the first model and warms it up on the worker thread, which then takes the jobs: all of the
    engine's work on one thread, because numba's parallel regions run on a pool of the calling thread's (libgomp),
    and a load and warm-up on the main thread left a second pool behind: with more pool threads than cores libgomp
    stops them spinning between regions, and serve generated at ~40% of run's speed on 2 cores."""

    def __init__(self, model_arg: str | None, load, load_options: dict, ctx: int | None, max_queue: int):
        self.engine = None                # the loaded Engine, or None after a failed load
        self.home = None                  # the model served from the start (its path, once loaded)
        self.model_arg = model_arg        # MODEL as given on the command line, a name it answers to
        self._load = load                 # inference.load
        self._load_options = load_options
        self._ctx = ctx                   # --ctx (None: the model's)
        self._jobs: queue.Queue = queue.Queue(max_queue)
        self.busy = False
        self.counters = {"requests": 0, "prompt_tokens": 0, "generated_tokens": 0, "cancelled": 0, "rejected": 0,
                         "prompt_seconds": 0.0, "generation_seconds": 0.0}
        self._ready = threading.Event()
        self._load_error = None
        self.thread = None

    def start(self, progress, warm_up) -> None:
        """Load MODEL (progress: a download's) and warm_up(engine) on the worker thread, which takes the jobs from
        then on; return once they are done, raising what they raised."""
        self.thread = threading.Thread(target=self._run, args=(progress, warm_up), name="engine", daemon=True)
        self.thread.start()
        self._ready.wait()
        if self._load_error is not None:
            raise self._load_error

    def submit(self, job: Job) -> None:
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            self.counters["rejected"] += 1
            raise ApiError(503, f"the server is busy: {self._jobs.maxsize} requests are already waiting; "
                           "try again later", type="server_error", code="server_busy") from None

    @property
    def waiting(self) -> int:
        return self._jobs.qsize()

    def _run(self, progress, warm_up) -> None:
        try:
            self.engine = self._load(self.model_arg, ctx=self._ctx, progress=progress, **self._load_options)
            self.home = self.engine.path
            warm_up(self.engine)
        except BaseException as e:  # noqa: BLE001 - start() raises it on the main thread
            self._load_error = e
            return
        finally:
            self._ready.set()
        while True:
            job = self._jobs.get()
            if job.cancelled.is_set():  # its client left while it waited
                self.counters["cancelled"] += 1
                job.send(END)
                continue
            self.busy = True
            try:
                self._generate(job)
            except UserError as e:
                job.send(e)
            except Exception as e:  # a bug or the machine (out of memory): this request fails, the server stays
                traceback.print_exc(file=sys.stderr)
                job.send(e)
            finally:
                self.busy = False
                job.send(END)

    def _engine_for(self, path: Path, ctx: int | None) -> float:
        """Load path's model if another one (or a smaller context than ctx) is loaded; the seconds it took."""
        e = self.engine
        if e is not None and e.path == path:
            if ctx is None or ctx <= e.n_ctx:
                return 0.0
            ctx = min(ctx, e.config.n_ctx_train)  # as Ollama clamps num_ctx to what the model was trained for
            if ctx <= e.n_ctx:
                return 0.0
        self.engine = None
        del e
        gc.collect()  # the old model's memory goes before the new one comes
        t = time.perf_counter()
        self.engine = self._load(path, ctx=max(ctx or 0, self._ctx or 0) or None, **self._load_options)
        return time.perf_counter() - t

    def _generate(self, job: Job) -> None:
        r = job.request
        load_seconds = self._engine_for(job.path, r.ctx)
        engine = self.engine
        if r.prompt is None:  # only load the model
            job.send(Started(0, False, load_seconds))
            return
        ids, thinks, tool_format = prompt_ids(engine, r)
        if r.count_only:
            job.send(Started(len(ids), thinks, load_seconds))
            return
        held = constraint(engine, r, thinks, tool_format)  # before Started: a tool schema it cannot compile is a 400
        template = engine.chat_template
        job.send(Started(len(ids), thinks, load_seconds, template.reply_format if template else "think", tool_format))
        max_tokens = r.max_tokens if r.max_tokens is not None else engine.n_ctx  # None: until the context is full
        # cancelled: a client that leaves during a long prompt frees the engine at the next prompt chunk;
        # special: the control tokens a tool call is written with (<|python_tag|>, harmony's) come as their text;
        # shown: those the reply's split reads (Gemma 4's channel markers), in a chat
        pieces = engine.generate(ids, max_tokens=max_tokens, stop=r.stop, cancelled=job.cancelled.is_set,
                                 special=tool_format is not None, shown=template.reply_markup if is_chat(r) else (),
                                 constraint=held, **r.sampling)
        try:
            for piece in pieces:
                if job.cancelled.is_set():
                    self.counters["cancelled"] += 1
                    return
                if not isinstance(piece, str):
                    self._count(piece)
                job.send(piece)
        finally:
            pieces.close()  # stops the generation where it is

    def _count(self, stats) -> None:
        c = self.counters
        c["requests"] += 1
        c["prompt_tokens"] += stats.prompt_tokens
        c["generated_tokens"] += stats.generated_tokens
        c["prompt_seconds"] += stats.prompt_seconds
        c["generation_seconds"] += stats.generation_seconds


def is_chat(r: GenRequest) -> bool:
    """The prompt is messages for the chat template, not plain text or token ids."""
    return isinstance(r.prompt, list) and bool(r.prompt) and isinstance(r.prompt[0], dict)


def prompt_ids(engine, r: GenRequest) -> tuple[list[int], bool, Format | None]:
    """The prompt's token ids, as `gguf-chat run` makes them, whether it leaves the reply inside <think>, and the
    parser of the tool calls its template asks for (None: the request has no tools)."""
    tool_format = None
    if is_chat(r):
        if engine.chat_template is None:
            raise PromptError("this model has no chat template: send plain text to /v1/completions "
                              "(or /api/generate with \"raw\": true)")
        effort_vars(engine.chat_template, r.template_vars.get("reasoning_effort"))  # refused if the template takes none
        messages, variables = r.prompt, thinking_vars(engine.chat_template) | r.template_vars
        if r.tools:
            messages, tools = with_tools(messages, r.tools, engine.chat_template.source)
            variables = variables | tools
            tool_format = format_for(engine.chat_template.source, tools["tools"])
        text = engine.chat_template.render(history_reasoning(engine.chat_template, messages), **variables)
        ids, thinks = engine.tokenizer.encode_prompt(text), text.rstrip().endswith("<think>")
    else:
        ids, thinks = engine.prompt_ids(r.prompt), False
    if not ids:
        raise PromptError("the prompt is empty")
    if len(ids) > engine.n_ctx:
        raise PromptError(f"the prompt is {len(ids)} tokens but the context holds {engine.n_ctx} (start the "
                          "server with a larger --ctx, or send a shorter prompt)", "context_length_exceeded")
    return ids, thinks, tool_format


def constraint(engine, r: GenRequest, thinks: bool, tool_format: Format | None) -> Constraint | None:
    """What the reply is held to: the request's JSON (response_format, format), or calls only where tool_choice
    asks for them (tool_grammar.py); None: free text."""
    grammar = r.grammar
    if r.tools and r.tools.choice != "auto":
        grammar = tool_call_grammar(tool_format, r.tools, "tools" in engine.chat_template.source, engine.tokenizer)
        if isinstance(tool_format, HarmonyFormat):  # its grammar holds the analysis before the call too
            return Constraint(grammar)
    if grammar is None:
        return None
    return answer_constraint(grammar, engine.chat_template if is_chat(r) else None, thinks)


def catalog(worker: EngineWorker) -> list[tuple[list[str], Path]]:
    """(names, path) of each model that can be served: the loaded one, the home one, then every pulled one. A
    model answers to its pulled name (first), its file name, and the home model also to MODEL as given. A file
    removed since (`gguf-chat rm`, or by hand) is left out, as Ollama's list leaves out a removed model."""
    from models import hub  # noqa: PLC0415
    pulled = hub.list_models()
    loaded = worker.engine  # read once: the worker may swap it
    out = []
    for path in ([loaded.path] if loaded else []) + [worker.home] + [m.path for m in pulled]:
        if any(_same_file(path, p) for _, p in out) or not path.exists():
            continue
        names = [m.name for m in pulled if _same_file(m.path, path)] + [path.name]
        if worker.model_arg and _same_file(path, worker.home) and worker.model_arg not in names:
            names.append(worker.model_arg)
        out.append((names, path))
    return out


def find_model(name: str | None, worker: EngineWorker) -> tuple[str, Path]:
    """(the name a reply goes under, the file) for a request's model name; no name: the loaded model (which runs
    from memory even if its file was removed since)."""
    models = catalog(worker)
    loaded = worker.engine
    if not name and loaded:
        names = next((names for names, path in models if _same_file(path, loaded.path)), [loaded.path.name])
        return names[0], loaded.path
    if not name and models:
        return models[0][0][0], models[0][1]
    for names, path in models if name else []:
        if name.casefold() in (n.casefold() for n in names):
            return name, path
    available = ', '.join(n[0] for n, _ in models) or "none (gguf-chat pull one)"
    raise ApiError(404, f"model '{name or ''}' not found; available: {available}", code="model_not_found")


def _same_file(a: Path, b: Path) -> bool:
    return a == b or a.resolve() == b.resolve()
