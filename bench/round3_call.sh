#!/usr/bin/env bash
# Round 3's GPU calls (issue #20), each measurement with its own time budget, results appended to $OUT as
# they finish (a call cut off at its limit still returns what it measured). Carry `.whl` and `.bench`.
#   bash bench/round3_call.sh 1|2|3
# 1: default, fp8, plain TRL, freeze_vision's 3 epochs, the FP8 kernel check, the Ray Train job start.
# 2: default, plain TRL, tutorial, fp8, freeze_vision's 3 epochs (call 1's rows failed in the model load).
# 3: default, the FP8 vs bf16 loss over 200 steps (reduced model), freeze_vision with 12 loader processes.
set -uo pipefail
. bench/device_env.sh
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
T0=$(date +%s)
log() { echo "[round3 +$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/timeline.log"; }
row() {  # row NAME RECIPE TIMEOUT [bench.py run options...] [-- trainer flags...]
  local name=$1 recipe=$2 budget=$3; shift 3
  log "start $name (budget ${budget}s)"
  timeout "$budget" python3 bench/bench.py run --recipe "$recipe" --name "$name" --out "$OUT/results.jsonl" "$@" \
    >>"$OUT/bench.log" 2>&1 || log "$name failed or timed out (rc $?)"
  log "end $name"
}
e2e() {  # e2e NAME TIMEOUT
  log "start $1"
  rm -rf /tmp/e2e-1
  E2E_ROWS=700 E2E_STEPS=8 timeout "$2" bash bench/e2e_ray.sh 1 --per_device_train_batch_size=16 \
    --global_batch_size=64 --sample_rows=0 >"$OUT/$1.log" 2>&1 || log "$1 failed or timed out (rc $?)"
  grep -A12 "gemma3-ray job start:" "$OUT/$1.log" | head -14 | tee -a "$OUT/timeline.log"
  log "end $1"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/timeline.log"
STEPS=(--warmup 1 --steps 3 --phase_steps 1)
case "${1:-1}" in
  1)
    log "start weights"; timeout 120 python3 bench/bench.py data --rows 1345 >>"$OUT/bench.log" 2>&1 || log "weights failed"
    log "start fp8_check"; timeout 45 python3 bench/fp8_check.py --out "$OUT/fp8-check.json" >>"$OUT/bench.log" 2>&1 \
      || log "fp8_check failed (rc $?)"
    row default default 110 "${STEPS[@]}"
    row fp8 fp8 110 "${STEPS[@]}"
    row plain_trl plain_trl 110 "${STEPS[@]}"
    row freeze_vision_3ep freeze_vision 160 --epochs 3 --rows 1345 --warmup 1
    e2e e2e-call1 140
    ;;
  2)
    log "start weights"; timeout 120 python3 bench/bench.py data --rows 1345 >>"$OUT/bench.log" 2>&1 || log "weights failed"
    row default default 100 "${STEPS[@]}"
    row plain_trl plain_trl 100 "${STEPS[@]}"
    row tutorial tutorial 110 "${STEPS[@]}"
    row fp8 fp8 100 "${STEPS[@]}"
    row freeze_vision_3ep freeze_vision 160 --epochs 3 --rows 1345 --warmup 1
    ;;
  3)
    log "start weights"; timeout 120 python3 bench/bench.py data --rows 1345 >>"$OUT/bench.log" 2>&1 || log "weights failed"
    row default default 150 "${STEPS[@]}"
    for r in default fp8; do  # the same 200 batches of 8 (400 rows, 4 epochs) on 2 + 2 layers of the 4B model
      row "loss200_$r" "$r" 60 --layers 2,2 --rows 400 --warmup 1 --steps 199 --phase_steps 0 \
        -- --per_device_train_batch_size=8 --global_batch_size=8
    done
    row freeze_vision_3ep freeze_vision 170 --epochs 3 --rows 1345 --warmup 1 -- --dataloader_num_workers=12
    ;;
esac
python3 bench/report.py "$OUT/results.jsonl" >"$OUT/report.md" 2>&1 || true
log "done"
