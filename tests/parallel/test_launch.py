"""The multi-GPU launcher on the CPU (gloo): a failing or hanging rank ends the whole job with a clear message within
its time limit, the ranks stop together, multicast must be off."""

from __future__ import annotations

import time

import pytest

from kernel_gym.parallel.collectives import NO_MULTICAST_ENV
from kernel_gym.parallel.launch import RankFailure, require_no_multicast, run_ranks
from tests.parallel import rank_fns


@pytest.fixture(autouse=True)
def _no_multicast(monkeypatch):
    for k, v in NO_MULTICAST_ENV.items():
        monkeypatch.setenv(k, v)


def test_a_raising_rank_ends_every_rank(tmp_path):
    t0 = time.time()
    with pytest.raises(RankFailure, match="rank 1 of 2 raised ValueError: boom on rank one"):
        run_ranks(rank_fns.raise_on_rank_one, 2, (2, f"file://{tmp_path}/rdv"), deadline=time.time() + 600)
    assert time.time() - t0 < 120  # not the 300 s collective timeout: the launcher ended rank 0


def test_a_hanging_rank_is_ended_after_the_deadline(tmp_path):
    t0 = time.time()
    with pytest.raises(RankFailure, match="still running .* after the budget"):
        run_ranks(rank_fns.hang_on_rank_one, 2, (2, f"file://{tmp_path}/rdv"), deadline=time.time() + 1,
                  grace_s=2)
    assert time.time() - t0 < 120


def test_ranks_stop_together_and_time_a_collective(tmp_path):
    out = tmp_path / "r.txt"
    run_ranks(rank_fns.stop_together, 2, (2, f"file://{tmp_path}/rdv", str(out)), deadline=time.time() + 600)
    rounds, inner, median = out.read_text().split()
    assert rounds == "0" and int(inner) >= 1 and float(median) > 0  # rank 0 stopped because rank 1 was past it


def test_multicast_must_be_off(monkeypatch):
    require_no_multicast()
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    with pytest.raises(RuntimeError, match="NCCL_NVLS_ENABLE"):
        require_no_multicast()
    with pytest.raises(RuntimeError, match="multicast"):
        run_ranks(rank_fns.raise_on_rank_one, 2, (2, "file:///nonexistent"), deadline=time.time() + 60)
