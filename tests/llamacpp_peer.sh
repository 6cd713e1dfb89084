#!/bin/bash
# The peer for side-by-side benchmarks: llama.cpp's llama-bench and llama-server (its speculative decoding:
# tests/inference/bench_llamacpp_spec.py), built with CUDA on the device machine from the llama.cpp copy inside the
# llama-cpp-python sdist (a registry package).
#
#   here:        bash tests/llamacpp_peer.sh prepare .carry   # .carry/ is ignored (.gitignore); needs PyPI
#   device run:  bash tests/llamacpp_peer.sh build .carry     (carry [".carry"]; ~5 min on 16 cores)
#                it prints the paths of BENCH (llama-bench) and SERVER (llama-server)
#   then:        BENCH -m FILE.gguf -ngl 99 -fa 1 -p 512 -n 128
#                python3 tests/inference/bench_llamacpp_spec.py SERVER FILE.gguf --synth 0.7
# The build runs detached, so a build cut by the command limit goes on while the machine stays warm:
# call `build` again and it waits for the same build instead of starting another.
set -eu
cmd=${1:?prepare|build}; dir=${2:?dir}
ver=0.3.36
case $cmd in
prepare)
  mkdir -p "$dir"; tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --no-binary :all: llama-cpp-python==$ver -d "$tmp"
  tar xzf "$tmp"/llama_cpp_python-$ver.tar.gz -C "$tmp"
  src="$tmp/llama_cpp_python-$ver/vendor/llama.cpp"
  rm -rf "$src"/{models,docs,media,benches,.github,conversion,gguf-py} "$src"/examples/*
  # the server's web UI: its build files alone (LLAMA_BUILD_UI=OFF builds the server without the assets)
  find "$src/tools/ui" -mindepth 1 -maxdepth 1 ! -name CMakeLists.txt ! -name '*.in' ! -name sources.cmake \
    -exec rm -rf {} +
  for b in virtgpu cann openvino webgpu et metal hexagon sycl vulkan opencl zdnn musa rpc blas kompute; do
    rm -rf "$src/ggml/src/ggml-$b"; done
  tar cJf "$dir/llamacpp.tar.xz" -C "$(dirname "$src")" llama.cpp
  rm -rf "$tmp"
  ls -la "$dir/llamacpp.tar.xz" ;;
build)
  mkdir -p /tmp/peer; cd /tmp/peer
  if [ ! -e started ]; then
    touch started; tar xJf "$OLDPWD/$dir/llamacpp.tar.xz"
    setsid nohup bash -c "cmake -S llama.cpp -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF \
      -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DCMAKE_BUILD_TYPE=Release > cfg.log 2>&1 \
      && cmake --build build -j \$(nproc) --target llama-bench llama-server > build.log 2>&1; echo \$? > done" >/dev/null 2>&1 &
  fi
  for _ in $(seq 1 110); do [ -e done ] && break; sleep 5; done
  if [ -e done ]; then tail -2 build.log; echo "$PWD"/build/bin/llama-bench "$PWD"/build/bin/llama-server
  else echo "still building: call build again"; fi ;;
esac
