#!/usr/bin/env bash
# Everything the CUDA kernels need from one device-machine call: the GPU tests, then the kernel benchmarks.
# Run from the repository root on a machine with an NVIDIA GPU, CuPy and pytest; arguments go to the bench
# (quant type names; all by default). Logs and bench_cuda.json go to $OUT when it is set.
set -uo pipefail
OUT=${OUT:-${TMPDIR:-/tmp}/device_run}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 OUT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -m pytest tests/kernels -m gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log" | tail -n 25
python3 -m kernels.bench.cuda "$@" 2>&1 | tee "$OUT/bench.log"
python3 -m kernels.bench.ops 2>&1 | tee "$OUT/bench_ops.log"
python3 -m kernels.bench.prefill 2>&1 | tee "$OUT/bench_prefill.log"
