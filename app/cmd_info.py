"""`gguf-chat info MODEL [--json]`: what a model file is, without reading its weights."""


def register(sub) -> None:
    p = sub.add_parser("info", help="show a model's architecture, size, quant mix and tokenizer")
    p.add_argument("model", help="path to a .gguf file")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    raise NotImplementedError  # written in issue 2
