"""Families for the farm tests (tests/measure/test_farm.py): imported by the Ray actors through PYTHONPATH.

SLOW: one workload (n=1000) whose configs each take SLOW_S seconds, the others fast: a dynamic queue must not make fast
work wait behind it. SLOWPAD: the padded family at 40 ms a config, so a chunk is in flight long enough to kill its
actor (or the driver) mid-way.
"""

from __future__ import annotations

import time

import torch
from tiny_family import PaddedFamily, TinyFamily, TinyInputs, TinyWorkload

from kernel_gym.kernels.space import Config

SLOW_N, SLOW_S = 1000, 1.5


class SlowFamily(TinyFamily):
    def __init__(self) -> None:
        super().__init__()
        self.name = "tiny_slow"

    def prepare(self, inputs: TinyInputs, config: Config):
        launch = super().prepare(inputs, config)
        delay = SLOW_S if inputs.x.numel() == SLOW_N else 0.0

        def slow() -> torch.Tensor:
            time.sleep(delay)
            return launch()

        return slow

    def plan_workloads(self, model: object, grid: str) -> list[TinyWorkload]:
        return [TinyWorkload(n) for n in ((SLOW_N, 8, 9, 10, 11, 12, 13) if grid == "eval" else ())]


SLOW = SlowFamily()
SLOWPAD = PaddedFamily(pads=12, delay_s=0.04)
