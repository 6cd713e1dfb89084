"""Which quant types the engine runs where: the IQ types on the CPU (the GPU has no kernels for them yet, so
--device cuda is refused in one line and auto runs the CPU), the types with no kernels at all refused by name.
The IQ4_XS file against llama.cpp: test_parity.py."""
import pytest
from gguf import GGMLQuantizationType as T

from tests.inference.synthetic import LLAMA_K_SHAPES, Q4_K_M_LAYERS, write_synthetic


def test_a_type_without_kernels_is_refused_by_name_in_one_line(tmp_path):
    from inference.engine import load
    from models.ggml_types import UnsupportedTypeError
    path = tmp_path / "tq2_0.gguf"
    write_synthetic(path, "llama", shapes=LLAMA_K_SHAPES, types=dict.fromkeys(Q4_K_M_LAYERS, T.TQ2_0))
    with pytest.raises(UnsupportedTypeError, match=r"^quant type TQ2_0 \(tensor 'blk\.0\.\w+\.weight'\) is not "
                                                   r"supported by gguf-chat$"):
        load(path, device="cpu", ctx=64)
