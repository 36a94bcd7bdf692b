#!/usr/bin/env bash
# The GPU check, first call: one command on a machine with a GPU (NVIDIA, or AMD with ROCm)
# that finishes within 600 s, every step under its own cap (they add up to 575 s):
#   1. builds a wheel of gnomon with the GPU backend for this GPU's own arch (no network) into
#      $OUT, and installs it;                                                     (240 + 30 s)
#   2. `gnomon info`;                                                                   (15 s)
#   3. the `gpu` tests (every op against the CPU op; the engine token-identical to the CPU);
#                                                                                      (120 s)
#   4. the performance goals against their baselines (bench/gpu_goals.py);            (90 s)
#   5. `gnomon bench --device cuda --mode cold --quick`, suite by suite.            (4 x 20 s)
# Everything lands in $OUT (else ./gpu-check/) the moment it exists: the log, each JSON and the
# wheel, so a run cut short still brings back what it made. bench/gpu_simulate.sh, the second
# call, installs that wheel. Usage: bench/gpu_check.sh
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
  nvidia-smi
else
  backend=hip
  archs=()
fi
commit=$(git rev-parse HEAD 2> /dev/null || echo 0000000000000000000000000000000000000000)
python -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__,
'cuda', torch.version.cuda, 'hip', torch.version.hip)"
nvcc --version 2> /dev/null | tail -2
cmake --version | head -1

step "build a wheel (GNOMON_GPU=$backend ${archs[*]})"
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) timeout 240 pip wheel --no-build-isolation --no-deps \
  -w "$OUT" -C cmake.define.GNOMON_GPU=$backend "${archs[@]}" -C build-dir=build/gpu . \
  || { echo "BUILD FAILED"; exit 1; }
timeout 30 pip install --no-deps --force-reinstall "$OUT"/gnomon-*.whl \
  || { echo "INSTALL FAILED"; exit 1; }
timeout 15 python -m gnomon.cli info --json | tee "$OUT/info.json" || status=1

step "gpu tests"
timeout 120 python -m pytest -q -m gpu -p no:cacheprovider tests/ops/test_gpu.py \
  tests/engine/test_gpu_engine.py --junitxml "$OUT/gpu-tests.xml" || status=1

step "performance goals (bench/gpu_goals.py)"
timeout 90 python bench/gpu_goals.py --out "$OUT/goals.json" || status=1

for suite in attention moe mxfp4 norm; do
  step "gnomon bench --device cuda --suite $suite"
  timeout 20 python -m gnomon.cli bench --device cuda --suite "$suite" --mode cold --quick \
    --commit "$commit" --out "$OUT/bench-$suite.json" || status=1
done

step "done (status $status)"
exit $status
