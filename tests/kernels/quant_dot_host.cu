// A CPU build of kernels/cuda/quant_dot.cuh: the very item dot products and row loop of the GPU kernels, run on
// the host, so that tests/kernels/test_quant_dot_host.py checks their index math in CI, without a GPU.
#include <string.h>

#include "quant_dot.cuh"

template <class T>
static void rows(const uint8_t* w, const int8_t* xq, const float2* xds, float* out, int n_rows, int nb) {
    for (int r = 0; r < n_rows; ++r) out[r] = row_dot<T>(w, r, n_rows, nb, 0, 1, xq, xds);
}

// w: the repacked weight (Q6_K_FILE: as in the file); xq int8 [nb * QK]; xds float [nb * QK / 32, 2];
// out float [n_rows].
// Returns 0, or -1 for a type name without a kernel.
extern "C" int matvec_host(const char* type, const uint8_t* w, const int8_t* xq, const float* xds, float* out,
                           int n_rows, int nb) {
    const float2* ds = reinterpret_cast<const float2*>(xds);
#define TYPE(T)                                                                                            \
    if (strcmp(type, #T) == 0) return rows<T>(w, xq, ds, out, n_rows, nb), 0;
    TYPE(Q4_0) TYPE(Q4_1) TYPE(Q5_0) TYPE(Q5_1) TYPE(Q8_0) TYPE(Q2_K) TYPE(Q3_K) TYPE(Q4_K) TYPE(Q5_K) TYPE(Q6_K)
    TYPE(Q6_K_FILE) TYPE(MXFP4) TYPE(IQ4_NL) TYPE(IQ4_XS) TYPE(IQ2_XXS) TYPE(IQ2_XS) TYPE(IQ2_S) TYPE(IQ3_XXS)
    TYPE(IQ3_S) TYPE(IQ1_S) TYPE(IQ1_M)
#undef TYPE
    return -1;
}
