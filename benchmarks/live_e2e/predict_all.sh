#!/usr/bin/env bash
# CPU: every graphed live run predicted again with today's tables (run.py --predict's defaults), each summary written
# beside its run under benchmarks/live_e2e/predicted/<run>/ (--summary-dir: the run's own summary.json, predicted at
# the tree it names, stays), then the live check over them (kernel_gym/data/live_check.json, printed under every
# replay table, and live_check.png). The step overheads are fitted on graphs/window1's vllm-table run first and held
# for the others, as every run's own prediction did. About 17 minutes on 2 cores (37 runs, 80 policy runs); JOBS=N runs
# N at once.
#   bash benchmarks/live_e2e/predict_all.sh
# To compare a --predict option: PREDICT_ARGS="--decode-waves off" P=/tmp/off bash benchmarks/live_e2e/predict_all.sh
# (the live check is written over those summaries too: `git checkout kernel_gym/data/live_check.json
# benchmarks/live_e2e/live_check.png` after).
# ONLY=<grep -E pattern> re-predicts only the runs it matches (e.g. ONLY=window for the Mixtral runs, the calibration
# run included); the others' committed summaries are copied into $P unchanged, so the live check still covers all.
set -eu
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
L=benchmarks/live_e2e
P=${P:-$L/predicted}
X=${PREDICT_ARGS:-}
RUNS="dense_217cbde/olmoe_w4 graph_5ebaec4/olmoe_g graph_5ebaec4/window1_g graphs/olmoe graphs/window1
graphs/window1_rep2 graphs/window1_rep3 graphs/window1_rep4 graphs/window2 graphs/window3_long
olmoe_rep_6331459/olmoe_rep_300 olmoe_rep_6331459/olmoe_rep_400 repeat_61e2314/olmoe_w3 repeat_61e2314/window4_rep2
retrained/run1_seed0_53398a4/window5 retrained/run1_seed0_53398a4/window6 retrained/run2_seeds12_b9a8a42/window5
retrained/run2_seeds12_b9a8a42/window6 retrained/run3_seed0_43be02e/window1 retrained/run3_seed0_43be02e/window4
retrained/run4_seed0_43be02e/window7 retrained/run4_seed0_43be02e/window8 window4_5ee0534/olmoe_w4_vllm
window4_5ee0534/window4 window5_f269e69/olmoe_prof window5_f269e69/olmoe_w5 window5_f269e69/window5
window6_01d3818/olmoe_w6 window6_01d3818/window6 eager_ab2db7d/window1_prof5
heldout_32cded3/code_mixtral heldout_32cded3/code_olmoe heldout_bffac01/code540_mixtral heldout_bffac01/code540_olmoe
dispatch_h200_0d9f96c/code540_mixtral issue_h200_0d9f96c/code_olmoe issue_h200_0d9f96c/code540_olmoe"
ONLY=${ONLY:-.}
echo "[predict_all] graphs/window1 (the calibration run)"
$PY $L/run.py --out $L/graphs/window1 --predict --calibrate vllm-table $X --summary-dir $P/graphs/window1 > /dev/null
for r in $RUNS; do
  [ "$r" = graphs/window1 ] && continue
  if echo "$r" | grep -qE "$ONLY"; then echo "$r"
  elif [ "$P" != "$L/predicted" ]; then mkdir -p "$P/$r" && cp "$L/predicted/$r/summary.json" "$P/$r/"
  fi
done | xargs -P "${JOBS:-2}" -I{} sh -c "$PY $L/run.py --out $L/{} --predict $X --summary-dir $P/{} \
  --calibration-from $P/graphs/window1/summary.json > /dev/null 2>&1 && echo '[predict_all] {}' || \
  { echo '[predict_all] FAILED {}'; exit 255; }"
$PY $L/run.py --live-check $(for r in $RUNS; do printf '%s ' "$P/$r"; done)
