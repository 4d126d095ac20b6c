"""Measurement: one backend interface (types.Backend), three backends, the SQLite store, collection and summary.

`make_backend("live" | "recorded" | "interpreter", **kw)` builds one (`resolve_backend`: from a name, a store path or
as is; `recorded_backend`: the same for stored rows only);
submodules import torch/triton only when used.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kernel_gym.measure.types import Backend, Measurement

BACKENDS = ("live", "recorded", "interpreter")


def make_backend(name: str, **kw: Any) -> Backend:
    """live: LiveBackend(gpu=, timing=, compile_workers=, ...); recorded: RecordedBackend(path=None -> the packaged
    H200 dataset, device=); interpreter: InterpreterBackend()."""
    if name == "live":
        from kernel_gym.measure.live import LiveBackend

        return LiveBackend(**kw)
    if name == "recorded":
        from kernel_gym.measure.recorded import RecordedBackend

        return RecordedBackend(**kw)
    if name == "interpreter":
        from kernel_gym.measure.interpreter import InterpreterBackend

        return InterpreterBackend(**kw)
    raise ValueError(f"unknown backend {name!r}: choose one of {list(BACKENDS)}")


def resolve_backend(backend: Any, **kw: Any) -> Any:
    """A Backend object as is; a name for make_backend ("recorded", "live", ...); or the path of a measurement store
    (the --db that tune and collect write, a snapshot): the recorded backend over it, so that what a user measured
    trains, replays and plans the same way the packaged data does. `kw` go to make_backend."""
    if isinstance(backend, os.PathLike):
        backend = os.fspath(backend)
    if not isinstance(backend, str):
        if not hasattr(backend, "measure") or not hasattr(backend, "available_configs"):
            raise TypeError(f"backend {backend!r} is neither a backend name nor a Backend (measure, available_configs)")
        return backend
    if backend in BACKENDS:
        return make_backend(backend, **kw)
    if backend and Path(backend).is_file():
        return make_backend("recorded", path=backend, **kw)
    raise ValueError(f"--backend {backend}: neither a backend ({', '.join(BACKENDS)}) nor an existing store file: pass "
                     "recorded (the packaged H200 data) or the --db path tune / collect wrote")


def recorded_backend(backend: Any, **kw: Any) -> Any:
    """resolve_backend for the commands that price from stored rows only (plan, replay): "recorded" or a store path
    becomes the recorded backend (`kw` to it), a Backend object stays as is, and "live" / "interpreter" are refused,
    since a whole replay or plan would compile and time every config it prices."""
    if isinstance(backend, str) and backend in BACKENDS and backend != "recorded":
        raise ValueError(f"--backend {backend}: replay and plan price from measured rows; measure first (kernel-gym "
                         "tune or collect --db FILE), then pass recorded or that --db path")
    if isinstance(backend, (str, os.PathLike)) and os.fspath(backend) != "recorded" and not Path(backend).is_file():
        raise ValueError(f"--backend {os.fspath(backend)}: no such store file; pass recorded (the packaged H200 data) "
                         "or the --db path tune / collect wrote")
    return resolve_backend(backend, **kw)


__all__ = ["BACKENDS", "Backend", "Measurement", "make_backend", "recorded_backend", "resolve_backend"]
