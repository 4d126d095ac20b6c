"""The held-out trace's live runs beside the prediction committed before they were measured: per policy, the
preregistered prediction (heldout_trace/preregistered/<run>/predicted.json, `run.py --predict-policies` on the window
alone), the measured figures and the same run's `--predict` afterwards (predicted/<runs>/<run>/summary.json), with the
relative errors of both. The two predictions differ only where the tree changed between them; the first is the
out-of-sample figure. CPU only.

    python benchmarks/live_e2e/heldout_check.py benchmarks/live_e2e/predicted/heldout_<commit> [...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from benchmarks.live_e2e.run import METRICS, TARGETS  # noqa: E402

PREREGISTERED = HERE / "heldout_trace" / "preregistered"


def check(predicted_runs: Path, preregistered: Path = PREREGISTERED) -> dict:
    """{run: {policy: {measured, preregistered, predicted_after, error_preregistered, error_after}}} over the runs
    both folders hold; a policy the live run did not finish is listed with the reason and no error."""
    out: dict = {}
    for pre in sorted(preregistered.glob("*/predicted.json")):
        run = pre.parent.name
        summary = predicted_runs / run / "summary.json"
        if not summary.exists():
            continue
        before = json.loads(pre.read_text())
        after = json.loads(summary.read_text())
        if before["meta"]["window"] != after["meta"]["window"] or before["meta"]["trace"] != after["meta"]["trace"]:
            raise SystemExit(f"{pre} and {summary} are not the same window: {before['meta']['window']} "
                             f"{before['meta']['trace']} vs {after['meta']['window']} {after['meta']['trace']}")
        rows = {}
        for spec, row in after["policies"].items():
            pre_row = before["policies"].get(spec, {})
            if "predicted" not in pre_row:
                rows[spec] = {"skipped": "no preregistered prediction for this policy"}
                continue
            if row.get("measured_run_complete") is False or "measured" not in row:
                rows[spec] = {"skipped": "the live run did not finish this policy's window"}
                continue
            m = row["measured"]
            rows[spec] = {"measured": {k: m[k] for k in METRICS},
                          "preregistered": pre_row["predicted"], "predicted_after": row["predicted"],
                          "estimated_share": pre_row.get("estimated_share"),
                          "error_preregistered": {k: pre_row["predicted"][k] / m[k] - 1.0 for k in METRICS},
                          "error_after": {k: row["predicted"][k] / m[k] - 1.0 for k in METRICS},
                          "measured_compiles_timed": bool(row.get("measured_compiles_timed")),
                          # the GPU's clocks around the measured policy (its run's power.csv has them per second)
                          "gpu_before": row.get("gpu_before"), "gpu_after": row.get("gpu_after")}
        out[run] = {"model": after["meta"]["model"], "trace": after["meta"]["trace"],
                    "window": after["meta"]["window"], "preregistered_commit": before["prediction"].get("commit"),
                    "after_commit": after["prediction"].get("commit"), "policies": rows}
    if not out:
        raise SystemExit(f"no run in {predicted_runs} has a preregistered prediction in {preregistered}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("predicted_runs", type=Path, nargs="+",
                   help="the held-out runs' --predict summaries (predicted/heldout_X), one folder per session")
    p.add_argument("--json", type=Path, default=HERE / "heldout_check.json")
    p.add_argument("--preregistered", type=Path, default=PREREGISTERED,
                   help="the predictions committed before the runs, one folder per run (predicted.json)")
    args = p.parse_args(argv)
    got: dict = {}
    for folder in args.predicted_runs:  # each session's held-out runs; a run's name is its preregistered folder's
        got |= check(folder, args.preregistered)
    args.json.write_text(json.dumps(got, indent=1) + "\n")
    print(f"{'run':14s} {'policy':16s} " + " ".join(f"{k:>26s}" for k in METRICS) + "  (measured, error before /"
          " after the run)")
    for run, r in got.items():
        for spec, row in r["policies"].items():
            if "skipped" in row:
                print(f"{run:14s} {spec[:16]:16s} {row['skipped']}")
                continue
            cells = []
            for k in METRICS:
                a, b = row["error_preregistered"][k], row["error_after"][k]
                flag = "" if abs(a) <= TARGETS[k] else "*"
                cells.append(f"{row['measured'][k]:9.4g} {a:+7.1%}{flag:1s}/{b:+7.1%}")
            print(f"{run:14s} {spec[:16]:16s} " + " ".join(f"{c:>26s}" for c in cells))
    print(f"wrote {args.json} (* outside issue 29's target: tokens/s 5%, TTFT 10%, TPOT 5%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
