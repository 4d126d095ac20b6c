# One H200 command (issue 29, item 2): Nsight Compute on the short-prefill cases' fastest configs and their SDPA
# anchors (ncu_profile.py). Results under $OUT: profile.txt (ncu), launched.json, e2e.tar.gz (machine, power.csv, log).
#   KERNEL_GYM_COMMIT=<sha> bash benchmarks/short_prefill/profile_session.sh
source benchmarks/live_e2e/session_common.sh
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -z "$NCU" ]; then log "no ncu on this machine"; finish; exit 1; fi
log "ncu on the short prefill cases"
timeout $(( $(left) - 20 )) "$NCU" --clock-control none --nvtx --nvtx-include "profile/" \
  --section LaunchStats --section Occupancy --section SpeedOfLight --section WarpStateStats \
  --section SchedulerStats --section ComputeWorkloadAnalysis \
  python3 benchmarks/short_prefill/ncu_profile.py \
  --details benchmarks/short_prefill/run3_pack/prefill_attention_details.json.gz \
  --out "$OUT/launched.json" > "$OUT/profile.txt" 2>&1
log "ncu rc $?"
tail -5 "$OUT/profile.txt"
finish
