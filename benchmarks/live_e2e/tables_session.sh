#!/usr/bin/env bash
# One H200 command (prepared in session 46, not yet run): does a learned table trained on the current data serve
# loaded windows as well as the vllm-table? The live runs' learned table was exported on 2026-11-30 and lost under
# load (benchmarks/live_e2e/tables/README.md). First what the prediction of the fresh tables lacks: the configs the
# dataset cannot time at the windows' shapes (collect --plan tables/untimed_plan.json) and their MoE configs as the
# graphs run them (moe_graph_table.py, tables/moe_graph_plan.json); then Mixtral windows 5 and 6 (unseen, loaded)
# under the vllm-table and the seed-0 table. Everything under $OUT comes back as one tarball and the log.
#   KERNEL_GYM_COMMIT=<tree> OUT=... bash benchmarks/live_e2e/tables_session.sh
source benchmarks/live_e2e/session_common.sh
T=benchmarks/live_e2e/tables
log "collect the fresh tables' untimed choices, $(left) s left"
timeout 150 python3 -m kernel_gym.cli collect --plan $T/untimed_plan.json --db /tmp/tables.sqlite --budget-s 90 \
  --compile-workers 14 --out "$E/untimed_rows.jsonl.gz" > "$E/collect.log" 2>&1
log "collect: exit $? $(tail -2 "$E/collect.log" | tr '\n' ' ')"
log "their MoE configs as the decode graphs run them, $(left) s left"
timeout 110 python3 benchmarks/live_e2e/moe_graph_table.py --plan $T/moe_graph_plan.json --out "$E/moe_graph" \
  --budget-s 60 > "$E/moe_graph.log" 2>&1
log "moe_graph: exit $?"
for w in "5 300" "6 400"; do
  set -- $w
  log "Mixtral window $1 ($2-$(( $2 + 30 )) s), $(left) s left"
  limit=$(( ($(left) - 10) / (7 - $1) ))
  if [ "$limit" -lt 60 ]; then log "window $1 skipped: ${limit} s left for it"; continue; fi
  timeout $limit python3 benchmarks/live_e2e/run.py --out "$E/window$1" --start-s $2 \
    --seconds 30 --rate 1.0 --budget-s 200 --policy-budget-s 90 \
    --policies vllm-table,table:$T/mixtral_seed0/dispatch_table.json > "$E/window$1.log" 2>&1
  log "window $1: exit $? $(grep -a 'tok/s' "$E/window$1.log" | tr '\n' ' ')"
done
finish
