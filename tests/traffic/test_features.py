"""Traffic features: a fixed-order vector over a trailing window, for environment observations."""

from __future__ import annotations

import numpy as np
import pytest

from kernel_gym.kernels.space import Config
from kernel_gym.measure.roofline import RooflineTimer
from kernel_gym.models import ModelSpec
from kernel_gym.traffic.features import FEATURE_NAMES, feature_dict, traffic_features
from kernel_gym.traffic.routing import ZipfRouting
from kernel_gym.traffic.simulator import Simulator, StaticChooser
from kernel_gym.traffic.synthetic import FixedLengths, Phase, traffic_shift

TINY = ModelSpec("tiny", num_layers=2, hidden=256, num_heads=4, num_kv_heads=2, head_dim=64, num_experts=4, top_k=2,
                 intermediate=512)
CH = StaticChooser({"prefill_attention": Config(A=1), "decode_attention": Config(PAGE_SIZE=16, LAYOUT="NHD"),
                    "fused_moe": Config(A=1)})


def test_features_follow_a_traffic_shift():
    tr = traffic_shift([Phase(20.0, 5.0, FixedLengths(200, 30)), Phase(20.0, 40.0, FixedLengths(1500, 30))], seed=0)
    s = Simulator(TINY, tr, RooflineTimer(0.5), CH, ZipfRouting(4, 2, seed=0, exponent=1.2),
                  gpu_memory_bytes=1e9, step_overhead_s=2e-3)
    s.run_until(20.0)
    before = feature_dict(s, 10.0)
    s.run_until(40.0)
    after = feature_dict(s, 10.0)
    vec = traffic_features(s, 10.0)
    assert vec.shape == (len(FEATURE_NAMES),) and vec.dtype == np.float32
    assert before["arrival_rate"] == pytest.approx(5.0, rel=0.4) and after["arrival_rate"] == pytest.approx(40, rel=0.2)
    assert before["prompt_len_p50"] == 200 and after["prompt_len_p90"] == 1500
    assert after["decode_batch_p50"] > before["decode_batch_p50"]
    assert after["context_len_p50"] > before["context_len_p50"]
    assert after["kv_occupancy"] > before["kv_occupancy"] > 0
    assert 0 < after["routing_entropy"] < 1 and after["routing_max_share"] > 0.25
    assert all(np.isfinite(vec))


def test_empty_window_before_any_step():
    tr = traffic_shift([Phase(5.0, 2.0, FixedLengths(10, 2))], seed=0)
    s = Simulator(TINY, tr, RooflineTimer(), CH, None, gpu_memory_bytes=1e9)
    f = feature_dict(s, 1.0)
    assert f["decode_batch_p50"] == 0 and f["kv_occupancy"] == 0 and f["routing_entropy"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="window_s"):
        traffic_features(s, 0.0)
