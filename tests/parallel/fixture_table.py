"""A FIXTURE collectives table for the tests: synthetic times (a latency plus bytes over a bandwidth), not a
measurement of any machine. The package never reads it unless a test passes it."""

from __future__ import annotations

from kernel_gym.parallel.collectives import FORMAT, VERSION


def fixture_time_s(op: str, gpus: int, nbytes: int) -> float:
    latency = 20e-6 if op == "all_reduce" else 30e-6
    bandwidth = 100e9 if op == "all_reduce" else 80e9
    return latency * (1 + 0.1 * gpus) + nbytes / bandwidth


def fixture_table(gpu_counts=(2, 4, 8), sizes=tuple(2 ** i for i in range(10, 31))) -> dict:
    rows = [{"op": op, "gpus": g, "bytes": b, "median_s": fixture_time_s(op, g, b), "p10_s": 0.0, "p90_s": 0.0,
             "repeats": 1, "correct": True}
            for op in ("all_reduce", "all_to_all") for g in gpu_counts for b in sizes]
    return {"format": FORMAT, "version": VERSION, "created": "fixture", "device": "FIXTURE (not a measurement)",
            "gpu_counts": list(gpu_counts), "torch": "", "nccl": "", "backend": "fixture", "topology": {},
            "env": {}, "timing": {}, "results": rows}
