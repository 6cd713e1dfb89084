#!/usr/bin/env bash
# Ours vs llama.cpp on the GPU machine, in one run, on tests/synth_gguf.py's files (BENCHMARKS.md has the results).
# Carry .carry/ (llamacpp.tar.xz: `bash tests/llamacpp_peer.sh prepare .carry`); start the peer
# build early in the lease (`setsid bash tests/llamacpp_peer.sh build .carry &`), then:
#   bash tests/device_bench.sh synth    # writes the files (a few minutes)
#   bash tests/device_bench.sh run      # gguf-chat bench and llama-bench, results under $OUT
#   bash tests/device_bench.sh hybrid   # llama3-8b q4_k_m with 32, 24 and 16 of its 32 layers on the GPU, the
#                                       # GPU's share of the CPU layers' rows at each of SHARES (default: 0 0.6)
#   bash tests/device_bench.sh vram     # its peak VRAM against file size + KV cache + 10%
#   bash tests/device_bench.sh moe      # Qwen3-30B-A3B's shapes (qwen3moe q4_k_m, 17.3 GiB) all on the GPU
#   bash tests/device_bench.sh moe_host # the same with all experts / those of 24 layers in host memory
#   bash tests/device_bench.sh iq_synth # issue 34's IQ files and gpt-oss-20b's, written side by side (~5 minutes)
#   bash tests/device_bench.sh iq       # llama3-8b in IQ4_XS and IQ2_XXS mixes, Qwen3-30B-A3B in IQ3_XXS, all on the GPU
#   bash tests/device_bench.sh oss_host # gpt-oss-20b with all experts in host memory (issue 33)
#   bash tests/device_bench.sh big_synth  # gpt-oss-120b (~61 GiB: a kind with more than 64 GiB of disk), Gemma 4 31B
#                                         # and 26B-A4B, written side by side
#   bash tests/device_bench.sh oss120_host  # gpt-oss-120b with all experts in host memory, on one GPU (issue 33)
#   bash tests/device_bench.sh gemma4_synth  # Gemma 4 31B and 26B-A4B alone, side by side (~1.5 minutes)
#   bash tests/device_bench.sh gemma4   # Gemma 4 31B and 26B-A4B all on the GPU, after 16384 tokens, and 26B-A4B's
#                                       # experts in host memory (issue 36)
# With layers on the CPU, where the time goes: python3 tests/device_profile.py FILE N (per-op, per-token), and
# the host's DRAM and PCIe rates: python3 tests/device_probe.py FILE (see inference/NOTES_gpu.md).
set -uo pipefail
tmp=${TMPDIR:-/tmp}
OUT=${OUT:-$tmp/device_bench}
files=$tmp/synth
# llama.cpp's llama-bench: the path the peer script prints as its build's last line (it waits for a build under
# way, or starts one); LLAMA_BENCH overrides it
peer_bench() { echo "${LLAMA_BENCH:-$(bash tests/llamacpp_peer.sh build .carry | tail -n 1)}"; }
mkdir -p "$OUT" $files
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
models="llama-1b:q4_k_m llama3-8b:q4_k_m llama3-8b:q8_0"
case ${1:-} in
synth)
  for m in $models; do
    f=$files/${m/:/-}.gguf
    [ -e "$f" ] || python3 tests/synth_gguf.py "$f" --preset "${m%:*}" --ftype "${m#*:}"
  done ;;
run)
  peer=$(peer_bench)
  for m in $models; do
    f=$files/${m/:/-}.gguf
    echo "== $m"
    python3 -m app.cli bench "$f" --device cuda -p 512 -n 128 -r 3 | tee -a "$OUT/ours.md"
    case $m in *q4_k_m)
      python3 -m app.cli bench "$f" --device cuda -p 512 -n 128 -r 3 -d 4096 | tail -n 2 | tee -a "$OUT/ours.md"
      python3 -m app.cli bench "$f" --device cuda -p 512 -n 128 -r 3 --no-graph | tail -n 2 | tee -a "$OUT/ours.md" ;;
    esac
    if [ -x "$peer" ]; then
      "$peer" -m "$f" -ngl 99 -fa 1 -p 512 -n 128 -r 3 2>/dev/null | tee -a "$OUT/llamacpp.md"
      case $m in *q4_k_m) "$peer" -m "$f" -ngl 99 -fa 1 -p 512 -n 128 -d 4096 -r 3 2>/dev/null | tail -n 3 | tee -a "$OUT/llamacpp.md" ;; esac
    else
      echo "llama-bench not built: $peer"
    fi
  done ;;
hybrid)
  peer=$(peer_bench)
  f=$files/llama3-8b-q4_k_m.gguf
  [ -e "$f" ] || python3 tests/synth_gguf.py "$f" --preset llama3-8b --ftype q4_k_m
  for ngl in ${NGL:-32 24 16}; do
    echo "== llama3-8b q4_k_m, $ngl of 32 layers on the GPU"
    for share in $([ $ngl = 32 ] && echo 0 || echo ${SHARES:-0 0.6}); do
      python3 -m app.cli bench "$f" --device cuda -ngl $ngl --gpu-share $share -p 512 -n 128 -r 3 | tail -n 2 \
        | tee -a "$OUT/hybrid_ours.md"
    done
    # llama.cpp's -ngl counts the output layer as layer 33: -ngl 32 leaves it on the CPU, so all-GPU is 99
    [ -x "$peer" ] && "$peer" -m "$f" -ngl $([ $ngl = 32 ] && echo 99 || echo $ngl) -fa 1 -p 512 -n 128 -r 3 2>/dev/null \
      | grep -E "pp512|tg128" | tee -a "$OUT/hybrid_llamacpp.md"
  done ;;
moe)  # issue 17: 128 experts, 8 a token; pp512, tg128, tg128 after 4096 tokens, ours then llama.cpp's
  peer=$(peer_bench)
  f=$files/qwen3moe-30b-a3b-q4_k_m.gguf
  [ -e "$f" ] || python3 tests/synth_gguf.py "$f" --preset qwen3moe-30b-a3b --ftype q4_k_m
  python3 -m app.cli bench "$f" --device cuda -p 512 -n 128 -r ${REPS:-3} | tee -a "$OUT/moe_ours.md"
  python3 -m app.cli bench "$f" --device cuda -p 512 -n 128 -r ${REPS:-3} -d 4096 | tail -n 2 | tee -a "$OUT/moe_ours.md"
  if [ -x "$peer" ]; then
    "$peer" -m "$f" -ngl 99 -fa 1 -p 512 -n 128 -r ${REPS:-3} 2>/dev/null | tee -a "$OUT/moe_llamacpp.md"
    "$peer" -m "$f" -ngl 99 -fa 1 -p 512 -n 128 -d 4096 -r ${REPS:-3} 2>/dev/null | tail -n 3 | tee -a "$OUT/moe_llamacpp.md"
  else
    echo "llama-bench not built: $peer"
  fi ;;
moe_host)  # issue 17: experts in host memory (--cpu-moe, --n-cpu-moe 24) next to llama.cpp's -ot exps=CPU, -ncmoe 24
  peer=$(peer_bench)
  f=$files/qwen3moe-30b-a3b-q4_k_m.gguf
  [ -e "$f" ] || python3 tests/synth_gguf.py "$f" --preset qwen3moe-30b-a3b --ftype q4_k_m
  for flags in "--cpu-moe" "--n-cpu-moe 24"; do
    python3 -m app.cli bench "$f" --device cuda $flags -p 512 -n 64 -r ${REPS:-3} | tail -n 2 | sed "s/gguf-chat cuda/gguf-chat cuda $flags/" \
      | tee -a "$OUT/moe_host_ours.md"
  done
  if [ -x "$peer" ]; then
    for flags in "-ot exps=CPU" "-ncmoe 24"; do
      "$peer" -m "$f" -ngl 99 -fa 1 $flags -t 16 -p 512 -n 64 -r ${REPS:-3} 2>/dev/null | grep -E "pp512|tg64" \
        | sed "s/CUDA /CUDA $flags /" | tee -a "$OUT/moe_host_llamacpp.md"
    done
  fi ;;
iq_synth)  # in parallel, each file's log beside it; the IQ3_XXS mixture as an imatrix file has it (its downs IQ3_XXS)
  for m in "llama3-8b iq4_xs" "llama3-8b iq2_xxs" "qwen3moe-30b-a3b iq3_xxs --imatrix-mix" "gpt-oss-20b q4_k_m"; do
    set -- $m; f=$files/$1-$2.gguf
    [ -e "$f" ] || python3 tests/synth_gguf.py "$f" --preset "$1" --ftype "$2" "${@:3}" >"$f.log" 2>&1 &
  done
  wait; ls -la $files ;;
iq)  # issue 34: pp512 and tg128 all on the GPU, ours then llama.cpp's
  peer=$(peer_bench)
  for f in $files/llama3-8b-iq4_xs.gguf $files/llama3-8b-iq2_xxs.gguf $files/qwen3moe-30b-a3b-iq3_xxs.gguf; do
    echo "== $f"
    timeout 240 python3 -m app.cli bench "$f" --device cuda -p 512 -n 128 -r ${REPS:-3} | tail -n 2 | tee -a "$OUT/iq_ours.md"
    [ -x "$peer" ] && timeout 240 "$peer" -m "$f" -ngl 99 -fa 1 -p 512 -n 128 -r ${REPS:-3} 2>/dev/null \
      | grep -E "pp512|tg128" | tee -a "$OUT/iq_llamacpp.md"
  done ;;
oss_host)  # issue 33: gpt-oss-20b, all experts in host memory, next to llama.cpp's -ot exps=CPU
  peer=$(peer_bench)
  f=$files/gpt-oss-20b-q4_k_m.gguf
  timeout 300 python3 -m app.cli bench "$f" --device cuda --cpu-moe -p 512 -n 64 -r ${REPS:-3} | tail -n 2 \
    | tee -a "$OUT/oss_host_ours.md"
  [ -x "$peer" ] && timeout 300 "$peer" -m "$f" -ngl 99 -fa 1 -ot exps=CPU -t 16 -p 512 -n 64 -r ${REPS:-3} 2>/dev/null \
    | grep -E "pp512|tg64" | tee -a "$OUT/oss_host_llamacpp.md" ;;
big_synth|gemma4_synth)  # gemma4_synth: the two Gemma 4 files alone (35 GB: a 64 GB disk holds them, not 120b's too)
  big=("gemma4-31b q4_k_m" "gemma4-26b-a4b q4_k_m")
  [ "$1" = big_synth ] && big=("gpt-oss-120b q4_k_m" "${big[@]}")
  for m in "${big[@]}"; do
    set -- $m; f=$files/$1-$2.gguf
    [ -e "$f" ] || python3 tests/synth_gguf.py "$f" --preset "$1" --ftype "$2" >"$f.log" 2>&1 &
  done
  wait; ls -la $files ;;
oss120_host)  # issue 33: gpt-oss-120b on ONE GPU, all experts in host memory, next to llama.cpp's -ot exps=CPU at
  # 16 threads and at every core
  peer=$(peer_bench)
  f=$files/gpt-oss-120b-q4_k_m.gguf
  export CUDA_VISIBLE_DEVICES=0
  timeout 500 python3 -m app.cli bench "$f" --device cuda --cpu-moe -p 512 -n 64 -r ${REPS:-2} | tail -n 2 \
    | tee -a "$OUT/oss120_host_ours.md"
  for t in 16 $(nproc); do
    [ -x "$peer" ] && timeout 400 "$peer" -m "$f" -ngl 99 -fa 1 -ot exps=CPU -t $t -p 512 -n 64 -r ${REPS:-2} 2>/dev/null \
      | grep -E "pp512|tg64" | sed "s/^/-t $t /" | tee -a "$OUT/oss120_host_llamacpp.md"
  done ;;
gemma4)  # issue 36: pp512, tg128, both after 16384 tokens, all on the GPU; 26B-A4B with its experts in host memory
  peer=$(peer_bench)
  export CUDA_VISIBLE_DEVICES=0
  for m in gemma4-31b gemma4-26b-a4b; do
    f=$files/$m-q4_k_m.gguf
    echo "== $m"
    timeout 300 python3 -m app.cli bench "$f" --device cuda -p 512 -n 128 -r ${REPS:-3} | tail -n 2 | tee -a "$OUT/gemma4_ours.md"
    timeout 300 python3 -m app.cli bench "$f" --device cuda -p 512 -n 128 -r ${REPS:-3} -d 16384 | tail -n 2 \
      | tee -a "$OUT/gemma4_ours.md"
    [ -x "$peer" ] && timeout 300 "$peer" -m "$f" -ngl 99 -fa 1 -p 512 -n 128 -r ${REPS:-3} 2>/dev/null \
      | grep -E "pp512|tg128" | tee -a "$OUT/gemma4_llamacpp.md"
    [ -x "$peer" ] && timeout 300 "$peer" -m "$f" -ngl 99 -fa 1 -p 512 -n 128 -d 16384 -r ${REPS:-3} 2>/dev/null \
      | grep -E "pp512|tg128" | tee -a "$OUT/gemma4_llamacpp.md"
  done
  f=$files/gemma4-26b-a4b-q4_k_m.gguf
  timeout 300 python3 -m app.cli bench "$f" --device cuda --cpu-moe -p 512 -n 64 -r ${REPS:-3} | tail -n 2 \
    | tee -a "$OUT/gemma4_host_ours.md"
  [ -x "$peer" ] && timeout 300 "$peer" -m "$f" -ngl 99 -fa 1 -ot exps=CPU -t 16 -p 512 -n 64 -r ${REPS:-3} 2>/dev/null \
    | grep -E "pp512|tg64" | tee -a "$OUT/gemma4_host_llamacpp.md" ;;
vram)  # issue 5: peak VRAM of llama3-8b q4_k_m at ctx 4096 (a full 1024-token chunk, then decoding) vs file + KV + 10%
  f=$files/llama3-8b-q4_k_m.gguf
  [ -e "$f" ] || python3 tests/synth_gguf.py "$f" --preset llama3-8b --ftype q4_k_m
  python3 - "$f" <<'PY' | tee -a "$OUT/vram.md"
import os, sys, threading, time
import cupy as cp
from inference import load
from inference.placement import kv_bytes_per_layer
free0, total = cp.cuda.runtime.memGetInfo()
peak = [0]
def watch():  # memGetInfo every ms: what the card had in use beyond what it had before the load
    while not done:
        peak[0] = max(peak[0], free0 - cp.cuda.runtime.memGetInfo()[0]); time.sleep(0.001)
done = False
threading.Thread(target=watch, daemon=True).start()
e = load(sys.argv[1], device="cuda", ctx=4096)
list(e.generate(list(range(100, 1124)), max_tokens=129, temperature=0))
list(e.generate(list(range(200, 3200)), max_tokens=129, temperature=0))
done = True; time.sleep(0.01)
file, kv = os.path.getsize(sys.argv[1]), e.config.n_layers * kv_bytes_per_layer(e.config, 4096)
print(f"llama3-8b q4_k_m ctx 4096: peak VRAM in use {peak[0] / 2**30:.3f} GiB (CUDA context excluded), "
      f"file + KV = {(file + kv) / 2**30:.3f} GiB, ratio {peak[0] / (file + kv):.3f} (limit 1.10)")
PY
  ;;
*) echo "usage: device_bench.sh synth | run | hybrid | moe | moe_host | iq_synth | iq | oss_host | big_synth | oss120_host | gemma4 | vram" >&2
   exit 2 ;;
esac
