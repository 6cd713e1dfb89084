"""`gguf-chat run MODEL -p PROMPT`: one reply streamed to stdout, nothing else there (stats on request)."""
import json
import sys
import time

from app.device_args import add_device_args, load_options, speculation_summary
from app.warm_up import add_no_warmup_arg, warm_up
from models.errors import UserError


class NoPromptError(UserError):
    pass


class MaxTokensError(UserError):
    pass


def check_max_tokens(n: int) -> None:
    """-n takes a count of at least 1, or -1 for the rest of the context (see run)."""
    if n < 1 and n != -1:
        raise MaxTokensError(f"-n/--max-tokens takes a count of at least 1, or -1 for 'until the context is full'; "
                             f"got {n}")


def add_sampling_args(p) -> None:
    """The sampling and context flags `run` and `chat` share."""
    p.add_argument("-n", "--max-tokens", type=int, default=512,
                   help="most tokens to generate (default 512; -1: until the context is full)")
    p.add_argument("--temperature", "--temp", type=float, default=0.8, help="0 for greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=40, help="0 to disable (default 40)")
    p.add_argument("--top-p", type=float, default=0.95, help="1 to disable (default 0.95)")
    p.add_argument("--min-p", type=float, default=0.05, help="0 to disable (default 0.05)")
    p.add_argument("--repeat-penalty", type=float, default=1.0, help="1 to disable (default 1.0)")
    p.add_argument("--seed", type=int, default=None, help="makes sampling repeatable")
    p.add_argument("--ctx", type=int, default=None, help="context size in tokens (default: the model's, capped to memory)")


def add_reasoning_args(p) -> None:
    """The flags `run` and `chat` share."""
    p.add_argument("--reasoning", choices=("on", "off"),
                   help="thinking on or off, for models whose template has the switch (Gemma 4, Qwen3; default: on)")
    p.add_argument("--reasoning-effort", metavar="LEVEL",
                   help="low, medium or high: how long gpt-oss reasons (its template's default: medium)")


def register(sub) -> None:
    p = sub.add_parser("run", help="answer one prompt, streaming the reply to stdout")
    p.add_argument("model", nargs="?", help="a .gguf path, owner/repo[:QUANT] or a pulled name (default: the configured default model)")
    p.add_argument("-p", "--prompt", help="the prompt; '-' or omitted with piped input: read stdin")
    p.add_argument("--raw", action="store_true", help="plain completion: no chat template")
    p.add_argument("--system", help="a system prompt (chat mode)")
    p.add_argument("--chat-template", metavar="NAME", help="a built-in chat template instead of the model's")
    add_reasoning_args(p)
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop when the reply contains TEXT (repeatable)")
    add_sampling_args(p)
    add_device_args(p)
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (text, thinking, stats) instead of streaming")
    p.add_argument("--json-schema", metavar="FILE",
                   help="the answer is JSON valid by the JSON schema in FILE, enforced token by token (a reply cut "
                   "by -n ends unfinished: finish_reason length)")
    p.add_argument("--hide-thinking", action="store_true",
                   help="leave out a reasoning model's thinking (<think>...</think>, gpt-oss's analysis channel, "
                   "Gemma 4's thought channel; else it goes to stderr, dimmed)")
    p.add_argument("--verbose", action="store_true", help="print where the layers run, load time and speeds to stderr")
    add_no_warmup_arg(p)
    p.set_defaults(func=run)


def read_prompt(args) -> str:
    if args.prompt is not None and args.prompt != "-":
        return args.prompt
    if args.prompt == "-" or not sys.stdin.isatty():
        return sys.stdin.read()
    raise NoPromptError("no prompt: give one with -p PROMPT or pipe it on stdin")


def run(args) -> int:
    from app.progress import DownloadBar  # noqa: PLC0415
    from app.reasoning import check_level, effort_vars, thinking_vars  # noqa: PLC0415
    from app.reply_split import reply_splitter  # noqa: PLC0415
    from app.structured import answer_constraint, schema_file_grammar  # noqa: PLC0415
    # what the flags alone decide is refused before the engine's imports (numba and the kernels: ~3 s on 2 cores)
    prompt = read_prompt(args)
    if args.raw and (args.system or args.chat_template or args.reasoning or args.reasoning_effort):
        raise NoPromptError("--raw is plain completion: it takes no --system, --chat-template, --reasoning or "
                            "--reasoning-effort")
    check_max_tokens(args.max_tokens)
    check_level(args.reasoning_effort)
    grammar = schema_file_grammar(args.json_schema) if args.json_schema else None
    options = load_options(args)
    from inference import load  # noqa: PLC0415  (heavy: numba, the model)
    t0 = time.perf_counter()
    engine = load(args.model, ctx=args.ctx, progress=DownloadBar(), **options)
    load_seconds = time.perf_counter() - t0
    if args.verbose:
        print(engine.summary(), file=sys.stderr)
    if args.raw:
        request, template = prompt, None
    else:
        request = ([{"role": "system", "content": args.system}] if args.system else []) + \
                  [{"role": "user", "content": prompt}]
        template = engine.template(args.chat_template)
    template_vars = thinking_vars(template, args.reasoning) | effort_vars(template, args.reasoning_effort)
    engine.check_prompt(request, args.chat_template, template_vars)  # a prompt that cannot run fails before the warm-up
    warm_seconds = None if args.no_warmup else warm_up(engine, lambda text: print(text, file=sys.stderr, flush=True))
    thinks = opens_thinking(engine, request, args.chat_template, template_vars)
    pieces = engine.generate(request, max_tokens=engine.n_ctx if args.max_tokens == -1 else args.max_tokens,
                             temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                             repeat_penalty=args.repeat_penalty, seed=args.seed, stop=tuple(args.stop),
                             chat_template=args.chat_template, template_vars=template_vars,
                             shown=template.reply_markup if template else (),
                             constraint=answer_constraint(grammar, template, thinks) if grammar else None)
    split = reply_splitter(template.reply_format if template else "think", thinks)
    show = Shown(args)
    text, thinking, stats = [], [], None

    def emit(reasoning: str, answer: str) -> None:
        thinking.append(reasoning)
        text.append(answer)
        show(reasoning, answer)

    try:
        for piece in pieces:
            if isinstance(piece, str):
                emit(*split.feed(piece))
            else:
                stats = piece
    except KeyboardInterrupt:
        pieces.close()  # Ctrl-C: what was generated stays printed, then a clean exit
    emit(*split.feed("", final=True))  # what the splitter held back for a tag that never came
    show.end()
    if args.json:
        out = {"text": "".join(text), "thinking": "".join(thinking),
               "stats": stats.to_dict() if stats else {"finish_reason": "interrupted"}}
        print(json.dumps(out, ensure_ascii=False))
    else:
        sys.stdout.write("\n")
        sys.stdout.flush()
    if args.verbose:
        ready = "no warm-up" if warm_seconds is None else f"kernels ready: {warm_seconds:.2f} s"
        print(f"load: {load_seconds:.2f} s, {ready}", file=sys.stderr)
        if stats:
            print(f"prompt: {stats.prompt_tokens} tokens, {stats.prompt_tok_s:.1f} tok/s | generation: "
                  f"{stats.generated_tokens} tokens, {stats.generation_tok_s:.1f} tok/s | {stats.finish_reason}",
                  file=sys.stderr)
            if engine.speculation:
                print(f"speculative ({engine.speculation.kind}): {speculation_summary(stats.drafted, stats.accepted)}", file=sys.stderr)
    return 0 if stats else 130


def opens_thinking(engine, request, chat_template: str | None, template_vars: dict) -> bool:
    """Whether the prompt leaves the reply inside <think> (the DeepSeek-R1 distills' templates end with it)."""
    text = request if isinstance(request, str) else engine.prompt_text(request, chat_template, template_vars)
    return text.rstrip().endswith("<think>")


class Shown:
    """Where run's pieces go: the answer to stdout, the reasoning to stderr, dimmed where stderr is a terminal
    (--hide-thinking: nowhere); --json: nothing until the end."""

    def __init__(self, args):
        self.quiet, self.hide = args.json, args.hide_thinking
        self.dim = sys.stderr.isatty()
        self.thinking = False  # inside a reasoning run on stderr

    def __call__(self, reasoning: str, answer: str) -> None:
        if self.quiet:
            return
        if reasoning and not self.hide:
            if not self.thinking and self.dim:
                sys.stderr.write("\x1b[2m")
            self.thinking = True
            sys.stderr.write(reasoning)
            sys.stderr.flush()
        if answer:
            self.end()
            sys.stdout.write(answer)
            sys.stdout.flush()

    def end(self) -> None:
        """Close a reasoning run on stderr (its dim style, and a line break before the answer)."""
        if self.thinking:
            sys.stderr.write("\x1b[0m\n" if self.dim else "\n")
            sys.stderr.flush()
            self.thinking = False
