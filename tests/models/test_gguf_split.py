"""Split models (name-0000N-of-0000M.gguf, as llama.cpp's gguf-split and gguf-py's writer make them)."""
import shutil
import struct

import llama_cpp
import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from models.gguf import GGUFError, open_gguf
from tests.models.malformed.build import F32_4, NAME, gguf, kv


def write_split(source, target, max_tensors: int) -> None:
    """Copy a model into parts with gguf-py: metadata through its reader, tensors as raw blocks."""
    src = GGUFReader(source)
    w = GGUFWriter(target, src.fields["general.architecture"].contents(), split_max_tensors=max_tensors)
    for key, field in src.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if field.types[0] == GGUFValueType.ARRAY:
            w.add_key_value(key, field.contents(), GGUFValueType.ARRAY, sub_type=field.types[-1])
        else:
            w.add_key_value(key, field.contents(), field.types[0])
    for t in src.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def smollm2_split(smollm2, tmp_path_factory):
    folder = tmp_path_factory.mktemp("split")
    write_split(smollm2, folder / "smollm2.gguf", max_tensors=100)  # 272 tensors: 3 parts
    return folder


def test_split_model_opens_as_one(smollm2, smollm2_split):
    parts = sorted(p.name for p in smollm2_split.iterdir())
    assert parts == [f"smollm2-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    with open_gguf(smollm2) as whole, open_gguf(smollm2_split / parts[1]) as split:
        assert len(split.files) == 3
        assert split.metadata["split.count"] == 3 and split.metadata["split.tensors.count"] == 272
        ours = {k: v for k, v in split.metadata.items() if not k.startswith("split.")}
        assert ours.keys() == whole.metadata.keys()
        for key, value in whole.metadata.items():
            assert np.array_equal(ours[key], value) if isinstance(value, np.ndarray) else ours[key] == value
        assert list(split.tensors) == list(whole.tensors)
        assert {t.part for t in split.tensors.values()} == {0, 1, 2}
        for name, t in whole.tensors.items():
            s = split.tensors[name]
            assert (s.shape, s.type, s.nbytes) == (t.shape, t.type, t.nbytes)
            assert np.array_equal(split.tensor_bytes(name), whole.tensor_bytes(name)), name
        assert split.file_size == sum((smollm2_split / p).stat().st_size for p in parts)


def test_llama_cpp_loads_the_same_split(smollm2_split):
    """The parts are a split as llama.cpp understands it: it loads them as one model of the same size."""
    first = smollm2_split / "smollm2-00001-of-00003.gguf"
    llm = llama_cpp.Llama(model_path=str(first), n_ctx=64, verbose=False)
    with open_gguf(first) as split:
        assert llama_cpp.llama_model_n_params(llm.model) == sum(t.n_elems for t in split.tensors.values())


def test_missing_part_is_named(smollm2_split, tmp_path):
    for p in smollm2_split.iterdir():
        if "00002" not in p.name:
            shutil.copy(p, tmp_path / p.name)
    with pytest.raises(GGUFError, match="has 3 parts; missing smollm2-00002-of-00003.gguf"):
        open_gguf(tmp_path / "smollm2-00001-of-00003.gguf")


def test_parts_out_of_place_are_rejected(smollm2_split, tmp_path):
    for p in smollm2_split.iterdir():
        swapped = {"00001": "00002", "00002": "00001"}.get(p.name[8:13], p.name[8:13])
        shutil.copy(p, tmp_path / f"smollm2-{swapped}-of-00003.gguf")
    with pytest.raises(GGUFError, match="do not make it part 1 of 3"):
        open_gguf(tmp_path / "smollm2-00001-of-00003.gguf")


def split_part(no: int, count: int, tensors_count: bytes, infos=()) -> bytes:
    keys = [kv("split.no", 2, struct.pack("<H", no)), kv("split.count", 2, struct.pack("<H", count)),
            kv("split.tensors.count", 5, tensors_count)]
    return gguf(([NAME] if no == 0 else []) + keys, list(infos), b"\0" * 32 if infos else b"")


@pytest.mark.parametrize("tensors_count, message", [
    (struct.pack("<i", 3), "split.tensors.count says 3 tensors but the 2 parts hold 1"),
    (struct.pack("<i", 1), None),
])
def test_split_tensor_count_is_checked(tmp_path, tensors_count, message):
    (tmp_path / "m-00001-of-00002.gguf").write_bytes(split_part(0, 2, tensors_count, [F32_4]))
    (tmp_path / "m-00002-of-00002.gguf").write_bytes(split_part(1, 2, tensors_count))
    if message is None:
        with open_gguf(tmp_path / "m-00001-of-00002.gguf") as m:
            assert list(m.tensors) == ["a"] and m.metadata["general.name"] == "tiny"
    else:
        with pytest.raises(GGUFError, match=message):
            open_gguf(tmp_path / "m-00001-of-00002.gguf")


def test_split_keys_of_the_wrong_type_are_rejected(tmp_path):
    """An array where an integer belongs must be our error, not numpy's ambiguous truth value."""
    array = kv("split.tensors.count", 9, struct.pack("<IQ", 5, 2) + struct.pack("<ii", 1, 1))
    first = gguf([NAME, kv("split.no", 2, b"\0\0"), kv("split.count", 2, b"\2\0"), array], [F32_4], b"\0" * 32)
    (tmp_path / "m-00001-of-00002.gguf").write_bytes(first)
    (tmp_path / "m-00002-of-00002.gguf").write_bytes(split_part(1, 2, struct.pack("<i", 1)))
    with pytest.raises(GGUFError, match="without an integer split.tensors.count"):
        open_gguf(tmp_path / "m-00002-of-00002.gguf")


def test_many_missing_parts_make_one_short_line(tmp_path):
    (tmp_path / "m-00001-of-99999.gguf").write_bytes(gguf([NAME]))
    with pytest.raises(GGUFError, match=r"has 99999 parts; missing m-00002-of-99999.gguf and 99997 more$"):
        open_gguf(tmp_path / "m-00001-of-99999.gguf")


def test_split_names_that_cannot_be(tmp_path):
    (tmp_path / "m-00000-of-00002.gguf").write_bytes(gguf([NAME]))
    with pytest.raises(GGUFError, match="part 00000 of 00002"):
        open_gguf(tmp_path / "m-00000-of-00002.gguf")


def test_one_of_one_is_an_ordinary_file(tmp_path):
    path = tmp_path / "m-00001-of-00001.gguf"
    path.write_bytes(gguf([NAME], [F32_4], b"\0" * 32))
    with open_gguf(path) as m:
        assert len(m.files) == 1 and list(m.tensors) == ["a"]
