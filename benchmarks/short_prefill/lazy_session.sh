# One H200 command (issue 29, items 1 and 2): the attention families' LAZY_RESCALE knob against the eager rescale and
# the SDPA anchors at every prefill and prefix bench case (knob_ab.py), then Nsight Compute on the fastest prefill
# configs of the two shortest cases (profile.py). Results under $OUT: ab.tar.gz (knob_ab's folder), profile.txt,
# launched.json, e2e.tar.gz.
#   KERNEL_GYM_COMMIT=<sha> bash benchmarks/short_prefill/lazy_session.sh
source benchmarks/live_e2e/session_common.sh
log "knob_ab LAZY_RESCALE"
mkdir -p "$OUT/ab"
timeout $(( $(left) - 80 )) python3 benchmarks/short_prefill/knob_ab.py --knob LAZY_RESCALE --out "$OUT/ab" \
  --budget-s $(( $(left) - 140 )) --compile-workers 14 > "$OUT/ab/run.log" 2>&1
log "knob_ab exit $?"
tail -20 "$OUT/ab/run.log"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ] && [ -s "$OUT/ab/prefill_attention_details.json" ]; then
  log "ncu"
  timeout $(( $(left) - 15 )) "$NCU" --clock-control none --nvtx --nvtx-include "profile/" \
    --section LaunchStats --section Occupancy --section SpeedOfLight --section WarpStateStats \
    --section SchedulerStats --section ComputeWorkloadAnalysis \
    python3 benchmarks/short_prefill/profile.py --details "$OUT/ab/prefill_attention_details.json" \
    --out "$OUT/launched.json" > "$OUT/profile.txt" 2>&1
  log "ncu rc $?"
fi
tar czf "$OUT/ab.tar.gz" -C "$OUT" ab && rm -rf "$OUT/ab"
finish
