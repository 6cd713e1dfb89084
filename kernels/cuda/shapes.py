"""The head sizes the CUDA kernels are built for, importable without CuPy: the engine reads them to leave a model
the GPU kernels cannot run to the CPU, in one line at load, rather than fail inside a kernel launcher."""
ATTENTION_HEAD_DIMS = (64, 128, 256, 512)  # attention.cu: ATTN(HD, ...)
DELTANET_HEAD_SIZES = (64, 128)  # deltanet.cu: the delta-rule kernels' S
DELTANET_CONV_K = 4  # deltanet.cu: CONV_K, the causal conv's taps
