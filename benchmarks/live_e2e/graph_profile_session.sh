#!/usr/bin/env bash
# One GPU command (session 56): does a graphed step's replay run its kernels as the eager launch does? OLMoE serves the
# held-out code window from 540 s under both of its policies with every 4th step profiled twice, eagerly and as its
# graph replays (run.py --profile-every: `kernels` and `kernels_graph` in each step record). Then, on the CPU,
# `band_check.py --profiles E/code540_olmoe` sets the two profiles side by side per part and band. Any GPU answers
# this (the prices are not compared here); the run says which one it was in machine.txt.
#   KERNEL_GYM_COMMIT=<tree> OUT=... bash benchmarks/live_e2e/graph_profile_session.sh
source benchmarks/live_e2e/session_common.sh
TRACE=benchmarks/live_e2e/heldout_trace/AzureLLMInferenceTrace_code_first10min.csv
log "OLMoE code540_olmoe, profiled every 4th step, $(left) s left"
timeout $(( $(left) - 10 )) python3 benchmarks/live_e2e/run.py --out "$E/code540_olmoe" --model olmoe-1b-7b \
  --vocab 50304 --trace "$TRACE" --start-s 540 --seconds 30 --rate 1.0 --budget-s 200 --policy-budget-s 90 \
  --profile-every 4 --policies default,vllm-table > "$E/code540_olmoe.log" 2>&1
log "code540_olmoe: exit $? $(grep -a 'tok/s' "$E/code540_olmoe.log" | tr '\n' ' ')"
finish
