"""CPU: where the prefill kernels' warps wait, from Nsight Compute's per-instruction stall sampling (SourceCounters)
of a session's ncu.tar.gz (prefetch_session.sh): per profiled kernel, the share of its warp samples on an instruction
that waits for a copy to land (the branch after a TMA barrier's try-wait, a shared-memory store of an LDG-loaded q
tile, the register move of a work-table entry), split by what it waits for; the share of padding warps idle at the
final join; and the top stall reasons.

    python benchmarks/short_prefill/stall_shares.py benchmarks/short_prefill/run11_prefetch/ncu.tar.gz

Which barrier is which comes from the Triton kernel's shared-memory map in its sm_90 code: the q tile's barrier at
offset 0x4000, the K ring's at 0xc000 / 0xc008, V's at 0xc010 / 0xc018 (other kernels' waits count as "other copy").
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import io
import json
import re
import sys
import tarfile
from pathlib import Path

BARRIERS = {0x4000: "q", 0xC000: "K", 0xC008: "K", 0xC010: "V", 0xC018: "V"}
SAMPLES = "Warp Stall Sampling (All Samples)"


def kernels(archive: Path) -> list[list[dict]]:
    """The per-instruction rows of each profiled kernel, in launch order (the csv of `ncu --page source --csv`; it
    lists FlashAttention-2's kernel twice, with the same rows: the repeat is dropped)."""
    with tarfile.open(archive) as tar:
        raw = tar.extractfile("ncu/short_prefill_source.csv.gz").read()
    text = gzip.decompress(raw).decode()
    out: list[list[dict]] = []
    for part in text.split('"Kernel Name"')[1:]:
        rows = list(csv.DictReader(io.StringIO("\n".join(part.splitlines()[1:]))))
        if not out or rows != out[-1]:
            out.append(rows)
    return out


def launches(archive: Path) -> list[dict]:
    """launched.json: what was profiled, in order (entries without a launch, refused or skipped, left out)."""
    with tarfile.open(archive) as tar:
        entries = json.load(tar.extractfile("ncu/launched.json"))
    return [e for e in entries if "error" not in e and "skipped" not in e]


def samples(row: dict, column: str = SAMPLES) -> int:
    """A row's count in one of the csv's sample columns (empty cells count 0)."""
    return int(row.get(column) or 0)


def copy_waits(rows: list[dict]) -> dict[str, float]:
    """Shares of the kernel's samples: waiting for q, K, V, the table, another copy; all of them; the top reasons."""
    total = sum(samples(r) for r in rows) or 1
    waits: collections.Counter = collections.Counter()
    counted: set[int] = set()
    for i, r in enumerate(rows):
        src = r["Source"].strip()
        m = re.search(r"TRYWAIT (P\d+), \[UR\d+\+(0x[0-9a-f]+)\]", src)
        if m:  # the wait, and the branch on its predicate a few instructions on, where the warp spins
            what = BARRIERS.get(int(m.group(2), 16), "other copy")
            waits[what] += samples(r)
            for j in range(i + 1, min(i + 8, len(rows))):
                if re.search(rf"@!{m.group(1)}\s+BRA", rows[j]["Source"]):
                    waits[what] += samples(rows[j])
                    counted.add(j)
                    break
        elif i not in counted and samples(r, "stall_long_sb") * 2 > samples(r):
            if "R2UR" in src:
                waits["table"] += samples(r)
            elif src.startswith("STS"):
                waits["q"] += samples(r)
    out = {k: waits[k] / total for k in ("q", "K", "V", "table", "other copy")}
    out["all"] = sum(out.values())
    reasons = collections.Counter({c[6:]: sum(samples(r, c) for r in rows) for c in rows[0]
                                   if c.startswith("stall_") and "Not Issued" not in c})
    out["top_reasons"] = {k: v / total for k, v in reasons.most_common(4)}
    return out


def idle_at_join(rows: list[dict]) -> float:
    """Share of the kernel's samples on warps parked at its final join: the NOP after `BAR.SYNC 0x1` where a
    warp-specialised CTA's padding warps (no partition of their own) wait from start to end, issuing nothing."""
    total = sum(samples(r) for r in rows) or 1
    return sum(samples(r) for prev, r in zip(rows, rows[1:])
               if r["Source"].strip() == "NOP" and "BAR.SYNC.DEFER_BLOCKING 0x1" in prev["Source"]) / total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("archive", type=Path, help="a session's ncu.tar.gz")
    args = p.parse_args(argv)
    for entry, rows in zip(launches(args.archive), kernels(args.archive)):
        s = copy_waits(rows)
        reasons = ", ".join(f"{k} {v:.0%}" for k, v in s["top_reasons"].items())
        print(f"{entry['case']:30s} {entry['what'][:60]:60s} q {s['q']:5.1%}  K {s['K']:5.1%}  "
              f"table {s['table']:4.1%}  all {s['all']:4.0%}  idle at join {idle_at_join(rows):5.1%}  ({reasons})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
