"""`gguf-chat chat [MODEL]`: the terminal chat, with chats saved in $GGUF_CHAT_HOME (or XDG_DATA_HOME)."""


from app.cmd_run import add_reasoning_args
from app.device_args import add_device_args, load_options
from app.warm_up import add_no_warmup_arg


def register(sub) -> None:
    p = sub.add_parser("chat", help="chat in the terminal; chats are saved and found again")
    p.add_argument("model", nargs="?", help="model for new chats: a .gguf path, owner/repo[:QUANT] or a pulled "
                   "name (default: $GGUF_CHAT_MODEL, config.toml's default_model, else the packaged SmolLM2)")
    p.add_argument("--system", default="", help="system prompt of new chats")
    p.add_argument("--temperature", type=float, default=0.8, help="of new chats; 0 = greedy (default 0.8)")
    p.add_argument("--max-tokens", type=int, default=1024, help="longest reply of new chats (default 1024)")
    p.add_argument("--ctx", type=int, help="context size in tokens (default: what fits, up to the model's)")
    add_reasoning_args(p)
    add_device_args(p)
    add_no_warmup_arg(p)
    p.add_argument("--drop-old-turns", action="store_true",
                   help="when a chat outgrows the context, leave out its oldest turns instead of stopping")
    p.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    from app.store import ChatStore, Sampling, default_db_path
    from app.tui.app import ChatApp
    from app.tui.model_picker import default_model

    from app.cmd_run import MaxTokensError
    from app.reasoning import check_level
    options = load_options(args)  # bad flags fail here, before the UI starts
    check_level(args.reasoning_effort)
    if args.max_tokens < 1:
        raise MaxTokensError(f"--max-tokens takes a count of at least 1, got {args.max_tokens}")
    model = args.model or default_model()
    if Path(model).is_file():
        model = str(Path(model).resolve())  # chats remember it: make it independent of the current folder
    store = ChatStore(default_db_path())
    try:
        sampling = Sampling(temperature=args.temperature, max_tokens=args.max_tokens)
        ChatApp(store, model, sampling, args.system, args.ctx, args.drop_old_turns, options,
                args.reasoning_effort, args.reasoning, warm_up=not args.no_warmup).run()
    finally:
        store.close()
    return 0
