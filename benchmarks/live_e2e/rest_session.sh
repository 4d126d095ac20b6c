#!/usr/bin/env bash
# One H200 command (session 68): the parts of session 67's plans its budget cut short. First the decode graph table's
# rest: the served plan's 19 Mixtral points (the configs the fixed chooser serves on the held-out Mixtral windows) and
# OLMoE's last 12 default-config points (rest3, two fresh graphs a point), each also timed after an L2 flush; then
# the neighbour-winner rows coverage_session.sh did not reach (neighbour_winners_rest_plan.json: 91 configs at 36
# shapes, 15 of them prefill). On the CPU afterwards: the tables join run.py's DECODE_GRAPH_TABLES, the rows are
# merged into the packaged dataset (coverage_h200_0d9f96c/README.md).
#   SESSION_S=575 KERNEL_GYM_COMMIT=<tree> OUT=... bash benchmarks/live_e2e/rest_session.sh
source benchmarks/live_e2e/session_common.sh
D=benchmarks/live_e2e/dispatch_h200_0d9f96c
log "decode graph table, the served plan's rest, $(left) s left"
timeout 170 python3 benchmarks/live_e2e/decode_graph_table.py --out "$E/served_rest" \
  --plan benchmarks/live_e2e/decode_graph_served_plan.json --done "$D/decode_graph/decode_graph.json" \
  --budget-s 140 --also-flushed > "$E/served_rest.log" 2>&1
log "served rest: exit $? $(tail -n 3 "$E/served_rest.log" | tr '\n' ' ')"
log "decode graph table, OLMoE's last points, $(left) s left"
timeout 170 python3 benchmarks/live_e2e/decode_graph_table.py --out "$E/rest3_rest" \
  --plan benchmarks/live_e2e/decode_graph_rest3_plan.json --done "$D/decode_rest3/decode_graph.json" \
  --budget-s 130 --also-flushed --repeats 2 > "$E/rest3_rest.log" 2>&1
log "rest3 rest: exit $? $(tail -n 3 "$E/rest3_rest.log" | tr '\n' ' ')"
log "neighbour-winner rows, the rest, $(left) s left"
mkdir -p "$E/coverage"
BUDGET_S=$(( $(left) - 15 )) PLAN=benchmarks/policy_quality/neighbour_winners_rest_plan.json OUT="$E/coverage" \
  bash benchmarks/policy_quality/coverage_session.sh > "$E/coverage.log" 2>&1
log "coverage: exit $? $(tail -c 300 "$E/coverage.log" | tr '\n' ' ')"
finish
