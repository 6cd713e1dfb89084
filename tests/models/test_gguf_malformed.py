"""Malformed files: each is rejected with one GGUFError naming the field and byte offset, fast."""
import re
import time
import tracemalloc

import pytest

from models.gguf import GGUFError, open_gguf
from tests.models.malformed.build import F32_4, NAME, corpus, gguf, valid_file
from tests.models.malformed.ggml_reader import ggml_accepts

CASES = corpus()
# Where we are stricter than llama.cpp's header reader on purpose: strings must be UTF-8 (python str),
# dims >= 1 (a zero dimension divides by zero downstream); data ranges llama.cpp checks in its loader.
STRICTER_THAN_GGML = {"key not UTF-8", "value not UTF-8", "string array not UTF-8", "n_dims 0", "dimension 0",
                      "data truncated"}


def assert_rejected(path, fragment: str = "") -> GGUFError:
    """Rejected with our one-line error, in well under a second of CPU time (wall time also counts a shared
    machine's other processes)."""
    start = time.process_time()
    with pytest.raises(GGUFError) as e:
        open_gguf(path)
    assert time.process_time() - start < 0.5
    message = str(e.value)
    assert fragment in message
    assert "\n" not in message and re.search(r"\(at byte \d+\)$", message), message
    return e.value


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_file_is_rejected(case, tmp_path):
    raw, fragment = CASES[case]
    path = tmp_path / "bad.gguf"
    path.write_bytes(raw)
    assert_rejected(path, fragment)
    tracemalloc.start()  # whatever count or length it claims, a bad file costs little memory
    with pytest.raises(GGUFError):
        open_gguf(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20


def test_corpus_base_is_valid(tmp_path):
    """The corpus changes one field of this file, so the file itself must open, in llama.cpp too."""
    path = tmp_path / "ok.gguf"
    path.write_bytes(gguf([NAME], [F32_4], b"\0" * 32))
    with open_gguf(path) as m:
        assert m.tensors["a"].nbytes == 16 and m.metadata["general.name"] == "tiny"
    assert ggml_accepts(path)


# once llama_cpp is imported, its log callback decodes llama.cpp's messages as strict UTF-8, and a
# message quoting a mutated key is not: it raises inside the callback, which ctypes reports and ignores
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_llama_cpp_rejects_the_corpus_too(tmp_path):
    """Each malformed file is malformed to llama.cpp's own reader as well, except where we chose to be
    stricter (named above)."""
    path = tmp_path / "bad.gguf"
    accepted = set()
    for case, (raw, _) in CASES.items():
        path.write_bytes(raw)
        if ggml_accepts(path):
            accepted.add(case)
    assert accepted == STRICTER_THAN_GGML


def test_truncated_anywhere(tmp_path):
    """Cut a gguf-py file at every byte of its header and at points in its data: always our error."""
    full = tmp_path / "full.gguf"
    valid_file(full)
    raw = full.read_bytes()
    with open_gguf(full) as m:
        data_offset = m.files[0].data_offset
        data_end = max(t.offset + t.nbytes for t in m.tensors.values())  # gguf-py pads after it
    cut = tmp_path / "cut.gguf"
    for n in [*range(data_offset + 1), data_offset + 16, data_end - 1]:
        cut.write_bytes(raw[:n])
        assert_rejected(cut)


def test_truncated_download_names_the_tensor(gemma3, tmp_path):
    """The most common bad file: a download cut short inside the tensor data."""
    cut = tmp_path / "gemma.gguf"
    with open(gemma3, "rb") as src:
        cut.write_bytes(src.read(100_000_000))
    error = assert_rejected(cut, "data is not within the file bounds")
    assert re.search(r"tensor '[^']+' data", str(error)) and "corrupted or incomplete" in str(error)
