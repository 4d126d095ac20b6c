#!/usr/bin/env bash
# One H200 command (session 41): the live stack's dense ops timed per model and token count
# (dense_price_check.py: the table run.py --predict --dense-ops prices them from), then two trace windows no earlier
# run served, for the prediction check out of sample: Mixtral 200-230 s of the trace (three policies) and OLMoE the
# same window at 1.5x, and last a short profiled run (every 50th step) of Mixtral's window 1 under the vllm-table,
# the kernel-name attribution's first GPU run. Everything under $OUT comes back as a tarball and the log.
#   KERNEL_GYM_COMMIT=<tree> OUT=... bash benchmarks/live_e2e/dense_session.sh
source benchmarks/live_e2e/session_common.sh
log "dense ops table"
timeout 150 python3 benchmarks/live_e2e/dense_price_check.py --out "$E/dense_ops.json" > "$E/dense.log" 2>&1
log "dense: exit $? $(tail -c 400 "$E/dense.log" | tr '\n' ' ')"
POL=default,vllm-table,table:benchmarks/live_replay/inputs/dispatch_table.json
log "Mixtral window 4 (200-230 s), $(left) s left"
timeout $(( $(left) - 120 )) python3 benchmarks/live_e2e/run.py --out "$E/window4" --start-s 200 --seconds 30 \
  --rate 1.0 --budget-s 200 --policy-budget-s 80 --policies $POL > "$E/window4.log" 2>&1
log "window 4: exit $? $(grep -a 'tok/s' "$E/window4.log" | tr '\n' ' ')"
log "OLMoE window 4 x1.5, $(left) s left"
timeout $(( $(left) - 50 )) python3 benchmarks/live_e2e/run.py --out "$E/olmoe_w4" --model olmoe-1b-7b --vocab 50304 \
  --start-s 200 --seconds 30 --rate 1.5 --budget-s 90 --policy-budget-s 50 --policies default,vllm-table \
  > "$E/olmoe_w4.log" 2>&1
log "OLMoE: exit $? $(grep -a 'tok/s' "$E/olmoe_w4.log" | tr '\n' ' ')"
if [ "$(left)" -gt 60 ]; then
  log "Mixtral window 1, vllm-table, profiled, $(left) s left"
  timeout $(( $(left) - 5 )) python3 benchmarks/live_e2e/run.py --out "$E/window1_prof" --seconds 30 --rate 1.0 \
    --budget-s 40 --policy-budget-s $(( $(left) - 25 )) --profile-every 50 --policies vllm-table \
    > "$E/window1_prof.log" 2>&1
  log "profiled: exit $? $(grep -a 'tok/s' "$E/window1_prof.log" | tr '\n' ' ')"
fi
finish
