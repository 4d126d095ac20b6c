"""Every stored ok time against the plausibility floor readers apply (kernel_gym/measure/store.py ROOFLINE_FLOOR):
per kernel, the lowest ratio of a stored time to the workload's strict roofline bound. The floor refuses a row
below ROOFLINE_FLOOR (0.5); this prints how much room real rows leave above it.

    python scripts/check_roofline_floor.py [--store PATH]     # default: the packaged dataset
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernel_gym.measure.store import PACKAGED_SNAPSHOT, ROOFLINE_FLOOR, load_rows, roofline_floor_ms  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", default=str(PACKAGED_SNAPSHOT), help="snapshot (.jsonl.gz) or store (.sqlite)")
    args = p.parse_args(argv)
    lowest: dict[str, tuple[float, str]] = {}
    rows = 0
    for ctx, ms in load_rows(args.store):  # load_rows itself refuses rows below the floor
        for m in ms:
            if not m.ok or m.median_ms is None:
                continue
            floor = roofline_floor_ms(ctx.kernel, m.workload)
            if floor is None:
                continue
            rows += 1
            ratio = m.median_ms / (floor / ROOFLINE_FLOOR)
            if ctx.kernel not in lowest or ratio < lowest[ctx.kernel][0]:
                lowest[ctx.kernel] = (ratio, m.workload)
    print(f"{rows} ok rows with a roofline in {args.store}; floor {ROOFLINE_FLOOR} x the strict bound")
    print("| kernel | lowest time / roofline bound | workload |")
    print("|---|---|---|")
    for k, (r, w) in sorted(lowest.items()):
        print(f"| {k} | {r:.3f} | {w[:100]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
