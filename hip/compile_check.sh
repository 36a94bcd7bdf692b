#!/usr/bin/env bash
# Builds the whole extension once per GPU vendor through the project's own CMake path: nvcc for
# NVIDIA sm_90 (CMake's CUDA language over the .hip files) and hipcc for AMD gfx90a (Debian's
# hipcc, the newest target it has), then checks that every GPU launcher of hip/kernels.h was
# defined and linked. No GPU is needed; CI runs this on a CPU-only machine, so a change that
# breaks either compiler fails there. Usage: hip/compile_check.sh [cuda|hip ...]
set -euo pipefail
cd "$(dirname "$0")/.."
backends=("$@")
if [ ${#backends[@]} -eq 0 ]; then backends=(cuda hip); fi
generator=()
if command -v ninja > /dev/null 2>&1; then generator=(-G Ninja); fi
for backend in "${backends[@]}"; do
  case "$backend" in
    cuda) archs=(-DCMAKE_CUDA_ARCHITECTURES=90) ;;
    hip) archs=(-DCMAKE_HIP_ARCHITECTURES=gfx90a) ;;
    *) echo "compile_check: unknown backend '$backend' (cuda or hip)" >&2; exit 2 ;;
  esac
  dir="build/check-$backend"
  echo "== GNOMON_GPU=$backend ${archs[*]}"
  cmake -S . -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DGNOMON_GPU="$backend" \
    "${archs[@]}" > /dev/null
  cmake --build "$dir" -j "$(nproc)"
  module=$(ls "$dir"/_C*.so)
  missing=$(nm -D --undefined-only "$module" | c++filt | grep 'gnomon::gpu::' || true)
  if [ -n "$missing" ]; then
    echo "compile_check: $backend build lacks GPU launchers:" >&2
    echo "$missing" >&2
    exit 1
  fi
  echo "== $backend: every GPU launcher linked"
done
