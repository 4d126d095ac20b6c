# One H200 command (issue 29, item 2): the Gluon lookahead schedules (IMPL gluon_*_lookahead) checked each in its own
# process under a timeout (probe.py), then, if all are right, `kernel-gym bench` over every valid prefill config at
# the seven prefill cases with the SDPA anchors in the same run. Results under $OUT: probe.json, prefill.json,
# prefill_details.json, bench.log, e2e.tar.gz.
#   KERNEL_GYM_COMMIT=<sha> bash benchmarks/short_prefill/lookahead_session.sh
source benchmarks/live_e2e/session_common.sh
log "probe: lookahead configs"
timeout 200 python3 benchmarks/short_prefill/probe.py --out "$OUT/probe.json" --impls _lookahead --timeout-s 90 \
  > "$OUT/probe.log" 2>&1
rc=$?
tail -4 "$OUT/probe.log"
log "probe rc $rc"
if [ "$rc" = 0 ]; then
  log "bench"
  timeout $(( $(left) - 20 )) python3 -m kernel_gym.cli bench --kernels prefill_attention --out "$OUT/prefill.json" \
    --budget-s $(( $(left) - 60 )) > "$OUT/bench.log" 2>&1
  log "bench rc $?"
  tail -3 "$OUT/bench.log"
fi
finish
