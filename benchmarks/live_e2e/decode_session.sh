#!/usr/bin/env bash
# One H200 command (session 50): the live policies' decode configs timed as the stack's CUDA graphs replay them, at
# the decode wave model's fit grid (decode_graph_table.py; plan decode_graph_plan.json). The wave model prices live
# decode from the dataset's rows, timed one launch at a time after an L2 flush; on the profiled live steps the learned
# table's 16-split config was priced at 66.7 us per layer where its kernels took 25.2 us
# (benchmarks/decode_waves/profile_check.json). Then, on the CPU: run.py --predict --decode-graph
# E/decode_graph/decode_graph.json over predicted/ (predict_all.sh with PREDICT_ARGS), default if it holds.
#   KERNEL_GYM_COMMIT=<tree> OUT=... [PLAN=decode_graph_rest_plan.json] bash benchmarks/live_e2e/decode_session.sh
source benchmarks/live_e2e/session_common.sh
log "decode graph table, $(left) s left"
timeout $(( $(left) - 15 )) python3 benchmarks/live_e2e/decode_graph_table.py --out "$E/decode_graph" ${PLAN:+--plan "$PLAN"} \
  --budget-s $(( $(left) - 90 )) > "$E/decode_graph.log" 2>&1
log "decode graph: exit $? $(tail -n 4 "$E/decode_graph.log" | tr '\n' ' ')"
finish
