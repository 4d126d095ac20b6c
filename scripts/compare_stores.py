"""Compare measurement stores: `python3 scripts/compare_stores.py A.sqlite B.sqlite` (same rows, same statuses, ok
timings within noise: exit 0, else 1), or `--gpus S [S ...]` (the same configs timed on several GPUs, per-GPU medians).

Made for checking a farm run (`collect --ray`) against a plain collection of the same plan on the same GPU
(scripts/gpu_session.sh step `farm`), and for the cross-GPU noise study. Imports only the standard library and
kernel_gym.measure.storetools, so it runs on the GPU machine as it is. Examples:
  python3 scripts/compare_stores.py plain.sqlite ray.sqlite --json cmp.json
  python3 scripts/compare_stores.py --gpus farm.sqlite                 # cross-GPU report (replicas + rows)
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernel_gym.measure.storetools import (  # noqa: E402
    compare_gpus,
    compare_stores,
    format_comparison,
    format_gpu_report,
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("stores", nargs="+", help="two stores (A B), or with --gpus one or more")
    p.add_argument("--gpus", action="store_true", help="compare GPUs on identical (kernel, workload, config) rows")
    p.add_argument("--rel-tol", type=float, default=0.05, help="a pair is within noise at |B/A - 1| <= this ...")
    p.add_argument("--spread-k", type=float, default=1.0, help="... or <= this times the larger row spread")
    p.add_argument("--geo-tol", type=float, default=0.03, help="geomean of B/A must be within 1 +- this")
    p.add_argument("--min-within", type=float, default=0.9, help="share of pairs that must be within noise")
    p.add_argument("--json", default="", help="also write the full comparison as JSON here")
    args = p.parse_args(argv)
    for s in args.stores:
        if not Path(s).exists():
            p.error(f"no store at {s}")
    if args.gpus:
        rep = compare_gpus(args.stores)
        print(format_gpu_report(rep))
        ok = True
    else:
        if len(args.stores) != 2:
            p.error("give two stores to compare (A B), or --gpus")
        rep = compare_stores(*args.stores, rel_tol=args.rel_tol, spread_k=args.spread_k, geo_tol=args.geo_tol,
                             min_within=args.min_within)
        print(format_comparison(rep))
        ok = rep["ok"]
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
