"""Recorded backend: lookups per second on one core, and the interpolation's held-out error, as JSON.

  python3 benchmarks/recorded_backend/run.py                 # the packaged H200 dataset
  python3 benchmarks/recorded_backend/run.py --db h200.sqlite --seconds 2
  python3 benchmarks/recorded_backend/run.py --no-heldout --json benchmarks/recorded_lookup_speed.json  # speed target
The target (formerly a timed test): >= 20,000 warm lookups/s on one core; the JSON records it, the rate and the host.
Queries mix measured shapes and shapes between them (the traffic grids at other sizes), each with a random
config of the kernel's space; both a cold pass (plans computed) and a warm pass (memoised) are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kernel_gym.kernels.workloads import DecodeWorkload, MoEWorkload, PrefillWorkload  # noqa: E402
from kernel_gym.measure.recorded import RecordedBackend, heldout_error  # noqa: E402

WARM_TARGET = 20_000  # warm (memoised) lookups per second on one core


def _between(wl: object, rng: random.Random) -> object:
    """A shape near a measured one (not on the grid), the kind of query traffic produces."""
    if isinstance(wl, MoEWorkload):
        return MoEWorkload(max(1, int(wl.num_tokens * rng.uniform(0.7, 1.3))), wl.num_experts, wl.top_k, wl.hidden,
                           wl.intermediate, round(rng.uniform(0, 1.2), 2), wl.dtype)
    if isinstance(wl, DecodeWorkload):
        return DecodeWorkload(wl.num_heads, wl.num_kv_heads, wl.head_dim, max(1, int(wl.batch * rng.uniform(0.7, 1.3))),
                              max(1, int(wl.context_len * rng.uniform(0.7, 1.3))), wl.dtype)
    if isinstance(wl, PrefillWorkload):
        return PrefillWorkload(wl.num_heads, wl.num_kv_heads, wl.head_dim,
                               tuple(max(1, int(n * rng.uniform(0.7, 1.3))) for n in wl.seq_lens), wl.dtype)
    return wl


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", default=None, help="snapshot (.jsonl.gz) or store (.sqlite); default: packaged dataset")
    p.add_argument("--seconds", type=float, default=1.0, help="duration of each timed pass")
    p.add_argument("--queries", type=int, default=5000)
    p.add_argument("--no-heldout", action="store_true", help="skip the held-out error computation")
    p.add_argument("--json", type=Path, default=None, help="also write the result to this JSON file")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    backend = RecordedBackend(args.db)
    load_s = time.perf_counter() - t0
    rng = random.Random(0)
    queries = []
    for kernel in backend.kernels():
        wls = backend.workloads(kernel)
        if not wls:
            continue  # a kernel outside kernel_gym.kernels.workloads (no workload type to query with)
        cfgs = sorted({c for rows in backend.rows(kernel).values() for c in rows})
        for _ in range(args.queries // max(1, len(backend.kernels()))):
            wl = rng.choice(wls)
            queries.append((kernel, wl if rng.random() < 0.5 else _between(wl, rng), backend._cfg(rng.choice(cfgs))))
    if not queries:
        raise SystemExit("bench_recorded: the data holds no kernel with a known workload type")
    result = {"load_s": load_s, "queries": len(queries)}
    for name in ("cold", "warm"):
        n, t1 = 0, time.perf_counter()
        while True:
            for kernel, wl, cfg in queries:
                backend.measure(kernel, wl, cfg)
            n += len(queries)
            if name == "cold" or time.perf_counter() - t1 >= args.seconds:
                break
        result[f"lookups_per_s_{name}"] = n / (time.perf_counter() - t1)
    statuses: dict[str, int] = {}
    for kernel, wl, cfg in queries:
        s = backend.measure(kernel, wl, cfg).status
        statuses[s] = statuses.get(s, 0) + 1
    result["answer_status"] = statuses
    result["warm_target_lookups_per_s"] = WARM_TARGET
    result["warm_target_met"] = result["lookups_per_s_warm"] >= WARM_TARGET
    result["host"] = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
                      "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if not args.no_heldout:
        result["heldout"] = [heldout_error(backend, k) for k in backend.kernels()]
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
