"""Where the simulator's price of a live step goes wrong, by kind of step, size and the GPU's SM clock at the time.

For each run folder (a window of `retrained/`), every policy's measured steps priced as `run.py --predict` prices
them (`priced_steps` plus the measured host overhead per kind of step), each step placed on the wall clock (the
policy's end, from measured.json's `ended_at` or else the console line the live run prints when it finishes, less
the measured seconds of the steps after it: the replay jumps idle gaps at once) and matched to the nearest sample of
the session's `power.csv` (nvidia-smi once a second: SM clock, throttle reasons). The ratio measured / price is
summarised for decode-only steps and steps with prefill chunks, at full clock (>= 1,975 MHz) and below it (the
software power cap), and the steps with chunks by token count. The matching is good to about a second: enough to
tell steps in long capped stretches from those at full clock, not single steps.

    python benchmarks/live_e2e/retrained/clock_check.py      # every window under retrained/: clock_check.json, a table
    python benchmarks/live_e2e/retrained/clock_check.py retrained/run3_seed0_43be02e/window4 ...
"""

from __future__ import annotations

import datetime
import json
import re
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from benchmarks.live_e2e import run  # noqa: E402

FULL_CLOCK_MHZ = 1975.0
SIZE_BINS = (0, 256, 512, 1024, 2048, 4096)
CALIBRATION = str(HERE.parent / "graphs" / "window1" / "summary.json")


def power_samples(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(seconds of the day, SM clock in MHz) per line of an nvidia-smi CSV log."""
    ts, mhz = [], []
    for line in path.read_text().splitlines()[1:]:
        f = [x.strip() for x in line.split(",")]
        try:
            ts.append(seconds_of_day(f[0]))
            mhz.append(float(f[1].split()[0]))
        except (ValueError, IndexError):
            continue
    return np.array(ts), np.array(mhz)


def seconds_of_day(stamp: str) -> float:
    t = datetime.datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f")
    return t.hour * 3600 + t.minute * 60 + t.second + t.microsecond / 1e6


def policy_ends(log: Path) -> dict[str, float]:
    """The second of the day each policy finished, from the live run's console ("[live_e2e HH:MM:SS] SPEC: ...")."""
    ends = {}
    for line in log.read_text(errors="replace").splitlines():
        m = re.match(r"\[live_e2e (\d+):(\d+):(\d+)\] (.+?): [0-9.]+ tok/s", line)
        if m:
            h, mi, s = (int(x) for x in m.groups()[:3])
            ends[m.group(4)] = h * 3600 + mi * 60 + s
    return ends


def ratio_summary(rows: np.ndarray) -> dict:
    """rows: (measured s, price s) -> steps, the median of measured / price, and the summed error of the price."""
    if not len(rows):
        return {"steps": 0}
    return {"steps": int(len(rows)), "median_measured_over_price": float(np.median(rows[:, 0] / rows[:, 1])),
            "sum_error": float(rows[:, 1].sum() / rows[:, 0].sum() - 1.0)}


def check_window(folder: Path) -> dict:
    args = run.build_parser().parse_args(["--out", str(folder), "--predict", "--calibration-from", CALIBRATION])
    data, meta, model, trace, backend, timer, _ = run.predict_setup(args)
    overheads = getattr(args, "step_host_s", None) or dict.fromkeys(run.STEP_KINDS, run.STEP_OVERHEAD_S)
    clock_t, clock_mhz = power_samples(folder.parent / "power.csv")
    # the policy's end: measured.json's `ended_at` (runs since session 48's last), else the console line it printed
    log = folder.parent / f"{folder.name}.log"
    ends = {spec: seconds_of_day(m["ended_at"]) for spec, m in data["measured"].items() if m.get("ended_at")}
    ends = ends if len(ends) == len(data["measured"]) else policy_ends(log)
    out = {}
    for spec in data["measured"]:
        priced = run.priced_steps(folder, spec, model, trace, timer, backend, args, meta)
        steps = run.read_steps(folder, spec) or []
        # the replay jumps idle gaps at once, so a step's wall time is the policy's end less the seconds of the steps
        # after it (the host's bookkeeping between steps and a step's rare untimed first run are left out)
        after = np.cumsum([r["seconds"] for r in steps][::-1])[::-1] - np.array([r["seconds"] for r in steps])
        rows = []
        for (kind, has_chunks, seconds, price, *_), r, left in zip(priced, steps, after):
            i = int(np.argmin(np.abs(clock_t - (ends[spec] - left - seconds / 2))))
            rows.append((has_chunks, seconds, price + overheads[kind], clock_mhz[i], r["tokens"],
                         r["gpu_s"] / seconds if r.get("gpu_s") else np.nan))
        a = np.array(rows, dtype=float)
        entry = {}
        for name, group in (("decode_only", a[:, 0] == 0), ("with_prefill", a[:, 0] == 1)):
            full = group & (a[:, 3] >= FULL_CLOCK_MHZ)
            entry[name] = {"all": ratio_summary(a[group][:, 1:3]),
                           "full_clock": ratio_summary(a[full][:, 1:3]),
                           "below_full_clock": {**ratio_summary(a[group & ~full][:, 1:3]),
                                                "mean_sm_mhz": float(a[group & ~full][:, 3].mean())
                                                if (group & ~full).any() else None},
                           "gpu_span_share_median": float(np.nanmedian(a[group][:, 5])) if group.any() else None}
        chunks = a[a[:, 0] == 1]
        entry["with_prefill_by_tokens"] = {
            f"{lo + 1}-{hi}": ratio_summary(chunks[(chunks[:, 4] > lo) & (chunks[:, 4] <= hi)][:, 1:3])
            for lo, hi in zip(SIZE_BINS, SIZE_BINS[1:])}
        out[spec] = entry
    return out


def main(argv: list[str]) -> int:
    folders = [Path(f) for f in argv] or sorted(p.parent for p in HERE.glob("run*/window*/measured.json"))
    result = {"what": __doc__.splitlines()[0], "full_clock_mhz": FULL_CLOCK_MHZ, "runs": {}}
    print(f"{'run / policy':<58} {'decode full':>11} {'decode cap':>10} {'chunks full':>11} {'chunks cap':>10}")
    for folder in folders:
        name = folder.resolve().relative_to(HERE.parent).as_posix()  # any run folder under live_e2e/
        result["runs"][name] = check_window(folder)
        for spec, e in result["runs"][name].items():
            cells = [e[g][c].get("median_measured_over_price", float("nan"))
                     for g in ("decode_only", "with_prefill") for c in ("full_clock", "below_full_clock")]
            print(f"{(name + ' ' + spec.split('/')[-2] if '/' in spec else name + ' ' + spec):<58} "
                  + " ".join(f"{x:>10.3f}" for x in cells))
    if not argv:
        (HERE / "clock_check.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
