"""The replay reports, per policy and kernel, the share of tuned-kernel time resting on estimated times."""

from __future__ import annotations

from kernel_gym.evaluate import replay
from kernel_gym.evaluate.replay_report import markdown
from kernel_gym.kernels import get_family
from kernel_gym.kernels.workloads import MoEWorkload
from kernel_gym.measure.types import OK, Measurement
from kernel_gym.traffic.simulator import KVLayout

WL_MEASURED = MoEWorkload(16, 8, 2, 4096, 14336, 0.0, "bfloat16")
WL_PROXIED = MoEWorkload(8192, 8, 2, 4096, 14336, 0.0, "bfloat16")


class TwoSourceBackend:
    name = "recorded"

    def measure(self, kernel, workload, config):
        proxied = workload == WL_PROXIED
        return Measurement(kernel, workload.key(), str(config), OK, median_ms=3.0 if proxied else 1.0, spread=0.0,
                           repeats=3, source="recorded-proxy" if proxied else "recorded")

    def available_configs(self, kernel, workload):
        return [get_family(kernel).default_config(workload)]


class DefaultPolicy:
    def choose(self, kernel, workload, kv):
        return get_family(kernel).default_config(workload)


def test_estimated_share_counts_time_on_estimated_answers() -> None:
    guard = replay.GuardedChooser(DefaultPolicy(), TwoSourceBackend(), num_layers=2)
    kv = KVLayout(16, "NHD")
    for wl in (WL_MEASURED, WL_MEASURED, WL_PROXIED):
        guard.choose("fused_moe", wl, kv)
    assert abs(guard.kernel_s["fused_moe"] - 10e-3) < 1e-12
    assert abs(guard.estimated_s["fused_moe"] - 6e-3) < 1e-12
    assert guard.estimated_s["decode_attention"] == 0.0


def test_markdown_prints_the_share_beside_the_figures() -> None:
    m = {k: 1.0 for k in ("tokens_per_s", "tuned_kernel_s", "tuning_gpu_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
                          "tpot_p99_s")}
    m.update({"estimated_share": 0.25, "estimated_share.fused_moe": 0.5, "estimated_share.decode_attention": 0.0,
              "estimated_share.prefill_attention": 0.1})
    md = markdown({"trace": "t", "model": "mixtral-8x7b", "routing": "zipf:1.2", "policies": {"learned": m}})
    assert "| 25.0% (10%/0%/50%) |" in md and "Expert routing: zipf:1.2" in md


class TableBackend:
    """Times and sources from a table {(workload, config): (ms, source)}; other pairs are unavailable."""

    name = "recorded"

    def __init__(self, table):
        self.table = table

    def measure(self, kernel, workload, config):
        hit = self.table.get((workload, config))
        if hit is None:
            return Measurement(kernel, workload.key(), str(config), "unavailable", source="recorded")
        return Measurement(kernel, workload.key(), str(config), OK, median_ms=hit[0], spread=0.0, repeats=3,
                           source=hit[1])

    def available_configs(self, kernel, workload):
        return [c for (w, c) in self.table if w == workload]


def test_policy_quality_shares_come_from_the_sources_of_the_scoring_times() -> None:
    """bench_policies: a workload counts as estimated when its oracle or the policy's (fallback) time is estimated; the
    oracle-time share weighs the oracle's milliseconds. A result on measured rows only reports 0.0, computed."""

    from benchmarks.policy_quality import run as bench
    fam = get_family("fused_moe")
    a, b = MoEWorkload(16, 16, 2, 4096, 14336, 0.0, "bfloat16"), MoEWorkload(4096, 16, 2, 4096, 14336, 0.0, "bfloat16")
    ca, cb = fam.default_config(a), fam.default_config(b)
    assert ca != cb
    table = {(a, ca): (1.0, "recorded"), (a, cb): (2.0, "recorded"),
             (b, ca): (4.0, "recorded-interpolated"), (b, cb): (3.0, "recorded-interpolated")}
    rows = [{"workload": a.key(), "chosen": str(cb)}, {"workload": b.key(), "chosen": str(cb)}]
    out = bench.estimated_shares(TableBackend(table), "fused_moe", rows)
    assert out["estimated_workloads"] == 1 and out["estimated_workload_share"] == 0.5
    assert abs(out["estimated_oracle_time_share"] - 3.0 / (1.0 + 3.0)) < 1e-12
    assert abs(out["estimated_policy_time_share"] - 3.0 / (2.0 + 3.0)) < 1e-12
    # only the policy's time estimated: the oracle (ca) is measured at b; the policy's choice has no time there, so
    # it is scored at b's default config (cb), whose time is borrowed
    table2 = {(b, ca): (2.0, "recorded"), (b, cb): (3.0, "recorded-borrowed")}
    other = ca.replace(num_warps=8 if ca["num_warps"] != 8 else 4)
    assert other not in (ca, cb)
    out2 = bench.estimated_shares(TableBackend(table2), "fused_moe", [{"workload": b.key(), "chosen": str(other)}])
    assert out2["estimated_workloads"] == 1 and out2["estimated_oracle_time_share"] == 0.0
    assert out2["estimated_policy_time_share"] == 1.0
    measured = {k: (v[0], "recorded") for k, v in table.items()}
    zero = bench.estimated_shares(TableBackend(measured), "fused_moe", rows)
    assert zero["estimated_workload_share"] == 0.0 and zero["estimated_oracle_time_share"] == 0.0
    assert zero["estimated_share_basis"].startswith("computed")
    md_doc = {"command": "x", "machine": {"cpus": 2}, "results": [
        {"env_id": "KernelGym/MoE-v0", "model": "m", "geomean_policy": 1.0, "geomean_default": 0.5,
         "geomean_static": 0.9, "heldout_workloads": 2, "timesteps": 1, "train_seconds": 1, "meets_target": True,
         **out}]}
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        md = bench.write_markdown(md_doc, Path(d) / "q.md")
    assert "| 1 of 2 / 75.0% |" in md


def test_serving_summary_cell() -> None:

    from benchmarks.serving import run as bench
    res = {"agent_estimated_share": 0.25, "agent_estimated_share.prefill_attention": 1.0,
           "agent_estimated_share.decode_attention": 0.0, "agent_estimated_share.fused_moe": 0.125}
    assert bench.estimated_cell(res, "agent") == "25.0% (100%/0%/12%)"
