#!/usr/bin/env bash
# One H200 command (session 41): Mixtral window 4 a second time (vllm-table, learned table: the run-to-run spread on
# a loaded window), then OLMoE over window 3 (60-180 s of the trace at 1.5x), which no OLMoE run had served.
#   KERNEL_GYM_COMMIT=<tree> OUT=... bash benchmarks/live_e2e/repeat_session.sh
source benchmarks/live_e2e/session_common.sh
log "Mixtral window 4, run 2"
timeout 260 python3 benchmarks/live_e2e/run.py --out "$E/window4_rep2" --start-s 200 --seconds 30 --rate 1.0 \
  --budget-s 150 --policy-budget-s 100 \
  --policies vllm-table,table:benchmarks/live_replay/inputs/dispatch_table.json > "$E/window4_rep2.log" 2>&1
log "window 4 run 2: exit $? $(grep -a 'tok/s' "$E/window4_rep2.log" | tr '\n' ' ')"
log "OLMoE window 3 x1.5, $(left) s left"
timeout $(( $(left) - 5 )) python3 benchmarks/live_e2e/run.py --out "$E/olmoe_w3" --model olmoe-1b-7b --vocab 50304 \
  --start-s 60 --seconds 120 --rate 1.5 --budget-s $(( $(left) / 2 + 20 )) --policy-budget-s $(( ($(left) - 40) / 2 )) \
  --policies vllm-table,default > "$E/olmoe_w3.log" 2>&1
log "OLMoE window 3: exit $? $(grep -a 'tok/s' "$E/olmoe_w3.log" | tr '\n' ' ')"
finish
