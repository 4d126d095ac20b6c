#!/usr/bin/env bash
# One H200 command (prepared in session 48, not yet run): why are steps with prefill chunks under-priced by 8-12%
# (benchmarks/live_e2e/retrained, GPU-bound, at full clock too)? The steps over 512 tokens run eagerly, and neither
# price table times what they run (the steps of up to 512 tokens, in piecewise graphs, are as under-priced: the
# profiled window says which parts). First the live MoE call as an eager step runs it, per model, config and token
# count (moe_graph_table.py --eager, plan moe_eager_plan.json: the table run.py --predict --moe-eager reads), then the
# dense ops launched eagerly (dense_price_check.py --eager: --dense-eager), then Mixtral's window 1 under the
# vllm-table with every 5th step profiled, so the chunk steps' kernel parts stand beside the new prices.
# Everything under $OUT comes back as one tarball and the log.
#   KERNEL_GYM_COMMIT=<tree> OUT=... bash benchmarks/live_e2e/eager_session.sh
source benchmarks/live_e2e/session_common.sh
log "MoE eager table, $(left) s left"
timeout 250 python3 benchmarks/live_e2e/moe_graph_table.py --eager --out "$E/moe_eager" --budget-s 200 \
  > "$E/moe_eager.log" 2>&1
log "MoE eager table: exit $? $(tail -n 20 "$E/moe_eager.log" | grep -a 'T=\|timed' | tr '\n' ' ')"
log "dense ops, eager, $(left) s left"
timeout 120 python3 benchmarks/live_e2e/dense_price_check.py --eager --out "$E/dense_eager.json" \
  > "$E/dense_eager.log" 2>&1
log "dense eager: exit $? $(tail -c 600 "$E/dense_eager.log" | tr '\n' ' ')"
if [ "$(left)" -gt 90 ]; then
  log "Mixtral window 1, vllm-table, every 5th step profiled, $(left) s left"
  timeout $(( $(left) - 10 )) python3 benchmarks/live_e2e/run.py --out "$E/window1_prof5" --seconds 30 --rate 1.0 \
    --budget-s 60 --policy-budget-s $(( $(left) - 40 )) --profile-every 5 --policies vllm-table \
    > "$E/window1_prof5.log" 2>&1
  log "window 1: exit $? $(grep -a 'tok/s' "$E/window1_prof5.log" | tr '\n' ' ')"
else
  log "window 1 skipped: $(left) s left"
fi
finish
