#!/usr/bin/env bash
# Runs on the GPU machine (the `device` tool), from the repository root, with `.whl` (the package bundle
# from ../shared/device/make-bundle.sh) and `.bench/assets.tar.xz` (bench.py prepare, packed) carried.
#   bench/device.sh RECIPE_SPEC...   where RECIPE_SPEC is "name:recipe[:flag,flag,...]"
set -euo pipefail
. bench/device_env.sh
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for spec in "$@"; do
  IFS=: read -r name recipe flags <<<"$spec"
  extra=()
  if [ -n "${flags:-}" ]; then IFS=, read -r -a extra <<<"$flags"; fi
  timeout "${RECIPE_TIMEOUT:-240}" python3 bench/bench.py run --recipe "$recipe" --name "$name" \
    --warmup "${WARMUP:-2}" --steps "${STEPS:-6}" --phase_steps "${PHASE_STEPS:-2}" \
    --out "$OUT/results.jsonl" -- "${extra[@]/#/--}" || echo "recipe $name failed or timed out"
done
