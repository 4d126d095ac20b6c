"""The collectives table: exact at measured sizes, log-log between them, refusals outside what was measured."""

from __future__ import annotations

import json
import math

import pytest

from kernel_gym.parallel.collectives import (
    CollectivesError,
    CollectivesMissing,
    CollectiveTable,
    load_table,
    message_sizes,
)
from tests.parallel.fixture_table import fixture_table, fixture_time_s

SIZES = (1024, 4096, 65536)


def table(**kw):
    return CollectiveTable(fixture_table(sizes=SIZES, **kw))


def test_exact_at_measured_sizes_and_log_log_between():
    t = table()
    for op in ("all_reduce", "all_to_all"):
        for g in (2, 4, 8):
            for b in SIZES:
                assert t.time_s(op, g, b) == pytest.approx(fixture_time_s(op, g, b), rel=1e-12)
                assert t.measured_at(op, g, b)
    mid = math.sqrt(1024 * 4096)  # halfway in log(bytes): the geometric mean of the two times
    want = math.sqrt(fixture_time_s("all_reduce", 4, 1024) * fixture_time_s("all_reduce", 4, 4096))
    assert t.time_s("all_reduce", 4, mid) == pytest.approx(want, rel=1e-9)
    assert not t.measured_at("all_reduce", 4, mid)
    assert t.time_s("all_reduce", 1, 10**12) == 0.0  # one GPU: no collective


def test_refuses_extrapolation_beyond_a_factor_two_and_clamps_below():
    t = table()
    assert t.time_s("all_to_all", 2, 600) == t.time_s("all_to_all", 2, 1024)  # never faster for less data
    t.time_s("all_to_all", 2, 2 * 65536)  # at the limit: answered
    with pytest.raises(CollectivesError, match="outside the measured sizes"):
        t.time_s("all_to_all", 2, 2.1 * 65536)
    with pytest.raises(CollectivesError, match="outside the measured sizes"):
        t.time_s("all_reduce", 2, 400)


def test_refuses_a_gpu_count_the_table_lacks():
    t = table(gpu_counts=(2, 4))
    with pytest.raises(CollectivesError, match="no all_reduce on 8 GPUs.*run_collectives.py --gpus 8"):
        t.time_s("all_reduce", 8, 4096)


def test_missing_table_names_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNEL_GYM_COLLECTIVES", str(tmp_path / "absent.json"))
    with pytest.raises(CollectivesMissing, match="benchmarks/multigpu/run_collectives.py --gpus 8"):
        load_table()


def test_refuses_bad_tables(tmp_path):
    data = fixture_table(sizes=SIZES)
    data["results"][0]["correct"] = False
    with pytest.raises(CollectivesError, match="correctness check"):
        CollectiveTable(data)
    one = fixture_table(sizes=(1024,))
    with pytest.raises(CollectivesError, match="need >= 2"):
        CollectiveTable(one)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(fixture_table(sizes=SIZES)))  # backend "fixture": not NCCL measurements
    with pytest.raises(CollectivesError, match="not NCCL"):
        load_table(path)


def test_message_sizes_cover_the_zoo():
    ar, a2a = message_sizes("all_reduce"), message_sizes("all_to_all")
    assert ar == sorted(ar) and a2a == sorted(a2a)
    from kernel_gym import zoo

    widest = max(s.hidden for s in zoo.ZOO.values())  # Jamba-1.5-Large's 8192 since the far test split
    narrowest = min(s.hidden for s in zoo.ZOO.values())  # Granite-3.0-1B's 1024 since the second far split
    assert ar[0] == narrowest * 2 and ar[-1] == 8192 * widest * 2  # the narrowest at 1 token .. the widest at 8192
    assert a2a[-1] == 8192 * max(s.top_k * s.hidden for s in zoo.ZOO.values()) * 2  # deepseek-v3: 8 x 7168
    assert all(b / a >= 1.25 for a, b in zip(ar[:-2], ar[1:-1]))
