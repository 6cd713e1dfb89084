"""Pulling from a Hub-like server on 127.0.0.1 into huggingface_hub's cache: choice, splits, resume, verification,
errors, offline mode, list and rm. The files are real GGUF files written by gguf-py and read back with it."""
import hashlib

import gguf
import pytest
from huggingface_hub import constants, get_hf_file_metadata, hf_hub_download, hf_hub_url, try_to_load_from_cache

from models import hub
from models.gguf import open_gguf
from models.hub_download import CorruptDownload, DownloadError
from models.hub_files import AmbiguousQuant, NoGGUFInRepo, QuantNotFound, parse_ref
from tests.hub_server import TOKEN, hub as fake_hub  # noqa: F401 (a fixture)


def pull(ref: str, progress=None) -> hub.LocalModel:
    return hub.pull(parse_ref(ref), progress)


def downloads(server) -> list[tuple[str, str | None]]:
    """(path, Range header) of every GET of file bytes the server answered."""
    return [(p, h.get("Range")) for m, p, h in server.requests if m == "GET" and p.startswith("/cdn/")]


def test_the_fake_hub_answers_huggingface_hub_itself(fake_hub):
    """huggingface_hub's own HEAD + download work against the fake server, so it speaks the Hub's protocol."""
    data = fake_hub.repos["tester/tiny-GGUF"]["tiny-IQ4_XS.gguf"]
    meta = get_hf_file_metadata(hf_hub_url("tester/tiny-GGUF", "tiny-IQ4_XS.gguf"))
    assert (meta.commit_hash, meta.etag, meta.size) == (fake_hub.commits["tester/tiny-GGUF"],
                                                       hashlib.sha256(data).hexdigest(), len(data))
    assert meta.location.startswith(f"http://localhost:{fake_hub.port}/cdn/")
    with open(hf_hub_download("tester/tiny-GGUF", "tiny-IQ4_XS.gguf"), "rb") as f:
        assert f.read() == data


def test_pull_by_tag_lands_verified_in_the_hf_cache(fake_hub):
    calls = []
    model = pull("tester/tiny-GGUF:q8_0", lambda *a: calls.append(a))
    data = fake_hub.repos["tester/tiny-GGUF"]["tiny-Q8_0.gguf"]
    assert model.name == "tester/tiny-GGUF:Q8_0" and model.size == len(data)
    assert model.path.read_bytes() == data
    assert model.path.parent.parent.name == "snapshots"
    assert model.path.resolve().name == hashlib.sha256(data).hexdigest()  # the blob, named as huggingface_hub does
    assert gguf.GGUFReader(model.path).fields["general.name"].contents() == "tiny q8_0"
    assert calls[0] == ("tiny-Q8_0.gguf", 0, len(data)) and calls[-1] == ("tiny-Q8_0.gguf", len(data), len(data))
    # huggingface_hub's own cache lookup sees the file we wrote
    commit = fake_hub.commits["tester/tiny-GGUF"]
    assert try_to_load_from_cache("tester/tiny-GGUF", "tiny-Q8_0.gguf", revision=commit) == str(model.path)
    assert hf_hub_download("tester/tiny-GGUF", "tiny-Q8_0.gguf", local_files_only=True) == str(model.path)


def test_no_tag_prefers_q4_k_m_and_skips_mmproj(fake_hub):
    assert pull("tester/tiny-GGUF").name == "tester/tiny-GGUF:Q4_K_M"
    assert pull("tester/unsloth-GGUF").name == "tester/unsloth-GGUF:Q8_0"


def test_pull_by_file_and_pulling_again_downloads_nothing(fake_hub):
    model = pull("tester/tiny-GGUF:tiny-IQ4_XS.gguf")
    assert model.label == "IQ4_XS" and model.path.name == "tiny-IQ4_XS.gguf"
    n = len(downloads(fake_hub))
    assert pull("tester/tiny-GGUF:IQ4_XS").path == model.path
    assert len(downloads(fake_hub)) == n


def test_split_model_pulls_every_part_and_opens(fake_hub):
    model = pull("tester/split-GGUF:Q4_K_M")
    assert [p.name for p in model.paths] == [f"Big-Q4_K_M-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    with open_gguf(model.path) as m:
        assert sorted(m.tensors) == ["blk.0.weight", "blk.1.weight", "blk.2.weight"]
    assert len(downloads(fake_hub)) == 3


def test_resumes_after_the_server_drops_the_connection_mid_file(fake_hub):
    data = fake_hub.repos["tester/tiny-GGUF"]["tiny-Q8_0.gguf"]
    fake_hub.drop_once["tiny-Q8_0.gguf"] = 100_000
    model = pull("tester/tiny-GGUF:Q8_0")
    assert model.path.read_bytes() == data
    ranges = [r for _, r in downloads(fake_hub)]
    assert ranges[0] is None and ranges[1] is not None and int(ranges[1][6:-1]) > 0  # bytes=N- with N > 0


def test_resumes_a_partial_file_left_by_a_killed_run(fake_hub):
    data = fake_hub.repos["tester/tiny-GGUF"]["tiny-Q8_0.gguf"]
    blob = hub.repo_dir("tester/tiny-GGUF") / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True)
    blob.with_name(blob.name + ".incomplete").write_bytes(data[:70_000])
    assert hub.find_cached(parse_ref("tester/tiny-GGUF:Q8_0")) is None  # a partial file is not a model
    assert pull("tester/tiny-GGUF:Q8_0").path.read_bytes() == data
    assert downloads(fake_hub)[0][1] == "bytes=70000-"
    assert not blob.with_name(blob.name + ".incomplete").exists()


def test_a_corrupted_download_is_detected_and_not_used(fake_hub):
    fake_hub.corrupt.add("tiny-Q4_K_M.gguf")  # same size, one byte changed: huggingface_hub alone would accept it
    with pytest.raises(CorruptDownload, match="sha256 .* does not match"):
        pull("tester/tiny-GGUF:Q4_K_M")
    repo = hub.repo_dir("tester/tiny-GGUF")
    assert list((repo / "blobs").iterdir()) == [] and not (repo / "snapshots").exists()
    assert hub.find_cached(parse_ref("tester/tiny-GGUF:Q4_K_M")) is None
    fake_hub.corrupt.clear()
    assert pull("tester/tiny-GGUF:Q4_K_M").path.read_bytes() == fake_hub.repos["tester/tiny-GGUF"]["tiny-Q4_K_M.gguf"]


def test_a_server_that_keeps_dropping_gives_a_resumable_error(fake_hub, monkeypatch):
    monkeypatch.setattr("models.hub_download.RETRIES", 0)
    fake_hub.drop_once["tiny-Q8_0.gguf"] = 50_000
    with pytest.raises(DownloadError, match=r"stopped at 50 kB of 240 kB .*run the same command again to resume"):
        pull("tester/tiny-GGUF:Q8_0")
    assert pull("tester/tiny-GGUF:Q8_0").size == 240_192
    assert downloads(fake_hub)[-1][1] == "bytes=50000-"


def test_a_server_error_mid_pull_is_retried(fake_hub):
    fake_hub.fail_once["tiny-Q8_0.gguf"] = 503
    assert pull("tester/tiny-GGUF:Q8_0").size == 240_192
    assert len(downloads(fake_hub)) == 2


def test_a_server_that_ignores_range_starts_the_file_over(fake_hub):
    data = fake_hub.repos["tester/tiny-GGUF"]["tiny-Q8_0.gguf"]
    fake_hub.ignore_range = True
    fake_hub.drop_once["tiny-Q8_0.gguf"] = 100_000
    assert pull("tester/tiny-GGUF:Q8_0").path.read_bytes() == data
    assert len(downloads(fake_hub)) == 2


def test_a_gated_model_says_what_to_do(fake_hub):
    with pytest.raises(DownloadError, match=r"gated-Q4_K_M.gguf: the Hub refused access \(403\); a gated or "
                                            r"private model needs its terms accepted on the Hub and HF_TOKEN set"):
        pull("tester/gated-GGUF")


def test_a_model_kept_at_an_older_commit_is_still_found(fake_hub):
    q8 = pull("tester/tiny-GGUF:Q8_0")
    old_commit = fake_hub.commits["tester/tiny-GGUF"]
    fake_hub.commits["tester/tiny-GGUF"] = "1" * 40  # the repo moves on; only Q4_K_M is pulled at the new commit
    q4 = pull("tester/tiny-GGUF:Q4_K_M")
    assert q4.path.parent.name == "1" * 40 and q8.path.parent.name == old_commit
    assert hub.find_cached(parse_ref("tester/tiny-GGUF:Q8_0")) == q8
    assert {m.name for m in hub.list_models()} == {"tester/tiny-GGUF:Q4_K_M", "tester/tiny-GGUF:Q8_0"}


@pytest.mark.parametrize("ref, error, message", [
    ("tester/missing", hub.RepoNotFound, r"no model repository tester/missing on http://127\.0\.0\.1:\d+"),
    ("tester/tiny-GGUF:Q5_K_S", QuantNotFound,
     r"no GGUF file with quant Q5_K_S; available: IQ4_XS \(160 kB\), Q4_K_M \(160 kB\), Q8_0 \(240 kB\)"),
    ("tester/unsloth-GGUF:Q4_K_M", QuantNotFound, r"quant Q4_K_M; available: Q8_0 \(160 kB\), UD-Q4_K_M \(160 kB\)"),
    ("tester/nogguf", NoGGUFInRepo, r"tester/nogguf holds no GGUF model file"),
    ("tester/twins-GGUF:Q4_K_M", AmbiguousQuant, r"matches 2 files: a/m-Q4_K_M.gguf \(160 kB\), b/m-Q4_K_M.gguf"),
])
def test_clear_errors(fake_hub, ref, error, message):
    with pytest.raises(error, match=message) as e:
        pull(ref)
    assert "\n" not in str(e.value) and TOKEN not in str(e.value)
    assert downloads(fake_hub) == []


def test_hub_unreachable_is_one_line(fake_hub, monkeypatch):
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    with pytest.raises(hub.HubError, match=r"cannot reach the Hub at http://127.0.0.1:9"):
        pull("tester/tiny-GGUF")


def test_token_goes_to_the_hub_but_not_to_the_cdn(fake_hub):
    pull("tester/tiny-GGUF:Q4_K_M")
    for method, path, headers in fake_hub.requests:
        auth = {k.lower(): v for k, v in headers.items()}.get("authorization")
        assert auth == (None if path.startswith("/cdn/") else f"Bearer {TOKEN}"), path


def test_offline_uses_the_cache_and_says_clearly_what_is_missing(fake_hub, monkeypatch):
    model = pull("tester/tiny-GGUF:Q4_K_M")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    n = len(fake_hub.requests)
    assert pull("tester/tiny-GGUF:q4_k_m").path == model.path
    assert pull("tester/tiny-GGUF").path == model.path
    with pytest.raises(hub.NotCached, match=r"HF_HUB_OFFLINE is set and tester/tiny-GGUF:Q8_0 is not in the cache"):
        pull("tester/tiny-GGUF:Q8_0")
    assert len(fake_hub.requests) == n


def test_list_and_rm(fake_hub):
    q4 = pull("tester/tiny-GGUF:Q4_K_M")
    q8 = pull("tester/tiny-GGUF:Q8_0")
    split = pull("tester/split-GGUF")
    models = {m.name: m for m in hub.list_models()}
    assert set(models) == {"tester/tiny-GGUF:Q4_K_M", "tester/tiny-GGUF:Q8_0", "tester/split-GGUF:Q4_K_M"}
    assert models["tester/split-GGUF:Q4_K_M"].size == split.size == 3 * 160_256
    assert models["tester/tiny-GGUF:Q8_0"].path == q8.path

    with pytest.raises(hub.NotCached, match="tester/tiny-GGUF has 2 pulled models"):
        hub.remove_model("tester/tiny-GGUF")
    with pytest.raises(hub.NotCached, match="no pulled model named tester/tiny-GGUF:Q2_K"):
        hub.remove_model("tester/tiny-GGUF:Q2_K")
    q4_blob = q4.path.resolve()
    assert hub.remove_model("tester/tiny-GGUF:q4_k_m").name == "tester/tiny-GGUF:Q4_K_M"
    assert not q4_blob.exists() and not q4.path.is_symlink() and q8.path.read_bytes()
    assert {m.name for m in hub.list_models()} == {"tester/tiny-GGUF:Q8_0", "tester/split-GGUF:Q4_K_M"}
    hub.remove_model("tester/split-GGUF")
    assert not hub.repo_dir("tester/split-GGUF").exists()
    assert [m.name for m in hub.list_models()] == ["tester/tiny-GGUF:Q8_0"]


def test_an_unwritable_cache_is_one_line(fake_hub, tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "a-file" / "cache"))
    with pytest.raises(hub.HubError, match=r"cannot write to the Hugging Face cache .*a-file/cache: Not a directory"):
        pull("tester/tiny-GGUF")
