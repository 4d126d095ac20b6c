"""Keep stored rows when a kernel family grows a new code path: move them to the family's new source hash.

The store keys every row by the source hash of the code that measured it, so any edit to a family's module orphans
its rows. When the edit only adds a path that a new knob selects (fused MoE's TMA_LOADS), the rows of the old path
still describe it. The family proves it with `legacy_source_hash()`: the hash of the old path's code as it is now.
This script moves the rows only when that equals the hash the rows carry, so a changed old path is never re-keyed.

    python scripts/rekey_rows.py --kernel fused_moe                   # the packaged snapshot, in place
    python scripts/rekey_rows.py --kernel fused_moe --snapshot other.jsonl.gz --out new.jsonl.gz
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from kernel_gym.kernels import FAMILY_MODULES
    from kernel_gym.measure.store import PACKAGED_SNAPSHOT, MeasurementStore

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernel", required=True, help="family name, e.g. fused_moe")
    p.add_argument("--snapshot", type=Path, default=PACKAGED_SNAPSHOT, help="snapshot to read (.jsonl.gz)")
    p.add_argument("--out", type=Path, default=None, help="snapshot to write (default: --snapshot, in place)")
    args = p.parse_args(argv)
    if args.kernel not in FAMILY_MODULES:
        p.error(f"unknown kernel {args.kernel!r}; choose one of {sorted(FAMILY_MODULES)}")
    module = importlib.import_module(FAMILY_MODULES[args.kernel])
    if not hasattr(module, "legacy_source_hash"):
        p.error(f"{args.kernel} has no legacy_source_hash(): nothing proves its stored rows still describe its code")
    old, new = module.legacy_source_hash(), module.source_hash()
    with tempfile.TemporaryDirectory() as tmp:
        store = MeasurementStore(Path(tmp) / "store.sqlite")
        try:
            total = store.import_snapshot(args.snapshot)
            stale = {h for (h,) in store.conn.execute(
                "SELECT DISTINCT source_hash FROM measurements WHERE kernel=?", (args.kernel,))} - {old, new}
            moved = store.rekey(args.kernel, old, new)
            out = args.out or args.snapshot
            written = store.export_snapshot(out)
        finally:
            store.close()
    print(f"{args.kernel}: {moved} rows moved from {old} (the unchanged old path) to {new}; {written} of {total} "
          f"rows written to {out}" + (f"; rows under other hashes left as they are: {sorted(stale)}" if stale else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
