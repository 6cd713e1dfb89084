"""resolve_model: a MODEL argument as a path, a Hub reference (pulled if missing), a pulled name, or the default."""
import subprocess
import sys

import pytest
from huggingface_hub import constants

from models import hub
from models.model_ref import ConfigError, ModelNotFound, default_model, resolve_model
from models.packaged import smollm2_path
from tests.hub_server import hub as fake_hub  # noqa: F401 (a fixture)


@pytest.fixture
def no_config(tmp_path, monkeypatch):
    monkeypatch.delenv("GGUF_CHAT_MODEL", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config" / "gguf-chat" / "config.toml"


def test_a_local_path_is_itself_and_never_imports_huggingface_hub(smollm2):
    code = ("import sys; from models.model_ref import resolve_model; "
            f"print(resolve_model({str(smollm2)!r})); print('huggingface_hub' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(smollm2), "False"]


def test_missing_files_and_non_references_are_one_line_errors(tmp_path):
    with pytest.raises(ModelNotFound, match="missing.gguf: no such file, and not a Hub reference"):
        resolve_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelNotFound, match="nonsense: no such file"):
        resolve_model("nonsense")
    with pytest.raises(ModelNotFound, match="is a folder"):
        resolve_model(str(tmp_path))


def test_default_is_the_packaged_smollm2_then_config_then_env(no_config, monkeypatch, gemma3):
    assert default_model() is None and resolve_model(None) == smollm2_path()
    no_config.parent.mkdir(parents=True)
    no_config.write_text(f'default_model = "{gemma3}"\n')
    assert resolve_model(None) == gemma3
    monkeypatch.setenv("GGUF_CHAT_MODEL", str(smollm2_path()))
    assert resolve_model(None) == smollm2_path()


def test_a_bad_config_file_is_a_clear_error(no_config):
    no_config.parent.mkdir(parents=True)
    no_config.write_text("default_model = [1]\n")
    with pytest.raises(ConfigError, match="default_model must be a string"):
        default_model()
    no_config.write_text("default_model = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        default_model()


def test_a_hub_reference_is_pulled_once_then_found_without_the_network(fake_hub, no_config, monkeypatch):
    calls = []
    path = resolve_model("tester/tiny-GGUF:Q8_0", progress=lambda *a: calls.append(a))
    assert path.read_bytes() == fake_hub.repos["tester/tiny-GGUF"]["tiny-Q8_0.gguf"] and calls
    n = len(fake_hub.requests)
    assert resolve_model("tester/tiny-GGUF:q8_0") == path
    assert resolve_model("hf.co/tester/tiny-GGUF:Q8_0") == path
    assert len(fake_hub.requests) == n
    name = hub.list_models()[0].name  # the name `gguf-chat list` shows
    assert resolve_model(name) == path
    monkeypatch.setenv("GGUF_CHAT_MODEL", "tester/split-GGUF")
    assert resolve_model(None).name == "Big-Q4_K_M-00001-of-00003.gguf"


def test_offline_without_the_model_cached_is_a_clear_error(fake_hub, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(hub.NotCached, match="HF_HUB_OFFLINE is set and tester/tiny-GGUF is not in the cache"):
        resolve_model("tester/tiny-GGUF")
    assert fake_hub.requests == []


def test_a_missing_path_object_is_a_clear_error(tmp_path):
    with pytest.raises(ModelNotFound, match="no such file"):
        resolve_model(tmp_path / "missing.gguf")
