"""`gguf-chat pull owner/repo[:QUANT] [--file NAME]`: download a GGUF model from the Hugging Face Hub.

Progress goes to stderr; stdout gets the local path of each file (first part first), so scripts can use it."""
import sys

from models.errors import UserError


class BadReference(UserError):
    pass


def register(sub) -> None:
    p = sub.add_parser("pull", help="download a GGUF model from the Hugging Face Hub",
                       description="Quant tags match file names case-insensitively; without one, Q4_K_M, then "
                                   "Q8_0, then the first GGUF. Uses HF_TOKEN, HF_ENDPOINT, HF_HUB_CACHE and "
                                   "HF_HUB_OFFLINE like huggingface_hub.")
    p.add_argument("ref", metavar="owner/repo[:QUANT]", help="a Hub repository, with an optional quant tag")
    p.add_argument("--file", metavar="NAME", help="an exact file in the repository (all parts if it is split)")
    p.set_defaults(func=run)


def run(args) -> int:
    from app.progress import DownloadBar
    from models import hub
    from models.hub_files import HubRef, human_bytes, parse_ref

    ref = parse_ref(args.ref)
    if ref is None:
        raise BadReference(f"{args.ref} is not a Hub reference: write owner/repo or owner/repo:QUANT")
    if args.file:
        if ref.tag is not None:
            raise BadReference("give a quant tag or --file, not both")
        ref = HubRef(ref.repo_id, args.file)
    model = hub.pull(ref, progress=DownloadBar())
    parts = f", {len(model.paths)} parts" if len(model.paths) > 1 else ""
    print(f"{model.name} ({human_bytes(model.size)}{parts})", file=sys.stderr)
    for path in model.paths:
        print(path)
    return 0
