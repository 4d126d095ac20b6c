# One H200 command (issue 29, item 2): the decode kernel at batch 1-16 beside what torch offers for the same decode
# step (FlashAttention-2 and memory-efficient varlen, SDPA's backends), each after a write and a clean L2 flush
# (run.py --sdpa-decode). Results under $OUT: flush_mode.json, log.txt, e2e.tar.gz (machine, power.csv), session.log.
# (At tree 32752aa, run2_torch_decode/, it went on to Nsight Compute on the short prefills, which stopped early;
# benchmarks/short_prefill/prefetch_session.sh profiles them.)
#   KERNEL_GYM_COMMIT=<sha> bash benchmarks/flush_mode/torch_decode_session.sh
source benchmarks/live_e2e/session_common.sh
log "decode beside torch's decode, write and clean flush"
timeout $(( $(left) - 30 )) python3 benchmarks/flush_mode/run.py --sdpa-decode --no-attention \
  --floor benchmarks/decode_floor/run5_tma/decode_floor.json.gz --out "$OUT/flush_mode.json" 2>&1 | tee "$OUT/log.txt"
log "flush_mode rc ${PIPESTATUS[0]}"
tail -16 "$OUT/log.txt"
finish
