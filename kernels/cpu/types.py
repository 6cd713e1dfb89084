"""What the CPU kernels share as values: ggml type ids (the dispatch key inside the kernels), the groups of
types each kernel takes, the f16 lookup table, the numba decorators and Variants (a kernel per set of types).

Numbers here are frozen into the compiled kernels when they compile: see kernels/cpu/cache.py."""
import numba as nb
import numpy as np

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 30
MXFP4 = 39
IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S, IQ2_S, IQ4_XS, IQ1_M = 16, 17, 18, 19, 20, 21, 22, 23, 29
IQ_IDS = (IQ4_NL, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M)
DECODED_IDS = (F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4) + IQ_IDS
# fused dots of float32 x (dot_float): Q5_K's; IQ4_NL's and IQ4_XS's where x stays float32 (INT8_IDS emptied)
FUSED_IDS = (Q5_K, IQ4_NL, IQ4_XS)
# blocks of 32 values: x goes in int8 blocks of 32 alike (MXFP4's scales rounded to fp16, as llama.cpp's q8_0)
BLOCK32_IDS = (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4)
# super-blocks of 256: x in int8 blocks of 256 in the matvecs (llama.cpp's q8_K)
K256_IDS = (Q4_K, Q6_K, IQ4_XS, IQ2_XXS, IQ3_XXS)
INT8_IDS = K256_IDS + BLOCK32_IDS  # fused dots of int8-quantized x (dot_int8), int8 GEMM tiles (gemm_int8)
X8 = 64  # X8 + a type id: that type repacked eight rows at a time (repack), dotted by dot_x8
X8_IDS = X8_Q4_0, X8_Q4_1, X8_Q5_0, X8_Q5_1 = tuple(X8 + t for t in (Q4_0, Q4_1, Q5_0, Q5_1))  # names: see dispatch
N16 = 16  # passed at run time, see dequant's decoders

F16_TO_F32 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)

jit = nb.njit(cache=True, nogil=True)  # bit-exact with ggml: no fastmath (no fused a*b+c)
fast = nb.njit(cache=True, nogil=True, fastmath=True)
parallel = nb.njit(cache=True, nogil=True, parallel=True, fastmath=True)
# A dispatch on type ids (an if-chain, each branch a call): inlined into its caller's numba IR, where a type id, or
# the tuple of those a kernel variant takes, that the caller holds as a constant prunes the other types' branches
# before typing (numba's dead-branch pruning runs after inlining), so their code is never compiled. The pruning
# resolves names of constants alone: a condition on X8 + Q4_0 stays (and compiles its branch), on X8_Q4_0 goes.
# A jitted function's branches on its own arguments would be compiled for every type, constants passed or not.
dispatch = nb.njit(inline="always")
# a leaf made by a factory around an intrinsic (one a type): compiled into the kernels that call it, never
# cached itself (numba keys a closure's cache on its cells, and an intrinsic's pickle differs in each process)
fast_leaf = nb.njit(cache=False, nogil=True, fastmath=True)


class Variants:
    """The kernel decorate(make(key)) for each key (a type id, or a sorted tuple of them), made on its first use and
    kept in made: a kernel that inlines a dispatch (above) with its key held in a closure cell compiles only those
    types' code. numba caches such a closure on disk (its cache is keyed on the cells' pickles: plain ints and
    tuples), so make's closure must reach other jitted functions as module globals, never through its cells (a
    dispatcher's pickle differs in each process: it would compile again at every start).
    Each variant gets a name of its own (the key in its __qualname__), so its own cache index file: numba picks a new
    entry's data file by reading the index, and two processes that compile two variants of one index at once (pytest
    -n 2) both took file 1, one's index entry then loading the other's code."""

    def __init__(self, make, decorate):
        self.make, self.decorate, self.made = make, decorate, {}

    def __call__(self, key):
        kernel = self.made.get(key)
        if kernel is None:
            func = self.make(key)
            func.__qualname__ += "_" + "_".join(map(str, key if isinstance(key, tuple) else (key,)))
            kernel = self.made[key] = self.decorate(func)
        return kernel


def type_set(tids) -> tuple:
    """The key of a kernel variant for the type ids tids: each once, sorted."""
    return tuple(sorted(set(tids)))
