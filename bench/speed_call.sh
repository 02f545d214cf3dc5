#!/usr/bin/env bash
# The speed comparison in one GPU-machine command (`make bench` there): every row of bench/RESULTS.md,
# then the Ray Train job's steady state, then the table. Carry `.whl` and `.bench/assets.tar.xz`.
# Raw results land in $OUT (results.jsonl, bench.log, e2e.log, e2e-metrics.jsonl, e2e-summary.json).
set -uo pipefail
. bench/device_env.sh
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
export WARMUP=${WARMUP:-1} STEPS=${STEPS:-3} PHASE_STEPS=${PHASE_STEPS:-1} RECIPE_TIMEOUT=${RECIPE_TIMEOUT:-200}
bash bench/device.sh "tutorial:tutorial" "plain_trl:plain_trl" "round1:round1" "default:default" \
  >>"$OUT/bench.log" 2>&1
timeout 220 python3 bench/bench.py run --recipe freeze_vision --name freeze_vision_3ep --epochs 3 --rows 1345 \
  --warmup 1 --out "$OUT/results.jsonl" >>"$OUT/bench.log" 2>&1 || echo "freeze_vision_3ep failed or timed out"
# the Ray Train job itself (vision_train.main, loader processes, checkpoint, eval) at the default's global batch
E2E_ROWS=${E2E_ROWS:-700} E2E_STEPS=${E2E_STEPS:-10} timeout 170 bash bench/e2e_ray.sh 1 \
  --per_device_train_batch_size=16 --global_batch_size=64 >"$OUT/e2e.log" 2>&1 || echo "e2e failed"
m=$(find /tmp/e2e-1 -name metrics.jsonl | head -1); [ -n "$m" ] && cp "$m" "$OUT/e2e-metrics.jsonl"
s=$(find /tmp/e2e-1 -name summary.json | head -1); [ -n "$s" ] && cp "$s" "$OUT/e2e-summary.json"
# the fused LoRA layer alone, against round1 (same micro-batch, same batches)
bash bench/device.sh "round1_fused:round1:fused_lora=true" >>"$OUT/bench.log" 2>&1
grep -E "fused LoRA|failed|Error" "$OUT/bench.log" | cut -c1-300
tail -n 5 "$OUT/e2e.log"
python3 bench/report.py "$OUT/results.jsonl" --e2e "$OUT/e2e-metrics.jsonl"
