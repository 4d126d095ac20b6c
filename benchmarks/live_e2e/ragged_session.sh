#!/usr/bin/env bash
# One GPU command (session 57): ragged_decode.py's cases for OLMoE's and Mixtral's attention shapes (the default
# config and the vllm-table's grouped one): is the default's slower per-token time on live steps of 9-16 sequences
# (same_gpu_h100_298d0ec/) set by the batch, the padding rows, the long sequence's place or the other sequences'
# tokens? Any GPU answers it; machine.txt says which.
#   KERNEL_GYM_COMMIT=<tree> OUT=... bash benchmarks/live_e2e/ragged_session.sh
source benchmarks/live_e2e/session_common.sh
for model in olmoe-1b-7b mixtral-8x7b; do
  log "$model, $(left) s left"
  timeout $(( $(left) / 2 + 20 )) python3 benchmarks/live_e2e/ragged_decode.py --model $model --out "$E/$model" \
    --budget-s $(( $(left) / 2 - 20 )) > "$E/$model.log" 2>&1
  log "$model: exit $? $(grep -a 'wrote' "$E/$model.log")"
done
finish
