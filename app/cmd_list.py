"""`gguf-chat list`: the GGUF models in the Hugging Face cache (pulled by us or by other tools)."""
import sys


def register(sub) -> None:
    p = sub.add_parser("list", help="list the models pulled from the Hub")
    p.set_defaults(func=run)


def run(args) -> int:
    from models import hub
    from models.hub_files import human_bytes

    models = hub.list_models()
    if not models:
        print(f"no models in {hub.cache_dir()}; try: gguf-chat pull owner/repo:Q4_K_M", file=sys.stderr)
        return 0
    rows = [("NAME", "QUANT", "SIZE", "PATH")]
    rows += [(m.name, m.label or "-", human_bytes(m.size), str(m.path)) for m in models]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[3])
    return 0
