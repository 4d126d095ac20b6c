# One H200 command (issue 29, items 1 and 2): an attention knob (KNOB, two values: 0 and one other) against the same
# tiles without it and the SDPA anchors, through knob_ab.py, for the families that have it (FAMILIES, comma-separated;
# default both attention families). Results under $OUT: ab.tar.gz (knob_ab.py's files and run.log), e2e.tar.gz
# (machine, power.csv), session.log.
#   KERNEL_GYM_COMMIT=<sha> KNOB=ONE_LOOP bash benchmarks/short_prefill/knob_session.sh
source benchmarks/live_e2e/session_common.sh
KNOB=${KNOB:?set KNOB}
mkdir -p "$OUT/ab"
log "knob_ab.py --knob $KNOB --families ${FAMILIES:-prefill_attention,prefix_prefill}"
python3 benchmarks/short_prefill/knob_ab.py --knob "$KNOB" --families "${FAMILIES:-prefill_attention,prefix_prefill}" \
  --out "$OUT/ab" --budget-s $(( $(left) - 60 )) --compile-workers 14 2>&1 | tee "$OUT/ab/run.log" | tail -30
log "knob_ab rc ${PIPESTATUS[0]}"
tar czf "$OUT/ab.tar.gz" -C "$OUT" ab && rm -rf "$OUT/ab"
finish
