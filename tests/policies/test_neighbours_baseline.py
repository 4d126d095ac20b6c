"""benchmarks/policy_quality/neighbours.py: the neighbours' best config is the one best on the nearest training
shapes below and above, among configs measured at all three, and its ratio is the held-out oracle's time over
its time."""

from __future__ import annotations

import math
from types import SimpleNamespace


def ref(batch: int, context: int, times: dict[str, float]):
    from kernel_gym.kernels.workloads import DecodeWorkload

    w = DecodeWorkload(num_heads=32, num_kv_heads=8, head_dim=128, batch=batch, context_len=context)
    return SimpleNamespace(workload=w, times=times, best_config=min(times, key=times.get), key=w.key())


def test_neighbours_pick_the_config_best_on_both_neighbours_and_score_it_at_the_heldout_shape() -> None:
    from benchmarks.policy_quality.neighbours import neighbours_best

    train = [ref(2, 1024, {"a": 1.0, "b": 1.1, "c": 0.9}), ref(4, 1024, {"a": 2.0, "b": 2.05, "c": 3.0}),
             ref(64, 1024, {"a": 9.0, "b": 1.0})]  # far away: must not vote
    heldout = [ref(3, 1024, {"a": 1.5, "b": 1.2, "d": 1.0})]  # "c" and "d" not measured at all three
    rows = neighbours_best(train, heldout)
    assert [r["pick"] for r in rows] == ["a"]  # a: log(1)+log(1) beats b: log(1/1.1)+log(2/2.05)
    assert math.isclose(rows[0]["ratio"], 1.0 / 1.5)
    assert rows[0]["oracle"] == "d" and rows[0]["oracle_at_neighbours"] is False
