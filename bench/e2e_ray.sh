#!/usr/bin/env bash
# The real job under Ray Train on the GPU machine: vision_train.py's own main (TorchTrainer, checkpoints,
# summary) on the bench's random 4B model and synthetic rows (bench.py run creates both first).
#   bench/e2e_ray.sh NUM_WORKERS [extra trainer flags...]
set -euo pipefail
. bench/device_env.sh
n=$1; shift
W=${BENCH_WORK:-/tmp/gemma3-bench}
export RAY_AUTH_MODE=disabled  # a private single-machine cluster started by this job
python3 trainer/vision_train.py --model_id="$W/gemma3-4b-random" --dataset_name="$(ls "$W"/products-*.parquet | tail -n1)" \
  --num_workers="$n" --max_steps="${E2E_STEPS:-12}" --save_strategy=steps --save_steps=6 --logging_steps=2 \
  --eval_fraction=0.1 --storage_path="/tmp/e2e-$n" "$@"
