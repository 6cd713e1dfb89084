"""The reader against gguf-py (an oracle we did not write): real models, and files gguf-py's writer made."""
import numpy as np
import pytest
from gguf import GGUFEndian, GGUFReader, GGUFValueType, GGUFWriter

from models.gguf import GGUFError, open_gguf
from tests.models.malformed.build import EVERY_VALUE_TYPE, valid_file


def plain(v):
    """numpy arrays and nested lists of them as python lists"""
    if isinstance(v, np.ndarray):
        return v.tolist()
    return [plain(x) for x in v] if isinstance(v, list) else v


def oracle_value(field):
    """A field's value as gguf-py reads it, in our representation (numeric arrays as numpy arrays)."""
    if field.types[0] == GGUFValueType.ARRAY and field.types[-1] != GGUFValueType.STRING:
        return np.concatenate([field.parts[i] for i in field.data]) if field.data else np.array([])
    return field.contents()


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_real_model_equals_gguf_py(model, request, gguf_py):
    path = request.getfixturevalue(model)
    oracle = gguf_py(path)
    with open_gguf(path) as m:
        keys = [k for k in oracle.fields if not k.startswith("GGUF.")]
        assert list(m.metadata) == keys
        for key in keys:
            field, ours = oracle.fields[key], m.metadata[key]
            assert m.value_types[key] == field.types[0], key
            expected = oracle_value(field)
            if isinstance(ours, np.ndarray):
                assert ours.dtype == expected.dtype and np.array_equal(ours, expected), key
            else:
                assert ours == expected, key
        assert list(m.tensors) == [t.name for t in oracle.tensors]
        for t in oracle.tensors:
            ours = m.tensors[t.name]
            assert ours.shape == tuple(int(d) for d in t.shape), t.name
            assert ours.type.id == int(t.tensor_type), t.name
            assert ours.offset == t.data_offset and ours.nbytes == t.n_bytes, t.name
            assert ours.n_elems == t.n_elements, t.name
        # zero-copy views hold the same bytes gguf-py maps
        for t in oracle.tensors[:3] + oracle.tensors[-3:]:
            view = m.tensor_bytes(t.name)
            assert not view.flags.writeable
            assert np.array_equal(view, t.data.view(np.uint8).reshape(-1))
        assert m.file_size == path.stat().st_size


def test_every_value_type_reads_back_exactly(tmp_path):
    path = tmp_path / "every.gguf"
    valid_file(path)
    with open_gguf(path) as m:
        for key, (value, vtype) in EVERY_VALUE_TYPE.items():
            got = m.metadata[key]
            if isinstance(value, list):
                assert m.value_types[key] == GGUFValueType.ARRAY
                got = plain(got)
            else:
                assert m.value_types[key] == vtype, key
            assert got == value and type(got) is type(value), key
        assert isinstance(m.metadata["t.arr_bool"], np.ndarray) and m.metadata["t.arr_bool"].dtype == bool
        assert m.metadata["general.architecture"] == "llama"
        f32, q8, q4k = m.tensors["f32"], m.tensors["q8"], m.tensors["q4k"]
        assert (f32.shape, f32.type.name, f32.nbytes) == ((4, 2), "F32", 32)
        assert (q8.shape, q8.type.name, q8.nbytes) == ((32, 2), "Q8_0", 68)
        assert (q4k.shape, q4k.type.name, q4k.nbytes) == ((256, 1), "Q4_K", 144)
        assert np.array_equal(m.tensor_bytes("f32").view(np.float32), np.arange(8, dtype=np.float32))
        assert np.array_equal(m.tensor_bytes("q8"), np.arange(68, dtype=np.uint8))
        for info in m.tensors.values():
            assert info.offset % m.alignment == 0


def test_version_2_reads_like_version_3(tmp_path):
    """v2 differs from v3 only in the version field (v3 added big-endian files, which we refuse)."""
    v3 = tmp_path / "v3.gguf"
    valid_file(v3)
    raw = bytearray(v3.read_bytes())
    raw[4:8] = (2).to_bytes(4, "little")
    v2 = tmp_path / "v2.gguf"
    v2.write_bytes(bytes(raw))
    with open_gguf(v3) as a, open_gguf(v2) as b:
        assert (a.version, b.version) == (3, 2)
        assert a.tensors == b.tensors and list(a.metadata) == list(b.metadata)


def test_custom_alignment(tmp_path):
    path = tmp_path / "aligned.gguf"
    valid_file(path, alignment=256)
    with open_gguf(path) as m:
        assert m.alignment == 256
        oracle = GGUFReader(path)
        assert [m.tensors[t.name].offset for t in oracle.tensors] == [t.data_offset for t in oracle.tensors]
        assert all(t.offset % 256 == 0 for t in m.tensors.values())


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(GGUFError, match="does not exist"):
        open_gguf(tmp_path / "nope.gguf")
    with pytest.raises(GGUFError, match="not a regular file"):
        open_gguf(tmp_path)


def test_big_endian_file_from_gguf_py_is_refused(tmp_path):
    path = tmp_path / "be.gguf"
    w = GGUFWriter(path, "llama", endianess=GGUFEndian.BIG)
    w.add_tensor("a", np.ones(8, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFError, match=r"big-endian GGUF files are not supported \(at byte 4\)"):
        open_gguf(path)
