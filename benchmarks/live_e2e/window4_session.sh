#!/usr/bin/env bash
# One H200 command (session 41): window 4 (200-230 s of the trace) again after the preemption fix, Mixtral with three
# policies, then OLMoE's vllm-table over the same window at 1.5x with the budget to finish it.
#   KERNEL_GYM_COMMIT=<tree> OUT=... bash benchmarks/live_e2e/window4_session.sh
source benchmarks/live_e2e/session_common.sh
log "Mixtral window 4 (200-230 s)"
timeout 420 python3 benchmarks/live_e2e/run.py --out "$E/window4" --start-s 200 --seconds 30 --rate 1.0 \
  --budget-s 300 --policy-budget-s 110 \
  --policies vllm-table,table:benchmarks/live_replay/inputs/dispatch_table.json,default > "$E/window4.log" 2>&1
log "window 4: exit $? $(grep -a 'tok/s' "$E/window4.log" | tr '\n' ' ')"
if [ "$(left)" -gt 90 ]; then
  timeout $(( $(left) - 5 )) python3 benchmarks/live_e2e/run.py --out "$E/olmoe_w4_vllm" --model olmoe-1b-7b \
    --vocab 50304 --start-s 200 --seconds 30 --rate 1.5 --budget-s 30 --policy-budget-s $(( $(left) - 30 )) \
    --policies vllm-table > "$E/olmoe_w4_vllm.log" 2>&1
  log "OLMoE vllm-table: exit $? $(grep -a 'tok/s' "$E/olmoe_w4_vllm.log" | tr '\n' ' ')"
fi
finish
