"""Dispatch: everything about choosing a config for a workload, between traffic and envs in the import order
(kernels < measure < traffic < dispatch < envs < policies < cli; docs/architecture.md).

- `catalogue.py`: reference times per workload (`WorkloadReference`, `measure_reference`), the agent's action set
  (`Catalogue`, `build_catalogue`), train / held-out splits and policy evaluation against the oracle.
- `observation.py`: the observation encoding every kernel env and the logged policy share (bundled verbatim with the
  MLflow pyfunc model: it imports nothing from kernel_gym).
- `dispatcher.py`: the dispatch table (shape buckets `AXES`, `KernelTable`, `DispatchTable`) and the `Dispatcher`
  serving code calls.
- `baselines.py`: the policies a user could run instead of the learned one (default, static, vllm-table, autotune,
  random, tpe, oracle) as simulator ConfigChoosers.
- `rules.py`: the decision rules those share, one named function per rule (below).
- `serving_rules.py`: Serving-v0's dispatch rules (`bucket_of`, `DispatchRule`), their catalogue built from the
  training traffic (`build_serving_catalogue`) and the choosers the simulator runs them through (`_RuleChooser`,
  `OracleChooser`).

The package's `__init__` imports nothing, so `import kernel_gym.dispatch.dispatcher` stays standard-library-only.

Decision rules: which chooser uses which
----------------------------------------
Oracle (`rules.fastest`: lowest time, ties to the first in the given order): `WorkloadReference.best_config`,
`baselines.Oracle.best` (fastest valid, answerable config on the KV layout in force), `SearchPolicy` keeping the
fastest of the configs it measured, `parallel/step_time.py`'s pricer and replay's oracle on a prefix call's layout.
`serving_rules.py`'s `OracleChooser` applies the same rule through `_Answers.ranked()[0]` (a stable sort by time, so
the same tie order) and its rule tables through `_fastest_of`.

Action masks (`catalogue.py`): `action_mask` (valid by the knob-space rules and answered by the backend, plus the timed
default: the kernel envs and training's evaluation) and `rule_mask` (the rules alone: a logged or bundled policy at a
shape it never saw).

Fallback, when a choice has no time: one rule, `rules.fallback_config`: the family default, else the SLOWEST timed
candidate (the conservative bound: a choice the data cannot score is never credited with a good time). Used by
`WorkloadReference.ratio_with_fallback` (training evaluation, the static baseline), `policies.replay`'s
`GuardedChooser` and the Serving-v0 env (`serving_rules._RuleChooser._resolve`, every fallback counted in
`info["fallbacks"]`; it used to credit the fastest available config, which flattered the agent at its 9 fallbacks on
the committed benchmark: benchmarks/serving/ was re-run with the shared rule).

Following the KV layout (a decode config under the page size and layout in force): two different rules.
- `rules.on_layout` / `rules.follow_kv` / `rules.default_for`: the same knobs on the new layout if valid there, else
  the valid config on that layout nearest in knobs. Used by the `Dispatcher`, the baselines, replay, export and
  online adaptation.
- Plain relabelling (`cfg.replace(PAGE_SIZE=..., LAYOUT=...)`, no validity check): `traffic.simulator.StaticChooser`
  (the traffic floor cannot import dispatch) and `serving_rules.py`'s `DispatchRule` / `_RuleChooser`, where a
  relabelled config that is invalid or untimed then takes the env's fallback above.

Shape buckets: the dispatch table's two axes per kernel are its profile's (`kernels/profiles.py` `dispatch_axes`,
`axis_values`, `export_grid`: `dispatcher.AXES`, `axis_values`, `grid_centers`); the search baselines' tuning key
(`baselines.shape_key`, what an autotuner keys on) and the Serving-v0 rule tables' half-octave buckets
(`serving_rules.py` `bucket_of`) stay per use. The deployment's KV layout: `DEFAULT_KV` and the export's choice of a
layout for a decode table (`dispatcher.layout_scores`, `pick_layout`) are here.
"""
