# One H200 command (issue 29, item 2): the decode kernel at batch 1-16 beside what torch offers for the same decode
# step (FlashAttention-2 and memory-efficient varlen, SDPA's backends), each after a write and a clean L2 flush
# (run.py --sdpa-decode); then Nsight Compute's per-instruction stall sampling (SourceCounters) on the short
# prefill cases' fastest Triton configs and cuDNN's kernel. Results under $OUT: flush_mode.json, log.txt,
# short_prefill_source.csv.gz, short_prefill.txt.gz, launched.json, e2e.tar.gz (machine, power.csv, session log).
#   KERNEL_GYM_COMMIT=<sha> bash benchmarks/flush_mode/torch_decode_session.sh
source benchmarks/live_e2e/session_common.sh
log "decode beside torch's decode, write and clean flush"
timeout $(( $(left) - 150 )) python3 benchmarks/flush_mode/run.py --sdpa-decode --no-attention \
  --floor benchmarks/decode_floor/run5_tma/decode_floor.json.gz --out "$OUT/flush_mode.json" 2>&1 | tee "$OUT/log.txt"
log "flush_mode rc ${PIPESTATUS[0]}"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ]; then
  log "ncu source counters on the short prefill cases ($($NCU --version | tail -1))"
  timeout $(( $(left) - 40 )) "$NCU" --clock-control none --nvtx --nvtx-include "profile/" \
    --section SourceCounters --section WarpStateStats --section LaunchStats --section Occupancy \
    -o "$OUT/short_prefill" \
    python3 benchmarks/short_prefill/ncu_profile.py \
    --details benchmarks/short_prefill/run8_lookahead/prefill_details.json.gz \
    --out "$OUT/launched.json" > "$OUT/ncu_run.txt" 2>&1
  log "ncu rc $?"
  "$NCU" --import "$OUT/short_prefill.ncu-rep" --print-details all > "$OUT/short_prefill.txt" 2>&1
  "$NCU" --import "$OUT/short_prefill.ncu-rep" --page source --print-source sass --csv \
    > "$OUT/short_prefill_source.csv" 2>&1
  log "source page rc $? ($(wc -l < "$OUT/short_prefill_source.csv") lines)"
  cat "$OUT/ncu_run.txt" >> "$OUT/short_prefill.txt"
  gzip -f "$OUT/short_prefill.txt" "$OUT/short_prefill_source.csv"
  rm -f "$OUT/short_prefill.ncu-rep" "$OUT/ncu_run.txt"
else
  log "no ncu on this machine"
fi
tail -16 "$OUT/log.txt"
finish
