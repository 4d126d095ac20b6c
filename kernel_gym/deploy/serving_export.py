"""Serving-v0's learned rules as a deployment's dispatch table: the rules a trained serving agent puts in force, turned
into a kernel_gym.dispatch.dispatcher.DispatchTable that the Dispatcher loads, as the kernel agents' exports are.

What carries over exactly and what does not:
- The agent switches rules every control interval from traffic features; a dispatch table is one static map.
  `most_used_rules` takes, per family, the rule the agent kept in force for the most intervals (evaluate_serving's
  `agent_rules`; `export_serving_agent` runs that evaluation). A deployment that wants the switching keeps one table per
  rule set and `Dispatcher.swap`s them; the controller deciding when is not exported.
- MoE and decode rules key on half-octave buckets of (num_tokens, skew in quarters) and (batch, context_len): the
  dispatch table's own axes. The exported grid has one cell per bucket (centers 2**(j/2) on the log axes, up to
  2**GRID_MAX_LOG2; skews 0 to SKEW_MAX in quarters) holding the rule's own choice for that bucket (nearest bucket
  included: `DispatchRule.config_at`), so inside the grid the Dispatcher returns the rule's config for every workload
  with integer sizes and a skew on the simulator's 0.05 grid. Outside it (or at a skew exactly halfway between two
  quarters: bucket_of rounds half to even, a table edge sends it up) the Dispatcher clamps to the edge cell.
- Prefill rules key on causal (query, key) pairs, which the table's axes (total_tokens, max_len) do not determine:
  a cell holds the rule's choice for its representative batch (sequences of max_len tokens summing to total_tokens,
  as deploy/export.py's cells): exact for those batches, an approximation for other batches in the cell.
- Default rules (the family heuristic per workload): MoE and prefill are left out of the table, so the Dispatcher
  answers with the same family default; decode's default config depends on neither batch nor context, so its cells
  hold it, on the rule's KV layout (the table's `kv_layout`).
"""

from __future__ import annotations

import inspect
from collections import Counter
from dataclasses import asdict
from typing import Any, Sequence

from kernel_gym.deploy.export import DEFAULT_DEVICE, cell_workload, fixed_dims, versions
from kernel_gym.dispatch.dispatcher import DispatchTable, KernelTable
from kernel_gym.dispatch.serving_rules import DispatchRule, ServingCatalogue
from kernel_gym.kernels import profiles
from kernel_gym.kernels.space import Config
from kernel_gym.traffic.simulator import KERNELS
from kernel_gym.traffic.windows import resolve_model

GRID_MAX_LOG2 = 20  # log axes: bucket centers 2**(j/2) for j = 0 .. 2 * GRID_MAX_LOG2 (1 to ~1M)
SKEW_MAX = 4.0  # MoE skew axis: 0 to SKEW_MAX in quarters (traffic.routing.effective_skew stays in [0, 4])


def rule_grid(kernel: str) -> tuple[list[float], list[float]]:
    """The bucket centers per axis of an exported rule: one per bucket_of bucket (see the module docstring)."""
    logs = [2.0 ** (j / 2.0) for j in range(2 * GRID_MAX_LOG2 + 1)]
    p = profiles.get(kernel)
    if p is None or p.serving_cell is None:
        raise ValueError(f"unknown kernel {kernel!r}: choose one of {list(KERNELS)}")
    return logs, ([q / 4.0 for q in range(int(SKEW_MAX * 4) + 1)] if p.serving_skews else list(logs))


def rule_kernel_table(rule: DispatchRule, model: Any, dtype: str = "bfloat16",
                      policy: dict[str, Any] | None = None) -> KernelTable | None:
    """The KernelTable serving `rule` for `model` (a name or ModelSpec), or None for a MoE or prefill default rule
    (the Dispatcher's answer for a kernel missing from the table is that same default)."""
    kernel = rule.kernel
    if rule.is_default and not profiles.follows_kv(kernel):
        return None
    spec = resolve_model(model)
    fixed = fixed_dims(kernel, spec, dtype)
    c0, c1 = rule_grid(kernel)
    serving_cell = profiles.profile(kernel).serving_cell
    configs: list[Config] = []
    for i, a in enumerate(c0):
        for j, b in enumerate(c1):
            if rule.is_default:  # decode: the default config on the rule's layout, the same in every cell
                configs.append(rule.choose(cell_workload(kernel, fixed, round(a), round(b))))
            else:  # the rule's own choice for the cell's bucket (its profile's serving_cell)
                configs.append(rule.config_at(serving_cell(i, j, a, b)))
    unique = list(dict.fromkeys(configs))
    index = {c: n for n, c in enumerate(unique)}
    kv = None
    if profiles.follows_kv(kernel):
        kv = {"page_size": rule.kv.page_size, "layout": rule.kv.layout, "chosen_by": "the Serving-v0 rule's KV layout"}
    provenance = {"source": "KernelGym/Serving-v0", "rule": rule.name, **(policy or {})}
    return KernelTable(kernel, (c0, c1), unique, [index[c] for c in configs], fixed, provenance, kv)


def serving_dispatch_table(rules: dict[str, DispatchRule], model: Any, device: str = DEFAULT_DEVICE,
                           dtype: str = "bfloat16", policy: dict[str, Any] | None = None) -> DispatchTable:
    """A DispatchTable from one Serving-v0 rule per family (`policy`: provenance stored with each kernel, e.g. the
    agent's run). Default MoE / prefill rules are left out (listed in meta["left_out"])."""
    spec = resolve_model(model)
    kernels: dict[str, KernelTable] = {}
    left_out: dict[str, str] = {}
    for kernel, rule in rules.items():
        if rule.kernel != kernel:
            raise ValueError(f"rules[{kernel!r}] is a {rule.kernel} rule ({rule.name!r}); key each rule by its kernel")
        table = rule_kernel_table(rule, spec, dtype, policy)
        if table is None:
            left_out[kernel] = f"rule {rule.name!r}: the family default, the Dispatcher's answer for a missing kernel"
        else:
            kernels[kernel] = table
    if not kernels:
        raise ValueError("every rule is a family default: the Dispatcher without a table already serves them; "
                         "nothing to export")
    meta = {"source": "KernelGym/Serving-v0", "rules": {k: r.name for k, r in rules.items()}, "left_out": left_out}
    return DispatchTable(kernels, device, asdict(spec), versions(), meta)


def rules_of_action(catalogue: ServingCatalogue, action: Sequence[int]) -> dict[str, DispatchRule]:
    """The rules an env action (one rule index per family, in KERNELS order) puts in force."""
    if len(action) != len(KERNELS):
        raise ValueError(f"action {list(action)} needs one rule index per family {list(KERNELS)}")
    return {k: catalogue.rules[k][int(i)] for k, i in zip(KERNELS, action)}


def most_used_rules(catalogue: ServingCatalogue, agent_rules: Sequence[Sequence[str]]) -> dict[str, DispatchRule]:
    """Per family, the rule in force for the most control intervals (`agent_rules`: one list of rule names per
    interval, in KERNELS order, as evaluate_serving returns them; ties: the rule seen first)."""
    if not agent_rules:
        raise ValueError("no intervals: evaluate the agent first (evaluate_serving's agent_rules)")
    out = {}
    for n, kernel in enumerate(KERNELS):
        name = Counter(step[n] for step in agent_rules).most_common(1)[0][0]
        by_name = {r.name: r for r in catalogue.rules[kernel]}
        if name not in by_name:
            raise ValueError(f"{kernel}: rule {name!r} is not in the catalogue ({sorted(by_name)}); pass the "
                             "catalogue the agent was evaluated with")
        out[kernel] = by_name[name]
    return out


def export_serving_agent(env_kwargs: dict[str, Any], policy: Any, num_windows: int = 1,
                         device: str = DEFAULT_DEVICE) -> tuple[DispatchTable, dict[str, Any]]:
    """Evaluate `policy` (a trained agent, a callable (obs, env) -> action, or "default") on held-out windows of the
    env (evaluate_serving) and export the rules it used most as a DispatchTable; returns (table, evaluation)."""
    from kernel_gym.envs.serving import ServingEnv
    from kernel_gym.evaluate.serving_eval import evaluate_serving

    catalogue = env_kwargs.get("catalogue")
    if catalogue is None:
        raise ValueError("pass the catalogue in env_kwargs (build_serving_catalogue) so the exported rules are the "
                         "ones the agent was trained on")
    res = evaluate_serving(env_kwargs, policy, num_windows=num_windows)
    model = env_kwargs.get("model", inspect.signature(ServingEnv).parameters["model"].default)
    rules = most_used_rules(catalogue, res["agent_rules"])
    used = {k: sum(1 for step in res["agent_rules"] if step[n] == rules[k].name) / len(res["agent_rules"])
            for n, k in enumerate(KERNELS)}
    table = serving_dispatch_table(rules, model, device, policy={"intervals_in_force": used})
    table.meta["agent_over_oracle"] = res["agent_over_oracle"]
    table.meta["intervals"] = len(res["agent_rules"])
    return table, res


__all__ = ["GRID_MAX_LOG2", "SKEW_MAX", "export_serving_agent", "most_used_rules", "rule_grid", "rule_kernel_table",
           "rules_of_action", "serving_dispatch_table"]
