"""Serving one MoE model on several GPUs: tensor and expert parallelism, priced from measurements.

- `collectives.py`: the measured NCCL collectives table (benchmarks/multigpu/run_collectives.py writes it on a multi-GPU
  machine), log-log interpolation in message size, refusals outside what was measured. Standard library only, so the
  GPU script can import it for the message sizes.
- `layout.py`: Layout(tp, ep) on G GPUs, its validity rules, the shapes each GPU runs, EP load imbalance from the
  step's routing.
- `step_time.py`: the per-layer time of one engine step under a layout (sharded kernel times from the backend at the
  busiest GPU + collective times from the table), with the share resting on estimates; the simulator subclass that
  serves a trace under a layout; goodput at a TTFT/TPOT SLO.

Nothing here runs without a measured collectives table: the simulator refuses, naming the command that makes one
(docs/parallelism.md).
"""
