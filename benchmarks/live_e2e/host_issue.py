"""How much of the live check's TTFT error is the host: the host's issue time of eager steps, run by run, and the
prediction again with each run's own issue time in place of the calibration run's.

`run.py --predict` charges an eager step no less than the host's issue time per layer x layers (`--eager-issue`,
fitted once on window5_f269e69/olmoe_w5's host-bound eager steps and held for every run). This reads every committed
live run whose step records carry `issue_s` (tree f269e69 on): per policy, its timed eager steps with prefill chunks,
how many were host-bound (issue time >= 0.95 of the step: the GPU waited on the host) and their median issue time per
layer. Then, for the runs named by --repredict, it predicts each again with `--eager-issue` set to the run itself and
sets TTFT / TPOT / tokens/s errors beside those of `predicted/<run>/summary.json` (predict_all.sh's). The second
prediction uses the measured run it is checked against: a diagnostic of where the error comes from, not a
prediction. CPU only, from committed runs.

    python benchmarks/live_e2e/host_issue.py                  # host_issue.json beside this file (~6 minutes, 2 cores)
    python benchmarks/live_e2e/host_issue.py --repredict none # the issue times only (~1 minute)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.live_e2e import run as le  # noqa: E402

REPREDICT = ("window6_01d3818/olmoe_w6", "window5_f269e69/olmoe_prof", "olmoe_rep_6331459/olmoe_rep_300")
CALIBRATION = HERE / "predicted" / "graphs" / "window1" / "summary.json"
METRICS = ("ttft_p50_s", "tpot_p50_s", "tokens_per_s")


def issue_times(folder: Path) -> dict:
    """Per policy of one live run: timed eager steps with chunks, the host-bound ones and their median issue time
    per layer (ms), the issue time the policy measured before its replay (where it did), and the machine it ran on
    (the host CPU where the run recorded it, the GPU's state before and after the policy). {} when the run's records
    carry no issue time."""
    data = json.loads((folder / "measured.json").read_text())
    meta = data.get("meta", {})
    layers = (le.TINY if meta.get("smoke") else le.load_model(meta["model"])).num_layers
    out = {}
    for spec in data["measured"]:
        steps = [r for r in le.read_steps(folder, spec) or [] if not r["ran_untimed_first"] and le.eager_issued(r)]
        if not steps:
            continue
        bound = [r["issue_s"] / layers * 1e3 for r in steps if le.host_bound(r)]
        out[spec] = {"model": meta.get("model", "smoke"), "eager_chunk_steps": len(steps), "host_bound": len(bound),
                     "issue_ms_per_layer_median": float(np.median(bound)) if bound else None,
                     "issue_ms_per_layer_p10_p90": [float(np.percentile(bound, q)) for q in (10, 90)] if bound
                     else None,
                     # the issue time the policy measured before its replay (run.py's calibrate_issue, session 54 on)
                     "calibration_before_replay": data["measured"][spec].get("host_issue_calibration"),
                     "host": meta.get("host"), "gpu_before": data["measured"][spec].get("gpu_before"),
                     "gpu_after": data["measured"][spec].get("gpu_after")}
    return out


def errors(summary: dict) -> dict:
    return {spec: {k: row["predicted"][k] / row["measured"][k] - 1.0 for k in METRICS}
            for spec, row in summary["policies"].items()}


def repredict(run: str, tmp: Path) -> dict:
    """run.py --predict of one run with its own eager issue time; the errors before (predicted/) and with it."""
    folder = HERE / run
    cmd = [sys.executable, str(HERE / "run.py"), "--out", str(folder), "--predict", "--eager-issue", str(folder),
           "--summary-dir", str(tmp / run), "--calibration-from", str(CALIBRATION)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    before = errors(json.loads((HERE / "predicted" / run / "summary.json").read_text()))
    own = errors(json.loads((tmp / run / "summary.json").read_text()))
    return {spec: {"calibration_run_issue": before[spec], "own_issue": own[spec]} for spec in before}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=HERE / "host_issue.json")
    p.add_argument("--repredict", default=",".join(REPREDICT),
                   help="runs (under benchmarks/live_e2e/) to predict again with their own issue time; none: skip")
    args = p.parse_args(argv)
    t0 = time.time()
    from kernel_gym.train.tracking import git_commit

    calibration = le.measured_eager_issue(le.EAGER_ISSUE_RUNS)
    out: dict = {"what": "host issue time of eager steps per live run, and the prediction with each run's own",
                 "commit": git_commit(), "host_bound_rule": f"issue_s >= {le.HOST_BOUND_SHARE} x step seconds",
                 "calibration": {"runs": [str(r.relative_to(ROOT)) for r in le.EAGER_ISSUE_RUNS],
                                 "issue_ms_per_layer": calibration["per_layer_s"] * 1e3,
                                 "steps": calibration["steps"]},
                 "runs": {}, "repredicted": {}}
    for measured in sorted(HERE.glob("**/measured.json")):
        folder = measured.parent
        if "predicted" in folder.parts or json.loads(measured.read_text()).get("meta", {}).get("smoke"):
            continue
        got = issue_times(folder)
        if got:
            out["runs"][str(folder.relative_to(HERE))] = got
    print(f"host issue per layer, host-bound eager steps with chunks (calibration "
          f"{out['calibration']['issue_ms_per_layer']:.3f} ms, {calibration['steps']} steps):", file=sys.stderr)
    for run, per in out["runs"].items():
        for spec, r in per.items():
            med = r["issue_ms_per_layer_median"]
            cal = (r["calibration_before_replay"] or {}).get("per_layer_s")
            print(f"  {run:42s} {spec[:14]:14s} {r['host_bound']:4d} of {r['eager_chunk_steps']:4d} host-bound"
                  + (f", {med:.3f} ms per layer" if med is not None else "")
                  + (f" (measured before the replay: {cal * 1e3:.3f})" if cal else ""), file=sys.stderr)
    runs = [r for r in args.repredict.split(",") if r and r != "none"]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(2) as pool:
        for run, got in zip(runs, pool.map(lambda r: repredict(r, Path(tmp)), runs)):
            out["repredicted"][run] = got
            for spec, e in got.items():
                a, b = e["calibration_run_issue"], e["own_issue"]
                print(f"  {run:42s} {spec[:14]:14s} TTFT p50 {a['ttft_p50_s']:+.1%} -> {b['ttft_p50_s']:+.1%} with "
                      f"its own issue time (TPOT {a['tpot_p50_s']:+.1%} -> {b['tpot_p50_s']:+.1%})", file=sys.stderr)
    out["seconds"] = round(time.time() - t0, 1)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out} in {out['seconds']} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
