#!/usr/bin/env bash
# One H200 command (session 49): the MoE of steps with prefill chunks timed as the live stack routes them. Steps with
# chunks were under-priced by 8-12% in every run while decode-only steps were not (benchmarks/live_e2e/retrained); the
# profiled window 1 (eager_ab2db7d) put the MoE with its routing at 1.19x its table at 396 tokens. The live stack's chunk
# tokens attend to the same earlier tokens and its router sends them to few experts (moe_graph_table.chunk_inputs),
# where the tables were timed with even routings. Both chunk tables (graphed, 16-512 rows; eager, 512-4,096 tokens),
# every live policy's configs, every layer's inputs from a model-shaped forward of one chunk; the tables
# run.py --predict --moe-chunk reads. Everything under $OUT comes back as one tarball and the log.
#   KERNEL_GYM_COMMIT=<tree> OUT=... bash benchmarks/live_e2e/chunk_session.sh
source benchmarks/live_e2e/session_common.sh
log "MoE chunk table, graphed, $(left) s left"
timeout 300 python3 benchmarks/live_e2e/moe_graph_table.py --chunk --out "$E/moe_chunk" --budget-s 240 \
  > "$E/moe_chunk_graph.log" 2>&1
log "graphed: exit $? $(tail -n 30 "$E/moe_chunk_graph.log" | grep -a 'T=\|timed' | tr '\n' ' ')"
log "MoE chunk table, eager, $(left) s left"
timeout $(( $(left) - 15 )) python3 benchmarks/live_e2e/moe_graph_table.py --chunk --eager --out "$E/moe_chunk" \
  --budget-s $(( $(left) - 60 )) > "$E/moe_chunk_eager.log" 2>&1
log "eager: exit $? $(tail -n 30 "$E/moe_chunk_eager.log" | grep -a 'T=\|timed' | tr '\n' ' ')"
finish
