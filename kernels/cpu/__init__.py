from kernels.cpu.cache import serialize_saves

serialize_saves()  # before any kernel of the package compiles (kernels/cpu/cache.py says why)
