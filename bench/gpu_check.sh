#!/usr/bin/env bash
# The whole GPU check in one go, on a machine with a GPU (NVIDIA, or AMD with ROCm):
#   1. builds gnomon with the GPU backend (editable install, no network);
#   2. runs the `gpu` tests (every op against the CPU op; the engine token-identical to the CPU);
#   3. measures the performance goals against their baselines (bench/gpu_goals.py);
#   4. runs `gnomon bench --device cuda` suite by suite, cold L2, each under a time cap;
# and writes its log and the results JSON into $OUT when that is set (else ./gpu-check/).
# Meant to finish in under 5 minutes on an H200. Usage: bench/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
status=0
step() { echo; echo "== $* ($(date +%T))"; }

if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
  backend=cuda
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.')
  archs=(-C "cmake.define.CMAKE_CUDA_ARCHITECTURES=${arch:-90}")
else
  backend=hip
  archs=()
fi
commit=$(git rev-parse HEAD 2> /dev/null || echo 0000000000000000000000000000000000000000)

step "build (GNOMON_GPU=$backend ${archs[*]})"
timeout 600 pip install --no-build-isolation --no-deps -e . -C cmake.define.GNOMON_GPU=$backend \
  "${archs[@]}" -C build-dir=build/gpu || { echo "BUILD FAILED"; exit 1; }
python -m gnomon.cli info

step "gpu tests"
timeout 180 python -m pytest -q -m gpu -p no:cacheprovider tests/ops/test_gpu.py \
  tests/engine/test_gpu_engine.py || status=1

step "performance goals (bench/gpu_goals.py)"
timeout 120 python bench/gpu_goals.py --out "$OUT/goals.json" || status=1

for suite in attention moe mxfp4 norm; do
  step "gnomon bench --device cuda --suite $suite"
  timeout 60 python -m gnomon.cli bench --device cuda --suite "$suite" --mode cold \
    --commit "$commit" --out "$OUT/bench-$suite.json" || status=1
done

step "done (status $status)"
exit $status
