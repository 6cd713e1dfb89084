"""Which file a Hub reference names: llama.cpp -hf conventions, on listings shaped like real GGUF repos."""
import pytest

from models.hub_files import (AmbiguousQuant, HubRef, NoGGUFInRepo, QuantNotFound, RepoFile, choose, parse_ref,
                              quant_label)


def listing(*paths: str) -> list[RepoFile]:
    return [RepoFile(p, 1_000_000 * (i + 1), None, None) for i, p in enumerate(paths)]


UNSLOTH = listing(".gitattributes", "README.md", "Qwen3-8B-BF16.gguf", "Qwen3-8B-Q4_K_M.gguf",
                  "Qwen3-8B-UD-Q4_K_XL.gguf", "Qwen3-8B-UD-Q4_K_M.gguf", "Qwen3-8B-Q8_0.gguf", "mmproj-F16.gguf",
                  "imatrix_unsloth.gguf")


@pytest.mark.parametrize("text, expected", [
    ("bartowski/Qwen3-8B-GGUF", HubRef("bartowski/Qwen3-8B-GGUF", None)),
    ("bartowski/Qwen3-8B-GGUF:q4_k_m", HubRef("bartowski/Qwen3-8B-GGUF", "q4_k_m")),
    ("hf.co/unsloth/Qwen3-8B-GGUF:UD-Q4_K_XL", HubRef("unsloth/Qwen3-8B-GGUF", "UD-Q4_K_XL")),
    ("https://huggingface.co/a/b", HubRef("a/b", None)),
    ("a/b:sub/x-00001-of-00002.gguf", HubRef("a/b", "sub/x-00001-of-00002.gguf")),
    ("models/foo.gguf", None),   # a path, not a repo
    ("/abs/model.gguf", None),
    ("model.gguf", None),
    ("just-a-name", None),
])
def test_parse_ref(text, expected):
    assert parse_ref(text) == expected


@pytest.mark.parametrize("path, label", [
    ("Qwen3-8B-Q4_K_M.gguf", "Q4_K_M"),
    ("Qwen3-8B-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"),
    ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
    ("gemma-3-270m-q4_k_m.gguf", "q4_k_m"),
    ("Q4_K_M/Big-Q4_K_M-00002-of-00003.gguf", "Q4_K_M"),
    ("Llama-3.2-1B.i1-IQ4_XS.gguf", "i1-IQ4_XS"),
    ("model-bf16.gguf", "bf16"),
    ("Qwen3-8B.gguf", None),
])
def test_quant_label(path, label):
    assert quant_label(path) == label


def test_tag_is_case_insensitive_and_never_picks_a_variant():
    assert choose(HubRef("u/r", "q4_k_m"), UNSLOTH).first_path == "Qwen3-8B-Q4_K_M.gguf"
    assert choose(HubRef("u/r", "ud-q4_k_m"), UNSLOTH).first_path == "Qwen3-8B-UD-Q4_K_M.gguf"
    only_ud = listing("m-UD-Q4_K_M.gguf", "m-Q8_0.gguf")
    with pytest.raises(QuantNotFound, match=r"no GGUF file with quant Q4_K_M; available: UD-Q4_K_M \(1.0 MB\), "
                                            r"Q8_0 \(2.0 MB\)"):
        choose(HubRef("u/r", "Q4_K_M"), only_ud)


def test_no_tag_prefers_q4_k_m_then_q8_0_then_the_first_gguf():
    assert choose(HubRef("u/r", None), UNSLOTH).first_path == "Qwen3-8B-Q4_K_M.gguf"
    assert choose(HubRef("u/r", None), listing("m-Q2_K.gguf", "m-Q8_0.gguf")).first_path == "m-Q8_0.gguf"
    assert choose(HubRef("u/r", None), listing("mmproj-f16.gguf", "m-Q2_K.gguf", "m-F16.gguf")).first_path \
        == "m-Q2_K.gguf"


def test_mmproj_and_imatrix_are_never_chosen():
    with pytest.raises(NoGGUFInRepo):
        choose(HubRef("u/r", None), listing("README.md", "mmproj-model-f16.gguf", "imatrix.gguf"))
    with pytest.raises(QuantNotFound):
        choose(HubRef("u/r", "F16"), listing("mmproj-model-F16.gguf", "m-Q8_0.gguf"))


def test_split_model_is_all_its_parts_in_order():
    files = listing("Q4_K_M/Big-Q4_K_M-00002-of-00003.gguf", "Q4_K_M/Big-Q4_K_M-00001-of-00003.gguf",
                    "Q4_K_M/Big-Q4_K_M-00003-of-00003.gguf", "Big-Q8_0.gguf")
    choice = choose(HubRef("u/r", "Q4_K_M"), files)
    assert [f.path for f in choice.files] == [f"Q4_K_M/Big-Q4_K_M-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert choice.size == 6_000_000
    by_file = choose(HubRef("u/r", "Q4_K_M/Big-Q4_K_M-00002-of-00003.gguf"), files)
    assert by_file == choice
    incomplete = listing("Big-Q4_K_M-00001-of-00002.gguf", "Big-Q8_0.gguf")
    with pytest.raises(QuantNotFound):
        choose(HubRef("u/r", "Q4_K_M"), incomplete)


def test_several_matches_are_listed_with_sizes():
    files = listing("a/m-Q4_K_M.gguf", "b/m-Q4_K_M.gguf")
    with pytest.raises(AmbiguousQuant, match=r"a/m-Q4_K_M.gguf \(1.0 MB\), b/m-Q4_K_M.gguf \(2.0 MB\)"):
        choose(HubRef("u/r", "Q4_K_M"), files)
    assert choose(HubRef("u/r", "b/m-Q4_K_M.gguf"), files).first_path == "b/m-Q4_K_M.gguf"


def test_missing_file_lists_the_gguf_files():
    with pytest.raises(QuantNotFound, match="has no file nope.gguf; its GGUF files: Qwen3-8B-BF16.gguf"):
        choose(HubRef("u/r", "nope.gguf"), UNSLOTH)
