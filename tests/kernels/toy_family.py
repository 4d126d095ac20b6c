"""A toy kernel family added the way docs/architecture.md says a family is added: this module (FAMILY, its workload
dataclass and shape grid) plus its profile and env line, which tests/kernels/test_toy_family.py registers.

out = a * x + y over a [batch, width] tensor, one program per BLOCK elements of a row.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch
import triton
import triton.language as tl

from kernel_gym.kernels.space import Config, Knob, KnobSpace

NAME = "toy_axpy"


@triton.jit
def _axpy_kernel(x_ptr, y_ptr, out_ptr, width, a, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < width
    x = tl.load(x_ptr + row * width + offs, mask=mask)
    y = tl.load(y_ptr + row * width + offs, mask=mask)
    tl.store(out_ptr + row * width + offs, a * x + y, mask=mask)


@dataclass(frozen=True)
class ToyWorkload:
    batch: int
    width: int
    dtype: str = "float32"
    kernel: str = field(default=NAME, init=False)

    def key(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    def features(self) -> dict[str, float]:
        return {"log2_batch": math.log2(self.batch), "log2_width": math.log2(self.width)}


@dataclass(frozen=True)
class ToyModel:
    """A model spec as far as this family cares: the width its calls have."""

    name: str = "toy-model"
    width: int = 256


def grid(model: Any, grid: str = "default", dtype: str = "bfloat16") -> list[ToyWorkload]:
    """The shape grid per model spec (kernels/workloads.model_workloads reaches it through the profile's `grid`)."""
    batches = {"default": (1, 2, 4, 8, 16, 32), "eval": (1, 8, 32), "small": (1, 3)}[grid]
    return [ToyWorkload(b, model.width if grid != "small" else 64, "float32") for b in batches]


def _rule_block(config: Config, workload: ToyWorkload) -> str | None:
    if int(config["BLOCK"]) > 4 * workload.width:
        return f"BLOCK {config['BLOCK']} is more than 4x the row width {workload.width}"
    return None


@dataclass(frozen=True)
class ToyInputs:
    workload: ToyWorkload
    x: torch.Tensor
    y: torch.Tensor
    a: float = 1.5


class ToyFamily:
    name = NAME
    workload_type = ToyWorkload
    space = KnobSpace([Knob("BLOCK", (16, 32, 64, 128)), Knob("num_warps", (1, 4))], [_rule_block])

    def default_config(self, workload: ToyWorkload) -> Config:
        return Config(BLOCK=64, num_warps=4)

    def make_inputs(self, workload: ToyWorkload, device: str, seed: int = 0) -> ToyInputs:
        gen = torch.Generator().manual_seed(seed)
        shape = (workload.batch, workload.width)
        return ToyInputs(workload, torch.randn(shape, generator=gen).to(device),
                         torch.randn(shape, generator=gen).to(device))

    def prepare(self, inputs: ToyInputs, config: Config) -> Callable[[], torch.Tensor]:
        self.space.check(config, inputs.workload)
        block, (rows, width) = int(config["BLOCK"]), inputs.x.shape
        out = torch.full_like(inputs.x, float("nan"))

        def launch() -> torch.Tensor:
            _axpy_kernel[(rows, triton.cdiv(width, block))](inputs.x, inputs.y, out, width, inputs.a, BLOCK=block,
                                                           num_warps=int(config["num_warps"]))
            return out

        return launch

    def reference(self, inputs: ToyInputs) -> torch.Tensor:
        return inputs.a * inputs.x + inputs.y

    def tolerance(self, dtype: str) -> tuple[float, float]:
        return 1e-5, 1e-5

    def flops(self, workload: ToyWorkload) -> float:
        return 2.0 * workload.batch * workload.width

    def bytes_moved(self, workload: ToyWorkload) -> float:
        return 12.0 * workload.batch * workload.width


FAMILY = ToyFamily()
