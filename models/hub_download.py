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
RETRY_WAIT_S = 0.5  # doubled after each failed attempt: 0.5 s ... 8 s


class DownloadError(UserError):
    pass


class CorruptDownload(DownloadError):
    pass


def download_blob(url: str, headers: dict, f: RepoFile, blob: Path, progress: Progress | None) -> None:
    """GET url into blob, resuming from blob.incomplete; raises DownloadError, leaving blob absent, if it fails."""
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError

    partial = blob.with_name(blob.name + ".incomplete")
    if partial.exists() and partial.stat().st_size > f.size:
        partial.unlink()
    for attempt in range(RETRIES + 1):
        try:
            digest = _get_rest(url, headers, f, partial, progress)
            if partial.stat().st_size >= f.size:
                break
            reason = "the connection closed early"
        except httpx2.TransportError as e:
            reason = type(e).__name__
        except HfHubHTTPError as e:
            status = e.response.status_code
            if status in (401, 403):
                raise DownloadError(f"{f.path}: the Hub refused access ({status}); a gated or private model needs "
                                    "its terms accepted on the Hub and HF_TOKEN set") from None
            if status < 500 and status != 429:
                raise DownloadError(f"{f.path}: the Hub answered {status}") from None
            reason = f"HTTP {status}"
        except OSError as e:
            raise DownloadError(f"cannot write {partial}: {e.strerror}") from None
        if attempt == RETRIES:
            done = partial.stat().st_size if partial.exists() else 0
            raise DownloadError(f"downloading {f.path} stopped at {human_bytes(done)} of {human_bytes(f.size)} "
                                f"({reason}); run the same command again to resume")
        time.sleep(RETRY_WAIT_S * 2 ** attempt)
    _verify(partial, f, digest)
    os.replace(partial, blob)


def _get_rest(url: str, headers: dict, f: RepoFile, partial: Path, progress: Progress | None):
    """One GET of the bytes the partial file lacks, appended to it; returns the sha256 state of the whole file
    (what an earlier attempt left is hashed from disk first)."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session, hf_raise_for_status

    name = f.path.rsplit("/", 1)[-1]
    done = partial.stat().st_size if partial.exists() else 0
    digest = _sha256_of(partial) if done else hashlib.sha256()
    if progress:
        progress(name, done, f.size)
    if done == f.size:
        return digest
    # identity: byte offsets must be the file's; Range: continue where the partial file ends
    request_headers = dict(headers, **{"Accept-Encoding": "identity"}, **({"Range": f"bytes={done}-"} if done else {}))
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
    return digest


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
