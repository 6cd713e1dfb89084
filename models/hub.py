"""Models from the Hugging Face Hub, kept in huggingface_hub's own cache so other tools see them (and we see theirs).

Cache layout (huggingface_hub's): <HF_HUB_CACHE>/models--owner--repo/
  blobs/<sha256 of LFS files, git oid otherwise>   the bytes, written only once verified
  snapshots/<commit>/<path in repo>                symlinks to the blobs
  refs/main                                        the commit `main` pointed at when last pulled
huggingface_hub supplies the endpoint (HF_ENDPOINT), the token (HF_TOKEN or the saved login), the cache folder
(HF_HOME, HF_HUB_CACHE), offline mode (HF_HUB_OFFLINE) and the repo listing; models/hub_download.py moves the bytes.
"""
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from models.errors import UserError
from models.hub_download import Progress, download_blob
from models.hub_files import GGUFChoice, HubRef, HubRefError, RepoFile, choose, gguf_models, parse_ref


class HubError(UserError):
    pass


class RepoNotFound(HubError):
    pass


class NotCached(HubError):
    pass


@dataclass(frozen=True)
class LocalModel:
    name: str                 # a reference that finds it again: owner/repo:QUANT or owner/repo:path.gguf
    repo_id: str
    label: str | None         # quant label from the file name
    size: int                 # bytes, all parts
    paths: tuple[Path, ...]   # snapshot paths, first part first

    @property
    def path(self) -> Path:
        return self.paths[0]


def cache_dir() -> Path:
    from huggingface_hub import constants
    return Path(constants.HF_HUB_CACHE)


def repo_dir(repo_id: str) -> Path:
    return cache_dir() / ("models--" + repo_id.replace("/", "--"))


def find_cached(ref: HubRef) -> LocalModel | None:
    """The model a reference names, if all its files are in the cache: at `main` as last pulled, else at an
    older commit kept (newest first). No network."""
    for snapshot in _snapshots(ref.repo_id):
        files = _snapshot_files(snapshot)
        try:
            choice = choose(ref, files)
        except HubRefError:
            continue
        return _local_model(ref.repo_id, snapshot, choice, gguf_models(files))
    return None


def pull(ref: HubRef, progress: Progress | None = None) -> LocalModel:
    """Download the model a reference names (what is cached already is not fetched again)."""
    from huggingface_hub import constants
    from huggingface_hub.utils import WeakFileLock, build_hf_headers

    if constants.is_offline_mode():
        cached = find_cached(ref)
        if cached is None:
            raise NotCached(f"HF_HUB_OFFLINE is set and {ref} is not in the cache ({cache_dir()}); "
                            "unset it to download, or see gguf-chat list")
        return cached
    commit, files = _remote_files(ref.repo_id)
    models = gguf_models(files)
    choice = choose(ref, files)
    repo = repo_dir(ref.repo_id)
    snapshot = repo / "snapshots" / commit
    headers = build_hf_headers()  # carries the token; never printed
    try:
        for f in choice.files:
            blob_name = f.sha256 or f.blob_id
            blob = repo / "blobs" / blob_name
            if not blob.exists():
                blob.parent.mkdir(parents=True, exist_ok=True)
                # The lock huggingface_hub takes for the same blob, so two tools never write one file together.
                with WeakFileLock(cache_dir() / ".locks" / repo.name / f"{blob_name}.lock"):
                    if not blob.exists():
                        download_blob(_resolve_url(ref.repo_id, commit, f.path), headers, f, blob, progress)
            _link(blob, snapshot / f.path)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(commit)
    except OSError as e:
        raise HubError(f"cannot write to the Hugging Face cache {cache_dir()}: {e.strerror}") from None
    return _local_model(ref.repo_id, snapshot, choice, models)


def list_models() -> list[LocalModel]:
    """Every GGUF model in the cache, by repo; a model kept at several commits is listed once (main's first)."""
    if not cache_dir().is_dir():
        return []
    found = {}
    for repo in sorted(cache_dir().glob("models--*--*")):
        repo_id = repo.name[len("models--"):].replace("--", "/", 1)
        for snapshot in _snapshots(repo_id):
            models = gguf_models(_snapshot_files(snapshot))
            for choice in models:
                model = _local_model(repo_id, snapshot, choice, models)
                found.setdefault(model.name, model)
    return list(found.values())


def remove_model(name: str) -> LocalModel:
    """Delete a pulled model's files (at every commit kept) and the blobs no other file links to."""
    ref = parse_ref(name)
    models = [m for m in list_models() if ref is not None and m.repo_id == ref.repo_id]
    if ref is not None and ref.tag is None and len(models) > 1:
        raise NotCached(f"{name} has {len(models)} pulled models: {', '.join(m.name for m in models)}; name one")
    matches = [m for m in models if ref.tag is None or _names_model(ref.tag, m)]  # models is [] without a ref
    if not matches:
        raise NotCached(f"no pulled model named {name}; see gguf-chat list")
    model = matches[0]
    repo = repo_dir(model.repo_id)
    relative = [p.relative_to(_snapshot_of(p)) for p in model.paths]
    blobs = set()
    for snapshot in (repo / "snapshots").glob("*"):
        for rel in relative:
            pointer = snapshot / rel
            if pointer.is_symlink() or pointer.exists():
                blobs.add(pointer.resolve())
                pointer.unlink()
    still_linked = {p.resolve() for p in (repo / "snapshots").rglob("*") if p.is_symlink()}
    for blob in blobs - still_linked:
        blob.unlink(missing_ok=True)
    for d in sorted((repo / "snapshots").rglob("*"), reverse=True):  # empty folders, deepest first
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()
    if not any((repo / "snapshots").glob("*")):
        shutil.rmtree(repo)
    return model


def _names_model(tag: str, model: LocalModel) -> bool:
    if tag.lower().endswith(".gguf"):
        return any(str(p).endswith("/" + tag) for p in model.paths)
    return model.label is not None and model.label.upper() == tag.upper()


def _snapshot_of(path: Path) -> Path:
    """The snapshots/<commit> folder a pointer path lies in."""
    while path.parent.name != "snapshots":
        path = path.parent
    return path


def _local_model(repo_id: str, snapshot: Path, choice: GGUFChoice, models: list[GGUFChoice]) -> LocalModel:
    same_label = [m for m in models if choice.label and m.label and m.label.upper() == choice.label.upper()]
    tag = choice.label if len(same_label) == 1 else choice.first_path
    return LocalModel(f"{repo_id}:{tag}", repo_id, choice.label, choice.size,
                      tuple(snapshot / f.path for f in choice.files))


def _snapshots(repo_id: str) -> list[Path]:
    """The repo's snapshot folders: the one `main` pointed at when last pulled first, then newest first."""
    folder = repo_dir(repo_id) / "snapshots"
    if not folder.is_dir():
        return []
    main_ref = repo_dir(repo_id) / "refs" / "main"
    main = folder / main_ref.read_text().strip() if main_ref.is_file() else None
    return sorted(folder.iterdir(), key=lambda s: (s != main, -s.stat().st_mtime))


def _snapshot_files(snapshot: Path) -> list[RepoFile]:
    """The complete files of a snapshot (dangling links left out), with sizes; no hashes (they were checked)."""
    files = []
    for root, _, names in os.walk(snapshot):
        for name in names:
            path = Path(root) / name
            if path.exists():
                files.append(RepoFile(path.relative_to(snapshot).as_posix(), path.stat().st_size, None, None))
    return sorted(files, key=lambda f: f.path)


def _remote_files(repo_id: str) -> tuple[str, list[RepoFile]]:
    """The commit `main` points at and the repo's files with the sizes and sha256 the Hub states."""
    import httpx2
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    try:
        info = HfApi().model_info(repo_id, files_metadata=True)
    except GatedRepoError:
        raise HubError(f"{repo_id} is gated: accept its terms on the Hub, then set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise RepoNotFound(f"no model repository {repo_id} on {constants.ENDPOINT} (a private one needs HF_TOKEN)") \
            from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "an error"
        raise HubError(f"the Hub at {constants.ENDPOINT} answered {status} for {repo_id}") from None
    except httpx2.TransportError as e:
        raise HubError(f"cannot reach the Hub at {constants.ENDPOINT} ({type(e).__name__}); "
                       "pulled models still work (gguf-chat list)") from None
    files = [RepoFile(s.rfilename, s.size or 0, s.lfs.sha256 if s.lfs else None, s.blob_id)
             for s in info.siblings or []]
    return info.sha, files


def _resolve_url(repo_id: str, commit: str, path: str) -> str:
    from huggingface_hub import constants
    return f"{constants.ENDPOINT}/{repo_id}/resolve/{commit}/{quote(path)}"


def _link(blob: Path, pointer: Path) -> None:
    """A relative symlink, as huggingface_hub makes them."""
    pointer.parent.mkdir(parents=True, exist_ok=True)
    if pointer.is_symlink() or pointer.exists():
        pointer.unlink()
    pointer.symlink_to(os.path.relpath(blob, pointer.parent))
