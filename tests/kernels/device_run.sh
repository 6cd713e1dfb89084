#!/usr/bin/env bash
# Everything the CUDA kernels need from one device-machine call: GPU tests, then the kernel benchmark.
# Run from the repository root; WHEELS names a folder holding gguf-*.whl (the reference dequantizer).
# Logs and bench_cuda.json go to $OUT when set.
set -uo pipefail
WHEELS=${WHEELS:-.whl}
OUT=${OUT:-/tmp/device_run}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$WHEELS"/gguf-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -m pytest tests/kernels -m gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log" | tail -n 25
python3 -m kernels.bench_cuda "$@" 2>&1 | tee "$OUT/bench.log"
