# One H200 command (issue 29, item 2): the prefill kernel's PERSISTENT knob against one program per item and the SDPA
# anchors at every prefill bench case (knob_ab.py), then Nsight Compute on the fastest configs of the two shortest
# cases (profile.py). Results under $OUT: ab.tar.gz (knob_ab's folder), profile.txt, launched.json, e2e.tar.gz.
#   KERNEL_GYM_COMMIT=<sha> bash benchmarks/short_prefill/persistent_session.sh
source benchmarks/live_e2e/session_common.sh
log "knob_ab PERSISTENT"
mkdir -p "$OUT/ab"
timeout $(( $(left) - 90 )) python3 benchmarks/short_prefill/knob_ab.py --knob PERSISTENT --out "$OUT/ab" \
  --budget-s $(( $(left) - 150 )) --compile-workers 14 2>&1 | tee "$OUT/ab/run.log" | tail -12
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
