"""Baselines: the covered backend (clamping a recorded store), search policies' measurement and stall accounting,
vLLM's nearest-M rule, static = best single config, oracle = fastest answerable config."""

from __future__ import annotations

import pytest

from kernel_gym.dispatch import baselines as bl  # noqa: E402
from kernel_gym.kernels import get_family  # noqa: E402
from kernel_gym.kernels.workloads import DecodeWorkload, MoEWorkload  # noqa: E402
from kernel_gym.measure.coverage import CoveredBackend, cover, roofline_scale  # noqa: E402
from kernel_gym.measure.recorded import RecordedBackend  # noqa: E402
from kernel_gym.measure.store import Context  # noqa: E402
from kernel_gym.models import BUILTIN_MODELS  # noqa: E402
from kernel_gym.traffic.simulator import KVLayout  # noqa: E402
from tests.fakes.analytic_backend import AnalyticBackend

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
MODEL = BUILTIN_MODELS["mixtral-8x7b"]


def moe(m, s=0.0):
    return MoEWorkload(m, 8, 2, 4096, 14336, s)


@pytest.fixture(scope="module")
def recorded():
    """A recorded backend over analytic measurements of MoE at M = 4..64, skew 0 and 1.2 (a measured grid)."""
    src = AnalyticBackend(sample=30)
    rows = [src.measure("fused_moe", moe(m, s), c) for m in (4, 8, 16, 32, 64) for s in (0.0, 1.2)
            for c in src.available_configs("fused_moe", moe(m, s))]
    ctx = Context("NVIDIA H200", "t", "t", "fused_moe", "h")
    return src, RecordedBackend(groups=[(ctx, rows)])


def test_covered_backend_clamps_outside_the_measured_range(recorded):
    src, rec = recorded
    cov = CoveredBackend(rec)
    cfg = rec.available_configs("fused_moe", moe(64))[0]
    assert rec.measure("fused_moe", moe(256), cfg).status == "unavailable"
    big = cov.measure("fused_moe", moe(256), cfg)
    anchor = rec.measure("fused_moe", moe(64), cfg)
    assert big.ok and big.source.endswith("-proxy") and big.median_ms > anchor.median_ms  # scaled up by work
    small = cov.measure("fused_moe", moe(1), cfg)
    assert small.median_ms == pytest.approx(rec.measure("fused_moe", moe(4), cfg).median_ms)  # kept, not scaled down
    inside = cov.measure("fused_moe", moe(12, 0.6), cfg)
    assert inside.source == "recorded-interpolated"  # inside the grid: the store answers itself
    assert cov.available_configs("fused_moe", moe(256)) == rec.available_configs("fused_moe", moe(64))
    assert len(cov.proxied) == 2 and cover(cov) is cov and cover(src) is src  # no measured grid: nothing to cover
    with pytest.raises(TypeError, match="already covered"):
        CoveredBackend(cov)


def test_covered_backend_borrows_a_config_measured_only_elsewhere(recorded):
    """A config missing at one measured workload is priced at the nearest workload where it was measured ok, by the
    same never-faster roofline rule; a config measured nowhere stays unavailable."""
    src, rec = recorded
    cfg = rec.available_configs("fused_moe", moe(16))[0]
    rows = [m for w in rec.rows("fused_moe").values() for m in w.values()
            if not (m.workload == moe(16).key() and m.config == str(cfg))]
    holed = RecordedBackend(groups=[(Context("NVIDIA H200", "t", "t", "fused_moe", "h"), rows)])
    assert holed.measure("fused_moe", moe(16), cfg).status == "unavailable"
    cov = CoveredBackend(holed)
    m = cov.measure("fused_moe", moe(16), cfg)
    (donor_key,) = cov.borrowed.values()
    donor = next(w for w in holed.workloads("fused_moe") if w.key() == donor_key)
    assert donor.skew == 0.0 and donor.num_tokens in (8, 32) and m.source == "recorded-borrowed"
    t = holed.measure("fused_moe", donor, cfg).median_ms
    assert m.median_ms == pytest.approx(t * roofline_scale("fused_moe", moe(16), donor)) and m.median_ms >= t
    assert cfg not in cov.available_configs("fused_moe", moe(16)) and not cov.is_proxied("fused_moe", moe(16))
    nowhere = cfg.replace(num_warps=16) if cfg["num_warps"] != 16 else cfg.replace(num_warps=1)
    assert cov.measure("fused_moe", moe(16), nowhere).status == "unavailable" and len(cov.borrowed) == 1


def test_search_policies_measure_and_charge_what_they_say():
    be = AnalyticBackend(sample=40)
    oracle = bl.Oracle(be)
    w = moe(48, 0.6)
    cands = oracle.candidates("fused_moe", w)
    auto = bl.SearchPolicy("exhaustive", oracle)
    assert auto.choose("fused_moe", w, None) == oracle.best("fused_moe", w)
    expected = sum(bl.COMPILE_S_DEFAULT + be.time_ms("fused_moe", w, c) * 1e-3 * 1 for c in cands)
    assert auto.measurements == len(cands) and auto.tuning_gpu_s == pytest.approx(expected)
    auto.choose("fused_moe", moe(48, 1.2), None)  # same M: the autotune key ignores routing
    assert auto.shapes_tuned == 1
    for mode in ("random", "tpe"):
        p = bl.SearchPolicy(mode, oracle, budget=4, seed=1)
        cfg = p.choose("fused_moe", w, None)
        assert p.measurements == 4 and cfg in cands
        assert 0 < p.tuning_gpu_s < auto.tuning_gpu_s
    with pytest.raises(ValueError, match="budget"):
        bl.SearchPolicy("random", oracle, budget=0)


def test_decode_candidates_stay_on_the_layout_in_force():
    oracle = bl.Oracle(AnalyticBackend(sample=300))
    w = DecodeWorkload(32, 8, 128, 8, 2048)
    kv = KVLayout(32, "HND")
    cands = oracle.candidates("decode_attention", w, kv)
    assert cands and all((c["PAGE_SIZE"], c["LAYOUT"]) == (32, "HND") for c in cands)
    d = bl.default_for("decode_attention", w, kv)
    assert get_family("decode_attention").space.is_valid(d, w) and d["PAGE_SIZE"] == 32


def test_table_baselines_static_and_vllm_nearest_m():
    be = AnalyticBackend(sample=40)
    refs = bl.training_references(be, MODEL, ["fused_moe", "decode_attention", "prefill_attention"])
    static = bl.static_configs(refs)
    from kernel_gym.dispatch.catalogue import best_static_config

    assert static["fused_moe"] == best_static_config(refs["fused_moe"])
    table = bl.vllm_moe_table(bl.Oracle(be), MODEL)
    p = bl.TablePolicy("vllm-table", static, table)
    assert p.choose("fused_moe", moe(40, 1.2), None) == table[48]  # |40-48| < |40-32|: vLLM's linear nearest M
    assert p.choose("fused_moe", moe(10000), None) == table[8192]
    assert p.choose("prefill_attention", None, None) == static["prefill_attention"]
    assert p.kv_layout.page_size == static["decode_attention"]["PAGE_SIZE"]
    assert ("fused_moe", table[48]) in p.precompiled
    with pytest.raises(ValueError, match="unknown baseline"):
        bl.make_baselines(["fastest"], be, MODEL)
