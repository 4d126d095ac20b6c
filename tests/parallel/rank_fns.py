"""Rank functions for tests/parallel/test_launch.py: spawned processes import them from here (gloo on the CPU)."""

from __future__ import annotations

import time


def _init(rank: int, world: int, init: str) -> None:
    from kernel_gym.parallel.launch import init_rank

    init_rank(rank, world, init, "gloo", timeout_s=300.0)


def raise_on_rank_one(rank: int, world: int, init: str) -> None:
    """Rank 1 raises while rank 0 waits in a barrier (a collective its peer never joins)."""
    import torch.distributed as dist

    _init(rank, world, init)
    if rank == 1:
        raise ValueError("boom on rank one")
    dist.barrier()


def hang_on_rank_one(rank: int, world: int, init: str) -> None:
    """Rank 1 never reaches the barrier rank 0 waits in."""
    import torch.distributed as dist

    _init(rank, world, init)
    if rank == 1:
        time.sleep(3600)
    dist.barrier()


def stop_together(rank: int, world: int, init: str, out: str) -> None:
    """Rank 1 is past the deadline, rank 0 is not: both must stop (rank 0 writes how many rounds it ran)."""
    import torch.distributed as dist

    from kernel_gym.parallel.launch import agree_to_stop, time_closure

    _init(rank, world, init)
    dev = __import__("torch").device("cpu")
    deadline = 0.0 if rank == 1 else time.time() + 3600
    rounds = 0
    while not agree_to_stop(dev, deadline) and rounds < 5:
        rounds += 1
    t = __import__("torch").ones(8)
    r = time_closure(lambda: dist.all_reduce(t), dev, repeats=3, warmup=1)
    if rank == 0:
        with open(out, "w") as f:
            f.write(f"{rounds} {r['inner']} {r['median_s']}")
    dist.destroy_process_group()
