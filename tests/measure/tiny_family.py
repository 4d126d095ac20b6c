"""A tiny Triton kernel family for measurement tests: out = x * scale, with a BLOCK knob.

FAMILY is well behaved. FAULTY adds a MODE knob whose values misbehave on purpose (wrong result, segfault, hang,
out-of-memory, a poisoned CUDA context) to test that the live backend's worker isolation records each with its reason.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import asdict, dataclass, field

import torch
import triton
import triton.language as tl

from kernel_gym.kernels.space import Config, Knob, KnobSpace


@triton.jit
def _scale_kernel(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * scale, mask=mask)


@dataclass(frozen=True)
class TinyWorkload:
    n: int
    dtype: str = "float32"
    kernel: str = field(default="tiny_scale", init=False)

    def key(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    def features(self) -> dict[str, float]:
        return {"n": float(self.n)}


def _rule_block(config: Config, workload: TinyWorkload) -> str | None:
    if int(config["BLOCK"]) > 4 * max(16, workload.n):
        return f"BLOCK {config['BLOCK']} is more than 4x the vector length {workload.n}"
    return None


@dataclass(frozen=True)
class TinyInputs:
    x: torch.Tensor
    scale: float


class TinyFamily:
    name = "tiny_scale"
    workload_type = TinyWorkload

    def __init__(self, modes: tuple[str, ...] = ()) -> None:
        knobs = [Knob("BLOCK", (16, 32, 64, 128, 256))]
        if modes:
            knobs.append(Knob("MODE", modes))
        self.space = KnobSpace(knobs, [_rule_block])
        if modes:
            self.name = "tiny_faulty"

    def default_config(self, workload: TinyWorkload) -> Config:
        return Config(BLOCK=64, **({"MODE": "ok"} if "MODE" in self.space.names else {}))

    def make_inputs(self, workload: TinyWorkload, device: str, seed: int = 0) -> TinyInputs:
        gen = torch.Generator().manual_seed(seed)
        return TinyInputs(torch.randn(workload.n, generator=gen).to(device), 1.5)

    def prepare(self, inputs: TinyInputs, config: Config):
        block = int(config["BLOCK"])
        mode = config.get("MODE", "ok")
        x = inputs.x
        scale = inputs.scale * (2.0 if mode == "wrong" else 1.0)
        grid = (triton.cdiv(x.numel(), block),)

        def launch() -> torch.Tensor:
            if mode == "segfault":
                os.kill(os.getpid(), signal.SIGSEGV)
            if mode == "hang":
                time.sleep(3600)
            if mode == "oom":
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 PiB")
            if mode == "illegal":
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            out = torch.empty_like(x)
            _scale_kernel[grid](x, out, x.numel(), scale, BLOCK=block)
            return out

        return launch

    def reference(self, inputs: TinyInputs) -> torch.Tensor:
        return inputs.x * inputs.scale

    def tolerance(self, dtype: str) -> tuple[float, float]:
        return (1e-6, 1e-6)

    def flops(self, workload: TinyWorkload) -> float:
        return float(workload.n)

    def bytes_moved(self, workload: TinyWorkload) -> float:
        return 8.0 * workload.n

    def plan_workloads(self, model: object, grid: str) -> list[TinyWorkload]:
        """Collection hook: the shapes to collect (the model does not matter for this family)."""
        return [TinyWorkload(n) for n in ((40, 100, 333) if grid == "eval" else (7, 64, 500, 1000))]


FAMILY = TinyFamily()
FAULTY = TinyFamily(("ok", "wrong", "segfault", "hang", "oom", "illegal"))


class PaddedFamily(TinyFamily):
    """Many configs that each take a few milliseconds: a collection long enough to kill mid-way."""

    def __init__(self, pads: int = 12, delay_s: float = 0.002) -> None:
        super().__init__()
        self.space = KnobSpace([Knob("BLOCK", (16, 32, 64, 128, 256)), Knob("PAD", tuple(range(pads)))], [_rule_block])
        self.name, self.delay_s = "tiny_padded", delay_s

    def default_config(self, workload: TinyWorkload) -> Config:
        return Config(BLOCK=64, PAD=0)

    def prepare(self, inputs: TinyInputs, config: Config):
        launch = super().prepare(inputs, Config(BLOCK=config["BLOCK"]))

        def slow() -> torch.Tensor:
            time.sleep(self.delay_s)
            return launch()

        return slow

    def plan_workloads(self, model: object, grid: str) -> list[TinyWorkload]:
        return [TinyWorkload(n) for n in ((16, 48) if grid == "eval" else (8, 32, 64))]


PADDED = PaddedFamily()


@triton.jit
def _scale_fp32_kernel(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)  # fp32 math: the interpreter's bf16 arithmetic is wrong
    tl.store(out_ptr + offs, (x * scale).to(out_ptr.dtype.element_ty), mask=mask)


class PreparedOutputFamily(TinyFamily):
    """Like the real families: the output is allocated in `prepare` (torch.empty_like) and the launch writes into it
    and returns it. MODE=noop launches nothing and returns that buffer as it is, so it holds whatever the allocator
    left there (after a correct config of the same shape, often that config's correct values)."""

    def __init__(self) -> None:
        super().__init__(("ok", "noop"))
        self.name = "tiny_prepared"

    def make_inputs(self, workload: TinyWorkload, device: str, seed: int = 0) -> TinyInputs:
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(workload.n, generator=gen).to(device=device, dtype=getattr(torch, workload.dtype))
        return TinyInputs(x, 1.5)

    def prepare(self, inputs: TinyInputs, config: Config):
        block, mode, x = int(config["BLOCK"]), config.get("MODE", "ok"), inputs.x
        out = torch.empty_like(x)
        grid = (triton.cdiv(x.numel(), block),)

        def launch() -> torch.Tensor:
            if mode != "noop":
                _scale_fp32_kernel[grid](x, out, x.numel(), inputs.scale, BLOCK=block)
            return out

        return launch

    def reference(self, inputs: TinyInputs) -> torch.Tensor:
        return (inputs.x.float() * inputs.scale).to(inputs.x.dtype)

    def tolerance(self, dtype: str) -> tuple[float, float]:
        return (1e-6, 1e-6) if dtype == "float32" else (1e-2, 1e-2)  # the interpreter's bf16 cast may round otherwise


PREPARED = PreparedOutputFamily()
