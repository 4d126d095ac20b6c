"""The reference check cannot be passed by a kernel that writes nothing into a reused output buffer."""

from __future__ import annotations

import pytest
import torch
from tiny_family import PREPARED, TinyWorkload

from kernel_gym.kernels.space import Config
from kernel_gym.measure.types import OK, WRONG_RESULT
from kernel_gym.measure.worker import WorkloadRunner, poisoned_empty


@pytest.fixture
def caching_allocator(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.empty_like hands back the last buffer of the same shape and dtype, as PyTorch's CUDA caching allocator
    hands a freed block to the next allocation of its size (the CPU allocator does so only by chance)."""
    real = torch.empty_like
    cache: dict[tuple, torch.Tensor] = {}

    def empty_like(t: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        key = (tuple(t.shape), kwargs.get("dtype", t.dtype), str(t.device))
        if key not in cache:
            cache[key] = real(t, *args, **kwargs)
        return cache[key]

    monkeypatch.setattr(torch, "empty_like", empty_like)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_noop_config_after_a_correct_one_is_wrong_result(dtype: str, caching_allocator: None) -> None:
    ok, noop = Config(BLOCK=64, MODE="ok"), Config(BLOCK=64, MODE="noop")
    foolable = WorkloadRunner(PREPARED, TinyWorkload(1000, dtype=dtype), "cpu", poison=False)
    assert [foolable.measure(c).status for c in (ok, noop)] == [OK, OK]  # the hazard: stale correct values pass
    runner = WorkloadRunner(PREPARED, TinyWorkload(1000, dtype=dtype), "cpu")
    assert runner.measure(ok).status == OK
    m = runner.measure(noop)
    assert m.status == WRONG_RESULT and "non-finite" in m.reason, m
    assert runner.measure(ok).status == OK  # a correct config still passes both launches


def test_second_launch_catches_an_output_written_only_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A config that writes its output on the first launch only (a stale buffer afterwards) fails the second check."""
    def once(inputs, config):
        out, calls = torch.empty_like(inputs.x), []

        def launch():
            if not calls:  # first launch only: later launches return the buffer as it is
                calls.append(1)
                out.copy_(PREPARED.reference(inputs))
            return out

        return launch

    monkeypatch.setattr(PREPARED, "prepare", once)
    m = WorkloadRunner(PREPARED, TinyWorkload(100), "cpu").measure(Config(BLOCK=64, MODE="ok"))
    assert m.status == WRONG_RESULT and m.reason.startswith("second launch over a NaN-filled output"), m


def test_poisoned_empty_fills_floats_only_and_restores_torch() -> None:
    with poisoned_empty():
        f = torch.empty(5)
        like = torch.empty_like(torch.zeros(3, dtype=torch.bfloat16))
        strided = torch.empty_strided((2, 2), (2, 1))
        new = torch.zeros(1).new_empty(4)
        ints = torch.empty(4, dtype=torch.int32)
    assert all(torch.isnan(t.float()).all() for t in (f, like, strided, new))
    assert ints.dtype == torch.int32
    assert torch.empty is not None and torch.empty.__name__ == "empty"
    after = torch.zeros(64)
    del after
    assert not torch.isnan(torch.zeros(8)).any()


@pytest.mark.parametrize("kernel", ["decode_attention", "prefill_attention", "fused_moe"])
def test_real_families_noop_launch_is_wrong_result_under_interpreter(kernel: str) -> None:
    from kernel_gym.kernels import get_family
    from kernel_gym.kernels.workloads import model_workloads
    from kernel_gym.models import BUILTIN_MODELS
    from tests.measure.noop_family import NoopFamily

    fam = get_family(kernel)
    wl = model_workloads(kernel, BUILTIN_MODELS["mixtral-8x7b"], grid="small", dtype="float16")[0]
    cfg = fam.default_config(wl)
    assert WorkloadRunner(fam, wl, "cpu").measure(cfg).status == OK
    m = WorkloadRunner(NoopFamily(fam), wl, "cpu").measure(cfg)
    assert m.status == WRONG_RESULT and "non-finite" in m.reason, m
