"""Measuring configs of one workload, and doing it inside a worker process that may die.

`WorkloadRunner` builds a workload's inputs and torch reference once and then measures configs on them: validity rules,
prepare + first launch (compile or cache load), output check against the reference (a wrong result is a failure, never
a time), then CUDA timing. `IsolatedRunner` runs that in a child process and supervises it: a crash (an illegal address
poisons the CUDA context, a segfault kills the process), a hang past the deadline or an out-of-memory costs only that
config, which is stored as failed with its reason; the worker is restarted and carries on with the remaining configs.

Imports only torch, triton, numpy and the standard library (lazily, in the worker).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib
import multiprocessing as mp
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, replace
from typing import Any

from kernel_gym.kernels.space import Config, KernelFamily
from kernel_gym.kernels.space import source_hash as _space_source_hash
from kernel_gym.measure.types import (
    COMPILE_ERROR,
    CRASH,
    INVALID,
    OK,
    OOM,
    OUT_OF_RESOURCES,
    TIMEOUT,
    WRONG_RESULT,
    Measurement,
)

REASON_CHARS = 400
COMPILE_EXCEPTIONS = ("CompilationError", "CompileTimeAssertionFailure", "PTXASError", "MLIRCompilationError")
CONTEXT_POISONING = (
    "illegal memory access", "illegal address", "unspecified launch failure", "misaligned address",
    "device-side assert", "an illegal instruction", "cudaErrorLaunchFailure", "CUDA error: unknown error",
)


# ---- families ---------------------------------------------------------------------------------------------------


def resolve_family(ref: str) -> KernelFamily:
    """A family by kernel name ("fused_moe") or by import path ("package.module" or "package.module:ATTR")."""
    from kernel_gym.kernels import FAMILY_MODULES, get_family

    if ref in FAMILY_MODULES:
        return get_family(ref)
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"kernel {ref!r}: not a built-in kernel {list(FAMILY_MODULES)} nor an importable module "
                         f"({exc})") from exc
    return getattr(module, attr or "FAMILY")


def family_ref(family: KernelFamily) -> str:
    """The import path a worker process uses to find the same family object."""
    from kernel_gym.kernels import FAMILY_MODULES

    module = type(family).__module__
    if FAMILY_MODULES.get(family.name) == module:
        return family.name
    mod = sys.modules[module]
    for attr, value in vars(mod).items():
        if value is family:
            return f"{module}:{attr}"
    raise ValueError(f"family {family.name!r} is not a module-level attribute of {module}; expose it as FAMILY")


def family_store_key(family: KernelFamily) -> str:
    """The store key of a family's rows: its profile's version ("v<N>", kernels/profiles.py) when the family is
    registered from this module, else (a family without a profile, such as benchmarks/fault_injection/run.py's) a
    hash of its whole module's source."""
    from kernel_gym.kernels import profiles

    mod = sys.modules[type(family).__module__]
    p = profiles.get(family.name)
    if p is not None and p.module == mod.__name__:
        return p.store_key
    return _space_source_hash(mod)


def workload_from_key(family: KernelFamily, key: str) -> Any:
    """Inverse of workload.key() for any family's workload dataclass (workloads.parse_key)."""
    from kernel_gym.kernels.workloads import parse_key

    return parse_key(family.workload_type, key)


# ---- one workload -----------------------------------------------------------------------------------------------


def classify(exc: BaseException) -> tuple[str, str, bool]:
    """(status, reason, context_poisoned) for an exception raised while compiling or running a config."""
    name = type(exc).__name__
    text = str(exc).strip().splitlines()
    reason = f"{name}: {text[0] if text else ''}"[:REASON_CHARS]
    full = str(exc)
    if name == "OutOfMemoryError" or "out of memory" in full.lower() or "can't allocate memory" in full:
        return OOM, reason, False
    if name == "OutOfResources":
        return OUT_OF_RESOURCES, reason, False
    if any(s in full for s in CONTEXT_POISONING):
        return CRASH, reason, True
    if name in COMPILE_EXCEPTIONS:
        return COMPILE_ERROR, reason, False
    # A Python error in the family's prepare/launch code for this config: record it, never time it.
    return COMPILE_ERROR, reason, False


def compare(family: KernelFamily, out: Any, ref: Any, dtype: str) -> str | None:
    """None when the kernel's output matches the reference within the family's tolerance; else why not."""
    import torch

    atol, rtol = family.tolerance(dtype)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    if len(outs) != len(refs):
        return f"kernel returned {len(outs)} outputs, the reference {len(refs)}"
    for i, (o, r) in enumerate(zip(outs, refs)):
        if tuple(o.shape) != tuple(r.shape):
            return f"output {i}: shape {tuple(o.shape)} != reference {tuple(r.shape)}"
        o32, r32 = o.detach().float(), r.detach().float().to(o.device)  # compare where the data is: no copies
        if not torch.isfinite(o32).all():
            return f"output {i}: {int((~torch.isfinite(o32)).sum())} non-finite values"
        err = (o32 - r32).abs()
        bad = err > atol + rtol * r32.abs()
        if bad.any():
            return (f"output {i}: {int(bad.sum())}/{bad.numel()} elements beyond atol={atol} rtol={rtol} "
                    f"(max abs err {float(err.max()):.3g})")
    return None


@contextlib.contextmanager
def poisoned_empty() -> Iterator[None]:
    """Inside: torch.empty / empty_like / empty_strided / Tensor.new_empty return floating tensors filled with NaN.

    PyTorch's caching allocator hands a freed block to the next allocation of its size, so an output made with
    torch.empty can hold the previous config's correct values: a kernel that writes nothing (or only part of its
    output) would pass the reference check. Under this context every uninitialised floating buffer starts as NaN, so
    whatever the kernel leaves unwritten fails the check. Integer buffers are left as they are (NaN has no integer).
    """
    import torch

    originals = {name: getattr(torch, name) for name in ("empty", "empty_like", "empty_strided")}
    new_empty = torch.Tensor.new_empty

    def poison(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()):
            with torch.no_grad():
                t.fill_(float("nan"))
        return t

    def wrap(fn: Any) -> Any:
        @functools.wraps(fn)
        def poisoned(*args: Any, **kwargs: Any) -> Any:
            return poison(fn(*args, **kwargs))

        return poisoned

    for name, fn in originals.items():
        setattr(torch, name, wrap(fn))
    torch.Tensor.new_empty = wrap(new_empty)
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(torch, name, fn)
        torch.Tensor.new_empty = new_empty


def poison_outputs(out: Any) -> None:
    """Fill the floating tensors a launch returned with NaN, so the next launch must write every element again."""
    import torch

    for t in out if isinstance(out, (tuple, list)) else (out,):
        if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()):
            with torch.no_grad():
                t.fill_(float("nan"))


class WorkloadRunner:
    """Inputs and reference built once for a workload; `measure(config)` for each config.

    timing=None measures correctness only (the interpreter backend); device "cpu" runs under TRITON_INTERPRET=1.
    The check cannot be passed by a kernel that leaves its output unwritten: `prepare` and the first launch run under
    `poisoned_empty` (uninitialised floating buffers are NaN), the output is checked, then the returned output is
    filled with NaN, launched again and checked again; only then is it timed. poison=False is the old, foolable
    check (kept only so a test can show the difference).
    """

    def __init__(self, family: KernelFamily, workload: Any, device: str, timing: Any = None, seed: int = 0,
                 poison: bool = True) -> None:
        self.family, self.workload, self.device, self.timing = family, workload, device, timing
        self.poison = poison
        self.key = workload.key()
        self.inputs = family.make_inputs(workload, device, seed)
        self.ref = family.reference(self.inputs)
        self.poisoned = False

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()

    def measure(self, config: Config) -> Measurement:
        self.timed_window: tuple[float, float] | None = None  # monotonic start and end of this config's timing
        fam, cfg = self.family, str(config)
        base = dict(kernel=fam.name, workload=self.key, config=cfg,
                    source="interpreter" if self.timing is None else "live")
        why = fam.space.why_invalid(config, self.workload)
        if why:
            return Measurement(status=INVALID, reason=why[:REASON_CHARS], **base)
        dtype = getattr(self.workload, "dtype", "float32")
        guard = poisoned_empty if self.poison else contextlib.nullcontext
        t0 = time.perf_counter()
        try:
            with guard():
                fn = fam.prepare(self.inputs, config)
                out = fn()
            self._sync()
        except Exception as exc:  # noqa: BLE001 - every failure is recorded with its reason
            status, reason, poisoned = classify(exc)
            self.poisoned |= poisoned
            self._after_failure(status)
            return Measurement(status=status, reason=reason, compile_s=time.perf_counter() - t0, **base)
        compile_s = time.perf_counter() - t0
        wrong = compare(fam, out, self.ref, dtype)
        if not wrong and self.poison:  # a second launch over a NaN-filled output must write all of it again
            try:
                poison_outputs(out)
                with guard():
                    out = fn()
                self._sync()
            except Exception as exc:  # noqa: BLE001
                status, reason, poisoned = classify(exc)
                self.poisoned |= poisoned
                self._after_failure(status)
                return Measurement(status=status, reason=reason, compile_s=compile_s, **base)
            wrong = compare(fam, out, self.ref, dtype)
            if wrong:
                wrong = f"second launch over a NaN-filled output: {wrong}"
        if wrong:
            return Measurement(status=WRONG_RESULT, reason=wrong[:REASON_CHARS], compile_s=compile_s, **base)
        if self.timing is None:
            return Measurement(status=OK, compile_s=compile_s, **base)
        from kernel_gym.measure.timing import time_launch

        try:
            t_start = time.monotonic()
            t = time_launch(fn, self.timing, self.device)
            self.timed_window = (t_start, time.monotonic())
        except Exception as exc:  # noqa: BLE001
            status, reason, poisoned = classify(exc)
            self.poisoned |= poisoned
            self._after_failure(status)
            return Measurement(status=status, reason=reason, compile_s=compile_s, **base)
        return Measurement(status=OK, median_ms=t.median_ms, spread=t.spread, repeats=t.repeats,
                           compile_s=compile_s, **base)

    def _after_failure(self, status: str) -> None:
        if status == OOM and self.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()


# ---- the worker process -----------------------------------------------------------------------------------------


def die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies, so a killed collection leaves no orphan writing on."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _worker_main(conn: Any, env: dict[str, str]) -> None:
    """Child process loop: one task = (family ref, workload key, configs, timing, device); one result per config,
    in order, so the supervisor always knows which config was in flight when the worker died or hung."""
    die_with_parent()
    os.environ.update(env)
    families: dict[str, KernelFamily] = {}
    runner: WorkloadRunner | None = None
    while True:
        try:
            msg = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if msg[0] == "stop":
            return
        _, ref, wkey, configs, timing, device, seed = msg
        if ref not in families:
            families[ref] = resolve_family(ref)
        fam = families[ref]
        if runner is not None and runner.key == wkey and runner.family is fam and runner.device == device:
            runner.timing = timing  # same inputs and reference, other timing options (pick_winner's confirmation)
        else:
            runner = None
            try:
                runner = WorkloadRunner(fam, workload_from_key(fam, wkey), device, timing, seed)
            except Exception as exc:  # noqa: BLE001 - the whole workload fails with this reason
                status, reason, poisoned = classify(exc)
                for cfg in configs:
                    m = Measurement(kernel=fam.name, workload=wkey, config=cfg, status=status,
                                    reason=f"building inputs: {reason}"[:REASON_CHARS])
                    conn.send(("result", asdict(m)))
                if poisoned:
                    return
                continue
        monitor = _start_power(timing, device)
        try:
            for cfg in configs:
                m = runner.measure(Config.parse(cfg))
                if monitor is not None and m.status == OK and runner.timed_window is not None:
                    monitor.sample_now()
                    m = replace(m, power=monitor.window(*runner.timed_window).compact())
                conn.send(("result", asdict(m)))
                if runner.poisoned:
                    conn.close()
                    os._exit(3)  # the CUDA context is unusable: the supervisor restarts a fresh worker
        finally:
            if monitor is not None:
                monitor.__exit__(None, None, None)


def _start_power(timing: Any, device: str) -> Any:
    """Before a batch of timings on a GPU: the warm-up rule (timing.keep_hot: recorded times stand for a hot GPU),
    then a PowerMonitor whose readings go with every row timed in the batch (Measurement.power). None when nothing
    is timed (the interpreter) or on the CPU."""
    if timing is None or not device.startswith("cuda"):
        return None
    from kernel_gym.measure.power import PowerMonitor
    from kernel_gym.measure.timing import keep_hot

    try:
        keep_hot(timing, device)
    except Exception as exc:  # noqa: BLE001 - a failed warm-up leaves the GPU as it is; the power record says so
        print(f"[worker] warm-up failed ({type(exc).__name__}: {exc}); timing without it", file=sys.stderr)
    import torch

    index = torch.device(device).index
    return PowerMonitor(torch.cuda.current_device() if index is None else index).__enter__()


class IsolatedRunner:
    """Supervises one worker process (one GPU): deadlines, crash detection, restarts."""

    def __init__(self, env: dict[str, str] | None = None, timeout_s: float = 60.0, first_timeout_s: float = 300.0):
        self.env = dict(env or {})
        self.timeout_s, self.first_timeout_s = timeout_s, first_timeout_s
        self.ctx = mp.get_context("spawn")
        self.proc: Any = None
        self.conn: Any = None
        self.restarts = 0

    def _start(self) -> None:
        parent, child = self.ctx.Pipe()
        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)  # inherited at exec: CUDA_VISIBLE_DEVICES must be set before CUDA initialises
        try:
            self.proc = self.ctx.Process(target=_worker_main, args=(child, self.env), daemon=True)
            self.proc.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        child.close()
        self.conn = parent

    def _kill(self) -> None:
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(timeout=10)
            self.conn.close()
        self.proc = self.conn = None

    def close(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            try:
                self.conn.send(("stop",))
                self.proc.join(timeout=5)
            except (BrokenPipeError, OSError):
                pass
        self._kill()

    def run(self, ref: str, kernel: str, workload_key: str, configs: list[str], timing: Any, device: str,
            seed: int = 0) -> list[Measurement]:
        """Measure configs (canonical strings) of one workload; always one Measurement per config, in order."""
        pending = list(configs)
        results: list[Measurement] = []
        while pending:
            if self.proc is None or not self.proc.is_alive():
                if self.proc is not None:
                    self._kill()
                    self.restarts += 1
                self._start()
            self.conn.send(("measure", ref, workload_key, pending, timing, device, seed))
            first = True
            while pending:
                wait = self.first_timeout_s if first else self.timeout_s
                failed: Measurement | None = None
                try:
                    ready = self.conn.poll(wait)
                    msg = self.conn.recv() if ready else None
                except (EOFError, OSError):
                    ready, msg = True, None
                if not ready:
                    failed = Measurement(kernel=kernel, workload=workload_key, config=pending[0], status=TIMEOUT,
                                         reason=f"no answer within {wait:.0f} s; worker killed and restarted")
                elif msg is None:
                    self.proc.join(timeout=10)
                    failed = Measurement(kernel=kernel, workload=workload_key, config=pending[0], status=CRASH,
                                         reason=f"worker process died (exit code {self.proc.exitcode}); restarted")
                if failed is not None:
                    self._kill()
                    self.restarts += 1
                    results.append(failed)
                    pending.pop(0)
                    break
                m = Measurement(**msg[1])
                if m.config != pending[0]:
                    raise RuntimeError(f"worker answered config {m.config}, expected {pending[0]}")
                results.append(m)
                pending.pop(0)
                first = False
                if m.status == CRASH:  # the worker exits itself after a poisoned context
                    self._kill()
                    self.restarts += 1
                    break
        return results
