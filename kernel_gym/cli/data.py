"""`kernel-gym data`: summarise a measurement store (default: the packaged dataset), merge stores, drop rows."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kernel-gym data")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--db", default=None, help="a measurement store (sqlite) instead of the packaged dataset")
    p.add_argument("--counts", action="store_true",
                   help="rows, statuses and shapes only: skip the config-space coverage (the slow part: about "
                        "40 s on 2 cores)")
    p.add_argument("--merge", nargs="+", default=None, metavar="STORE",
                   help="merge these stores (.sqlite/.db or .jsonl.gz snapshots) into --into, deduplicated by key")
    p.add_argument("--into", default=None, metavar="DB", help="the store --merge writes (created when missing)")
    p.add_argument("--prefer-steadier", action="store_true",
                   help="with --merge: an ok row replaces a stored ok row of the same key whose samples spread more "
                        "(a re-timing of a noisy row); the stored one is kept as a replica")
    p.add_argument("--drop-row", type=int, action="append", default=[], metavar="ID",
                   help="with --db: delete the row with this id (one a reader refused as implausible); repeatable")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.drop_row:
        if not args.db or not str(args.db).endswith((".sqlite", ".db")):
            raise ValueError("--drop-row ID needs --db STORE.sqlite (the store the refused row is in)")
        from kernel_gym.measure.store import MeasurementStore

        MeasurementStore(args.db, read_only=True).close()  # a kernel_gym store, not another database
        with MeasurementStore(args.db) as store:
            n = store.drop_rows(args.drop_row)
        print(f"{args.db}: {n} of {len(args.drop_row)} rows dropped")
        return 0
    if args.merge or args.into:
        if not (args.merge and args.into):
            raise ValueError("--merge STORE... needs --into NEW.db (and --into needs --merge)")
        from kernel_gym.measure.storetools import merge_stores

        report = merge_stores(args.merge, args.into, prefer_steadier=args.prefer_steadier)
        print(json.dumps(report, indent=2) if args.json else
              "\n".join([f"{src}: {c['rows']} rows, {c['inserted']} new, {c['duplicates']} already there "
                          f"({c['replicas']} kept as replicas"
                          + (f"; {c['replaced']} replaced by a steadier re-timing" if c.get("replaced") else "")
                          + ")" for src, c in report["sources"].items()]
                         + [f"{report['into']}: {report['rows']} rows, integrity {report['integrity']}"]))
        return 0
    from kernel_gym.measure import summary

    progress = lambda msg: print(f"[data] {msg}", file=sys.stderr, flush=True)  # noqa: E731 - minutes on 2 cores
    info = summary.dataset_summary(args.db, coverage=not args.counts, progress=progress)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(summary.format_summary(info))
    return 0
