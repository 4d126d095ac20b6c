# Sourced by the one-command H200 sessions (*_session.sh): the environment, a log with seconds since the start,
# `left` (seconds before the device's 10-minute command limit, less a margin), the machine's description and the
# GPU's clocks and power once a second under $OUT/e2e (E), stopped and packed by `finish`.
set -u
OUT=${OUT:?set OUT}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/kernel_gym_triton_cache KERNEL_GYM_HEAT=0
start=$(date +%s)
log() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a "$OUT/session.log"; }
left() { echo $(( ${SESSION_S:-575} - ($(date +%s) - start) )); }
E=$OUT/e2e
mkdir -p "$E"
{ nvidia-smi; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } \
  > "$E/machine.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv -l 1 > "$E/power.csv" 2>&1 &
smi=$!
finish() {  # the power monitor stopped, $E as one tarball (the device returns at most 8 files)
  kill "$smi" 2>/dev/null
  tar czf "$OUT/e2e.tar.gz" -C "$OUT" e2e && rm -rf "$E"
  log "done"
}
