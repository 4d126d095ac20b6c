"""The interpreter backend: CPU correctness only, under Triton's interpreter. Never returns a time.

Answers whether a config is valid, runs, and matches the torch reference on CPU (status "ok", median_ms None,
source "interpreter"). Used by tests and by CPU-only checks of a kernel family; it is slow (every program instance runs
in Python), so use small workloads (model_workloads(..., grid="small")).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from kernel_gym.kernels.space import Config, KernelFamily
from kernel_gym.measure.types import Measurement
from kernel_gym.measure.worker import WorkloadRunner, resolve_family


class InterpreterBackend:
    """In-process correctness checks; inputs and reference are built once per workload and reused across configs."""

    name = "interpreter"

    def __init__(self, max_cached_workloads: int = 4) -> None:
        if os.environ.get("TRITON_INTERPRET") != "1":
            if any(m.startswith("kernel_gym.kernels.") and m.split(".")[-1] not in ("space", "workloads")
                   for m in sys.modules):
                raise RuntimeError("TRITON_INTERPRET=1 must be set before kernel modules are imported; set it in the "
                                   "environment (export TRITON_INTERPRET=1) and restart")
            os.environ["TRITON_INTERPRET"] = "1"
        self.max_cached = max_cached_workloads
        self._runners: dict[tuple[str, str], WorkloadRunner] = {}

    def _runner(self, kernel: str | KernelFamily, workload: Any) -> WorkloadRunner:
        fam = resolve_family(kernel) if isinstance(kernel, str) else kernel
        key = (fam.name, workload.key())
        if key not in self._runners:
            if len(self._runners) >= self.max_cached:
                self._runners.pop(next(iter(self._runners)))
            self._runners[key] = WorkloadRunner(fam, workload, "cpu", timing=None)
        return self._runners[key]

    def measure(self, kernel: str | KernelFamily, workload: Any, config: Config) -> Measurement:
        return self._runner(kernel, workload).measure(config)

    def available_configs(self, kernel: str | KernelFamily, workload: Any) -> list[Config]:
        fam = resolve_family(kernel) if isinstance(kernel, str) else kernel
        return fam.space.valid_configs(workload)
