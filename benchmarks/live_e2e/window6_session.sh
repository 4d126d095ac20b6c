#!/usr/bin/env bash
# One H200 command (session 42): one more trace window no run had served (400-430 s) for Mixtral under the three
# policies and OLMoE at 1.5x under two: out of sample for every price the prediction now reads from measurements
# (the MoE graph table, the step host time, the eager issue time). Everything under $OUT comes back as a tarball.
#   KERNEL_GYM_COMMIT=<tree> OUT=... bash benchmarks/live_e2e/window6_session.sh
source benchmarks/live_e2e/session_common.sh
POL=default,vllm-table,table:benchmarks/live_replay/inputs/dispatch_table.json
log "Mixtral window 6 (400-430 s), $(left) s left"
timeout $(( $(left) - 200 )) python3 benchmarks/live_e2e/run.py --out "$E/window6" --start-s 400 --seconds 30 \
  --rate 1.0 --budget-s 250 --policy-budget-s 80 --policies $POL > "$E/window6.log" 2>&1
log "window 6: exit $? $(grep -a 'tok/s' "$E/window6.log" | tr '\n' ' ')"
log "OLMoE window 6 x1.5, $(left) s left"
timeout $(( $(left) - 10 )) python3 benchmarks/live_e2e/run.py --out "$E/olmoe_w6" --model olmoe-1b-7b --vocab 50304 \
  --start-s 400 --seconds 30 --rate 1.5 --budget-s 150 --policy-budget-s 75 --policies default,vllm-table \
  > "$E/olmoe_w6.log" 2>&1
log "OLMoE window 6: exit $? $(grep -a 'tok/s' "$E/olmoe_w6.log" | tr '\n' ' ')"
finish
