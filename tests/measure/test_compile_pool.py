"""The compile pool: closing it must not wait for compiles still running (a collection's exit joins every pool
process, and a slow one once held a finished GPU collection past its time limit)."""

from __future__ import annotations

import time
from pathlib import Path

from kernel_gym.measure.compiler import CompilePool


def _mark_then_sleep(path: str) -> None:
    """A stand-in for a long compile: says it has started, then takes a minute."""
    Path(path).touch()
    time.sleep(60)


def test_close_terminates_busy_compile_processes_at_once(tmp_path: Path) -> None:
    pool = CompilePool(2, env={})
    marks = [tmp_path / f"started{i}" for i in range(2)]
    for m in marks:
        pool.pool.submit(_mark_then_sleep, str(m))
    deadline = time.time() + 120
    while not all(m.exists() for m in marks) and time.time() < deadline:
        time.sleep(0.1)
    assert all(m.exists() for m in marks), "the pool never started both jobs"
    procs = list(pool.pool._processes.values())
    assert len(procs) == 2 and all(p.is_alive() for p in procs)
    pool.close()
    assert not any(p.is_alive() for p in procs)
    # killed mid-job by a signal (negative exit code), not left to finish their 60 s sleeps and exit normally
    assert all(p.exitcode is not None and p.exitcode < 0 for p in procs), [p.exitcode for p in procs]
