"""The compile pool: closing it must not wait for compiles still running (a collection's exit joins every pool
process, and a slow one once held a finished GPU collection past its time limit)."""

from __future__ import annotations

import time

from kernel_gym.measure.compiler import CompilePool


def test_close_terminates_busy_compile_processes_at_once() -> None:
    pool = CompilePool(2, env={})
    busy = [pool.pool.submit(time.sleep, 60) for _ in range(2)]
    deadline = time.time() + 60
    while not all(f.running() for f in busy) and time.time() < deadline:
        time.sleep(0.1)
    procs = list(pool.pool._processes.values())
    assert len(procs) == 2 and all(p.is_alive() for p in procs)
    t0 = time.perf_counter()
    pool.close()
    assert time.perf_counter() - t0 < 10
    assert not any(p.is_alive() for p in procs)
