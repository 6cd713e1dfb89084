#!/usr/bin/env bash
# The real test models on the GPU machine, which has no model packages and takes at most 64 MiB a call.
# Here:   cat SmolLM2.gguf gemma3.gguf | split -b 52000000 -d -a 1 - part; put part<i> in .f<i>/ (ignored).
# Device: one call per part while the machine stays warm: `bash tests/device_models.sh add .f<i>`,
#         then `source tests/device_models.sh env` before pytest sets GGUF_CHAT_TEST_SMOLLM2/GEMMA3.
SMOLLM2_BYTES=98362432
GEMMA3_BYTES=253113024
store=${TMPDIR:-/tmp}/gguf-chat-models
case ${1:-} in
add) mkdir -p $store && cp "$2"/part* $store/ && ls $store ;;
env)
  if [ ! -e $store/gemma3.gguf ]; then
    cat $store/part* > $store/all.bin
    [ "$(stat -c %s $store/all.bin)" = $((SMOLLM2_BYTES + GEMMA3_BYTES)) ] || { echo "parts missing" >&2; return 1; }
    head -c $SMOLLM2_BYTES $store/all.bin > $store/smollm2.gguf
    tail -c $GEMMA3_BYTES $store/all.bin > $store/gemma3.gguf
    rm $store/all.bin
  fi
  export GGUF_CHAT_TEST_SMOLLM2=$store/smollm2.gguf GGUF_CHAT_TEST_GEMMA3=$store/gemma3.gguf ;;
*) echo "usage: device_models.sh add DIR | env" >&2; exit 2 ;;
esac
