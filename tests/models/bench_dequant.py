"""Speed of our reference dequantizer against gguf-py's on synthetic tensors.

Best CPU time of several runs: steadier than wall time on a shared machine.

    python -m tests.models.bench_dequant [TYPE ...]     (default: Q4_K Q6_K)
"""
import sys
import time

import gguf
import numpy as np
from gguf.quants import dequantize as gguf_dequantize

from models.dequant import dequantize
from models.ggml_types import TYPES_BY_NAME
from tests.models.quant_blocks import random_blocks

ROWS, COLS = 8192, 4096  # a large 7B-sized matrix: 32M weights


def best_seconds(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def bench(type_name: str, repeats: int = 3) -> None:
    qtype = TYPES_BY_NAME[type_name]
    raw = random_blocks(np.random.default_rng(0), qtype, ROWS * COLS // qtype.block_elems)
    rows = raw.reshape(ROWS, -1)  # (rows, row_bytes), the layout gguf-py takes
    mb = raw.nbytes / 1e6
    ours = best_seconds(lambda: dequantize(raw, qtype, (COLS, ROWS)), repeats)
    theirs = best_seconds(lambda: gguf_dequantize(rows, gguf.GGMLQuantizationType[type_name]), repeats)
    print(f"{type_name} {ROWS}x{COLS} ({mb:.1f} MB): ours {mb / ours:6.0f} MB/s, "
          f"gguf-py {mb / theirs:6.0f} MB/s, x{theirs / ours:.1f}")


if __name__ == "__main__":
    for name in sys.argv[1:] or ["Q4_K", "Q6_K"]:
        bench(name)
