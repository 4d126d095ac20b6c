"""Interpreter backend (correctness only) and the live backend's worker isolation, on the CPU interpreter."""

from __future__ import annotations

import pytest
from tiny_family import FAMILY, FAULTY, TinyWorkload

from kernel_gym.kernels.space import Config
from kernel_gym.measure import make_backend
from kernel_gym.measure.live import LiveBackend
from kernel_gym.measure.types import CRASH, INVALID, OK, OOM, TIMEOUT, WRONG_RESULT
from kernel_gym.measure.worker import WorkloadRunner, classify, family_ref


def test_interpreter_checks_correctness_without_times() -> None:
    backend = make_backend("interpreter")
    wl = TinyWorkload(100)
    m = backend.measure(FAMILY, wl, Config(BLOCK=32))
    assert m.status == OK and m.median_ms is None and m.source == "interpreter" and m.workload == wl.key()
    assert backend.measure(FAMILY, TinyWorkload(3), Config(BLOCK=256)).status == INVALID
    wrong = backend.measure(FAULTY, wl, Config(BLOCK=32, MODE="wrong"))
    assert wrong.status == WRONG_RESULT and "beyond atol" in wrong.reason
    assert Config(BLOCK=256) not in backend.available_configs(FAMILY, TinyWorkload(3))


def test_make_backend_rejects_unknown_name() -> None:
    with pytest.raises(ValueError, match="choose one of"):
        make_backend("fast")


def test_classify_failures() -> None:
    assert classify(RuntimeError("CUDA error: an illegal memory access was encountered"))[::2] == (CRASH, True)
    assert classify(MemoryError("CUDA out of memory. Tried to allocate"))[0] == OOM
    assert family_ref(FAULTY) == "tiny_family:FAULTY"


def test_poisoned_context_is_flagged() -> None:
    """An illegal address is recorded as a crash and marks the runner poisoned (the worker then exits, restarted)."""
    runner = WorkloadRunner(FAULTY, TinyWorkload(64), "cpu")
    m = runner.measure(Config(BLOCK=32, MODE="illegal"))
    assert m.status == CRASH and "illegal memory access" in m.reason and runner.poisoned


def test_live_worker_isolates_crash_hang_and_oom() -> None:
    """Every failure costs only its own config: the worker restarts and the next config is measured."""
    wl = TinyWorkload(64)
    modes = ["ok", "segfault", "ok", "hang", "wrong", "oom", "ok"]
    configs = [Config(BLOCK=32, MODE=m) for m in modes]
    with LiveBackend(device="cpu", timeout_s=3.0, first_timeout_s=60.0) as backend:
        ms = backend.measure_many(FAULTY, wl, configs)
        restarts = backend.runner.restarts
    got = [m.status for m in ms]
    assert got == [OK, CRASH, OK, TIMEOUT, WRONG_RESULT, OOM, OK], got
    assert "exit code -11" in ms[1].reason
    assert "no answer within 3 s" in ms[3].reason
    assert restarts == 2  # segfault, hang
    assert all(m.median_ms is None for m in ms)  # the interpreter never times


@pytest.mark.gpu
def test_graph_and_interleaved_timing_measure_the_same_kernel_alike():
    """capture_graph replays the launch (same result), time_interleaved returns per-closure samples, and a launch
    doing twice the work takes longer under both."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: run `pytest -m gpu` on the GPU machine (README: GPU parts)")
    from kernel_gym.measure.timing import capture_graph, time_interleaved, time_launch

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(a)

    def once():
        torch.matmul(a, a, out=out)

    def twice():
        torch.matmul(a, a, out=out)
        torch.matmul(a, a, out=out)

    replay = capture_graph(once)
    out.zero_()
    replay()
    torch.cuda.synchronize()
    assert torch.allclose(out.float(), (a @ a).float(), rtol=1e-2, atol=1e-1)
    graph_ms = time_launch(capture_graph(once)).median_ms
    t_once, t_twice = time_interleaved([once, twice], 8)
    assert len(t_once) == len(t_twice) == 8
    assert sorted(t_twice)[4] > 1.5 * sorted(t_once)[4]
    assert graph_ms > 0.5 * sorted(t_once)[4]
