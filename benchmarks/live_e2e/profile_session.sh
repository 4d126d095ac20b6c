#!/usr/bin/env bash
# One H200 command (session 40): the short-prefill and prefix benchmark cases again with the work items carrying
# their sequence's start and length (benchmarks/short_prefill/knob_ab.py, anchors in the same run), then window 1
# of the live end-to-end replay (Mixtral, three policies) and OLMoE's window with every 25th / 50th step profiled
# (run.py --profile-every). Everything under $OUT comes back as three tarballs and the log.
#   KERNEL_GYM_COMMIT=<tree> OUT=... bash benchmarks/live_e2e/profile_session.sh
source benchmarks/live_e2e/session_common.sh
mkdir -p "$OUT/pack"
log "pack_gqa (work items with start and length)"
timeout 150 python3 benchmarks/short_prefill/knob_ab.py --knob PACK_GQA --out "$OUT/pack" --budget-s 120 --compile-workers 12 \
  > "$OUT/pack/run.log" 2>&1
log "pack_gqa: exit $? $(tail -c 300 "$OUT/pack/run.log" | tr '\n' ' ')"
tar czf "$OUT/pack.tar.gz" -C "$OUT" pack && rm -rf "$OUT/pack"
log "Mixtral window 1, profiled"
timeout 300 python3 benchmarks/live_e2e/run.py --out "$OUT/e2e/window1_prof" --seconds 30 --rate 1.0 --budget-s 240 \
  --policy-budget-s 90 --profile-every 25 \
  --policies default,vllm-table,table:benchmarks/live_replay/inputs/dispatch_table.json > "$OUT/e2e/window1.log" 2>&1
log "window 1: exit $? $(grep -a 'tok/s' "$OUT/e2e/window1.log" | tr '\n' ' ')"
left=$(( 560 - ($(date +%s) - start) ))
if [ "$left" -gt 100 ]; then
  log "OLMoE, profiled ($left s left)"
  timeout "$left" python3 benchmarks/live_e2e/run.py --out "$OUT/e2e/olmoe_prof" --model olmoe-1b-7b --vocab 50304 \
    --rate 1.5 --budget-s $(( left - 80 )) --policy-budget-s $(( (left - 40) / 2 )) --profile-every 50 \
    --policies default,vllm-table > "$OUT/e2e/olmoe.log" 2>&1
  log "OLMoE: exit $? $(grep -a 'tok/s' "$OUT/e2e/olmoe.log" | tr '\n' ' ')"
else
  log "OLMoE skipped: $left s left"
fi
finish
