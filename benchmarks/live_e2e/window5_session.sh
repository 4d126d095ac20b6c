#!/usr/bin/env bash
# One H200 command (session 42): a trace window no run had served (300-330 s) for Mixtral under the three policies
# and OLMoE at 1.5x under two, the out-of-sample check of the graph-priced prediction; last a profiled OLMoE window 1
# (every 10th step) whose records carry the host's issue time (issue_s) beside the GPU span (gpu_s), for the eager
# steps' price. Everything under $OUT comes back as a tarball and the log.
#   KERNEL_GYM_COMMIT=<tree> OUT=... bash benchmarks/live_e2e/window5_session.sh
source benchmarks/live_e2e/session_common.sh
POL=default,vllm-table,table:benchmarks/live_replay/inputs/dispatch_table.json
log "Mixtral window 5 (300-330 s), $(left) s left"
timeout $(( $(left) - 250 )) python3 benchmarks/live_e2e/run.py --out "$E/window5" --start-s 300 --seconds 30 \
  --rate 1.0 --budget-s 250 --policy-budget-s 80 --policies $POL > "$E/window5.log" 2>&1
log "window 5: exit $? $(grep -a 'tok/s' "$E/window5.log" | tr '\n' ' ')"
log "OLMoE window 5 x1.5, $(left) s left"
timeout $(( $(left) - 80 )) python3 benchmarks/live_e2e/run.py --out "$E/olmoe_w5" --model olmoe-1b-7b --vocab 50304 \
  --start-s 300 --seconds 30 --rate 1.5 --budget-s 150 --policy-budget-s 75 --policies default,vllm-table \
  > "$E/olmoe_w5.log" 2>&1
log "OLMoE window 5: exit $? $(grep -a 'tok/s' "$E/olmoe_w5.log" | tr '\n' ' ')"
if [ "$(left)" -gt 50 ]; then
  log "OLMoE window 1 x1.5, vllm-table, profiled, $(left) s left"
  timeout $(( $(left) - 5 )) python3 benchmarks/live_e2e/run.py --out "$E/olmoe_prof" --model olmoe-1b-7b \
    --vocab 50304 --rate 1.5 --budget-s 20 --policy-budget-s $(( $(left) - 25 )) --profile-every 10 \
    --policies vllm-table > "$E/olmoe_prof.log" 2>&1
  log "profiled: exit $? $(grep -a 'tok/s' "$E/olmoe_prof.log" | tr '\n' ' ')"
fi
finish
