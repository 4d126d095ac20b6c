"""NoopFamily(real) wraps a real family: same knobs, inputs and reference, but its launch writes nothing and returns an
output buffer allocated in `prepare`, as a kernel that forgot its stores would. The reference check must call it
wrong (tests/measure/test_poisoned_gpu.py, tests/measure/test_poisoned_check.py). Importable on the GPU machine
(torch and the standard library only)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kernel_gym.kernels.space import Config


class NoopFamily:
    """A real family whose launch writes nothing: returns a buffer of the output's shape and dtype made in prepare."""

    def __init__(self, real: Any) -> None:
        self.real, self.name = real, real.name
        self.space, self.workload_type = real.space, real.workload_type

    def __getattr__(self, attr: str) -> Any:  # default_config, make_inputs, reference, tolerance, flops, ...
        return getattr(self.real, attr)

    def prepare(self, inputs: Any, config: Config) -> Callable[[], torch.Tensor]:
        ref = self.real.reference(inputs)
        dtype = getattr(torch, getattr(inputs.workload, "dtype", "float32"))
        out = torch.empty(tuple(ref.shape), dtype=dtype, device=ref.device)
        del ref

        def launch() -> torch.Tensor:
            return out

        return launch
