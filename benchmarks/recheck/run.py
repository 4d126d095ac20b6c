"""Re-check a random sample of the stored ok rows with the poisoned reference check (GPU).

The rows of the packaged dataset were checked against the torch reference with outputs made by torch.empty, which the
caching allocator may hand back holding a previous config's correct values. This re-runs, in a supervised worker, the
check that cannot be fooled that way (kernel_gym.measure.worker: NaN-filled buffers, two launches) on a seeded sample
of ok rows per kernel, and writes JSON: per kernel how many were checked, how many fail and which.

  python benchmarks/recheck/run.py --per-kernel 150 --budget-s 400 --json $OUT/recheck.json      # GPU
  python benchmarks/recheck/run.py --drop $OUT/recheck.json                                         # CPU: remove them

--drop rewrites the snapshot (default the packaged one, atomically) without the rows the JSON lists as failing.
Imports only torch, triton, numpy and the standard library on the GPU path.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kernel_gym.measure.store import PACKAGED_SNAPSHOT, SNAPSHOT_FORMAT, Context, iter_snapshot  # noqa: E402
from kernel_gym.measure.types import OK, Measurement  # noqa: E402

MeasureFn = Callable[[str, str, list[str]], list[Measurement]]


def main_contexts(groups: list[tuple[Context, list[Measurement]]]) -> dict[str, tuple[Context, list[Measurement]]]:
    """Per kernel, the context with the most rows (the one the recorded backend serves)."""
    best: dict[str, tuple[Context, list[Measurement]]] = {}
    for ctx, ms in groups:
        if ctx.kernel not in best or len(ms) > len(best[ctx.kernel][1]):
            best[ctx.kernel] = (ctx, ms)
    return best


def sample_ok_rows(groups: list[tuple[Context, list[Measurement]]], per_kernel: int, seed: int,
                   kernels: list[str] | None = None) -> dict[str, list[Measurement]]:
    """A seeded sample of up to per_kernel ok rows per kernel, ordered by workload (inputs built once per workload)."""
    out = {}
    for kernel, (_, ms) in sorted(main_contexts(groups).items()):
        if kernels and kernel not in kernels:
            continue
        ok = sorted((m for m in ms if m.status == OK), key=lambda m: (m.workload, m.config))
        picked = random.Random(f"{seed}:{kernel}").sample(ok, min(per_kernel, len(ok)))
        out[kernel] = sorted(picked, key=lambda m: (m.workload, m.config))
    return out


def isolated_measure(device: str, timeout_s: float = 60.0) -> tuple[MeasureFn, Callable[[], None]]:
    """Correctness only (timing=None), in a supervised worker: a crash or hang costs one row, not the run."""
    from kernel_gym.measure.worker import IsolatedRunner

    env = {"TRITON_INTERPRET": "1"} if device == "cpu" else {}
    runner = IsolatedRunner(env, timeout_s=timeout_s, first_timeout_s=300.0)

    def measure(kernel: str, wkey: str, configs: list[str]) -> list[Measurement]:
        return runner.run(kernel, kernel, wkey, configs, None, device)

    return measure, runner.close


def recheck(sample: dict[str, list[Measurement]], measure: MeasureFn, budget_s: float,
            log: Any = sys.stderr) -> dict[str, Any]:
    """Re-check the sample, kernel by kernel and workload by workload, until budget_s (split evenly per kernel)."""
    report: dict[str, Any] = {"budget_s": budget_s, "kernels": {}}
    per_kernel_s = budget_s / max(1, len(sample))
    for kernel, rows in sample.items():
        t0 = time.time()
        by_workload: dict[str, list[str]] = defaultdict(list)
        for m in rows:
            by_workload[m.workload].append(m.config)
        checked, failing, statuses = 0, [], defaultdict(int)
        for wkey, configs in by_workload.items():
            if time.time() - t0 > per_kernel_s:
                break
            for m in measure(kernel, wkey, configs):
                checked += 1
                statuses[m.status] += 1
                if m.status != OK:
                    failing.append({"workload": wkey, "config": m.config, "status": m.status, "reason": m.reason})
        report["kernels"][kernel] = {"sampled": len(rows), "checked": checked, "failed": len(failing),
                                     "statuses": dict(statuses), "failing": failing,
                                     "seconds": round(time.time() - t0, 1)}
        print(f"[recheck] {kernel}: {checked}/{len(rows)} checked, {len(failing)} fail", file=log)
    return report


def drop_rows(snapshot: Path, failing: set[tuple[str, str, str]], out: Path) -> dict[str, int]:
    """Rewrite a snapshot without the (kernel, workload, config) rows in failing; written to a temporary file in out's
    folder and moved into place. Returns rows kept and dropped."""
    kept = dropped = 0
    tmp = out.with_name(out.name + ".tmp")
    with gzip.open(snapshot, "rt", encoding="utf-8") as src, gzip.open(tmp, "wt", encoding="utf-8",
                                                                       compresslevel=9) as dst:
        header = json.loads(src.readline())
        if header.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(f"{snapshot} is not a kernel_gym measurement snapshot (header {header})")
        dst.write(json.dumps(header) + "\n")
        fields = header["fields"]
        kernel = ""
        for line in src:
            item = json.loads(line)
            if isinstance(item, dict):
                kernel = item["context"]["kernel"]
            else:
                row = dict(zip(fields, item))
                if (kernel, row["workload"], row["config"]) in failing:
                    dropped += 1
                    continue
                kept += 1
            dst.write(line)
    os.replace(tmp, out)
    return {"kept": kept, "dropped": dropped}


def failing_keys(report: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(k, f["workload"], f["config"]) for k, info in report["kernels"].items() for f in info["failing"]}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--snapshot", type=Path, default=PACKAGED_SNAPSHOT)
    p.add_argument("--per-kernel", type=int, default=150, help="ok rows sampled per kernel (default 150)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kernels", default="", help="comma-separated kernels (default all)")
    p.add_argument("--budget-s", type=float, default=400.0, help="stop after this long (split over the kernels)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--json", type=Path, default=Path(os.environ.get("OUT", "out")) / "recheck.json")
    p.add_argument("--drop", type=Path, help="a recheck JSON: rewrite --snapshot without its failing rows (CPU)")
    p.add_argument("--drop-out", type=Path, help="where --drop writes (default: --snapshot itself)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not args.snapshot.exists():
        print(f"error: no snapshot at {args.snapshot}: pass --snapshot FILE.jsonl.gz", file=sys.stderr)
        return 2
    if args.drop:
        try:
            report = json.loads(args.drop.read_text())
            keys = failing_keys(report)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"error: {args.drop} is not a benchmarks/recheck/run.py JSON ({exc}): run it with --json first",
                  file=sys.stderr)
            return 2
        res = drop_rows(args.snapshot, keys, args.drop_out or args.snapshot)
        print(f"{args.drop_out or args.snapshot}: {res['dropped']} rows dropped, {res['kept']} kept")
        return 0
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("error: no CUDA device: run this on the GPU machine (or --device cpu for the interpreter)",
                  file=sys.stderr)
            return 2
    groups = list(iter_snapshot(args.snapshot))
    sample = sample_ok_rows(groups, args.per_kernel, args.seed, [k for k in args.kernels.split(",") if k])
    measure, close = isolated_measure(args.device)
    try:
        report = recheck(sample, measure, args.budget_s)
    finally:
        close()
    from kernel_gym.measure.worker import family_store_key, resolve_family

    for kernel, info in report["kernels"].items():  # a kernel edited since collection is checked as it is now
        stored = main_contexts(groups)[kernel][0].source_hash
        info.update(stored_source_hash=stored, current_source_hash=family_store_key(resolve_family(kernel)))
    report.update(snapshot=str(args.snapshot), per_kernel=args.per_kernel, seed=args.seed)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1))
    print(f"{'kernel':<20} {'sampled':>8} {'checked':>8} {'failed':>7}")
    for k, info in report["kernels"].items():
        print(f"{k:<20} {info['sampled']:>8} {info['checked']:>8} {info['failed']:>7}")
    print(f"-> {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
