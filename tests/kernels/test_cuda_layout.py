"""The device layout of weights (kernels/cuda/layout.py) and its agreement with quant_dot.cuh; no GPU."""
import re
from pathlib import Path

import numpy as np
import pytest

from kernels.cuda.layout import (ELEMS_PER_ITEM, META_SPLIT, TABLE16_IN_SEQUENCE, bulk_meta_bytes, expert_rows, repack,
                                 table16_in_sequence)
from models.ggml_types import TYPES_BY_NAME

KERNEL_DIR = Path(__file__).parents[2] / "kernels" / "cuda"
CUH = "".join((KERNEL_DIR / name).read_text() for name in ("quant_dot.cuh", "quant_dot_iq.cuh"))
QUANT_TYPES = [n for n in META_SPLIT if n not in ("F32", "F16", "BF16")]


@pytest.mark.parametrize("name", QUANT_TYPES)
def test_kernel_constants_match_layout(name):
    # Q6_K is Q6_KL<false> (FILE ? the file's layout : VRAM's): the VRAM values are checked
    vram = r"(?:FILE \? \d+ : )?(\d+)"
    m = re.search(rf"struct {name}L? {{\s*static constexpr int QK = (\d+), BULK = {vram}, META = {vram}, ITEMS = (\d+)",
                  CUH)
    assert m, f"struct {name} not found in quant_dot.cuh"
    qtype = TYPES_BY_NAME[name]
    qk, bulk, meta, items = (int(g) for g in m.groups())
    assert qk == qtype.block_elems
    assert (bulk, meta) == bulk_meta_bytes(qtype)
    assert bulk % 16 == 0  # 16-byte loads of the bulk
    assert qk // items == ELEMS_PER_ITEM[name]


@pytest.mark.parametrize("name", list(META_SPLIT))
def test_repack_moves_every_byte_once(name):
    qtype = TYPES_BY_NAME[name]
    rng = np.random.default_rng(0)
    n_rows, n_blocks = 3, 8 if qtype.block_elems > 1 else 64
    raw = rng.integers(0, 256, size=(n_rows, n_blocks * qtype.block_bytes), dtype=np.uint8)
    out = repack(raw, qtype)
    assert out.shape == (raw.size,) and out.dtype == np.uint8
    front, back = META_SPLIT[name]
    bulk, meta = bulk_meta_bytes(qtype)
    for r in range(n_rows):
        for b in range(n_blocks):
            block = raw[r, b * qtype.block_bytes : (b + 1) * qtype.block_bytes]
            i = r * n_blocks + b
            block_bulk = block[front : qtype.block_bytes - back]
            if name in TABLE16_IN_SEQUENCE:
                block_bulk = table16_in_sequence(block_bulk.reshape(-1, 16)).reshape(-1)
            assert np.array_equal(out[i * bulk : (i + 1) * bulk], block_bulk)
            m0 = n_rows * n_blocks * bulk + i * meta
            block_meta = np.concatenate([block[:front], block[qtype.block_bytes - back :]])
            assert np.array_equal(out[m0 : m0 + meta], block_meta)


def test_table16_in_sequence_puts_each_word_s_codes_in_order():
    """Word j of a group holds the codes of weights 4j..4j+3, then 16+4j..19+4j, a nibble each from the lowest."""
    codes = np.random.default_rng(1).integers(0, 16, size=(5, 32), dtype=np.uint8)
    ggml = codes[:, :16] | (codes[:, 16:] << 4)  # byte l: weight l low, weight 16 + l high
    words = table16_in_sequence(ggml).view("<u4")
    for g in range(5):
        for j in range(4):
            nibbles = [int(words[g, j]) >> (4 * n) & 15 for n in range(8)]
            assert nibbles == [*codes[g, 4 * j : 4 * j + 4], *codes[g, 16 + 4 * j : 20 + 4 * j]]


def test_iq_tables_header_is_generated_from_the_references():
    """kernels/cuda/iq_tables.cuh is what kernels/cuda/iq_tables.py renders from models/ (rerun it after an edit)."""
    from kernels.cuda.iq_tables import HEADER, render

    assert HEADER.read_text() == render()


def test_iq_tables_hold_the_grids(monkeypatch):
    """The header carries ggml's values, and a changed grid entry changes it."""
    from kernels.cuda import iq_tables
    from models.iq_grids import GRIDS

    text = iq_tables.render()
    assert "0x0808080808080808, 0x080808080808082b" in text  # ggml-common.h's iq2xxs_grid[0], [1]
    assert "K0 = 0xbfad9881u" in text  # kvalues_iq4nl -127, -104, -83, -65
    wrong = GRIDS["IQ3_S"].copy()
    wrong[5, 2] += 2
    monkeypatch.setattr(iq_tables, "GRIDS", dict(GRIDS, IQ3_S=wrong))
    assert iq_tables.render() != text


def test_expert_rows_of_stacks_and_of_a_stacked_gate_up():
    """A stack's experts lie n_rows apart; gemma4's gate and up, views of ffn_gate_up_exps [n_expert, 2 n_ff,
    row_bytes] (inference/weights.py), 2 n_ff apart: row r of expert e lies (e * expert_rows + r) rows past the view's
    first byte, as moe_gate_up_glu reads it. Views whose rows are not back to back, or not whole rows apart, are
    refused."""
    n_expert, ff, row_bytes = 5, 6, 144
    stacked = np.random.default_rng(0).integers(0, 256, (n_expert, 2 * ff, row_bytes), dtype=np.uint8)
    assert expert_rows(stacked) == 2 * ff and expert_rows(np.ascontiguousarray(stacked[:, :ff])) == ff
    for first, view in ((0, stacked[:, :ff]), (ff, stacked[:, ff:])):
        assert expert_rows(view) == 2 * ff
        flat = stacked.reshape(-1)
        base = view.ctypes.data - stacked.ctypes.data
        for e, r in ((0, 0), (2, 5), (n_expert - 1, ff - 1)):
            at = base + (e * expert_rows(view) + r) * row_bytes
            assert np.array_equal(flat[at:at + row_bytes], stacked[e, first + r])
    wider = np.lib.stride_tricks.as_strided(stacked.reshape(-1), (n_expert - 1, ff, row_bytes),
                                            (2 * ff * row_bytes + 16, row_bytes, 1))
    for refused in (stacked[:, ::2], stacked[:, :, :72], stacked[::-1], wider, stacked.view(np.int8)):
        assert expert_rows(refused) is None
