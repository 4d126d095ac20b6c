"""timing's two L2 flushes (TimingOptions.flush_mode), that both timers use the one asked for, that the store's
backend refuses the clean one, and the decode profile's config picks; on the CPU."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.decode_floor import ncu_profile
from kernel_gym.measure import timing
from kernel_gym.measure.live import LiveBackend
from kernel_gym.measure.timing import TimingOptions, flush_l2


def test_write_flush_zeroes_the_buffer_and_clean_flush_only_reads_it():
    buf = torch.arange(1, 1025, dtype=torch.int32)
    flush_l2(buf, "clean")
    assert torch.equal(buf, torch.arange(1, 1025, dtype=torch.int32)), "the clean flush must not write the buffer"
    flush_l2(buf, "write")
    assert int(buf.abs().sum()) == 0


def test_unknown_flush_mode_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="flush_mode 'dirty' is not one of"):
        TimingOptions(flush_mode="dirty")
    with pytest.raises(ValueError, match="not one of"):
        flush_l2(torch.zeros(4), "dirty")
    assert TimingOptions().flush_mode == "write"  # what every stored row was timed with


class _Event:
    """torch.cuda.Event on the CPU: every interval 1 ms."""

    def __init__(self, enable_timing: bool = True) -> None:
        pass

    def record(self) -> None:
        pass

    def elapsed_time(self, end: object) -> float:
        return 1.0


def test_both_timers_flush_the_way_they_are_asked(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(timing, "_flush_buffer", lambda device: torch.zeros(8, dtype=torch.int32))
    seen: list[str] = []
    monkeypatch.setattr(timing, "flush_l2", lambda buf, mode: seen.append(mode))
    t = timing.time_launch(lambda: None, TimingOptions(flush_mode="clean", heat_max_s=0.0))
    assert t.median_ms == 1.0 and seen and set(seen) == {"clean"}
    seen.clear()
    samples = timing.time_interleaved([lambda: None, lambda: None], reps=3, heat=False, flush_mode="clean")
    assert [len(s) for s in samples] == [3, 3] and seen == ["clean"] * 6
    seen.clear()
    timing.time_interleaved([lambda: None], reps=2, heat=False)
    assert seen == ["write", "write"]


def test_the_store_backend_refuses_a_clean_flush():
    """A stored row does not record its flush, and every stored row had the write flush."""
    with pytest.raises(ValueError, match="flush_mode='clean'"):
        LiveBackend(timing=TimingOptions(flush_mode="clean"), device="cpu")


def test_profile_picks_the_fastest_overall_then_per_kv_tma_value():
    times = {json.dumps({"BLOCK_N": 64, "KV_TMA": 1}): 2.0, json.dumps({"BLOCK_N": 128, "KV_TMA": 1}): 1.0,
             json.dumps({"BLOCK_N": 64}): 1.5, json.dumps({"BLOCK_N": 128}): 3.0}
    picked = ncu_profile.picks(times)
    assert [json.loads(c) for c in picked] == [{"BLOCK_N": 128, "KV_TMA": 1}, {"BLOCK_N": 64}]
    only_pointer = {json.dumps({"BLOCK_N": 64}): 1.5}
    assert ncu_profile.picks(only_pointer) == list(only_pointer)
