#!/usr/bin/env bash
# One GPU command (session 54): does the host issue calibration measured before a replay (run.py's calibrate_issue:
# the mixed workload --predict reads, and the single chunk) match the issue time of the replay's own eager steps?
# OLMoE (its eager steps wait on the host) serves both held-out windows again, each policy calibrated first; then
# host_issue.py on the CPU sets the replay's issue times beside the calibrations. On an H200 these are also repeats
# of heldout_32cded3/code_olmoe and heldout_bffac01/code540_olmoe.
#   KERNEL_GYM_COMMIT=<tree> OUT=... bash benchmarks/live_e2e/issue_session.sh
source benchmarks/live_e2e/session_common.sh
TRACE=benchmarks/live_e2e/heldout_trace/AzureLLMInferenceTrace_code_first10min.csv
for w in "code540_olmoe 540 1.0" "code_olmoe 300 1.5"; do
  set -- $w
  log "OLMoE $1 (from $2 s, x$3), $(left) s left"
  timeout $(( $(left) - 10 )) python3 benchmarks/live_e2e/run.py --out "$E/$1" --model olmoe-1b-7b --vocab 50304 \
    --trace "$TRACE" --start-s "$2" --seconds 30 --rate "$3" --budget-s 200 --policy-budget-s 80 \
    --policies default,vllm-table > "$E/$1.log" 2>&1
  log "$1: exit $? $(grep -a 'tok/s' "$E/$1.log" | tr '\n' ' ')"
done
finish
