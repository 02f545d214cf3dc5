#!/usr/bin/env bash
# Round 4's GPU calls (issue #26), each measurement with its own time budget, results appended to $OUT as
# they finish (a call cut off at its limit still returns what it measured). Carry `.whl` and `.bench`.
#   bash bench/round4_call.sh 1|2
# 1: the kernel check (fused LoRA correctness, tile sweep, LM attention candidates), default with --profile,
#    freeze_vision's 3 epochs.
# 2: default with --profile, plain TRL, freeze_vision's 3 epochs (the headline: one call).
# 3: default with --profile and plain TRL, after call 2's profile (lean step: contiguous SigLIP embeddings, the
#    NaN filter on the GPU).
# 4: the fast recipe on 2 + 2 layers of the 4B model, a functional check only (no timing).
set -uo pipefail
. bench/device_env.sh
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
T0=$(date +%s)
log() { echo "[round4 +$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/timeline.log"; }
row() {  # row NAME RECIPE TIMEOUT [bench.py run options...] [-- trainer flags...]
  local name=$1 recipe=$2 budget=$3; shift 3
  local left=$(( ${CALL_BUDGET:-585} - ($(date +%s) - T0) ))
  [ "$left" -lt "$budget" ] && budget=$left
  [ "$budget" -lt 30 ] && { log "skip $name (${budget}s left)"; return; }
  log "start $name (budget ${budget}s)"
  timeout "$budget" python3 bench/bench.py run --recipe "$recipe" --name "$name" --out "$OUT/results.jsonl" "$@" \
    >>"$OUT/bench.log" 2>&1 || log "$name failed or timed out (rc $?)"
  log "end $name"
}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a "$OUT/timeline.log"
STEPS=(--warmup 1 --steps 3 --phase_steps 0)
weights() { log "start weights"; timeout 120 python3 bench/bench.py data --rows 1345 >>"$OUT/bench.log" 2>&1 || log "weights failed"; }
case "${1:-1}" in
  1)
    weights
    log "start kernel_check"; timeout 150 python3 bench/kernel_check.py --out "$OUT/kernel-check.json" \
      >"$OUT/kernel-check.log" 2>&1 || log "kernel_check failed or timed out (rc $?)"
    row default default 190 "${STEPS[@]}" --profile
    row freeze_vision_3ep freeze_vision 170 --epochs 3 --rows 1345 --warmup 1
    ;;
  2)
    weights
    row default default 190 "${STEPS[@]}" --profile
    row plain_trl plain_trl 110 "${STEPS[@]}"
    row freeze_vision_3ep freeze_vision 160 --epochs 3 --rows 1345 --warmup 1
    ;;
  3)
    weights
    row default default 170 "${STEPS[@]}" --profile
    row plain_trl plain_trl 100 "${STEPS[@]}"
    ;;
  4)  # functional check of the fast recipe on 2 + 2 layers of the 4B model (no timing): the lean step's fixes
    row smoke_default default 80 --layers 2,2 --rows 128 --warmup 1 --steps 2 --phase_steps 0
    ;;
esac
python3 bench/report.py "$OUT/results.jsonl" >"$OUT/report.md" 2>&1 || true
log "done"
