"""How far interpolation between measured shapes can go on today's data: for each held-out workload of the policy
quality split, the config that is best on its nearest training workloads below and above it along the primary axis
(among the configs measured at all three), scored like the policy (oracle time / its time at the held-out workload).

Why: a policy scored below the 0.97 target either learned badly or faces winners its training shapes do not show.
This baseline sees the training shapes' times in hindsight, so where it scores no better than the policy the gap is
in the data (a held-out shape's fastest config measured there and not at its neighbours), not in the learning.

    python benchmarks/policy_quality/neighbours.py                      # decode and prefill, both models, splits 0-2
    python benchmarks/policy_quality/neighbours.py --kernels decode_attention --models mixtral-8x7b --splits 0

Writes benchmarks/policy_quality/neighbours.json (--out) and prints one line per (kernel, model, split).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kernel_gym.measure import make_backend  # noqa: E402
from kernel_gym.train.measurement_plans import neighbours  # noqa: E402
from kernel_gym.train.train import prepare_data  # noqa: E402


def neighbours_best(train: list, heldout: list) -> list[dict]:
    """Per held-out reference: the config with the highest summed log ratio on its nearest training references
    below and above along the primary axis (measurement_plans.neighbours: what --neighbour-winners plans from)."""
    rows = []
    for h in heldout:
        near = neighbours(h.workload, train)
        options = [c for c in h.times if near and all(c in n.times for n in near)]
        if not options:
            continue
        pick = max(options, key=lambda c: sum(math.log(n.times[n.best_config] / n.times[c]) for n in near))
        rows.append({"workload": h.key, "pick": str(pick), "ratio": h.times[h.best_config] / h.times[pick],
                     "oracle": str(h.best_config), "oracle_at_neighbours": all(h.best_config in n.times for n in near)})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", default="decode_attention,prefill_attention")
    p.add_argument("--models", default="mixtral-8x7b,olmoe-1b-7b")
    p.add_argument("--splits", default="0,1,2", help="split seeds (0 is policy_quality/run.py's)")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "neighbours.json")
    args = p.parse_args(argv)
    backend = make_backend("recorded")
    results = []
    for kernel in args.kernels.split(","):
        for model in args.models.split(","):
            for split in (int(s) for s in args.splits.split(",")):
                data = prepare_data(kernel, backend, model, "grid", 0.25, split)
                rows = neighbours_best(data.train, data.heldout)
                geo = math.exp(sum(math.log(r["ratio"]) for r in rows) / len(rows))
                seen = sum(r["oracle_at_neighbours"] for r in rows)
                results.append({"kernel": kernel, "model": model, "split_seed": split, "heldout": len(rows),
                                "geomean": geo, "oracle_measured_at_neighbours": seen, "rows": rows})
                print(f"{kernel} {model} split {split}: neighbours' best {geo:.3f} over {len(rows)} held-out; "
                      f"the held-out winner measured at both neighbours for {seen}", flush=True)
    doc = {"command": "python benchmarks/policy_quality/neighbours.py " + " ".join(argv or sys.argv[1:]),
           "dataset_hash": str(getattr(backend, "dataset_hash", "") or "n/a"), "results": results}
    args.out.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
