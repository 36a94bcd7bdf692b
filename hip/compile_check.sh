#!/usr/bin/env bash
# Compiles every hip/*.hip for both vendors: nvcc for sm_90 and Debian's hipcc for gfx90a (the
# newest it targets). CI runs it on a CPU-only machine, so a change that breaks either compiler
# fails there. Usage: hip/compile_check.sh [file.hip ...]   (default: all of hip/*.hip)
set -euo pipefail
cd "$(dirname "$0")/.."
files=("$@")
if [ ${#files[@]} -eq 0 ]; then files=(hip/*.hip); fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(-std=c++17 -O3 -Icsrc -Ihip -DGNOMON_HAS_GPU)
for f in "${files[@]}"; do
  name=$(basename "$f" .hip)
  echo "nvcc  sm_90   $f"
  nvcc -x cu -arch=sm_90 --expt-relaxed-constexpr -Xcompiler -Wall "${common[@]}" \
    -DGNOMON_WITH_CUDA -DGNOMON_GPU_ARCHS='"90"' -c "$f" -o "$out/$name.cuda.o"
  echo "hipcc gfx90a  $f"
  HIP_PLATFORM=amd hipcc -x hip --offload-arch=gfx90a -fPIC -Wall "${common[@]}" \
    -DGNOMON_WITH_HIP -DGNOMON_GPU_ARCHS='"gfx90a"' -c "$f" -o "$out/$name.hip.o"
done
echo "compiled ${#files[@]} file(s) with nvcc and hipcc"
