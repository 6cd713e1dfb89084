"""What the CPU kernels share as values: ggml type ids (the dispatch key inside the kernels), the groups of
types each kernel takes, the f16 lookup table and the numba decorators.

Numbers here are frozen into the compiled kernels when they compile: see kernels/cpu/cache.py."""
import numba as nb
import numpy as np

from kernels.cpu.cache import serialize_saves

serialize_saves()  # at the first import of the kernels, before any compiles (kernels/cpu/cache.py says why)

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
K256_IDS = (Q4_K, Q6_K, IQ4_XS, IQ2_XXS, IQ3_XXS, IQ3_S, IQ2_XS, IQ2_S, IQ1_S, IQ1_M)
INT8_IDS = K256_IDS + BLOCK32_IDS  # fused dots of int8-quantized x (dot_int8), int8 GEMM tiles (gemm_int8)
X8 = 64  # X8 + a type id: that type repacked eight rows at a time (repack), dotted by dot_x8
X8_IDS = tuple(X8 + t for t in (Q4_0, Q4_1, Q5_0, Q5_1))
N16 = 16  # passed at run time, see dequant's decoders

F16_TO_F32 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)

jit = nb.njit(cache=True, nogil=True)  # bit-exact with ggml: no fastmath (no fused a*b+c)
fast = nb.njit(cache=True, nogil=True, fastmath=True)
