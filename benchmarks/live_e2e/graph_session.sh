#!/usr/bin/env bash
# One H200 command (session 42): the live MoE layer as its CUDA graphs run it, per model, config and capture size
# (moe_graph_table.py: the table run.py --predict --moe-graph prices graphed steps' MoE from), then Mixtral's window 1
# under the three policies with every 10th step profiled: the step records now carry each step's GPU span (gpu_s:
# its host part is seconds - gpu_s) and its longest context (max_context), beside the profiled decode attention.
# Everything under $OUT comes back as a tarball and the log.
#   KERNEL_GYM_COMMIT=<tree> OUT=... bash benchmarks/live_e2e/graph_session.sh
source benchmarks/live_e2e/session_common.sh
log "MoE graph table"
timeout 290 python3 benchmarks/live_e2e/moe_graph_table.py --out "$E/moe_graph" --budget-s 250 \
  > "$E/moe_graph.log" 2>&1
log "MoE graph table: exit $? $(tail -n 40 "$E/moe_graph.log" | grep -a 'T=\|timed' | tr '\n' ' ')"
POL=default,vllm-table,table:benchmarks/live_replay/inputs/dispatch_table.json
log "Mixtral window 1, profiled every 10th step, $(left) s left"
timeout $(( $(left) - 10 )) python3 benchmarks/live_e2e/run.py --out "$E/window1_spans" --seconds 30 --rate 1.0 \
  --budget-s $(( $(left) - 90 )) --policy-budget-s 80 --profile-every 10 --policies $POL > "$E/window1_spans.log" 2>&1
log "window 1: exit $? $(grep -a 'tok/s' "$E/window1_spans.log" | tr '\n' ' ')"
finish
