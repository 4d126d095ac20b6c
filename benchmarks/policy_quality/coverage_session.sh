#!/usr/bin/env bash
# One H200 command (session 60): measure each shape's neighbours' three fastest configs where it has not stored them
# (neighbour_winners_plan.json, `scripts/plan_coverage.py --neighbour-winners --top 3`), so that a held-out shape's
# winner is seen on both sides of it. Raw rows, the log
# and the GPU's clocks once a second under $OUT; merged into the packaged dataset on the CPU afterwards
# (benchmarks/new_knob_rows/README.md, "Merged"), then `benchmarks/policy_quality/run.py --seeds 0 1 2` again.
#   BUDGET_S=560 KERNEL_GYM_COMMIT=<tree> OUT=... bash benchmarks/policy_quality/coverage_session.sh   (about 500 of 675)
# PLAN=<file> measures another plan: neighbour_winners_rest_plan.json is the 91 configs session 67's run did not reach.
set -u
OUT=${OUT:?set OUT}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/kernel_gym_triton_cache KERNEL_GYM_HEAT=0
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv -l 1 > "$OUT/power.csv" 2>&1 &
smi=$!
echo "${KERNEL_GYM_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}" > "$OUT/commit.txt"  # the tree sent
B=${BUDGET_S:-480}
# one call over both kernels (collect --plan refuses entries of a kernel --kernels leaves out); it stops starting
# chunks at its budget, and the timeout bounds the chunk in flight and the integrity check
timeout $(( B - 30 )) python3 scripts/collect.py --plan "${PLAN:-benchmarks/policy_quality/neighbour_winners_plan.json}" \
  --kernels decode_attention,prefill_attention --db /tmp/neighbour_winners.sqlite --compile-workers 14 \
  --budget-s $(( B - 100 )) >> "$OUT/collect.log" 2>&1
echo "[coverage_session] collect: exit $?" >> "$OUT/collect.log"
python3 -c "from kernel_gym.measure.store import MeasurementStore as S; S('/tmp/neighbour_winners.sqlite').export_snapshot('$OUT/neighbour_winner_rows.jsonl.gz')" >> "$OUT/collect.log" 2>&1
kill "$smi" 2>/dev/null
tail -n 5 "$OUT/collect.log"
