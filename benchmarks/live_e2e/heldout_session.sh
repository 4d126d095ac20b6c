#!/usr/bin/env bash
# One H200 command (session 53): a trace no live run or fit had read, the Azure code trace (bursty arrivals, prompts
# 1.5k tokens at the median, outputs 13), Mixtral under the three policies and OLMoE at 1.5x under two, each a
# 30-second window served live. Every price the prediction reads was measured or fitted on the bundled conversation
# trace, so its error here is out of sample in the traffic as well as in time. Everything under $OUT comes back as a
# tarball. Session 54: a second window (START=540 NAME=code540 OLMOE_RATE=1.0), and each policy's host issue time
# measured before its replay (run.py's calibrate_issue).
#   KERNEL_GYM_COMMIT=<tree> OUT=... [TRACE=file START=s NAME=code OLMOE_RATE=1.5] bash benchmarks/live_e2e/heldout_session.sh
source benchmarks/live_e2e/session_common.sh
TRACE=${TRACE:-benchmarks/live_e2e/heldout_trace/AzureLLMInferenceTrace_code_first10min.csv}
START=${START:-300}
NAME=${NAME:-code}  # the runs' folders: ${NAME}_mixtral, ${NAME}_olmoe (as heldout_trace/preregistered/ names them)
OLMOE_RATE=${OLMOE_RATE:-1.5}
POL=vllm-table,table:benchmarks/live_e2e/tables/mixtral_seed0/dispatch_table.json,default  # default last: predicted
# to overload the GPU on this window, the slowest to serve
log "Mixtral, $TRACE from $START s, $(left) s left"
timeout $(( $(left) - 170 )) python3 benchmarks/live_e2e/run.py --out "$E/${NAME}_mixtral" --trace "$TRACE" \
  --start-s "$START" --seconds 30 --rate 1.0 --budget-s 330 --policy-budget-s 110 --policies $POL \
  > "$E/${NAME}_mixtral.log" 2>&1
log "Mixtral: exit $? $(grep -a 'tok/s' "$E/${NAME}_mixtral.log" | tr '\n' ' ')"
log "OLMoE x$OLMOE_RATE, $(left) s left"
timeout $(( $(left) - 10 )) python3 benchmarks/live_e2e/run.py --out "$E/${NAME}_olmoe" --model olmoe-1b-7b --vocab 50304 \
  --trace "$TRACE" --start-s "$START" --seconds 30 --rate "$OLMOE_RATE" --budget-s 110 --policy-budget-s 70 \
  --policies default,vllm-table > "$E/${NAME}_olmoe.log" 2>&1
log "OLMoE: exit $? $(grep -a 'tok/s' "$E/${NAME}_olmoe.log" | tr '\n' ' ')"
finish
