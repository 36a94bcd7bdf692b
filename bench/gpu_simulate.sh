#!/usr/bin/env bash
# The GPU check, second call: the simulator against gnomon's own engine on this GPU, within
# 600 s (caps add up to 570 s). It installs the wheel the first call (bench/gpu_check.sh) built,
# then runs `gnomon validate --device cuda` on the two about-1B presets: each calibrates on
# this GPU (bench sweep, GEMM sweep, calibration workload through the real engine), runs a
# held-out workload for real three times and simulated twice, and reports the calibrated
# predictor's step, TTFT, TPOT and throughput errors against their noise floors, and beside
# them the uncalibrated roofline's (the `gnomon` engine profile's host cost; its `roofline`
# part). Everything lands in $OUT (else ./gpu-check/) as it is made.
# Usage: bench/gpu_simulate.sh WHEEL
set -uo pipefail
cd "$(dirname "$0")/.."
wheel=${1:?usage: bench/gpu_simulate.sh WHEEL (the first call\'s gnomon-*.whl)}
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_simulate.log") 2>&1
status=0
step() { echo; echo "== $* ($(date +%T))"; }
commit=$(git rev-parse HEAD 2> /dev/null || echo 0000000000000000000000000000000000000000)

step "install $wheel"
timeout 30 pip install --no-deps --force-reinstall "$wheel" || { echo "INSTALL FAILED"; exit 1; }

for model in llama-1b gpt-oss-1b; do
  step "gnomon validate --device cuda --model $model"
  timeout 270 python -m gnomon.cli validate --device cuda --model "$model" --commit "$commit" \
    --no-goal-gate --out "$OUT/validate-$model.json" || status=1
done

step "done (status $status)"
exit $status
