"""Hub references and which GGUF files of a repo one names (llama.cpp -hf conventions). No network here.

A reference is `owner/repo`, `owner/repo:QUANT` (matched case-insensitively against the quant label of each
file name) or `owner/repo:path/in/repo.gguf` (one exact file). Without a tag: Q4_K_M, then Q8_0, then the
first GGUF. mmproj and imatrix files are never chosen. A split model is all its parts.
"""
import re
from dataclasses import dataclass

from models.errors import UserError

DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")
SKIPPED_WORDS = ("mmproj", "imatrix")
# Quant labels as uploaders write them at the end of a file name: Q4_K_M, IQ4_XS, Q4_0_4_4, BF16, F16, MXFP4_MOE...
# UD- (Unsloth Dynamic) and i1- (imatrix) mark a different file with the same core quant: part of the label,
# so that `:Q4_K_M` never picks `UD-Q4_K_M`.
QUANT_RE = re.compile(
    r"(?:^|[-._])(?P<label>(?:(?:UD|i1)-)?(?:I?Q\d+(?:_[A-Z0-9]+)*|TQ\d_\d|BF16|FP?16|FP?32|MXFP4(?:_MOE)?))$",
    re.IGNORECASE)
SPLIT_RE = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")  # as in models/gguf.py
REF_RE = re.compile(r"^(?:https?://)?(?:hf\.co/|huggingface\.co/)?(?P<repo>[\w][\w.-]*/[\w][\w.-]*)(?::(?P<tag>.+))?$")


class HubRefError(UserError):
    pass


class NoGGUFInRepo(HubRefError):
    pass


class QuantNotFound(HubRefError):
    pass


class AmbiguousQuant(HubRefError):
    pass


@dataclass(frozen=True)
class HubRef:
    repo_id: str      # owner/repo
    tag: str | None   # quant label, an exact .gguf path in the repo, or None for the default choice

    @property
    def is_file(self) -> bool:
        return self.tag is not None and self.tag.lower().endswith(".gguf")

    def __str__(self) -> str:
        return f"{self.repo_id}:{self.tag}" if self.tag else self.repo_id


@dataclass(frozen=True)
class RepoFile:
    path: str              # path inside the repo
    size: int
    sha256: str | None     # stated by the Hub for LFS files
    blob_id: str | None    # git object id (the cache's blob name for non-LFS files)


@dataclass(frozen=True)
class GGUFChoice:
    """One model inside a repo: a single file or all parts of a split model, in part order."""
    files: tuple[RepoFile, ...]
    label: str | None  # quant label from the file name, e.g. Q4_K_M

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def first_path(self) -> str:
        return self.files[0].path


def parse_ref(text: str) -> HubRef | None:
    """A Hub reference, or None where the text is not one (a .gguf path without a tag is a path, not a repo)."""
    m = REF_RE.match(text.strip())
    if not m or (m["tag"] is None and text.lower().endswith(".gguf")):
        return None
    tag = m["tag"]
    return HubRef(m["repo"], tag if tag else None)


def quant_label(path: str) -> str | None:
    """The quant label at the end of a GGUF file name (split suffix removed), e.g. 'UD-Q4_K_M'."""
    name = path.rsplit("/", 1)[-1]
    split = SPLIT_RE.match(name)
    stem = split["prefix"] if split else name[: -len(".gguf")]
    m = QUANT_RE.search(stem)
    return m["label"] if m else None


def gguf_models(files: list[RepoFile]) -> list[GGUFChoice]:
    """The GGUF models among a repo's files, in repo order: split parts grouped, mmproj/imatrix left out.

    A split model with a part missing from the listing is left out too (it could never load)."""
    models, groups = [], {}
    for f in files:
        lower = f.path.lower()
        if not lower.endswith(".gguf") or any(w in lower.rsplit("/", 1)[-1] for w in SKIPPED_WORDS):
            continue
        split = SPLIT_RE.match(f.path)
        if split is None:
            models.append([f])
            continue
        key = (split["prefix"], split["count"])
        if key not in groups:
            groups[key] = []
            models.append(groups[key])
        groups[key].append(f)
    result = []
    for parts in models:
        split = SPLIT_RE.match(parts[0].path)
        if split:
            parts.sort(key=lambda f: f.path)
            if len(parts) != int(split["count"]):
                continue
        result.append(GGUFChoice(tuple(parts), quant_label(parts[0].path)))
    return result


def choose(ref: HubRef, files: list[RepoFile]) -> GGUFChoice:
    """The one model a reference names among a repo's files, or a one-line error that lists what there is."""
    models = gguf_models(files)
    if not models:
        raise NoGGUFInRepo(f"{ref.repo_id} holds no GGUF model file")
    if ref.is_file:
        for m in models:
            if any(f.path == ref.tag for f in m.files):
                return m
        raise QuantNotFound(f"{ref.repo_id} has no file {ref.tag}; its GGUF files: {_listing(models, by_path=True)}")
    if ref.tag is not None:
        matches = [m for m in models if m.label and m.label.upper() == ref.tag.upper()]
        if not matches:
            raise QuantNotFound(f"{ref.repo_id} has no GGUF file with quant {ref.tag}; available: {_listing(models)}")
        return _one(ref, matches)
    for quant in DEFAULT_QUANTS:
        matches = [m for m in models if m.label and m.label.upper() == quant]
        if matches:
            return _one(ref, matches)
    return models[0]


def _one(ref: HubRef, matches: list[GGUFChoice]) -> GGUFChoice:
    if len(matches) > 1:
        raise AmbiguousQuant(f"{ref} matches {len(matches)} files: {_listing(matches, by_path=True)}; "
                             f"name one with {ref.repo_id}:FILE.gguf (or --file)")
    return matches[0]


def _listing(models: list[GGUFChoice], by_path: bool = False) -> str:
    return ", ".join(f"{m.first_path if by_path or not m.label else m.label} ({human_bytes(m.size)})"
                     for m in models)


def human_bytes(n: float) -> str:
    """Decimal units as Ollama and the Hub show them: 586 MB, 1.7 GB."""
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit in ("B", "kB") or n >= 100 else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
