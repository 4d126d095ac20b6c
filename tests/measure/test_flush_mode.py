"""timing's two L2 flushes (TimingOptions.flush_mode) and the decode profile's config picks, on the CPU."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.decode_floor import profile
from kernel_gym.measure.timing import FLUSH_MODES, TimingOptions, flush_l2


def test_write_flush_zeroes_the_buffer_and_clean_flush_only_reads_it():
    buf = torch.arange(1, 1025, dtype=torch.int32)
    flush_l2(buf, "clean")
    assert torch.equal(buf, torch.arange(1, 1025, dtype=torch.int32)), "the clean flush must not write the buffer"
    flush_l2(buf, "write")
    assert int(buf.abs().sum()) == 0
    assert FLUSH_MODES == ("write", "clean")


def test_unknown_flush_mode_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="flush_mode 'dirty' is not one of"):
        TimingOptions(flush_mode="dirty")
    with pytest.raises(ValueError, match="not one of"):
        flush_l2(torch.zeros(4), "dirty")
    assert TimingOptions().flush_mode == "write"  # what every stored row was timed with


def test_profile_picks_the_fastest_overall_then_per_kv_tma_value():
    times = {json.dumps({"BLOCK_N": 64, "KV_TMA": 1}): 2.0, json.dumps({"BLOCK_N": 128, "KV_TMA": 1}): 1.0,
             json.dumps({"BLOCK_N": 64}): 1.5, json.dumps({"BLOCK_N": 128}): 3.0}
    picked = profile.picks(times)
    assert [json.loads(c) for c in picked] == [{"BLOCK_N": 128, "KV_TMA": 1}, {"BLOCK_N": 64}]
    only_pointer = {json.dumps({"BLOCK_N": 64}): 1.5}
    assert profile.picks(only_pointer) == list(only_pointer)
