"""Serving-v0 evaluation: tokens/s of a policy (a trained agent, a callable or "default") on held-out windows of the
trace, beside the default rules and the per-workload oracle on the same windows, with stalls, fallbacks, proxied calls
and the share of tuned-kernel time resting on estimated times (`evaluate_serving`). benchmarks/serving/run.py and
benchmarks/serving/ use it; the environment is kernel_gym/envs/serving.py.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from kernel_gym.dispatch.serving_rules import OracleChooser, _RuleChooser
from kernel_gym.envs.serving import ServingEnv
from kernel_gym.kernels import profiles
from kernel_gym.traffic.simulator import KERNELS


def _act(policy: Any, obs: np.ndarray, env: ServingEnv) -> np.ndarray:
    if isinstance(policy, str):
        if policy != "default":
            raise ValueError(f"policy {policy!r}: give 'default', a callable (obs, env) -> action or a model")
        return env.default_action()
    if hasattr(policy, "predict"):
        try:
            a, _ = policy.predict(obs, deterministic=True, action_masks=env.action_masks())
        except TypeError:  # a plain sb3 model takes no masks
            a, _ = policy.predict(obs, deterministic=True)
        return np.asarray(a)
    return np.asarray(policy(obs, env))


def estimated_shares(kernel_s: dict[str, dict[str, float]], estimated_s: dict[str, dict[str, float]],
                     windows: int = 1) -> dict[str, float]:
    """Per policy ("agent", ...): `<who>_tuned_kernel_s` (per window), `<who>_estimated_share` and
    `<who>_estimated_share.<kernel>`: estimated seconds / tuned-kernel seconds (0.0 when a family ran no kernel)."""
    out: dict[str, float] = {}
    for who, ks in kernel_s.items():
        es = estimated_s[who]
        total = sum(ks.values())
        out[f"{who}_tuned_kernel_s"] = total / max(windows, 1)
        out[f"{who}_estimated_share"] = sum(es.values()) / total if total > 0 else 0.0
        for k in KERNELS:
            out[f"{who}_estimated_share.{k}"] = es[k] / ks[k] if ks[k] > 0 else 0.0
    return out


def evaluate_serving(env_kwargs: dict[str, Any], policy: Any, start_s: Sequence[float] | None = None,
                     num_windows: int = 1) -> dict[str, Any]:
    """Tokens/s of `policy` (a callable (obs, env) -> action, an sb3 model, or "default"), of the default rules, and
    of the per-workload oracle chooser (fastest available config per step's workload, compile stalls counted, decode
    layout fixed to the catalogue's oracle layout) on the same windows. Windows: `start_s` (trace seconds) or
    `num_windows` evenly spaced over the env's split (default split "heldout"). Per policy (agent, default, oracle)
    also the share of its tuned-kernel seconds resting on estimated times, overall and per family
    (`estimated_shares`), and the share of kernel calls on proxied workloads (`<who>_proxied_share`)."""
    kw = dict(env_kwargs)
    kw.setdefault("split", "heldout")
    env = ServingEnv(**kw)
    if start_s is None:
        lo, hi = env._range
        start_s = [lo] if num_windows <= 1 else list(np.linspace(lo, hi, num_windows))
    span = env.interval_s * env.num_intervals
    totals = {"agent": 0.0, "default": 0.0, "oracle": 0.0}
    calls = {"agent": [0, 0, 0], "default": [0, 0, 0], "oracle": [0, 0, 0]}  # kernel calls, proxied, fallbacks
    stalls = {"agent": 0.0, "default": 0.0, "oracle": 0.0}
    # tuned-kernel seconds per family (all layers) and the part resting on estimated times
    kernel_s = {who: dict.fromkeys(KERNELS, 0.0) for who in calls}
    est_s = {who: dict.fromkeys(KERNELS, 0.0) for who in calls}
    rows: list[dict[str, Any]] = []
    actions: list[list[str]] = []
    for s in start_s:
        row: dict[str, Any] = {"start_s": float(s)}
        for who in ("agent", "default"):
            obs, _ = env.reset(options={"start_s": float(s)})
            tokens, stall, done = 0, 0.0, False
            while not done:
                a = env.default_action() if who == "default" else _act(policy, obs, env)
                obs, _, done, _, info = env.step(a)
                tokens += info["tokens"]
                stall += info["stall_s"]
                calls[who][0] += info["kernel_calls"]
                calls[who][1] += info["proxied_calls"]
                calls[who][2] += info["fallbacks"]
                for k in KERNELS:
                    kernel_s[who][k] += info["kernel_s"][k]
                    est_s[who][k] += info["estimated_kernel_s"][k]
                if who == "agent":
                    actions.append(info["rules"])
            elapsed = env.sim.clock - env._t0
            row[f"{who}_tokens_per_s"] = tokens / elapsed
            totals[who] += tokens / elapsed
            stalls[who] += stall
        oracle = OracleChooser(env.answers)
        sim = env.make_simulator(float(s), _RuleChooser(env.answers, {k: env.catalogue.rules[k][0] for k in KERNELS}))
        t0 = sim.clock
        kv = env.catalogue.oracle_kv
        relayout = sim.set_kv_layout(kv.page_size, kv.layout)
        sim.chooser = oracle
        st = sim.run_until(t0 + span)
        row["oracle_tokens_per_s"] = st.output_tokens / (sim.clock - t0)
        totals["oracle"] += row["oracle_tokens_per_s"]
        n_calls, n_prox = oracle.coverage.snapshot()
        calls["oracle"][0] += n_calls
        calls["oracle"][1] += n_prox
        ks, es = oracle.coverage.seconds()
        for k in KERNELS:
            kernel_s["oracle"][k] += ks[k] * profiles.layers_of(k, env.model)
            est_s["oracle"][k] += es[k] * profiles.layers_of(k, env.model)
        stalls["oracle"] += st.stall_s
        row["oracle_relayout_s"] = relayout
        row["oracle_compiles"] = sum(1 for _, _, why in st.stalls if why.startswith("compile"))
        rows.append(row)
    n = len(rows)
    out = {k + "_tokens_per_s": v / n for k, v in totals.items()}
    out.update({k + "_stall_s": v / n for k, v in stalls.items()})
    out["agent_over_oracle"] = out["agent_tokens_per_s"] / out["oracle_tokens_per_s"]
    out["default_over_oracle"] = out["default_tokens_per_s"] / out["oracle_tokens_per_s"]
    # honesty of the numbers: the share of kernel calls answered outside the measured grid (CoveredBackend proxy),
    # and of rule picks the backend could not answer (the chooser fell back to the default or fastest config)
    for who, (nc, npx, nfb) in calls.items():
        out[f"{who}_proxied_share"] = npx / nc if nc else 0.0
        out[f"{who}_fallbacks"] = nfb
    # and the share of each policy's tuned-kernel seconds whose times are estimates (interpolated between measured
    # shapes, proxied, or borrowed from another shape) rather than measurements of that workload and config
    out.update(estimated_shares(kernel_s, est_s, n))
    out["windows"] = rows
    out["agent_rules"] = actions
    out["oracle_kv"] = f"{env.catalogue.oracle_kv.page_size}/{env.catalogue.oracle_kv.layout}"
    return out
