#!/usr/bin/env bash
# One H200 command (session 55), three checks in the order of their worth:
# 1. The learned table with the Dispatcher fixed (a config moved onto the serving KV layout is remembered per shape;
#    before, the first shape's move answered every later one, so up to 35% of a learned table's decode steps in the
#    committed runs were served a config that depended on earlier calls). Mixtral, seed 0's table, on the held-out
#    code window from 540 s, as heldout_bffac01/code540_mixtral served it before the fix. Every 8th step is profiled
#    again, eagerly and as its graph replays (band_check.py --profiled: is the MoE graph table's 1.14-1.24x over the
#    eager profile's kernels there in the graph replay too?).
# 2. The decode graph table for the configs the fixed chooser serves on both held-out Mixtral windows and no table
#    timed yet (decode_graph_served_plan.json: decode_graph_table.py --served-by), most served first: the prediction
#    priced them at the default config's time (the fallback for a config the data cannot time).
# 3. OLMoE on the held-out windows with what time is left, each policy's host issue time calibrated first: does the
#    mixed calibration match the replay's own eager issue time (host_issue.py)?
#   KERNEL_GYM_COMMIT=<tree> OUT=... bash benchmarks/live_e2e/dispatch_session.sh
source benchmarks/live_e2e/session_common.sh
TRACE=benchmarks/live_e2e/heldout_trace/AzureLLMInferenceTrace_code_first10min.csv
log "Mixtral, learned table, code window from 540 s, $(left) s left"
timeout 150 python3 benchmarks/live_e2e/run.py --out "$E/code540_mixtral" --trace "$TRACE" --start-s 540 \
  --seconds 30 --rate 1.0 --budget-s 140 --policy-budget-s 110 \
  --profile-every 8 \
  --policies table:benchmarks/live_e2e/tables/mixtral_seed0/dispatch_table.json > "$E/code540_mixtral.log" 2>&1
log "Mixtral: exit $? $(grep -a 'tok/s' "$E/code540_mixtral.log" | tr '\n' ' ')"
log "decode graph table, the served plan, $(left) s left"
timeout 260 python3 benchmarks/live_e2e/decode_graph_table.py --out "$E/decode_graph" \
  --plan benchmarks/live_e2e/decode_graph_served_plan.json --budget-s 230 > "$E/decode_graph.log" 2>&1
log "decode graph: exit $? $(tail -n 3 "$E/decode_graph.log" | tr '\n' ' ')"
for w in "code540_olmoe 540 1.0" "code_olmoe 300 1.5"; do
  set -- $w
  [ "$(left)" -lt 70 ] && { log "$1: skipped, $(left) s left"; continue; }
  log "OLMoE $1 (from $2 s, x$3), $(left) s left"
  timeout $(( $(left) - 5 )) python3 benchmarks/live_e2e/run.py --out "$E/$1" --model olmoe-1b-7b --vocab 50304 \
    --trace "$TRACE" --start-s "$2" --seconds 30 --rate "$3" --budget-s $(( $(left) - 60 )) --policy-budget-s 60 \
    --policies default,vllm-table > "$E/$1.log" 2>&1
  log "$1: exit $? $(grep -a 'tok/s' "$E/$1.log" | tr '\n' ' ')"
done
finish
