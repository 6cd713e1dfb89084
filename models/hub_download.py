"""One file from the Hub into a cache blob: resumable and verified.

huggingface_hub 2.x restarts a killed download from zero and checks only the size. Here the bytes go to
`<blob>.incomplete` next to the blob, a later run continues it with an HTTP Range request, and only a file whose
size and sha256 match what the Hub states is renamed to its blob path: a partial or corrupted file is never
where a model is looked for.
"""
import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path

from models.errors import UserError
from models.hub_files import RepoFile, human_bytes

Progress = Callable[[str, int, int], None]  # (file name, bytes done, bytes total)
CHUNK = 1 << 20
RETRIES = 5  # reconnects after the connection drops mid-file, each resuming where the last one stopped


class DownloadError(UserError):
    pass


class CorruptDownload(DownloadError):
    pass


def download_blob(url: str, headers: dict, f: RepoFile, blob: Path, progress: Progress | None) -> None:
    """GET url into blob, resuming from blob.incomplete; raises DownloadError, leaving blob absent, if it fails."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session, hf_raise_for_status

    partial = blob.with_name(blob.name + ".incomplete")
    if partial.exists() and partial.stat().st_size > f.size:
        partial.unlink()
    digest = _sha256_of(partial) if partial.exists() else hashlib.sha256()
    name = f.path.rsplit("/", 1)[-1]
    for attempt in range(RETRIES + 1):
        done = partial.stat().st_size if partial.exists() else 0
        if progress:
            progress(name, done, f.size)
        if done == f.size:
            break
        # identity: byte offsets must be those of the file; Range: continue where the partial file ends
        request_headers = dict(headers, **{"Accept-Encoding": "identity"}, **{"Range": f"bytes={done}-"} if done else {})
        try:
            with get_session().stream("GET", url, headers=request_headers,
                                      timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT) as response:
                hf_raise_for_status(response)
                if done and response.status_code != 206:  # the server ignored the Range: start over
                    done, digest = 0, hashlib.sha256()
                with open(partial, "ab" if done else "wb") as out:
                    for chunk in response.iter_bytes():  # as they arrive: nothing held back if the link drops
                        out.write(chunk)
                        digest.update(chunk)
                        done += len(chunk)
                        if progress:
                            progress(name, done, f.size)
                        if done > f.size:
                            break
            if done >= f.size:
                break
        except httpx2.TransportError as e:
            if attempt == RETRIES:
                raise DownloadError(f"downloading {f.path} stopped at {human_bytes(done)} of "
                                    f"{human_bytes(f.size)} ({type(e).__name__}); run the same command "
                                    "again to resume") from None
            time.sleep(min(2 ** attempt * 0.1, 5))
    _verify(partial, f, digest)
    os.replace(partial, blob)


def _verify(partial: Path, f: RepoFile, digest) -> None:
    size = partial.stat().st_size
    if size != f.size:
        partial.unlink()
        raise CorruptDownload(f"{f.path}: got {size} bytes but the Hub states {f.size}; removed it, run the "
                              "command again")
    if f.sha256 is not None and digest.hexdigest() != f.sha256:
        partial.unlink()
        raise CorruptDownload(f"{f.path}: sha256 {digest.hexdigest()} does not match the {f.sha256} the Hub "
                              "states; removed the corrupted download, run the command again")


def _sha256_of(path: Path):
    digest = hashlib.sha256()
    with open(path, "rb") as src:
        while chunk := src.read(CHUNK):
            digest.update(chunk)
    return digest
