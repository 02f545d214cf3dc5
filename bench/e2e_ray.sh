#!/usr/bin/env bash
# A script, run bare on the GPU machine (bash, from the repository root).
# The real job under Ray Train: vision_train.py's own main (Ray Train, checkpoints, summary) on the bench's
# random 4B model and synthetic rows.
#   bench/e2e_ray.sh NUM_WORKERS [extra trainer flags...]
# Env: E2E_ROWS (600), E2E_STEPS (30). Prints the job start split (gemma3-ray job start: ...) at the end. Throughput per log interval lands in /tmp/e2e-N/runs/<run>/metrics.jsonl (the log's first line names the run).
set -euo pipefail
. bench/device_env.sh
n=$1; shift
W=${BENCH_WORK:-/tmp/gemma3-bench}
data=$(python3 -m bench.bench data --rows "${E2E_ROWS:-600}" | tail -n1)
steps=${E2E_STEPS:-30}
export RAY_AUTH_MODE=disabled  # a private single-machine cluster started by this job
# No Jobs API here: the job start split (trainer/job/startup_timing.py) counts from this launch.
export GEMMA3_RAY_SUBMITTED_AT=$(date +%s.%N)
python3 -m trainer.vision_train --model_id="$W/gemma3-4b-random" --dataset_name="$data" \
  --num_workers="$n" --max_steps="$steps" --save_strategy=steps --save_steps="$steps" --logging_steps=5 \
  --eval_fraction=0.05 --storage_path="/tmp/e2e-$n" "$@"
# The job start split again, from the run's summary.json (the log printed it at the first step).
summary=$(ls -t /tmp/e2e-"$n"/runs/*/summary.json 2>/dev/null | head -n1 || true)
if [ -n "$summary" ]; then python3 -m trainer.job.startup_timing "$summary" || true; fi
