"""How far the simulator's old chunk charge is from the measured prefix_prefill kernel (CPU, from committed H200 data).

The old charge (Simulator chunk_attention="equivalent") times a chunk of c tokens after p cached tokens as a fresh
causal prefill of n tokens with as many (query, key) pairs (chunk_equivalent_len), at the packaged dataset's fastest
prefill_attention config. This compares it with prefix_prefill measured on the H200: (a) the benchmark cases
(the best of 25 configs each, benchmarks/h200_prefix/h200_prefix.json) and (b) the dataset rows collected over
Mixtral's prefix grid (the best of the 7 configs sampled per shape: fewer configs, so these measured times are upper
bounds of the kernel's best). Writes the JSON given by --out and prints a table; ratio = stand-in / measured.

    python3 benchmarks/h200_prefix/run_standin_error.py --out benchmarks/h200_prefix/standin_error.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kernel_gym.kernels.workloads import PREFILL_TOTALS, PrefillWorkload, workload_from_key  # noqa: E402
from kernel_gym.measure import make_backend  # noqa: E402
from kernel_gym.traffic.simulator import chunk_equivalent_len  # noqa: E402

DIR = Path(__file__).resolve().parent  # the study folder


def stand_in_ms(backend, w) -> float | None:
    lens = tuple(sorted((chunk_equivalent_len(c, p) for c, p in zip(w.chunk_lens, w.prefix_lens)), reverse=True))
    if not PREFILL_TOTALS[0] <= sum(lens) <= PREFILL_TOTALS[-1]:
        return None  # outside the prefill grid: the recorded backend cannot answer
    pw = PrefillWorkload(w.num_heads, w.num_kv_heads, w.head_dim, lens)
    times = [m.median_ms for c in backend.available_configs("prefill_attention", pw)
             if (m := backend.measure("prefill_attention", pw, c)).ok and m.median_ms]
    return min(times) if times else None


def row(backend, w, measured_ms: float, source: str) -> dict:
    eq = stand_in_ms(backend, w)
    return {"chunk_lens": list(w.chunk_lens), "prefix_lens": list(w.prefix_lens), "measured_ms": measured_ms,
            "stand_in_ms": eq, "ratio": eq / measured_ms if eq else None, "measured_from": source}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=DIR / "standin_error.json")
    args = p.parse_args(argv)
    backend = make_backend("recorded")
    rows = []
    for r in json.loads((DIR / "h200_prefix.json").read_text()):
        w = workload_from_key("prefix_prefill", json.dumps(r["workload"]))
        rows.append({"case": r["case"], **row(backend, w, r["ms"], "bench: best of 25 configs")})
    best: dict[str, float] = defaultdict(lambda: math.inf)
    with gzip.open(DIR / "prefix_prefill.jsonl.gz", "rt") as fh:
        for line in fh:
            rec = json.loads(line)
            if isinstance(rec, list) and rec[2] == "ok":
                best[rec[0]] = min(best[rec[0]], rec[3])
    for wkey, ms in sorted(best.items()):
        rows.append(row(backend, workload_from_key("prefix_prefill", wkey), ms, "dataset: best of 7 sampled configs"))
    out = {"rows": rows}
    for source in ("bench", "dataset"):
        ratios = [r["ratio"] for r in rows if r["ratio"] and r["measured_from"].startswith(source)]
        if ratios:
            out[source] = {"n": len(ratios), "median": statistics.median(ratios), "min": min(ratios),
                           "max": max(ratios)}
    args.out.write_text(json.dumps(out, indent=1))
    for r in rows:
        ratio = f"{r['ratio']:.2f}" if r["ratio"] else "outside the prefill grid"
        print(f"{r.get('case', ''):<28} {str(r['chunk_lens']):<22} {str(r['prefix_lens']):<28} "
              f"{r['measured_ms']:>8.4f} {r['stand_in_ms'] or float('nan'):>8.4f} {ratio}")
    print({k: v for k, v in out.items() if k != "rows"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
