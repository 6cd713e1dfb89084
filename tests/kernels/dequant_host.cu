// A CPU build of kernels/cuda/dequant_chunk.cuh: the very chunk dequantizers of the GPU prefill kernel, run on
// the host, so that tests/kernels/test_dequant_host.py checks them bit for bit against models/dequant.py in CI.
#include <string.h>

#include "dequant_chunk.cuh"

// out[r, :] = float32 row r of the repacked weight w, for every row and chunk, as kernels/cuda/dequant.cu walks them.
template <class T>
static void rows(const uint8_t* w, float* out, int n_rows, int nb) {
    constexpr int CPB = T::QK / 32;
    for (int r = 0; r < n_rows; ++r)
        for (int c = 0; c < nb * CPB; ++c) {
            size_t blk = (size_t)r * nb + c / CPB;
            chunk(T{}, w + blk * T::BULK, w + (size_t)n_rows * nb * T::BULK + blk * T::META, c % CPB,
                  out + ((size_t)r * nb * CPB + c) * 32);
        }
}

// w: the repacked weight of n_rows rows of nb blocks (nb counts 32 values for F32 / BF16); out float
// [n_rows, nb * QK]. Returns 0, or -1 for a type name without a dequantizer.
extern "C" int dequant_host(const char* type, const uint8_t* w, float* out, int n_rows, int nb) {
#define TYPE(NAME, T)                                                                                      \
    if (strcmp(type, NAME) == 0) return rows<T>(w, out, n_rows, nb), 0;
    TYPE("Q4_0", Q4_0) TYPE("Q4_1", Q4_1) TYPE("Q5_0", Q5_0) TYPE("Q5_1", Q5_1) TYPE("Q8_0", Q8_0)
    TYPE("Q2_K", Q2_K) TYPE("Q3_K", Q3_K) TYPE("Q4_K", Q4_K) TYPE("Q5_K", Q5_K) TYPE("Q6_K", Q6_K)
    TYPE("F32", F32B) TYPE("BF16", BF16B)
    TYPE("MXFP4", MXFP4) TYPE("IQ4_NL", IQ4_NL) TYPE("IQ4_XS", IQ4_XS) TYPE("IQ2_XXS", IQ2_XXS) TYPE("IQ2_XS", IQ2_XS)
    TYPE("IQ2_S", IQ2_S) TYPE("IQ3_XXS", IQ3_XXS) TYPE("IQ3_S", IQ3_S) TYPE("IQ1_S", IQ1_S) TYPE("IQ1_M", IQ1_M)
#undef TYPE
    return -1;
}
