#!/usr/bin/env bash
# One GPU command (session 57): are the tables' prices what the live stack's kernels take, on one machine? On the H200
# the profiled graph replays put the dense ops at 1.2-1.3x their table price and the default's decode attention at
# 9-32 sequences at 1.2-1.3x (band_check.py --profiled); the tables and the profiled runs came from different
# sessions. Here one machine times the three tables for OLMoE's two policies (dense_price_check.py, moe_graph_table.py
# and decode_graph_table.py over same_gpu_*_plan.json: the configs its held-out code540 run serves) and then serves
# that run again with every 4th step profiled eagerly and as its graph replays. On the CPU, `band_check.py --profiled
# E/code540_olmoe --tables E` prices the profiled steps from this machine's tables only. Any GPU answers it (the
# machine is in machine.txt); it checks the tables' method, not the H200's prices.
#   KERNEL_GYM_COMMIT=<tree> OUT=... bash benchmarks/live_e2e/same_gpu_session.sh
# Session 58: the window, its rate, the policies and the decode plan are settable, and RAGGED=<batches> runs
# ragged_decode.py's padded and alone cases for OLMoE's default config on the same machine before the replay
# (band_check.py --ragged):
#   NAME=w5_olmoe TRACE=bundled START=300 RATE=1.5 POLICIES=default RAGGED=8,9,12,16,20,24,32 \
#   DECODE_PLAN=benchmarks/live_e2e/same_gpu_decode_plan32.json KERNEL_GYM_COMMIT=<tree> OUT=... \
#   bash benchmarks/live_e2e/same_gpu_session.sh
# (same_gpu_decode_plan32.json: decode_graph_table.py --plan ... --served-by graph_profile_h100_dd2acd0/code540_olmoe,
# window5_f269e69/olmoe_w5 --min-steps 20 --batches 1,2,4,8,16,24,32 --contexts 256,1024,4096.)
source benchmarks/live_e2e/session_common.sh
L=benchmarks/live_e2e
log "dense ops table (OLMoE)"
timeout 100 python3 $L/dense_price_check.py --models olmoe-1b-7b --out "$E/dense_ops.json" > "$E/dense.log" 2>&1
log "dense: exit $? $(tail -n 2 "$E/dense.log" | tr '\n' ' ')"
log "MoE graph table (OLMoE), $(left) s left"
timeout 100 python3 $L/moe_graph_table.py --plan $L/same_gpu_moe_plan.json --out "$E/moe_graph" --budget-s 70 \
  > "$E/moe_graph.log" 2>&1
log "moe graph: exit $? $(tail -n 2 "$E/moe_graph.log" | tr '\n' ' ')"
log "decode graph table (OLMoE), $(left) s left"
timeout 190 python3 $L/decode_graph_table.py --plan "${DECODE_PLAN:-$L/same_gpu_decode_plan.json}" \
  --out "$E/decode_graph" --budget-s 160 > "$E/decode_graph.log" 2>&1
log "decode graph: exit $? $(tail -n 2 "$E/decode_graph.log" | tr '\n' ' ')"
if [ -n "${RAGGED:-}" ]; then
  log "ragged decode launches (OLMoE, default config), $(left) s left"
  timeout 90 python3 $L/ragged_decode.py --model olmoe-1b-7b --out "$E/ragged" --cases padded,alone \
    --batches "$RAGGED" --configs "$(python3 -c 'from benchmarks.live_e2e.ragged_decode import CONFIGS
print(CONFIGS["olmoe-1b-7b"][0])')" --budget-s 70 > "$E/ragged.log" 2>&1
  log "ragged: exit $? $(grep -a 'wrote' "$E/ragged.log")"
fi
TRACE=${TRACE:-$L/heldout_trace/AzureLLMInferenceTrace_code_first10min.csv}
NAME=${NAME:-code540_olmoe}
POLICIES=${POLICIES:-default,vllm-table}
log "OLMoE $NAME, profiled every 4th step, $(left) s left"
timeout $(( $(left) - 10 )) python3 $L/run.py --out "$E/$NAME" --model olmoe-1b-7b --vocab 50304 \
  --trace "$TRACE" --start-s "${START:-540}" --seconds 30 --rate "${RATE:-1.0}" --budget-s $(( $(left) - 30 )) \
  --policy-budget-s $(( ($(left) - 40) / $(echo "$POLICIES" | tr ',' '\n' | wc -l) )) --profile-every 4 \
  --policies "$POLICIES" > "$E/$NAME.log" 2>&1
log "$NAME: exit $? $(grep -a 'tok/s' "$E/$NAME.log" | tr '\n' ' ')"
finish
