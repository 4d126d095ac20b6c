#!/usr/bin/env bash
# One H200 command (session 48): retrained seeds' tables live on Mixtral windows, each window beside the vllm-table
# in the same run. WINDOWS: "number:start_s" pairs (30 s of arrivals each, rate 1.0); SEEDS: which of tables/mixtral_seed*
# to serve. Everything under $OUT comes back as one tarball and the log.
#   KERNEL_GYM_COMMIT=<tree> WINDOWS="5:300 6:400" SEEDS="1 2" OUT=... bash benchmarks/live_e2e/tables_live_session.sh
source benchmarks/live_e2e/session_common.sh
T=benchmarks/live_e2e/tables
policies=vllm-table
for s in ${SEEDS:-1 2}; do policies="$policies,table:$T/mixtral_seed$s/dispatch_table.json"; done
set -- ${WINDOWS:-5:300 6:400}
n=$#
for w in "$@"; do
  num=${w%%:*} s0=${w##*:}
  limit=$(( ($(left) - 10) / n )); n=$(( n - 1 ))
  log "Mixtral window $num ($s0-$(( s0 + 30 )) s), $(left) s left, $limit s for it"
  if [ "$limit" -lt 60 ]; then log "window $num skipped"; continue; fi
  timeout $limit python3 benchmarks/live_e2e/run.py --out "$E/window$num" --start-s $s0 \
    --seconds 30 --rate 1.0 --budget-s $(( limit - 100 )) --policy-budget-s 90 --policies $policies \
    > "$E/window$num.log" 2>&1
  log "window $num: exit $? $(grep -a 'tok/s' "$E/window$num.log" | tr '\n' ' ')"
done
finish
