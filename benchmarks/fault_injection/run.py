"""Fault injection in a real collection (GPU): a hanging kernel, an illegal address and an out-of-memory config among
correct ones; each failure must be stored with its reason, the worker restarted, every other config stored ok.

  python benchmarks/fault_injection/run.py                      # GPU, under ~1 minute; JSON under $OUT (default ./out)
  python benchmarks/fault_injection/run.py --device cpu         # the same under the Triton interpreter (tests)

The family is benchmarks.fault_injection.fault_family:FAULTS, beside this file: the worker process finds it by that
import path (run from the repository root, which this file puts on sys.path).
Measurements go through the live backend's supervised worker (worker.IsolatedRunner) into a SQLite measurement store,
one put_many per workload as the collector does; the table and the checks are read back from the store.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kernel_gym.kernels.space import Config  # noqa: E402
from kernel_gym.measure.types import CRASH, OK, OOM, TIMEOUT  # noqa: E402

FAMILY_REF = "benchmarks.fault_injection.fault_family:FAULTS"
EXPECTED = {"ok": OK, "hang": TIMEOUT, "illegal": CRASH, "oom": OOM}
# per workload size: (BLOCK, MODE) in measurement order; faults between correct configs, never first (the first
# config of a workload has the long first-config deadline, which covers building inputs)
PLAN = {
    4096: [(64, "ok"), (128, "ok"), (128, "hang"), (256, "ok"), (256, "illegal"), (512, "ok"), (512, "oom"),
           (1024, "ok")],
    65536: [(64, "ok"), (128, "ok"), (256, "ok"), (512, "ok"), (1024, "ok")],
}


def run(device: str, db: Path, hang_timeout_s: float, modes: tuple[str, ...] = tuple(EXPECTED)) -> dict[str, Any]:
    from benchmarks.fault_injection.fault_family import FAULTS, FaultWorkload
    from kernel_gym.measure.live import LiveBackend
    from kernel_gym.measure.store import Context, MeasurementStore
    from kernel_gym.measure.worker import family_store_key

    ctx = Context.current(FAULTS.name, family_store_key(FAULTS), device=None if device == "cuda" else "cpu")
    t0 = time.time()
    with MeasurementStore(db) as store, LiveBackend(device=device, timeout_s=hang_timeout_s,
                                                    first_timeout_s=300.0) as backend:
        for n, items in PLAN.items():
            configs = [Config(BLOCK=b, MODE=m) for b, m in items if m in modes]
            store.put_many(ctx, backend.measure_many(FAULTS, FaultWorkload(n), configs))
        restarts = backend.runner.restarts
        rows = [r for r in store.rows(FAULTS.name)]
    table, problems = [], []
    for r in rows:
        mode = json.loads(r["config"])["MODE"]
        n = json.loads(r["workload"])["n"]
        want = EXPECTED[mode]
        good = r["status"] == want and (want != OK or (r["median_ms"] or 0) > 0 or device == "cpu")
        good = good and (want == OK or bool(r["reason"]))
        table.append({"n": n, "config": r["config"], "mode": mode, "expected": want, "status": r["status"],
                      "median_ms": r["median_ms"], "reason": r["reason"], "as_expected": good})
        if not good:
            problems.append(f"n={n} {r['config']}: {r['status']} ({r['reason']}), expected {want}")
    planned = sum(1 for items in PLAN.values() for _, m in items if m in modes)
    if len(rows) != planned:
        problems.append(f"{len(rows)} rows stored, {planned} planned")
    expected_restarts = sum(1 for items in PLAN.values() for _, m in items if m in ("hang", "illegal") and m in modes)
    if restarts != expected_restarts:
        problems.append(f"{restarts} worker restarts, expected {expected_restarts} (hang, illegal)")
    return {"device": ctx.device, "torch": ctx.torch_version, "triton": ctx.triton_version, "db": str(db),
            "hang_timeout_s": hang_timeout_s, "restarts": restarts, "rows": table, "problems": problems,
            "passed": not problems, "seconds": round(time.time() - t0, 1)}


def format_table(report: dict[str, Any]) -> str:
    lines = [f"{'n':>6}  {'mode':<8} {'status':<13} {'expected':<13} {'ms':>8}  reason"]
    for r in report["rows"]:
        ms = f"{r['median_ms']:.4f}" if r["median_ms"] else "-"
        lines.append(f"{r['n']:>6}  {r['mode']:<8} {r['status']:<13} {r['expected']:<13} {ms:>8}  "
                     f"{(r['reason'] or '')[:70]}")
    lines.append(f"worker restarts: {report['restarts']}; {'PASSED' if report['passed'] else 'FAILED: '}"
                 + "; ".join(report["problems"]) + f" ({report['seconds']} s)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--hang-timeout-s", type=float, default=10.0, help="deadline of a config after the first")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")), help="folder for the JSON")
    p.add_argument("--modes", default=",".join(EXPECTED), help="faults to inject (ok is always kept)")
    args = p.parse_args(argv)
    modes = tuple(dict.fromkeys(["ok", *(m for m in args.modes.split(",") if m)]))
    bad = [m for m in modes if m not in EXPECTED]
    if bad:
        print(f"error: --modes {args.modes!r}: unknown {bad}; use some of {','.join(EXPECTED)}", file=sys.stderr)
        return 2
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("error: no CUDA device: run this on the GPU machine, or pass --device cpu", file=sys.stderr)
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        report = run(args.device, Path(tmp) / "faults.sqlite", args.hang_timeout_s, modes)
    path = args.out / "fault_injection.json"
    path.write_text(json.dumps(report, indent=1))
    print(format_table(report))
    print(f"-> {path}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
