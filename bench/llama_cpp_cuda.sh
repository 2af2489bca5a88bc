#!/usr/bin/env bash
# llama.cpp's CUDA build, the peer of bench/llama_decode.py --llama-bench (issue 24): llama-bench
# built from the llama.cpp source that llama-cpp-python's sdist bundles (vendor/llama.cpp), for
# the GPU of the machine it runs on. Takes the sdist (or a tarball of its llama.cpp folder) and
# a build folder; prints the binary's path last.
#
#   python3 -m pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/lcp
#   bench/llama_cpp_cuda.sh /tmp/lcp/llama_cpp_python-0.3.36.tar.gz /tmp/llama-cpp-cuda
#   python3 bench/llama_decode.py --llama-bench /tmp/llama-cpp-cuda/build/bin/llama-bench
#
# The sdist is 77 MB, mostly llama.cpp's models/ (vocabularies for its tests) and docs/: a
# tarball of llama.cpp/ without them (about 9 MB) builds the same binary. On the H200
# machine (16 cores, CUDA architecture 90 only) the build takes a few minutes.
set -euo pipefail
src_tar=${1:?usage: llama_cpp_cuda.sh SDIST_OR_TARBALL BUILD_DIR}
dir=${2:?usage: llama_cpp_cuda.sh SDIST_OR_TARBALL BUILD_DIR}
cuda=${CUDA:-ON}   # CUDA=OFF: a CPU build of the same binary (checks this script where no GPU is)
arch=native
if [ "$cuda" = ON ]; then
    arch=${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)}
fi
mkdir -p "$dir"
if [ ! -f "$dir/src/CMakeLists.txt" ]; then
    rm -rf "$dir/unpack" "$dir/src"
    mkdir -p "$dir/unpack"
    tar -xf "$src_tar" -C "$dir/unpack"
    top=$(dirname "$(find "$dir/unpack" -maxdepth 4 -type d -name ggml -path '*llama.cpp/ggml' | head -1)")
    [ -f "$top/CMakeLists.txt" ] || { echo "no llama.cpp source in $src_tar" >&2; exit 1; }
    mv "$top" "$dir/src"
    rm -rf "$dir/unpack"
fi
cmake -S "$dir/src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA="$cuda" \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >"$dir/cmake.log" 2>&1 ||
    { tail -20 "$dir/cmake.log" >&2; exit 1; }
cmake --build "$dir/build" --target llama-bench -j "${JOBS:-$(nproc)}" >"$dir/build.log" 2>&1 ||
    { tail -30 "$dir/build.log" >&2; exit 1; }
echo "$dir/build/bin/llama-bench"
