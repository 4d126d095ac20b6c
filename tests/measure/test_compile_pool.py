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
    # gone (or a zombie) right after close, not left to finish their 60 s sleeps. Asked of the kernel, not of
    # Process.is_alive(): another waiter (the executor's manager thread, or a SIGCHLD handler a library installed in
    # this test process) may reap the child first, after which is_alive() can never see it exit.
    assert not any(_running(p.pid) for p in procs), [p.pid for p in procs]


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")
