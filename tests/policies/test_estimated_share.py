"""The replay reports, per policy and kernel, the share of tuned-kernel time resting on estimated times."""

from __future__ import annotations

from kernel_gym.kernels import get_family
from kernel_gym.kernels.workloads import MoEWorkload
from kernel_gym.measure.types import OK, Measurement
from kernel_gym.policies import replay
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
    md = replay.markdown({"trace": "t", "model": "mixtral-8x7b", "routing": "zipf:1.2", "policies": {"learned": m}})
    assert "| 25.0% (10%/0%/50%) |" in md and "Expert routing: zipf:1.2" in md
