"""A kernel family that misbehaves on purpose, importable on the GPU machine (torch, triton, stdlib only).

FAULTS (`benchmarks.fault_injection.fault_family:FAULTS`): out = x * 2 with a MODE knob. MODE=ok is correct; hang
launches a Triton kernel that spins forever on a flag nobody sets; illegal stores through an out-of-bounds pointer (an
illegal address, which poisons the CUDA context); oom allocates a buffer far beyond the GPU's memory. Used by
benchmarks/fault_injection/run.py to check that a real collection stores each failure with its reason, restarts its
worker and stores every other config ok.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import triton
import triton.language as tl

from kernel_gym.kernels.space import Config, Knob, KnobSpace

MODES = ("ok", "hang", "illegal", "oom")
OOM_BYTES = 1 << 50  # 1 PiB


@triton.jit
def _double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


@triton.jit
def _hang_kernel(flag_ptr, out_ptr, n, BLOCK: tl.constexpr):
    flag = tl.load(flag_ptr, volatile=True)
    while flag == 0:  # the flag is zero and nothing writes it: spins until the process is killed
        flag = tl.load(flag_ptr, volatile=True)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.zeros((BLOCK,), tl.float32), mask=offs < n)


@triton.jit
def _illegal_kernel(x_ptr, out_ptr, n, far, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + far + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)  # far: 2^40 elements out of bounds


@dataclass(frozen=True)
class FaultWorkload:
    n: int
    dtype: str = "float32"
    kernel: str = field(default="fault_injection", init=False)

    def key(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    def features(self) -> dict[str, float]:
        return {"n": float(self.n)}


@dataclass(frozen=True)
class FaultInputs:
    x: torch.Tensor


class FaultFamily:
    name = "fault_injection"
    workload_type = FaultWorkload

    def __init__(self) -> None:
        self.space = KnobSpace([Knob("BLOCK", (64, 128, 256, 512, 1024)), Knob("MODE", MODES)], [])

    def default_config(self, workload: FaultWorkload) -> Config:
        return Config(BLOCK=256, MODE="ok")

    def make_inputs(self, workload: FaultWorkload, device: str, seed: int = 0) -> FaultInputs:
        gen = torch.Generator().manual_seed(seed)
        return FaultInputs(torch.randn(workload.n, generator=gen).to(device))

    def prepare(self, inputs: FaultInputs, config: Config) -> Callable[[], torch.Tensor]:
        block, mode, x = int(config["BLOCK"]), config["MODE"], inputs.x
        out = torch.empty_like(x)
        grid = (triton.cdiv(x.numel(), block),)
        if mode == "oom":
            torch.empty(OOM_BYTES, dtype=torch.uint8, device=x.device)  # raises out of memory
        flag = torch.zeros(1, dtype=torch.int32, device=x.device)

        def launch() -> torch.Tensor:
            if mode == "hang":
                _hang_kernel[grid](flag, out, x.numel(), BLOCK=block)
            elif mode == "illegal":
                _illegal_kernel[grid](x, out, x.numel(), 1 << 40, BLOCK=block)
            else:
                _double_kernel[grid](x, out, x.numel(), BLOCK=block)
            return out

        return launch

    def reference(self, inputs: FaultInputs) -> torch.Tensor:
        return inputs.x * 2

    def tolerance(self, dtype: str) -> tuple[float, float]:
        return (1e-6, 1e-6)

    def flops(self, workload: FaultWorkload) -> float:
        return float(workload.n)

    def bytes_moved(self, workload: FaultWorkload) -> float:
        return 8.0 * workload.n

    def plan_workloads(self, model: object, grid: str) -> list[FaultWorkload]:
        return [FaultWorkload(n) for n in (4096, 65536)]


FAULTS = FaultFamily()
