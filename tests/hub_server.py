"""A Hub-like HTTP server on 127.0.0.1 for tests: the endpoints huggingface_hub really calls.

- GET /api/models/{owner}/{repo}[/revision/{rev}]?blobs=true: id, sha and siblings with size, blobId, lfs.
- HEAD/GET /{owner}/{repo}/resolve/{rev}/{path}: LFS files answer 302 to a CDN URL on another host name
  (localhost) with X-Repo-Commit, X-Linked-Etag and X-Linked-Size, as the Hub does; small files answer 200.
- GET /cdn/{sha256}: the bytes, with Range requests (206). Faults on request: drop the connection after n
  bytes once (`drop_once[path] = n`), answer an HTTP error once (`fail_once[path] = status`), serve a body of
  the right size with one byte changed (`corrupt`), or ignore Range headers (`ignore_range`).
Errors carry the Hub's X-Error-Code headers (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo).
"""
import functools
import hashlib
import json
import re
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

import gguf

TOKEN = "hf_testtokenthatmustneverbeprinted"


def make_gguf(name: str, n_floats: int = 40_000, split: tuple[int, int, int] | None = None) -> bytes:
    """A small real GGUF file written by gguf-py; split = (part index from 0, part count, total tensors)."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m.gguf"
        w = gguf.GGUFWriter(str(path), "llama")
        w.add_name(name)
        if split:
            w.add_uint16("split.no", split[0])
            w.add_uint16("split.count", split[1])
            w.add_int32("split.tensors.count", split[2])
        part = split[0] if split else 0
        w.add_tensor(f"blk.{part}.weight", np.arange(n_floats, dtype=np.float32).reshape(-1, 100))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path.read_bytes()


@functools.cache
def default_repos() -> dict[str, dict[str, bytes]]:
    split = {f"Big-Q4_K_M-{i + 1:05d}-of-00003.gguf": make_gguf("big", split=(i, 3, 3)) for i in range(3)}
    return {
        "tester/tiny-GGUF": {
            "README.md": b"# tiny\n",
            "tiny-Q4_K_M.gguf": make_gguf("tiny q4_k_m"),
            "tiny-UD-Q4_K_XL.gguf": make_gguf("tiny ud"),
            "tiny-Q8_0.gguf": make_gguf("tiny q8_0", n_floats=60_000),
            "tiny-IQ4_XS.gguf": make_gguf("tiny iq4_xs"),
            "mmproj-tiny-F16.gguf": make_gguf("mmproj"),
        },
        "tester/unsloth-GGUF": {  # only a UD- file: `:Q4_K_M` must not pick it
            "model-UD-Q4_K_M.gguf": make_gguf("ud only"),
            "model-Q8_0.gguf": make_gguf("q8"),
        },
        "tester/split-GGUF": {"README.md": b"# split\n", **split},
        "tester/nogguf": {"README.md": b"# nothing here\n", "model.safetensors": b"\0" * 64},
        "tester/twins-GGUF": {"a/m-Q4_K_M.gguf": make_gguf("a"), "b/m-Q4_K_M.gguf": make_gguf("b")},
        "tester/gated-GGUF": {"gated-Q4_K_M.gguf": make_gguf("gated")},  # listed, but files refused
    }


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    def __init__(self, repos: dict[str, dict[str, bytes]]):
        self.repos = repos
        self.commits = {r: hashlib.sha1(repr(sorted(f.items())).encode()).hexdigest() for r, f in repos.items()}
        self.by_sha256 = {hashlib.sha256(d).hexdigest(): (r, p) for r, fs in repos.items() for p, d in fs.items()}
        self.drop_once: dict[str, int] = {}   # path in repo -> bytes sent before the connection drops (once)
        self.fail_once: dict[str, int] = {}   # path in repo -> HTTP status answered once
        self.corrupt: set[str] = set()        # paths in repo served with one byte changed
        self.ignore_range = False
        self.gated = {"tester/gated-GGUF"}
        self.requests: list[tuple[str, str, dict]] = []  # (method, path, headers)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def is_lfs(self, path: str) -> bool:
        return path.endswith(".gguf") or path.endswith(".safetensors")

    def model_info(self, repo: str) -> dict:
        siblings = []
        for path, data in sorted(self.repos[repo].items()):
            s = {"rfilename": path, "size": len(data), "blobId": git_blob_id(data)}
            if self.is_lfs(path):
                s["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            siblings.append(s)
        return {"id": repo, "modelId": repo, "sha": self.commits[repo], "private": False, "siblings": siblings}


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_HEAD(self):
            self.route(head=True)

        def do_GET(self):
            self.route(head=False)

        def route(self, head: bool):
            hub.requests.append((self.command, self.path, dict(self.headers)))
            path = self.path.split("?")[0]
            if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path):
                repo = m[1]
                if repo not in hub.repos:
                    return self.error(401, "RepoNotFound", "Repository not found")
                if m[2] not in (None, "main", hub.commits[repo]):
                    return self.error(404, "RevisionNotFound", "Invalid rev id")
                return self.send(200, json.dumps(hub.model_info(repo)).encode(), {"Content-Type": "application/json"})
            if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
                return self.resolve(m[1], m[2], m[3], head)
            if m := re.fullmatch(r"/cdn/([0-9a-f]{64})", path):
                return self.cdn(*hub.by_sha256[m[1]], head)
            self.error(404, None, "Not found")

        def resolve(self, repo, rev, file, head):
            if repo not in hub.repos:
                return self.error(401, "RepoNotFound", "Repository not found")
            commit = hub.commits[repo]
            if rev not in ("main", commit):
                return self.error(404, "RevisionNotFound", "Invalid rev id")
            data = hub.repos[repo].get(file)
            if data is None:
                return self.error(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": commit})
            if repo in hub.gated:
                return self.error(403, "GatedRepo", "Access to model is restricted", {"X-Repo-Commit": commit})
            headers = {"X-Repo-Commit": commit, "Accept-Ranges": "bytes"}
            if not hub.is_lfs(file):
                return self.send(200, b"" if head else data, dict(headers, ETag=f'"{git_blob_id(data)}"'),
                                 length=len(data))
            sha = hashlib.sha256(data).hexdigest()
            # The CDN lies on another host name, so clients drop the Authorization header when redirected.
            self.send(302, b"", dict(headers, **{"Location": f"http://localhost:{hub.port}/cdn/{sha}",
                                                 "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data)),
                                                 "ETag": f'"{git_blob_id(data)}"'}))

        def cdn(self, repo, file, head):
            data = hub.repos[repo][file]
            if file in hub.corrupt:
                data = data[:-1] + bytes([data[-1] ^ 0xFF])
            start, status, headers = 0, 200, {"Accept-Ranges": "bytes", "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}
            if file in hub.fail_once:
                return self.error(hub.fail_once.pop(file), None, "Service unavailable")
            if (m := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))) and not hub.ignore_range:
                start, status = int(m[1]), 206
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            body = data[start:]
            drop = hub.drop_once.pop(file, None)
            if drop is not None and not head:
                self.send_response(status)
                for k, v in dict(headers, **{"Content-Length": str(len(body))}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body[:drop])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            self.send(status, b"" if head else body, headers, length=len(body))

        def error(self, status, code, message, extra=None):
            headers = dict(extra or {}, **{"X-Error-Message": message})
            if code:
                headers["X-Error-Code"] = code
            body = json.dumps({"error": message}).encode()
            self.send(status, b"" if self.command == "HEAD" else body, headers, length=len(body))

        def send(self, status, body, headers, length=None):
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body) if length is None else length))
            self.end_headers()
            self.wfile.write(body)

    return Handler


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A running FakeHub with huggingface_hub pointed at it and a fresh cache under tmp_path."""
    from huggingface_hub import constants

    server = FakeHub(default_repos())
    monkeypatch.setattr(constants, "ENDPOINT", server.endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        server.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-tokens"))
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    yield server
    server.close()
