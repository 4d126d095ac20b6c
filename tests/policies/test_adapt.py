"""Online adaptation: traffic drifting beyond the table's coverage (routing skew past the table's grid) is detected,
the policy is asked for the new buckets, the new configs are pre-compiled, and the table is swapped atomically."""

from __future__ import annotations

import pytest

from kernel_gym.deploy.adapt import OnlineTuner, run_adaptive  # noqa: E402
from kernel_gym.deploy.export import fixed_dims  # noqa: E402
from kernel_gym.dispatch.dispatcher import Dispatcher, DispatchTable, KernelTable  # noqa: E402
from kernel_gym.kernels.space import Config  # noqa: E402
from kernel_gym.models import BUILTIN_MODELS  # noqa: E402
from kernel_gym.traffic import BackendTimer, Simulator, ZipfRouting, load_trace  # noqa: E402
from kernel_gym.traffic.simulator import KVLayout  # noqa: E402
from tests.fakes.analytic_backend import AnalyticBackend

MODEL = BUILTIN_MODELS["mixtral-8x7b"]
A = Config(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, GROUP_M=1, num_warps=4, num_stages=3, SPLIT_K=1, FUSE_SILU=0,
           FUSE_WEIGHT=1, FUSE_SUM=0)
HOT = A.replace(BLOCK_N=128, GROUP_M=8, num_warps=8)  # valid at every M (BLOCK_M 16 fits any batch)


def narrow_table() -> DispatchTable:
    """MoE buckets for uniform-ish routing only (skew 0..0.3)."""
    t = KernelTable("fused_moe", ([1, 64, 8192], [0.0, 0.3]), [A], [0] * 6, fixed_dims("fused_moe", MODEL))
    return DispatchTable({"fused_moe": t}, model={"name": MODEL.name})


def test_skew_drift_triggers_replan_and_atomic_swap():
    asked = []

    def policy(workloads):  # the policy: strong skew -> HOT
        asked.extend(workloads)
        return [HOT if w.skew > 0.5 else A for w in workloads]

    disp = Dispatcher(narrow_table())
    backend = AnalyticBackend(sample=400)
    trace = load_trace("bundled").window(0, 40)
    sim = Simulator(MODEL, trace, BackendTimer(backend), disp, ZipfRouting(8, 2, seed=0, exponent=1.5),
                    kv_layout=KVLayout(16, "NHD"))
    tuner = OnlineTuner(disp, MODEL, {"fused_moe": policy}, window_s=5.0)
    first = disp.table
    res = run_adaptive(sim, tuner, interval_s=5.0)
    assert disp.swaps == 1 and disp.table is not first  # one re-plan covers the drift; no flapping
    skews = disp.table.kernels["fused_moe"].centers[1]
    assert max(skews) > 1.0 and tuner.replans[0]["kernel"] == "fused_moe" and tuner.replans[0]["axis"] == 1
    assert asked and all(w.skew > 1.0 for w in asked)  # only the new buckets were asked
    assert disp.moe_config(64, max(skews)) == HOT and disp.moe_config(64, 0.0) == A
    # the new config was compiled before the swap: no compile stall after it
    assert not [s for s in res.stalls if "compile fused_moe" in s[2] and s[0] > 5.0]
    assert res.configs_used["fused_moe"].get(str(HOT), 0) > 0


def test_measure_budget_picks_the_fastest_and_charges_it():
    backend = AnalyticBackend(sample=400)
    disp = Dispatcher(narrow_table())
    tuner = OnlineTuner(disp, MODEL, {"fused_moe": lambda ws: [HOT] * len(ws)}, backend=backend, measure_budget=2)
    from kernel_gym.deploy.adapt import Drift

    table = tuner.replan([Drift("fused_moe", 1, [1.4, 1.6], (0.0, 0.3))])
    t = table.kernels["fused_moe"]
    assert t.centers[1] == [0.0, 0.3, 1.4, 1.6] and t.policy.get("adapted") is True
    assert tuner.tuning_gpu_s > 0
    w = __import__("kernel_gym.kernels.workloads", fromlist=["x"]).MoEWorkload(64, 8, 2, 4096, 14336, 1.6)
    chosen = t.lookup(64, 1.6)
    assert backend.time_ms("fused_moe", w, chosen) == pytest.approx(
        min(backend.time_ms("fused_moe", w, c) for c in (HOT, A)))
