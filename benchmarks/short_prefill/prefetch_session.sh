# One H200 command (issue 29, item 2): L2_PREFETCH (the prefill Triton kernel asks the L2 for its tile's first K/V
# rows before it loads q) against the same tiles without it and the SDPA anchors (knob_ab.py), then Nsight Compute's
# per-instruction stall sampling (SourceCounters) on the short cases' fastest configs and cuDNN's kernel.
# Results under $OUT: ab/ (knob_ab.py's files and run.log), ncu.tar.gz (report text, per-instruction csv,
# launched.json), e2e.tar.gz (machine, power.csv), session.log.
#   KERNEL_GYM_COMMIT=<sha> bash benchmarks/short_prefill/prefetch_session.sh
# L2_PREFETCH was reverted after run11_prefetch (tree d573f17 has it): at a later tree knob_ab.py refuses the knob with
# a message and the session goes on to the profile; KNOB=<another two-valued knob> A/Bs that one instead.
source benchmarks/live_e2e/session_common.sh
mkdir -p "$OUT/ab" "$OUT/ncu"
log "knob_ab.py --knob ${KNOB:-L2_PREFETCH}"
python3 benchmarks/short_prefill/knob_ab.py --knob "${KNOB:-L2_PREFETCH}" --families prefill_attention --out "$OUT/ab" \
  --budget-s $(( $(left) - 170 )) --compile-workers 14 2>&1 | tee "$OUT/ab/run.log" | tail -25
log "knob_ab rc ${PIPESTATUS[0]}"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ] && [ "$(left)" -gt 60 ]; then
  log "ncu source counters on the short prefill cases"
  timeout $(( $(left) - 30 )) "$NCU" --clock-control none --nvtx --nvtx-include "profile/" \
    --section SourceCounters --section WarpStateStats --section LaunchStats --section Occupancy \
    --section SpeedOfLight -o "$OUT/ncu/short_prefill" \
    python3 benchmarks/short_prefill/ncu_profile.py \
    --details benchmarks/short_prefill/run8_lookahead/prefill_details.json.gz \
    --out "$OUT/ncu/launched.json" > "$OUT/ncu/ncu_run.txt" 2>&1
  log "ncu rc $?"
  "$NCU" --import "$OUT/ncu/short_prefill.ncu-rep" --print-details all > "$OUT/ncu/short_prefill.txt" 2>&1
  "$NCU" --import "$OUT/ncu/short_prefill.ncu-rep" --page source --print-source sass --csv \
    > "$OUT/ncu/short_prefill_source.csv" 2>&1
  log "source page rc $?"
  rm -f "$OUT/ncu/short_prefill.ncu-rep"
fi
tar czf "$OUT/ncu.tar.gz" -C "$OUT" ncu && rm -rf "$OUT/ncu"
finish
