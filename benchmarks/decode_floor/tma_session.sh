# One H200 command (issue 29, item 2): every grouped decode config at batch 1-16 with and without KV_TMA (run.py
# --grid), then Nsight Compute on the fastest configs at batch 1-4 (ncu_profile.py). Results under $OUT:
#   decode_floor.json, log.txt, profile.txt (ncu), profiled.json, e2e.tar.gz (machine, power.csv, session log).
#   KERNEL_GYM_COMMIT=<sha> bash benchmarks/decode_floor/tma_session.sh
source benchmarks/live_e2e/session_common.sh
log "decode grid, KV_TMA twins"
timeout $(( $(left) - 150 )) python3 benchmarks/decode_floor/run.py --grid --batches 1,2,4,16 \
  --contexts 1024,4096,16384 --compile-workers 14 --out "$OUT/decode_floor.json" 2>&1 | tee "$OUT/log.txt"
log "ncu"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ] && [ -s "$OUT/decode_floor.json" ]; then
  timeout $(( $(left) - 20 )) "$NCU" --clock-control none --kernel-name regex:_decode_grouped_kernel \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
    python3 benchmarks/decode_floor/ncu_profile.py --floor "$OUT/decode_floor.json" \
    --workloads 1:16384,1:1024,4:4096 --out "$OUT/profiled.json" > "$OUT/profile.txt" 2>&1
  log "ncu rc $?"
else
  log "no ncu or no grid result: profile skipped"
fi
finish
