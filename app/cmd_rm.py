"""`gguf-chat rm NAME`: delete a pulled model (a NAME from `gguf-chat list`)."""


def register(sub) -> None:
    p = sub.add_parser("rm", help="delete a pulled model")
    p.add_argument("name", help="a name from gguf-chat list, e.g. owner/repo:Q4_K_M")
    p.set_defaults(func=run)


def run(args) -> int:
    from models import hub
    from models.hub_files import human_bytes

    model = hub.remove_model(args.name)
    print(f"removed {model.name} ({human_bytes(model.size)})")
    return 0
