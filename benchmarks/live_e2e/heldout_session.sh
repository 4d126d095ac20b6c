#!/usr/bin/env bash
# One H200 command (session 53): a trace no live run or fit had read, the Azure code trace (bursty arrivals, prompts
# 1.5k tokens at the median, outputs 13), Mixtral under the three policies and OLMoE at 1.5x under two, each a
# 30-second window served live. Every price the prediction reads was measured or fitted on the bundled conversation
# trace, so its error here is out of sample in the traffic as well as in time. Everything under $OUT comes back as a
# tarball.
#   KERNEL_GYM_COMMIT=<tree> OUT=... [TRACE=file START=s] bash benchmarks/live_e2e/heldout_session.sh
source benchmarks/live_e2e/session_common.sh
TRACE=${TRACE:-benchmarks/live_e2e/heldout_trace/AzureLLMInferenceTrace_code_first10min.csv}
START=${START:-300}
POL=vllm-table,table:benchmarks/live_e2e/tables/mixtral_seed0/dispatch_table.json,default  # default last: predicted
# to overload the GPU on this window, the slowest to serve
log "Mixtral, $TRACE from $START s, $(left) s left"
timeout $(( $(left) - 170 )) python3 benchmarks/live_e2e/run.py --out "$E/code_mixtral" --trace "$TRACE" \
  --start-s "$START" --seconds 30 --rate 1.0 --budget-s 330 --policy-budget-s 110 --policies $POL \
  > "$E/code_mixtral.log" 2>&1
log "Mixtral: exit $? $(grep -a 'tok/s' "$E/code_mixtral.log" | tr '\n' ' ')"
log "OLMoE x1.5, $(left) s left"
timeout $(( $(left) - 10 )) python3 benchmarks/live_e2e/run.py --out "$E/code_olmoe" --model olmoe-1b-7b --vocab 50304 \
  --trace "$TRACE" --start-s "$START" --seconds 30 --rate 1.5 --budget-s 110 --policy-budget-s 70 \
  --policies default,vllm-table > "$E/code_olmoe.log" 2>&1
log "OLMoE: exit $? $(grep -a 'tok/s' "$E/code_olmoe.log" | tr '\n' ' ')"
finish
