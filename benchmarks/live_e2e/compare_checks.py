"""Two live checks (run.py --live-check files) side by side, by model and policy: how many policy runs each predicted
within the issue's targets (tokens/s 5%, TTFT p50 10%, TPOT p50 5%). What a change to --predict's pricing moved, and
where. CPU only, from committed files.

    python benchmarks/live_e2e/compare_checks.py benchmarks/live_e2e/live_check_before_chunk_tables.json \
        kernel_gym/data/live_check.json --json benchmarks/live_e2e/chunk_tables_check.json
    python benchmarks/live_e2e/compare_checks.py benchmarks/live_e2e/live_check_before_ragged.json \
        kernel_gym/data/live_check.json --common --json benchmarks/live_e2e/ragged_check.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TARGETS = {"tokens_per_s": 0.05, "ttft_p50_s": 0.10, "tpot_p50_s": 0.05}


def group(row: dict) -> str:
    policy = "learned table" if row["policy"].startswith("table:") else row["policy"]
    return f"{row['model']} {policy}"


def counts(check: dict) -> dict[str, dict]:
    """Per model and policy: the runs, and per metric how many were within its target and the error range."""
    out: dict[str, dict] = {}
    for row in check["rows"]:
        g = out.setdefault(group(row), {"runs": 0, **{m: {"within": 0, "range": [None, None]} for m in TARGETS}})
        g["runs"] += 1
        for metric, limit in TARGETS.items():
            e = row[metric]
            g[metric]["within"] += abs(e) <= limit
            lo, hi = g[metric]["range"]
            g[metric]["range"] = [e if lo is None else min(lo, e), e if hi is None else max(hi, e)]
    return dict(sorted(out.items()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--json", type=Path, default=None, help="write both sides' counts here")
    p.add_argument("--common", action="store_true",
                   help="compare the policy runs both checks cover (a later check that added runs), not all")
    args = p.parse_args(argv)
    before, after = (json.loads(f.read_text()) for f in (args.before, args.after))
    runs_a, runs_b = ({(r["run"], r["policy"]) for r in c["rows"]} for c in (before, after))
    if args.common:
        if not runs_a & runs_b:
            raise SystemExit(f"--common: {args.before} and {args.after} share no policy run")
        for c in (before, after):
            c["rows"] = [r for r in c["rows"] if (r["run"], r["policy"]) in runs_a & runs_b]
        print(f"the {len(runs_a & runs_b)} policy runs both checks cover ({len(runs_b - runs_a)} only in {args.after}, "
              f"{len(runs_a - runs_b)} only in {args.before})")
    elif runs_a != runs_b:
        raise SystemExit(f"the two checks cover different policy runs ({len(runs_a - runs_b)} only in {args.before}, "
                         f"{len(runs_b - runs_a)} only in {args.after}, e.g. {sorted(runs_a ^ runs_b)[0]}): compare "
                         "checks over the same runs, or pass --common")
    a, b = counts(before), counts(after)
    print(f"{'model, policy':28s} {'runs':>4s}  " + "  ".join(f"{m} within {int(t * 100)}%" for m, t in
                                                                TARGETS.items()))
    for g in a:
        print(f"{g:28s} {a[g]['runs']:4d}  " + "  ".join(
            f"{a[g][m]['within']:>{len(m) + 5}d} -> {b[g][m]['within']:<3d}" for m in TARGETS))
    total = {m: (sum(v[m]["within"] for v in a.values()), sum(v[m]["within"] for v in b.values())) for m in TARGETS}
    print(f"{'all':28s} {sum(v['runs'] for v in a.values()):4d}  " + "  ".join(
        f"{x:>{len(m) + 5}d} -> {y:<3d}" for m, (x, y) in total.items()))
    if args.json:
        args.json.write_text(json.dumps({"before": str(args.before), "after": str(args.after), "targets": TARGETS,
                                         "by_group": {g: {"before": a[g], "after": b[g]} for g in a}}, indent=1)
                             + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
