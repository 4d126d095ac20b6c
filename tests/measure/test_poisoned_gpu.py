"""On the GPU: a launch that writes nothing, run right after a correct config of the same shape (so PyTorch's caching
allocator hands it that config's freed output block), is wrong_result for every real family; and the poisoned check
calls no correct config wrong."""

from __future__ import annotations

import pytest

from kernel_gym.kernels import FAMILY_MODULES, get_family
from kernel_gym.kernels.workloads import model_workloads
from kernel_gym.measure.types import OK, WRONG_RESULT
from kernel_gym.measure.worker import WorkloadRunner
from kernel_gym.models import BUILTIN_MODELS
from tests.measure.noop_family import NoopFamily

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("kernel", list(FAMILY_MODULES))
def test_noop_launch_after_a_correct_config_is_wrong_result(kernel: str) -> None:
    fam = get_family(kernel)
    for wl in model_workloads(kernel, BUILTIN_MODELS["mixtral-8x7b"], grid="eval")[:2]:
        cfg = fam.default_config(wl)
        real = WorkloadRunner(fam, wl, "cuda")
        noop = WorkloadRunner(NoopFamily(fam), wl, "cuda")
        assert real.measure(cfg).status == OK
        m = noop.measure(cfg)
        assert m.status == WRONG_RESULT and "non-finite" in m.reason, (wl.key(), m)
        assert real.measure(cfg).status == OK


@pytest.mark.parametrize("kernel", list(FAMILY_MODULES))
def test_poisoned_check_passes_correct_configs(kernel: str) -> None:
    """NaN-filled workspaces and outputs must not fail a correct kernel (every ok stored row passed the old check)."""
    fam = get_family(kernel)
    for wl in model_workloads(kernel, BUILTIN_MODELS["mixtral-8x7b"], grid="eval")[:2]:
        runner = WorkloadRunner(fam, wl, "cuda")
        configs = list(dict.fromkeys([fam.default_config(wl), *fam.space.sample(wl, 12, seed=3)]))
        wrong = [(str(c), m.reason) for c in configs if (m := runner.measure(c)).status == WRONG_RESULT]
        assert not wrong, (wl.key(), wrong)
