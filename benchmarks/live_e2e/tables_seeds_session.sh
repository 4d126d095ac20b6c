#!/usr/bin/env bash
# One H200 command (session 48): the two other retrained seeds' tables live on Mixtral windows 5 and 6, each window
# beside the vllm-table in the same run (tables_session.sh ran seed 0 there). Everything under $OUT comes back as one
# tarball and the log.
#   KERNEL_GYM_COMMIT=<tree> OUT=... bash benchmarks/live_e2e/tables_seeds_session.sh
source benchmarks/live_e2e/session_common.sh
T=benchmarks/live_e2e/tables
for w in "5 300" "6 400"; do
  set -- $w
  log "Mixtral window $1 ($2-$(( $2 + 30 )) s), $(left) s left"
  limit=$(( ($(left) - 10) / (7 - $1) ))
  if [ "$limit" -lt 60 ]; then log "window $1 skipped: ${limit} s left for it"; continue; fi
  timeout $limit python3 benchmarks/live_e2e/run.py --out "$E/window$1" --start-s $2 \
    --seconds 30 --rate 1.0 --budget-s 260 --policy-budget-s 90 \
    --policies vllm-table,table:$T/mixtral_seed1/dispatch_table.json,table:$T/mixtral_seed2/dispatch_table.json \
    > "$E/window$1.log" 2>&1
  log "window $1: exit $? $(grep -a 'tok/s' "$E/window$1.log" | tr '\n' ' ')"
done
finish
