#!/usr/bin/env bash
# One H200 session: what this project runs on the GPU machine, step by step, each step time-boxed, all raw output under
# $OUT (fetched back and committed under benchmarks/). Only python3 with torch, triton, numpy and the standard library
# is needed (plus pytest for the gpu-marked tests).
#   STEPS="tests bench collect" bash scripts/gpu_session.sh
# Steps:
#   tests       bf16 correctness over many configs per kernel
#   bench       kernels vs anchors
#   collect     fill the measurement store (resumable; PREV=snapshot to start from)
#   remeasure   measure again, in place, the stored rows too noisy to rank (PREV=kernel_gym/data/h200_measurements.jsonl.gz)
#   noise       repeat a subset of measurements in separate processes (PREV=snapshot on a fresh machine)
#   recorded    interpolation error and lookup speed
#   farm        the same small plan (FARM_ARGS) collected by the plain path and by `collect --ray` (a local Ray
#               cluster on this machine's GPUs), compared by scripts/compare_stores.py; without ray installed the
#               plain run is repeated instead (the noise floor the ray run is judged against)
#   live        a short MaskablePPO run on KernelGym/MoE-live-v0 (gymnasium, SB3, sb3-contrib, cloudpickle wheels on
#               PYTHONPATH)
#   livereplay  time the kernels of a replayed trace window against the simulator's prediction (inputs in
#               benchmarks/live_replay/inputs, made on the CPU by `kernel-gym export` and `kernel-gym replay --steps-json`)
#   diag        the fused-MoE atomic-lowering diagnosis (experiments/diag_moe_atomics.py); later steps use the mode
#               it prints as KERNEL_GYM_MOE_ATOMIC
case "${1:-}" in -h|--help) sed -n "2,/^set -u/p" "$0" | grep "^#" | sed "s/^# \{0,1\}//"; exit 0 ;; esac
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/kernel_gym_triton_cache}
STEPS=${STEPS:-"tests bench collect"}
DB=${DB:-/tmp/h200.sqlite}
T_TESTS=${T_TESTS:-150} T_BENCH=${T_BENCH:-240} T_COLLECT=${T_COLLECT:-150} T_NOISE=${T_NOISE:-90}
start=$(date +%s)
log() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a "$OUT/session.log"; }
import_prev() {  # a fresh machine starts from the committed snapshot (PREV=...) when the store does not exist yet
  if [ -n "${PREV:-}" ] && [ ! -e "$DB" ]; then
    if python3 -c "import sys; from kernel_gym.measure.store import MeasurementStore as S; print(S(sys.argv[1]).import_snapshot(sys.argv[2]))" "$DB" "$PREV" > "$OUT/import.txt" 2>&1; then
      log "imported $(tail -1 "$OUT/import.txt") rows of $PREV"
    else  # a half-imported store would be exported later as if it were the dataset: remove it and stop
      rm -f "$DB" "$DB-wal" "$DB-shm"
      log "import of $PREV FAILED ($(tail -1 "$OUT/import.txt")); store removed, check PREV"
      return 1
    fi
  fi
}

{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
  nproc; } > "$OUT/machine.txt" 2>&1
log "machine: $(tail -2 "$OUT/machine.txt" | tr '\n' ' ')"

for step in $STEPS; do
  case $step in
    diag)
      log "diag: fused-MoE atomic lowering"
      mode=$(timeout "${T_DIAG:-150}" python3 experiments/diag_moe_atomics.py --out "$OUT/diag_moe_atomics.json" 2>>"$OUT/diag.txt" | tail -1)
      [ "$mode" = "relaxed" ] || [ "$mode" = "acq_rel" ] || [ "$mode" = "flat" ] || mode=relaxed
      export KERNEL_GYM_MOE_ATOMIC=$mode
      log "diag: using KERNEL_GYM_MOE_ATOMIC=$mode ($(tr '\n' ' ' < "$OUT/diag.txt"))" ;;
    tests)
      log "tests: pytest -m gpu tests/kernels"
      timeout "$T_TESTS" python3 -m pytest -m gpu tests/kernels -q -n 8 -p no:cacheprovider --maxfail=20 -rfE \
        > "$OUT/gpu_tests.txt" 2>&1
      log "tests: exit $? ($(tail -1 "$OUT/gpu_tests.txt"))" ;;
    bench)
      log "bench"
      timeout "$T_BENCH" python3 -m kernel_gym.cli bench --out "$OUT/h200_kernels.json" --md "$OUT/benchmarks.md" \
        --configs "${BENCH_CONFIGS:-60}" --budget-s $(( T_BENCH - 60 )) > "$OUT/bench.txt" 2>&1
      log "bench: exit $?" ;;
    collect|remeasure)
      import_prev || continue
      extra=${COLLECT_ARGS:-}
      [ "$step" = remeasure ] && extra="--remeasure-noisy $extra"
      # 60 s of slack (half the time for short runs): the shards finish their chunk after the budget, then the
      # integrity check and the snapshot export
      budget=$(( T_COLLECT - 60 )); [ "$budget" -lt $(( T_COLLECT / 2 )) ] && budget=$(( T_COLLECT / 2 ))
      log "$step: budget $budget s"
      timeout "$T_COLLECT" python3 scripts/collect.py --db "$DB" --budget-s "$budget" \
        --out "$OUT/h200_measurements.jsonl.gz" $extra > "$OUT/$step.txt" 2>&1
      log "$step: exit $? ($(tail -c 300 "$OUT/$step.txt" | tr '\n' ' '))" ;;
    noise)
      import_prev || continue
      log "noise study"
      CUDA_VISIBLE_DEVICES=${NOISE_GPU:-${CUDA_VISIBLE_DEVICES:-0}} timeout "$T_NOISE" python3 scripts/collect.py --db "$DB" --noise 3 --noise-out "$OUT/noise.json" \
        > "$OUT/noise.txt" 2>&1
      log "noise: exit $?" ;;
    farm)
      args=${FARM_ARGS:-"--kernels fused_moe --model mixtral-8x7b --grid default --configs-per-shape 4"}
      half=$(( ${T_FARM:-480} / 2 ))
      rm -f /tmp/farm_plain.sqlite* /tmp/farm_b.sqlite*
      log "farm: plain collection ($args)"
      timeout "$half" python3 scripts/collect.py --db /tmp/farm_plain.sqlite --gpus 1 $args > "$OUT/farm_plain.txt" 2>&1
      log "farm: plain exit $? ($(tail -c 300 "$OUT/farm_plain.txt" | tr '\n' ' '))"
      if python3 -c "import ray" 2>/dev/null; then how="--ray"; else how=""; fi
      log "farm: second collection ${how:-plain (ray not installed: $(python3 scripts/collect.py --ray 2>&1 | tail -1))}"
      timeout "$half" python3 scripts/collect.py --db /tmp/farm_b.sqlite --gpus 1 $how $args > "$OUT/farm_b.txt" 2>&1
      log "farm: second exit $? ($(tail -c 300 "$OUT/farm_b.txt" | tr '\n' ' '))"
      python3 scripts/compare_stores.py /tmp/farm_plain.sqlite /tmp/farm_b.sqlite --json "$OUT/farm_compare.json" \
        > "$OUT/farm_compare.txt" 2>&1
      log "farm: compare exit $? ($(tr '\n' ' ' < "$OUT/farm_compare.txt"))"
      cp /tmp/farm_plain.sqlite "$OUT/farm_plain.sqlite"; cp /tmp/farm_b.sqlite "$OUT/farm_b.sqlite" ;;
    recorded)
      log "recorded backend: held-out error, lookups/s"
      timeout 120 python3 benchmarks/recorded_backend/run.py --db "$DB" > "$OUT/recorded.txt" 2>&1
      log "recorded: exit $?" ;;
    live)
      log "live: MaskablePPO on KernelGym/MoE-live-v0"
      timeout "${T_LIVE:-330}" python3 scripts/live_train.py run --out "$OUT/live_moe.json" \
        --timesteps "${LIVE_STEPS:-320}" --budget-s $(( ${T_LIVE:-330} - 100 )) > "$OUT/live_train.txt" 2>&1
      log "live: exit $? ($(tail -c 400 "$OUT/live_train.txt" | tr '\n' ' '))" ;;
    livereplay)
      log "livereplay: replayed kernels timed vs the simulator's prediction"
      timeout "${T_LIVEREPLAY:-240}" python3 benchmarks/live_replay/run.py \
        --steps benchmarks/live_replay/inputs/steps.json.gz --table benchmarks/live_replay/inputs/dispatch_table.json \
        --out "$OUT/live_replay.json" --max-steps 2000 --budget-s $(( ${T_LIVEREPLAY:-240} - 40 )) \
        > "$OUT/live_replay.txt" 2>&1
      log "livereplay: exit $? ($(tail -c 600 "$OUT/live_replay.txt" | tr '\n' ' '))" ;;
    *) log "unknown step $step" ;;
  esac
done
log "done"
