#!/usr/bin/env bash
# One H200 command (written in session 55, reordered in 57 and 58), the checks that move the most predictions per
# device second first (the H200 has often come with little device time left):
# 1. ragged_decode.py at Mixtral's shape, as the live graphs launch a ragged step (one long sequence, the others
#    short, padding rows to the capture size) beside the long sequence alone, for the three decode configs the live
#    Mixtral runs serve most: on an H100 the default config's long sequence ran 1.06-1.88x slower in such launches
#    than alone (ragged_h100_6b74fdc/), which the wave model leaves out; this times it on the H200 the prices are
#    from (run.py --predict --decode-ragged). Then the same at OLMoE's shape for its default config (1.07-1.37x on
#    the H100).
# 2. The decode graph table's last 13 OLMoE points (decode_graph_rest3_plan.json: the default config, which rest2's
#    budget cut short), then the configs the fixed chooser serves on both held-out Mixtral windows and no table timed
#    yet (decode_graph_served_plan.json: decode_graph_table.py --served-by), most served first, leaving 165 s for 3:
#    the prediction priced them at the default config's time (the fallback for a config the data cannot time).
# 3. The learned table with the Dispatcher fixed (a config moved onto the serving KV layout is remembered per shape;
#    before, the first shape's move answered every later one, so up to 35% of a learned table's decode steps in the
#    committed runs were served a config that depended on earlier calls). Mixtral, seed 0's table, on the held-out
#    code window from 540 s, as heldout_bffac01/code540_mixtral served it before the fix. Every 8th step is profiled
#    again, eagerly and as its graph replays (band_check.py --profiled).
# The decode tables also time each point after an L2 flush (--also-flushed, flushed_ms: docs/live.md, session 61);
# OLMoE's last points are timed over two fresh allocations each (--repeats 2: one H100 point had two speeds).
#   SESSION_S=<seconds> KERNEL_GYM_COMMIT=<tree> OUT=... bash benchmarks/live_e2e/dispatch_session.sh
source benchmarks/live_e2e/session_common.sh
TRACE=benchmarks/live_e2e/heldout_trace/AzureLLMInferenceTrace_code_first10min.csv
log "ragged decode launches (Mixtral), $(left) s left"
CFGS='{"BLOCK_N":16,"GQA_GROUPED":0,"LAYOUT":"NHD","NUM_SPLITS":1,"PAGE_SIZE":16,"num_stages":2,"num_warps":4}'
for splits in 1 2; do
  CFGS="$CFGS;{\"BLOCK_N\":16,\"GQA_GROUPED\":1,\"LAYOUT\":\"NHD\",\"NUM_SPLITS\":$splits,\"PAGE_SIZE\":16,\"num_stages\":2,\"num_warps\":4}"
done
T=$(( $(left) < 125 ? $(left) : 125 ))  # a short SESSION_S still ends with the tarball
timeout $T python3 benchmarks/live_e2e/ragged_decode.py --model mixtral-8x7b --out "$E/ragged" --cases padded,alone \
  --batches 6,8,9,12,16,20,24,32 --configs "$CFGS" --budget-s $(( T - 20 )) > "$E/ragged.log" 2>&1
log "ragged: exit $? $(grep -a 'wrote' "$E/ragged.log")"
log "ragged decode launches (OLMoE, default config), $(left) s left"
[ "$(left)" -gt 85 ] && timeout 80 python3 benchmarks/live_e2e/ragged_decode.py --model olmoe-1b-7b \
  --out "$E/ragged_olmoe" --cases padded,alone --batches 4,8,9,12,16,20,24,32 \
  --configs "${CFGS%%;*}" \
  --budget-s 60 > "$E/ragged_olmoe.log" 2>&1
log "ragged OLMoE: exit $? $(grep -a 'wrote' "$E/ragged_olmoe.log")"
log "decode graph table, OLMoE's last points (rest3), $(left) s left"
[ "$(left)" -gt 100 ] && timeout 95 python3 benchmarks/live_e2e/decode_graph_table.py --out "$E/decode_rest3" \
  --plan benchmarks/live_e2e/decode_graph_rest3_plan.json --budget-s 70 --also-flushed --repeats 2 \
  > "$E/decode_rest3.log" 2>&1
log "decode rest3: exit $? $(tail -n 3 "$E/decode_rest3.log" | tr '\n' ' ')"
log "decode graph table, the served plan, $(left) s left"
[ "$(left)" -gt 200 ] && timeout $(( $(left) - 165 )) python3 benchmarks/live_e2e/decode_graph_table.py \
  --out "$E/decode_graph" --plan benchmarks/live_e2e/decode_graph_served_plan.json --budget-s $(( $(left) - 190 )) \
  --also-flushed \
  > "$E/decode_graph.log" 2>&1
log "decode graph: exit $? $(tail -n 3 "$E/decode_graph.log" | tr '\n' ' ')"
log "Mixtral, learned table, code window from 540 s, $(left) s left"
[ "$(left)" -gt 150 ] && timeout 150 python3 benchmarks/live_e2e/run.py --out "$E/code540_mixtral" \
  --trace "$TRACE" --start-s 540 --seconds 30 --rate 1.0 --budget-s 140 --policy-budget-s 110 --profile-every 8 \
  --policies table:benchmarks/live_e2e/tables/mixtral_seed0/dispatch_table.json > "$E/code540_mixtral.log" 2>&1
log "Mixtral: exit $? $(grep -a 'tok/s' "$E/code540_mixtral.log" | tr '\n' ' ')"
finish
