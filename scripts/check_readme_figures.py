"""Check that the figures in README.md, docs/ and the benchmarks index (benchmarks/README.md) reproduce with the
command or committed results file next to them.

Each checked figure names the file, a pattern of the text that holds it (one number, the group `v`), the command that
produces it, and a tolerance. CPU figures are recomputed by running that command; GPU figures are checked only
against their committed results JSON (the figure must equal what the JSON says, to its printed precision).

    python scripts/check_readme_figures.py            # the cheap figures (CI: scripts/test.sh; about a minute)
    python scripts/check_readme_figures.py --all      # also the expensive CPU ones (training: ~30 min on 2 cores;
                                                      # Serving-v0 needs the Azure trace in KERNEL_GYM_TRACES)
    python scripts/check_readme_figures.py --list     # the checked figures, without running anything

Exits 1 when a figure does not match, 2 when a file no longer holds a figure's text (the text moved: update FIGURES).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


@dataclass(frozen=True)
class Figure:
    """One figure: `pattern` (a regex with one group `v`, the number) must match `file` once; `source` names the
    command or committed JSON that produces it; `value` computes it; |printed - value| <= tolerance passes."""

    name: str
    file: str
    pattern: str
    source: str
    value: Callable[[], float]
    tolerance: float = 0.0
    tier: str = "ci"  # ci: cheap commands; json: a committed results file; gpu: a committed H200 results file;
    # all: expensive CPU commands, only with --all (scripts/test.sh runs ci, json and gpu)


def run(cmd: list[str], what: str) -> str:
    """Run a command from the repository root, with progress on stderr; its stdout."""
    t0 = time.time()
    print(f"[figures] running {what} ...", file=sys.stderr, flush=True)
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"{what} failed (rc {res.returncode}): {res.stderr.strip()[-400:]}")
    print(f"[figures] {what}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    return res.stdout


@lru_cache(maxsize=None)
def data_summary() -> dict[str, Any]:
    return json.loads(run([PY, "-m", "kernel_gym.cli", "data", "--json", "--counts"], "kernel-gym data --json"))


@lru_cache(maxsize=None)
def zoo_count() -> int:
    out = run([PY, "-c", "from kernel_gym import zoo; print(len(zoo.ZOO))"], "len(kernel_gym.zoo.ZOO)")
    return int(out.strip())


@lru_cache(maxsize=None)
def serving_v0() -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix="figures-serving-"))
    run([PY, "benchmarks/serving/run.py", "--timesteps", "400", "--rate-scale", "1.0", "--interval-s", "20.0",
         "--num-intervals", "10", "--windows", "3", "--n-steps", "50", "--threads", "2", "--seed", "0",
         "--out-dir", str(out), "--no-mlflow"], "benchmarks/serving/run.py (Serving-v0)")
    return json.loads((out / "serving_v0.json").read_text())


@lru_cache(maxsize=None)
def policy_quality(env: str) -> dict[str, Any]:
    """One env of benchmarks/policy_quality/run.py (both built-in models, 30k steps each: ~2-6 min per model on 2
    cores)."""
    out = Path(tempfile.mkdtemp(prefix="figures-policies-"))
    run([PY, "benchmarks/policy_quality/run.py", "--envs", env, "--out", str(out),
         "--tracking-uri", f"sqlite:///{out / 'mlflow.db'}"], f"benchmarks/policy_quality/run.py --envs {env}")
    return json.loads((out / "policy_quality.json").read_text())


def policy_geomean(env: str, model: str, rerun: bool = True) -> float:
    """The held-out geomean of (env, model): from a rerun, or (rerun=False) from benchmarks/policy_quality.json."""
    rows = (policy_quality(env) if rerun else committed("benchmarks/policy_quality.json"))["results"]
    return next(r["geomean_policy"] for r in rows
                if r["env_id"] == env and r["model"] == model and r.get("seed", 0) == 0)


@lru_cache(maxsize=None)
def committed(path: str) -> dict[str, Any]:
    return json.loads((ROOT / path).read_text())


def plan_ratio(load_kind: str, key: str) -> float:
    """The serving plan's geomean ratio over one load's profiles with a nonzero baseline (its run.py's markdown)."""
    vals = [q["ratios"][key] for q in committed(PLAN)["profiles"]
            if q["load_kind"] == load_kind and q["ratios"].get(key)]
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def prefill_ratio(pick: Callable[[dict[str, Any]], bool], agg: Callable[..., float] = max) -> float:
    """best / SDPA of the short-prefill run's records that pick selects (agg over them)."""
    return agg(r["ratio_to_anchor"] for r in committed(SHORT_PREFILL) if pick(r))


def pack_ratio(key: str, agg: Callable[..., float]) -> float:
    """best / SDPA without (pack0_ratio) or with (pack1_ratio) PACK_GQA at the four short prefill cases."""
    return agg(r[key] for r in committed(PACK) if r["case"].startswith("prefill_") and
               ("n512" in r["case"] or "n128" in r["case"]))


def prefill_record(pick: Callable[[str], bool], agg: Callable[..., float]) -> float:
    """best / SDPA of the prefill records in benchmarks/h200_kernels.json whose case name `pick` selects."""
    return agg(r["ratio_to_anchor"] for r in committed(KERNELS) if r["kernel"] == "prefill_attention"
               and pick(r["case"]))


def knob_gain(path: str, tokens: str, agg: Callable[..., float]) -> float:
    """The knob's speedup over the same tiles without it (twin_speedup) in a knob_ab.py compare.json, at the prefill
    cases whose name holds `tokens` (n512, n128; "" for all)."""
    return agg(r["twin_speedup"] for r in committed(path) if tokens in r["case"])


def torch_decode(key: str, batches: tuple[int, ...], agg: Callable[..., float]) -> float:
    """torch's fastest decode variant beside ours (flush_mode.json's `torch`), over both flush modes at the batches
    given: key "kernel_speedup" (torch's time / ours) or "ratio_to_floor"."""
    return agg(r[m]["torch"][key] for r in committed(TORCH_DECODE)["decode"] if r["batch"] in batches
               for m in ("write", "clean"))


def _profiled_rows(case: str, what: str) -> list[dict]:
    """The run11 profile's per-instruction rows of the kernel `what` (its launch label's first word) at `case`."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.short_prefill import stall_shares

    archive = ROOT / STALLS
    for entry, rows in zip(stall_shares.launches(archive), stall_shares.kernels(archive)):
        if entry["case"] == case and entry["what"].split()[0] == what:
            return rows
    raise ValueError(f"no {what} kernel at {case} in {STALLS}")


def junit_count(path: str, what: str) -> float:
    """A count ("tests", "failures", "errors", "skipped") of the pytest junit XML report at `path` (gzipped)."""
    import gzip

    suite = re.search(r"<testsuite [^>]*>", gzip.open(ROOT / path, "rt").read()).group(0)
    return float(re.search(rf'{what}="([0-9]+)"', suite).group(1))


def copy_wait_share(case: str, what: str) -> float:
    """stall_shares.py on the run11 profile: the share (percent) of the kernel `what` at `case` waiting on copies."""
    from benchmarks.short_prefill import stall_shares

    rows = _profiled_rows(case, what)
    return 100 * stall_shares.copy_waits(rows)["all"]


def idle_warp_share(case: str, what: str) -> float:
    """stall_shares.py on the run11 profile: the share (percent) of samples on padding warps idle at the join."""
    from benchmarks.short_prefill import stall_shares

    rows = _profiled_rows(case, what)
    return 100 * stall_shares.idle_at_join(rows)


def lookahead_ratio(num: str, den: str, agg: Callable[..., float]) -> float:
    """At the four short prefill cases of the lookahead run: time of `den`'s best / time of `num`'s best (`num` and
    `den`: "anchor", or a compare.json group such as "lookahead" and "persistent")."""
    def ms(r: dict[str, Any], key: str) -> float:
        return r["anchor_ms"] if key == "anchor" else r[key]["ms"]

    return agg(ms(r, num) / ms(r, den) for r in committed(LOOKAHEAD) if "n512" in r["case"] or "n128" in r["case"])


def at(path: str, *keys: str, scale: float = 1.0) -> Callable[[], float]:
    """The number at keys in a committed JSON file (times scale: 100 for a share printed in %)."""

    def get() -> float:
        v: Any = committed(path)
        for k in keys:
            v = v[k]
        return scale * float(v)

    return get


def figure_at(text: str, i: int) -> str:
    """A pattern of `text`, whose {} stand for printed numbers: the i-th is the figure (the group v)."""
    return text.format(*[N if k == i else r"[0-9.]+" for k in range(text.count("{}"))])


def floor_ratio(pick: Callable[[list[float]], float], path: str = "", batches: tuple[int, int] = (1, 1 << 30),
                key: str = "ratio_to_floor") -> float:
    """The lowest or highest best / floor ratio of a decode-floor run (run 1 by default), over workloads whose batch
    lies in `batches` (inclusive); key="copy_ms" gives the same-size copy's time / floor instead."""
    rows = [r for r in committed(path or FLOOR)["rows"] if batches[0] <= r["batch"] <= batches[1]]
    return pick([r[key] / r["floor_ms"] if key == "copy_ms" else r[key] for r in rows])


def floor4_figures(label: str, where: str, patterns: tuple[str, ...]) -> list:
    """The decode-floor run 4 figures as `where` words them: the lowest and highest best / floor at batch 1-4, the
    same-size copy / floor there, and best / floor at batch 16-64, in that order of `patterns`."""
    picks = (("batch 1-4 lowest", min, (1, 4), "ratio_to_floor"), ("batch 1-4 highest", max, (1, 4), "ratio_to_floor"),
             ("copy lowest", min, (1, 4), "copy_ms"), ("copy highest", max, (1, 4), "copy_ms"),
             ("batch 16-64 lowest", min, (16, 64), "ratio_to_floor"),
             ("batch 16-64 highest", max, (16, 64), "ratio_to_floor"))
    return [Figure(f"{label}decode floor run 4 {name}", where, pattern, FLOOR4,
                   (lambda pick=pick, batches=batches, key=key: floor_ratio(pick, FLOOR4, batches, key)), 0.005, "gpu")
            for pattern, (name, pick, batches, key) in zip(patterns, picks, strict=True)]


def flush_figures(where: str, patterns: tuple[str, ...]) -> list:
    """The flush-mode run's figures as `where` words them: best / floor at batch 1-4 after a clean L2 flush (lowest,
    highest), after the dataset's write flush (lowest, highest), and how many of the 9 are within the target clean."""
    def ratios(mode: str) -> list[float]:
        return [r[mode]["ratio_to_floor"] for r in committed(FLUSH)["decode"] if r["batch"] <= 4]

    values = ((lambda: min(ratios("clean"))), (lambda: max(ratios("clean"))), (lambda: min(ratios("write"))),
              (lambda: max(ratios("write"))), (lambda: float(sum(x <= 1.25 for x in ratios("clean")))))
    names = ("clean lowest", "clean highest", "write lowest", "write highest", "clean within 1.25")
    return [Figure(f"decode floor, flush modes: {name} ({where})", where, pattern, FLUSH, value, 0.005, "gpu")
            for pattern, name, value in zip(patterns, names, values)]  # the first len(patterns)


def flush_gain(pick: Callable[[list[float]], float], as_ratio: bool) -> float:
    """The flush-mode run's best decode time at batch 1-16, clean against write: microseconds taken off, or the
    ratio clean / write (pick: min or max)."""
    rows = committed(FLUSH)["decode"]
    if as_ratio:
        return pick([r["clean"]["best_ms"] / r["write"]["best_ms"] for r in rows])
    return pick([(r["write"]["best_ms"] - r["clean"]["best_ms"]) * 1e3 for r in rows])


def export_speedups() -> tuple[float, float]:
    """(lowest speedup of the exported file over the shipped one, keys) over every shape and routing of the export
    benchmark."""
    speedups = [r["speedup"] for m in committed(EXPORT)["models"].values() for r in m["rows"]]
    return min(speedups), float(len(speedups))


def replay_wall(backend: str, chooser: str) -> float:
    """The replay's wall seconds of one backend and chooser in the replay-speed benchmark."""
    runs = committed(SPEED_REPLAY)["runs"]
    return next(r["replay_wall_s"] for r in runs if (r["backend"], r["chooser"]) == (backend, chooser))


REPLAY_RUNS = ("azure-conv_mixtral-8x7b", "azure-code_mixtral-8x7b", "azure-conv_olmoe-1b-7b", "azure-code_olmoe-1b-7b")


def replay_run(run: str) -> dict[str, Any]:
    """One run of the replay benchmark (benchmarks/replay/run.py), its committed JSON."""
    return committed(f"benchmarks/replay/{run}_zipf1.2.json")


def replay_same_traffic(run: str) -> float:
    """The oracle's same-traffic tuned-kernel seconds / the learned policy's in one replay run."""
    p = replay_run(run)["policies"]
    return p["oracle"]["tuned_kernel_s_same_traffic"] / p["learned"]["tuned_kernel_s_same_traffic"]


def replay_targets(count_met: bool) -> float:
    """The replay benchmark's targets over its four runs (summary.md's rows): met ones, or all."""
    sys.path.insert(0, str(ROOT))
    from kernel_gym.evaluate.replay_report import target_checks

    checks = [c for run in REPLAY_RUNS for c in target_checks(replay_run(run))]
    return float(sum(c["met"] for c in checks) if count_met else len(checks))


def noisy_rows(families: tuple[str, ...]) -> float:
    return float(sum(data_summary()["kernels"][k]["ok_noisy"] for k in families))


THREE = ("decode_attention", "fused_moe", "prefill_attention")
GEN = "benchmarks/generalisation.json"
LIVE = "benchmarks/live_e2e/summary.json"
GRAPHS = "benchmarks/live_e2e/graphs/window1/summary.json"
CHECK = "kernel_gym/data/live_check.json"
# sessions 54-58's check (before untimed decode choices were priced from a sibling, session 59)
SIBLING_BEFORE = "benchmarks/live_e2e/live_check_before_sibling.json"
LEARNED = "table:benchmarks/live_replay/inputs/dispatch_table.json"
W5 = "benchmarks/live_e2e/window5_f269e69/window5/summary.json"
W6 = "benchmarks/live_e2e/window6_01d3818/window6/summary.json"
RETRAINED = "benchmarks/live_e2e/retrained/compare.json"  # retrained/compare.py: the retrained tables live
CLOCKS = "benchmarks/live_e2e/retrained/clock_check.json"  # retrained/clock_check.py: step prices by SM clock
GAP = "benchmarks/live_e2e/tables/gap.json"  # table_gap.py: dispatch tables against the dataset's fastest configs
PROF5 = "benchmarks/live_e2e/eager_ab2db7d/window1_prof5/measured.json"  # eager_session.sh's profiled window 1
ROUTING = "benchmarks/live_e2e/chunk_routing.json"  # chunk_routing.py: the live stack's routing of a chunk (CPU)
BEFORE = "benchmarks/decode_waves/live_check_before.json"  # session 49's live check (before the decode wave model)
WAVES_CHECK = "benchmarks/live_e2e/live_check_before_chunk_tables.json"  # sessions 50-51's (before the chunk tables)
HOST_ISSUE = "benchmarks/live_e2e/host_issue.json"  # host_issue.py: eager steps' host issue time per live run
CHUNK_CHECK = "benchmarks/live_e2e/chunk_tables_check.json"  # compare_checks.py: before / with the chunk tables
SIBLING_CHECK = "benchmarks/live_e2e/sibling_fix_check.json"  # compare_checks.py: session 59's sibling price
SIBLING_PRICES = "benchmarks/live_e2e/sibling_check.json"  # sibling_check.py on the H200 decode graph tables
DECODE_GRAPH_CHECK = "benchmarks/live_e2e/decode_graph_check.json"  # compare_checks.py: session 54's decode table
HELDOUT = "benchmarks/live_e2e/heldout_check.json"  # heldout_check.py: the held-out trace's runs, predicted first
CAL_ONLY = "benchmarks/live_e2e/heldout_bffac01/calibration_only/heldout_check.json"  # the host calibration alone
DISPATCH_ORDER = "benchmarks/live_e2e/dispatch_order.json"  # dispatch_order.py: steps served a call-order config
LEARNED_SEED0 = "table:benchmarks/live_e2e/tables/mixtral_seed0/dispatch_table.json"
PAIRS = "benchmarks/live_e2e/graph_profile_h100_dd2acd0/profiles.json"  # band_check.py --profiles: graph vs eager
BANDS = "benchmarks/live_e2e/band_check.json"  # band_check.py --profiled ...window1_spans: decode price by batch band
HELDOUT_TRACE = "benchmarks/live_e2e/heldout_trace/AzureLLMInferenceTrace_code_first10min.csv"
SAME_GPU = "benchmarks/live_e2e/same_gpu_h100_298d0ec/band_check_same_gpu.json"  # one H100's tables vs its replay
SAME_GPU_RAGGED = "benchmarks/live_e2e/same_gpu_h100_298d0ec/band_check_same_gpu_ragged.json"  # ... --ragged
SAME_GPU_S56 = "benchmarks/live_e2e/same_gpu_h100_298d0ec/band_check_session56_run_ragged.json"  # session 56's run
RAGGED = "benchmarks/live_e2e/ragged_h100_6b74fdc/{}/ragged_decode.json"  # ragged_decode.py on an H100
SAME_GPU_W5 = "benchmarks/live_e2e/same_gpu_h100_8868229/band_check_same_gpu.json"  # session 58: window 5, 9-64 seqs
SAME_GPU_W5_RAGGED = "benchmarks/live_e2e/same_gpu_h100_8868229/band_check_same_gpu_ragged.json"  # ... --ragged


def profiled_ratio(path: str, policy: str, band: str, part: str) -> Callable[[], float]:
    """A band_check.py --profiled file's price / replayed kernels of one part (or "dense_and_moe") in one band."""
    def get() -> float:
        cell = committed(path)["profiled"]["policies"][policy][band]
        c = cell["dense_and_moe"] if part == "dense_and_moe" else cell["parts"][part]
        return c["priced_ms"] / c["measured_ms"]
    return get


def ragged_ratio(model: str, batch: int, case: str) -> Callable[[], float]:
    """ragged_decode.py: one case's time over the long sequence alone (batch 1), the default config."""
    def get() -> float:
        rows = next(iter(committed(RAGGED.format(model))["configs"].values()))
        one = next(r["ms"] for r in rows if r["batch"] == 1)
        return next(r["ms"] for r in rows if r["batch"] == batch and r["case"] == case) / one
    return get


def host_ttft(run: str, which: str) -> Callable[[], float]:
    """host_issue.json: minus the vllm-table's TTFT p50 error (%) of one run (the docs print the sign), priced with the
    calibration run's host issue time or with its own."""
    return lambda: -100 * committed(HOST_ISSUE)["repredicted"][run]["vllm-table"][which]["ttft_p50_s"]
FITS = "benchmarks/decode_waves/fits.json"  # decode_waves/fits.py: the wave model over the dataset's decode configs
PROFILED = "benchmarks/decode_waves/profile_check.json"  # decode_waves/profile_check.py: price / profiled kernel time
WAVES_REPLAY = ("benchmarks/decode_waves/replay/off.json", "benchmarks/decode_waves/replay/on.json")


def _group_total(path: str, side: str, metric: str) -> Callable[[], float]:
    """A compare_checks.py file's runs within `metric`'s target on one side ("before" / "after"), over every group."""
    return lambda: float(sum(g[side][metric]["within"] for g in committed(path)["by_group"].values()))


def chunk_check_total(metric: str) -> Callable[[], float]:
    return _group_total(CHUNK_CHECK, "after", metric)


def decode_graph_total(metric: str, side: str) -> Callable[[], float]:
    return _group_total(DECODE_GRAPH_CHECK, side, metric)


def within(path: str, metric: str, limit: float) -> Callable[[], float]:
    """How many policy runs of a live check (run.py --live-check) the simulator predicted within `limit`."""
    return lambda: float(sum(abs(r[metric]) <= limit for r in committed(path)["rows"]))


def waves_replay_shift() -> float:
    """The largest relative move of tokens/s, TTFT p50 or TPOT p50 the wave model makes on the README's replay (%)."""
    off, on = (committed(p)["policies"] for p in WAVES_REPLAY)
    return 100 * max(abs(on[n][k] / off[n][k] - 1) for n in off for k in ("tokens_per_s", "ttft_p50_s", "tpot_p50_s"))


def chunk_balance(model: str, tokens: str) -> float:
    """The mean over layers of the busiest-expert balance of a chunk of `tokens` (chunk_routing.py)."""
    b = committed(ROUTING)["models"][model][tokens]["balance"]
    return sum(b) / len(b)


def step_ms(path: str, policy: str, kind: str) -> Callable[[], float]:
    """Mean measured milliseconds per step of one kind (decode_only / with_prefill) in a live run's step_check."""
    return lambda: 1e3 * (c := committed(path)["step_check"][policy][kind])["measured_s"] / c["steps"]


def clock_ratio(group: str, clock: str, learned: bool, agg: Callable[..., float]) -> float:
    """agg over the retrained runs' policies (the retrained tables', or the vllm-table's) of the median measured / price
    of one kind of step at full clock or under it (clock_check.py)."""
    return agg(e[group][clock]["median_measured_over_price"] for run in committed(CLOCKS)["runs"].values()
               for spec, e in run.items() if (spec != "vllm-table") == learned)


def gap_at_chunks(agg: Callable[..., float]) -> float:
    """agg of the live runs' table's fused-MoE gap at uniform routing over 256-4096 tokens (table_gap.py)."""
    by = committed(GAP)["tables"][LEARNED[len("table:"):]]["fused_moe"]["skew0_by_tokens"]
    return agg(v for m, v in by.items() if 256 <= int(m) <= 6144)
ZS = ("zero_shot", "kernel")
# The benchmarks index (benchmarks/README.md) and the results files its figures come from.
BENCH = "benchmarks/README.md"
KERNELS = "benchmarks/h200_kernels.json"
STANDIN = "benchmarks/h200_prefix/standin_error.json"
FLOOR = "benchmarks/decode_floor/decode_floor.json"
FLOOR4 = "benchmarks/decode_floor/run4_preload/decode_floor.json"
FLUSH = "benchmarks/flush_mode/run1_cf0ac05/flush_mode.json"
LOMO = "benchmarks/generalisation/lomo_recorded.json"
LOO = "benchmarks/generalisation/design_loo.json"
EXPORT = "benchmarks/vllm_export.json"
LOOKUP = "benchmarks/engine_lookup/vllm-0.33.0.json"
SPEED_LOOKUP = "benchmarks/recorded_lookup_speed.json"
SPEED_REPLAY = "benchmarks/serving/replay_speed.json"
LIVE_TRAIN = "benchmarks/h200_run3/live_moe.json"
SERVING = "benchmarks/serving/serving_v0.json"
CYCLE = "benchmarks/cycle.json"
PLAN = "benchmarks/serving_plan.json"
FAULTS = "benchmarks/generalisation/run3/fault_injection.json"
SHORT_PREFILL = "benchmarks/short_prefill/run2_bb6853d/prefill.json"
PACK = "benchmarks/short_prefill/run3_pack/compare.json"
RESIDENT = "benchmarks/short_prefill/run6_persistent/compare.json"
LAZY = "benchmarks/short_prefill/run7_lazy/compare.json"
LOOKAHEAD = "benchmarks/short_prefill/run8_lookahead/compare.json"
REGCAP = "benchmarks/short_prefill/run10_maxnreg/compare.json"
PREFETCH = "benchmarks/short_prefill/run11_prefetch/compare.json"
STALLS = "benchmarks/short_prefill/run11_prefetch/ncu.tar.gz"
TORCH_DECODE = "benchmarks/flush_mode/run2_torch_decode/flush_mode.json"
SHAPES = "benchmarks/shape_generality/shape_generality_junit.xml.gz"
# Texts of the index holding several figures: {} are the figures' places, in order.
STATS = ("median", "min", "max")
STANDIN_TEXT = r"7 bench cases: median {} \(min {}, max {}\)"
GEN_TEXT = r"zero-shot MoE geomean {} \(p5 {}\), decode {} \(p5 {}\); the second far split {} \(p5 {}\)"
LOMO_TEXT = r"\| MoE {} \(p5 {}\), decode {} \(p5 {}\);"
PQ_TEXT = r"MoE {} / {}, decode {} / {}, prefill {} / {} \(mixtral / olmoe\)"
REPLAY_RATIO_TEXT = r"same traffic {} / {} of the oracle's for mixtral \(conv / code\), {} / {} for olmoe"
REPLAY_SHARE_TEXT = (r"Estimated share of tuned-kernel time: learned {}% / {}% \(mixtral conv / code\), {}% / {}% "
                     r"\(olmoe\); oracle {}% / {}%, {}% / {}%")
NEIGHBOURS = "benchmarks/policy_quality/neighbours.json"  # policy_quality/neighbours.py: interpolation's reach
N = r"(?P<v>[0-9][0-9,]*(?:\.[0-9]+)?)"  # a number as printed: 142,156 or 0.976

FIGURES = [
    # ---- CPU, cheap: the dataset and the zoo (CI) ----
    Figure("dataset rows", "README.md", rf"recorded dataset \| {N} measurements", "kernel-gym data --json: rows",
           lambda: float(data_summary()["rows"])),
    Figure("dataset ok rows", "README.md", rf"measurements \({N} ok\)", "kernel-gym data --json: ok_rows",
           lambda: float(data_summary()["ok_rows"])),
    Figure("noisy ok rows, three families", "README.md", rf"{N} ok rows of the three kernel families too noisy",
           "kernel-gym data --json: ok_noisy of the three families", lambda: noisy_rows(THREE)),
    Figure("noisy ok rows, vllm_fused_moe", "README.md", rf"{N} of `vllm_fused_moe`\), `kernel-gym data --counts`",
           "kernel-gym data --json: ok_noisy of vllm_fused_moe", lambda: noisy_rows(("vllm_fused_moe",))),
    Figure("vllm_fused_moe rows", "README.md", rf"{N} `vllm_fused_moe` rows, [0-9,]+ rows of", "kernel-gym data --json",
           lambda: float(data_summary()["kernels"]["vllm_fused_moe"]["rows"])),
    Figure("kernel families with rows", "README.md", rf"measurements \([0-9,]+ ok\) on {N} kernel families",
           "kernel-gym data --json: kernels", lambda: float(len(data_summary()["kernels"]))),
    Figure("prefix_prefill rows", "README.md", rf"{N} `prefix_prefill` rows at [0-9]+ chunk/prefix shapes",
           "kernel-gym data --json: kernels.prefix_prefill.rows",
           lambda: float(data_summary()["kernels"]["prefix_prefill"]["rows"])),
    Figure("prefix_prefill shapes", "README.md", rf"`prefix_prefill` rows at {N} chunk/prefix shapes",
           "kernel-gym data --json: kernels.prefix_prefill.shapes",
           lambda: float(data_summary()["kernels"]["prefix_prefill"]["shapes"])),
    Figure("noisy ok rows, prefix_prefill", "README.md", rf"`benchmarks/h200_prefix/`; {N} of them too\s+noisy",
           "kernel-gym data --json: ok_noisy of prefix_prefill", lambda: noisy_rows(("prefix_prefill",))),
    Figure("zoo models with rows", "README.md", rf"with rows at the shapes of {N} of the [0-9]+ zoo architectures",
           "kernel-gym data --json: zoo_models_with_rows", lambda: float(len(data_summary()["zoo_models_with_rows"]))),
    Figure("zoo size (dataset row)", "README.md", rf"at the shapes of [0-9]+ of the {N} zoo architectures",
           "len(kernel_gym.zoo.ZOO)", lambda: float(zoo_count())),
    Figure("dataset rows (architecture)", "docs/architecture.md", rf"h200_measurements\.jsonl\.gz`, {N} rows",
           "kernel-gym data --json: rows", lambda: float(data_summary()["rows"])),
    Figure("other zoo models with rows", "docs/architecture.md",
           rf"built-in models in full, the\s+shapes of {N} other zoo",
           "kernel-gym data --json: zoo_models_with_rows, less the 2 built-ins",
           lambda: float(len(data_summary()["zoo_models_with_rows"]) - 2)),
    Figure("zoo size (README)", "README.md", rf"any of the {N} architectures in `kernel_gym/zoo.py`",
           "len(kernel_gym.zoo.ZOO)", lambda: float(zoo_count())),
    Figure("zoo size (generalisation)", "docs/generalisation.md", rf"`kernel_gym/zoo.py` lists {N} published",
           "len(kernel_gym.zoo.ZOO)", lambda: float(zoo_count())),
    # ---- CPU, expensive (--all): training runs ----
    *[Figure(f"learned {label}, {model}{' (committed JSON)' if tier == 'json' else ''}", "README.md",
             rf"geomean vs the best measured config: {pre}"
             + (rf"{N} /" if model == "mixtral-8x7b" else rf"[0-9.]+ / {N}"),
             f"python benchmarks/policy_quality/run.py --envs {env}" if tier == "all"
             else "benchmarks/policy_quality.json",
             (lambda env=env, model=model, tier=tier: policy_geomean(env, model, tier == "all")), 0.0005, tier)
      for tier in ("all", "json")
      for label, env, pre in (("MoE", "KernelGym/MoE-v0", "MoE "),
                              ("decode", "KernelGym/DecodeAttention-v0", r"MoE [0-9.]+ / [0-9.]+, decode "),
                              ("prefill", "KernelGym/PrefillAttention-v0",
                               r"MoE [0-9.]+ / [0-9.]+, decode [0-9.]+ / [0-9.]+, prefill "))
      for model in ("mixtral-8x7b", "olmoe-1b-7b")],
    Figure("learned prefix prefill, mixtral-8x7b (committed JSON)", "README.md",
           rf"chunked prefill\s+over a paged prefix {N} \(mixtral", "benchmarks/policy_quality.json",
           lambda: policy_geomean("KernelGym/PrefixPrefill-v0", "mixtral-8x7b", False), 0.0005, "json"),
    Figure("learned decode, mixtral-8x7b, lowest of three seeds", "README.md", rf"decode {N}-[0-9.]+ / 0.974",
           "benchmarks/policy_quality.json",
           lambda: min(r["geomean_policy"] for r in committed("benchmarks/policy_quality.json")["results"]
                       if r["env_id"] == "KernelGym/DecodeAttention-v0" and r["model"] == "mixtral-8x7b"),
           0.0005, "json"),
    Figure("neighbours' best, prefill mixtral split 0", "README.md", rf"hindsight, scores {N} on Mixtral's split 0",
           NEIGHBOURS, lambda: next(r["geomean"] for r in committed(NEIGHBOURS)["results"]
                                    if r["kernel"] == "prefill_attention" and r["model"] == "mixtral-8x7b"
                                    and r["split_seed"] == 0), 0.0005, "json"),
    Figure("Serving-v0 agent estimated share", "README.md", rf"Estimated share of\s+tuned-kernel time: agent {N}%",
           "python benchmarks/serving/run.py (benchmarks/serving/serving_v0.md's command)",
           lambda: 100 * serving_v0()["agent_estimated_share"], 0.05, "all"),
    Figure("Serving-v0 agent fallback calls", "README.md", rf"its {N} calls whose rule named a config without a time",
           "python benchmarks/serving/run.py (benchmarks/serving/serving_v0.md's command)",
           lambda: float(serving_v0()["agent_fallbacks"]), 0.0, "all"),
    Figure("Serving-v0 default estimated share", "README.md", rf"oracle [0-9.]+%, default {N}% \(mostly interpolated",
           "python benchmarks/serving/run.py (benchmarks/serving/serving_v0.md's command)",
           lambda: 100 * serving_v0()["default_estimated_share"], 0.05, "all"),
    *[Figure(f"Serving-v0 {who} estimated share (committed JSON)", "README.md", pattern,
             "benchmarks/serving/serving_v0.json", at("benchmarks/serving/serving_v0.json", f"{who}_estimated_share",
                                                      scale=100.0), 0.05, "json")
      for who, pattern in (("agent", rf"Estimated share of\s+tuned-kernel time: agent {N}%"),
                           ("oracle", rf"tuned-kernel time: agent [0-9.]+%, oracle {N}%"))],
    Figure("Serving-v0 oracle estimated share", "README.md", rf"tuned-kernel time: agent [0-9.]+%, oracle {N}%",
           "python benchmarks/serving/run.py (benchmarks/serving/serving_v0.md's command)",
           lambda: 100 * serving_v0()["oracle_estimated_share"], 0.05, "all"),
    # ---- GPU: equal to the committed JSON, to the printed precision ----
    Figure("zero-shot MoE geomean", "README.md", rf"zipf-1\.2\): geomean \*\*{N}\*\*", GEN,
           at(GEN, *ZS, "fused_moe", "geomean"), 0.0005, "gpu"),
    Figure("zero-shot MoE p5", "README.md", rf"zipf-1\.2\): geomean \*\*[0-9.]+\*\*, 5th percentile {N}", GEN,
           at(GEN, *ZS, "fused_moe", "p5"), 0.0005, "gpu"),
    Figure("zero-shot decode geomean", "README.md", rf"GLM-4\.5-Air\): geomean \*\*{N}\*\*", GEN,
           at(GEN, *ZS, "decode_attention", "geomean"), 0.0005, "gpu"),
    Figure("zero-shot decode p5", "README.md", rf"GLM-4\.5-Air\): geomean \*\*[0-9.]+\*\*, 5th percentile {N}",
           GEN, at(GEN, *ZS, "decode_attention", "p5"), 0.0005, "gpu"),
    Figure("zero-shot default MoE", "README.md", rf"Default configs: {N} /", GEN,
           at(GEN, *ZS, "fused_moe", "default_geomean"), 0.005, "gpu"),
    Figure("zero-shot default decode", "README.md", rf"Default configs: [0-9.]+ / {N}\.", GEN,
           at(GEN, *ZS, "decode_attention", "default_geomean"), 0.005, "gpu"),
    Figure("tune's selection MoE", "README.md", rf"scored on the same live sweeps \| {N} \(MoE", GEN,
           at(GEN, "tuned", "fused_moe", "geomean"), 0.0005, "gpu"),
    Figure("tune's selection MoE p5", "README.md", rf"\(MoE, p5 {N};", GEN,
           at(GEN, "tuned", "fused_moe", "p5"), 0.0005, "gpu"),
    Figure("tune's selection decode", "README.md", rf"and {N} \(decode, p5", GEN,
           at(GEN, "tuned", "decode_attention", "geomean"), 0.0005, "gpu"),
    Figure("tune's selection decode p5", "README.md", rf"\(decode, p5 {N}\)", GEN,
           at(GEN, "tuned", "decode_attention", "p5"), 0.0005, "gpu"),
    Figure("leave-one-model-out MoE", "README.md", rf"1 seed\): {N}, worst", GEN,
           at(GEN, "leave_one_model_out_live", "fused_moe", "geomean"), 0.0005, "gpu"),
    Figure("leave-one-model-out MoE worst", "README.md", rf"1 seed\): [0-9.]+, worst {N}", GEN,
           at(GEN, "leave_one_model_out_live", "fused_moe", "p5"), 0.0005, "gpu"),
    Figure("far test zero-shot MoE", "README.md", rf"zero-shot geomean {N}, p5 [0-9.]+ \(targets", GEN,
           at(GEN, "far_test", "fused_moe", "geomean"), 0.0005, "gpu"),
    Figure("far test zero-shot MoE p5", "README.md", rf"zero-shot geomean [0-9.]+, p5 {N} \(targets", GEN,
           at(GEN, "far_test", "fused_moe", "p5"), 0.0005, "gpu"),
    Figure("far test tune's search", "README.md", rf"round\): \*\*{N}\*\*", GEN,
           at(GEN, "far_test", "fused_moe", "tuned", "geomean"), 0.0005, "gpu"),
    Figure("far test tune's search p5", "README.md", rf"round\): \*\*[0-9.]+\*\*, p5 {N}", GEN,
           at(GEN, "far_test", "fused_moe", "tuned", "p5"), 0.0005, "gpu"),
    Figure("far test vs vLLM's kernel, tune", "docs/generalisation.md", rf"tune's pick {N}x \(worst cell 0.856x\)", GEN,
           at(GEN, "far_test", "fused_moe", "vs_engine", "tuned_geomean"), 0.0005, "gpu"),
    Figure("far2 zero-shot (re-ranked)", "README.md", rf"`export --policy-dir` answers\) \*\*{N}\*\*", GEN,
           at(GEN, "far2_test", "fused_moe", "geomean"), 0.0005, "gpu"),
    Figure("far2 zero-shot p5", "README.md", rf"answers\) \*\*[0-9.]+\*\*, p5 \*\*{N}\*\*", GEN,
           at(GEN, "far2_test", "fused_moe", "p5"), 0.0005, "gpu"),
    Figure("far2 policy argmax", "README.md", rf"the policy's argmax alone {N} / ", GEN,
           at(GEN, "far2_test", "fused_moe", "policy_argmax", "geomean"), 0.0005, "gpu"),
    Figure("far2 tune's search", "README.md", rf"local round\) \*\*{N}\*\*, p5", GEN,
           at(GEN, "far2_test", "fused_moe", "tuned", "geomean"), 0.0005, "gpu"),
    Figure("far2 tune's search p5", "README.md", rf"local round\) \*\*[0-9.]+\*\*, p5 \*\*{N}\*\*", GEN,
           at(GEN, "far2_test", "fused_moe", "tuned", "p5"), 0.0005, "gpu"),
    Figure("far2 vs vLLM's kernel, tune", "docs/generalisation.md", rf"tune's pick {N}x \(worst cell 0.998x\)",
           GEN, at(GEN, "far2_test", "fused_moe", "vs_engine", "tuned_geomean"), 0.0005, "gpu"),
    # ---- the live end-to-end replay (benchmarks/live_e2e: measured on the H200, predicted by --predict) ----
    Figure("live e2e (graphs) learned TPOT p50, window 1 (ms)", "README.md", rf"TPOT p50 \*\*{N}\*\* / ", GRAPHS,
           at(GRAPHS, "policies", LEARNED, "measured", "tpot_p50_s", scale=1e3), 0.06, "gpu"),
    Figure("live e2e (graphs) vllm-table TPOT p50, window 1 (ms)", "README.md",
           rf"TPOT p50 \*\*[0-9.]+\*\* / {N} / ", GRAPHS,
           at(GRAPHS, "policies", "vllm-table", "measured", "tpot_p50_s", scale=1e3), 0.06, "gpu"),
    Figure("live e2e (graphs) learned TTFT p50, window 1 (ms)", "README.md", rf"ms, TTFT p50 {N} / ", GRAPHS,
           at(GRAPHS, "policies", LEARNED, "measured", "ttft_p50_s", scale=1e3), 0.06, "gpu"),
    Figure("live e2e (graphs) simulator throughput error, lowest (%)", "README.md",
           rf"graphed policy runs(?: \([^)]*\))?: throughput -{N}% to ", CHECK,
           lambda: -100 * committed(CHECK)["range"]["tokens_per_s"][0],
           0.06, "gpu"),
    Figure("live e2e (graphs) simulator TPOT error, highest (%)", "README.md",
           rf"TPOT -[0-9.]+% to \+{N}% \(within", CHECK, lambda: 100 * committed(CHECK)["range"]["tpot_p50_s"][1],
           0.06, "gpu"),
    Figure("live e2e learned TPOT calibrated error, window 1 (%)", "docs/live.md",
           rf"learned table \| 160.1 \| 117 \| 67.7 \| [^|]+\| [+-][0-9.]+% / [+-][0-9.]+% / -{N}%", LIVE,
           at(LIVE, "policies", LEARNED, "calibrated", "relative_error", "tpot_p50_s", scale=-100), 0.06, "gpu"),
    Figure("live e2e (graphs) simulator TTFT error, highest (%)", "README.md",
           rf"TTFT -[0-9.]+% to \+{N}% \(within", CHECK, lambda: 100 * committed(CHECK)["range"]["ttft_p50_s"][1],
           0.06, "gpu"),
    Figure("live e2e (graphs) runs within the TTFT target", "README.md", rf"\(within 10% on {N} of", CHECK,
           lambda: float(sum(abs(r["ttft_p50_s"]) <= 0.10 for r in committed(CHECK)["rows"])), 0.0, "gpu"),
    Figure("live e2e (graphs) runs within the TPOT target", "README.md", rf"\(within 5% on {N} of", CHECK,
           lambda: float(sum(abs(r["tpot_p50_s"]) <= 0.05 for r in committed(CHECK)["rows"])), 0.0, "gpu"),
    Figure("live e2e (graphs) policy runs in the check", "README.md", rf"over {N} graphed policy runs", CHECK,
           lambda: float(len(committed(CHECK)["rows"])), 0.0, "gpu"),
    Figure("live check at a glance: runs within the tokens/s target", "docs/live.md",
           rf"\| all \| 80 \| \*\*{N}\*\* \|", CHECK,
           lambda: float(sum(abs(r["tokens_per_s"]) <= 0.05 for r in committed(CHECK)["rows"])), 0.0, "gpu"),
    Figure("live check at a glance: runs within the TTFT target", "docs/live.md",
           rf"\| all \| 80 \| \*\*[0-9]+\*\* \| \*\*{N}\*\* \|", CHECK,
           lambda: float(sum(abs(r["ttft_p50_s"]) <= 0.10 for r in committed(CHECK)["rows"])), 0.0, "gpu"),
    Figure("live check at a glance: runs within the TPOT target", "docs/live.md",
           rf"\| all \| 80 \| \*\*[0-9]+\*\* \| \*\*[0-9]+\*\* \| \*\*{N}\*\* \|", CHECK,
           lambda: float(sum(abs(r["tpot_p50_s"]) <= 0.05 for r in committed(CHECK)["rows"])), 0.0, "gpu"),
    Figure("live check at a glance: OLMoE vllm-table's lowest TTFT error (%)", "docs/live.md",
           rf"TTFT -12.8% to -{N}% \(host issue time\)", CHECK,
           lambda: -100 * min(r["ttft_p50_s"] for r in committed(CHECK)["rows"]
                              if r["model"] == "olmoe-1b-7b" and r["policy"] == "vllm-table"), 0.06, "gpu"),
    Figure("live check at a glance: Mixtral learned tables' highest TPOT error (%)", "docs/live.md",
           rf"TPOT \+[0-9.]+% to \+{N}% on 6 runs: three are window 1", CHECK,
           lambda: 100 * max(r["tpot_p50_s"] for r in committed(CHECK)["rows"]
                             if r["model"] == "mixtral-8x7b" and r["policy"].startswith("table:")), 0.6, "gpu"),
    Figure("live check at a glance: Mixtral learned tables' lowest TPOT miss (%)", "docs/live.md",
           rf"TPOT \+{N}% to \+[0-9.]+% on 6 runs: three are window 1", CHECK,
           lambda: 100 * min(r["tpot_p50_s"] for r in committed(CHECK)["rows"]
                             if r["model"] == "mixtral-8x7b" and r["policy"].startswith("table:")
                             and r["tpot_p50_s"] > 0.05), 0.06, "gpu"),
    Figure("retrained tables live: TPOT p50 / vllm-table's, geomean", "README.md", rf"TPOT p50 \*\*{N}x\*\* its in",
           RETRAINED, at(RETRAINED, "geomean_learned_over_vllm_table", "tpot_p50_s"), 0.0005, "gpu"),
    Figure("retrained tables live: window runs with lower TPOT", "README.md", rf"command \(lower in {N} of 10;",
           RETRAINED, at(RETRAINED, "tpot_better"), 0.0, "gpu"),
    Figure("retrained tables live: TTFT p50 / vllm-table's, geomean", "README.md",
           rf"and 8\), TTFT p50 {N}x, tokens/s", RETRAINED, at(RETRAINED, "geomean_learned_over_vllm_table",
                                                                "ttft_p50_s"), 0.0005, "gpu"),
    Figure("retrained tables live: chunk steps at full clock, highest measured / price", "docs/live.md",
           rf"1.075-1.113 / 1.097-{N} \|", CLOCKS, lambda: clock_ratio("with_prefill", "full_clock", True, max),
           0.0005, "gpu"),
    Figure("retrained tables live: decode steps under the cap, highest measured / price", "docs/live.md",
           rf"0.980-1.020 / 0.955-{N} \|", CLOCKS, lambda: clock_ratio("decode_only", "below_full_clock", True, max),
           0.0005, "gpu"),
    Figure("retrained tables live: TPOT ratio in the docs", "docs/live.md",
           rf"retrained tables' TPOT p50 is {N}x the vllm-table's", RETRAINED,
           at(RETRAINED, "geomean_learned_over_vllm_table", "tpot_p50_s"), 0.0005, "gpu"),
    Figure("live e2e window 3 vllm-table TPOT p50 (ms)", "README.md", rf"window 3, 594 requests: TPOT {N} / ",
           "benchmarks/live_e2e/graphs/window3_long/summary.json",
           at("benchmarks/live_e2e/graphs/window3_long/summary.json", "policies", "vllm-table", "measured",
              "tpot_p50_s", scale=1e3), 0.06, "gpu"),
    Figure("stale table: learned steps with chunks, window 5 (ms)", "docs/live.md",
           rf"steps with prefill chunks took {N} / ", W5, step_ms(W5, LEARNED, "with_prefill"), 0.06, "gpu"),
    Figure("stale table: learned steps with chunks, window 6 (ms)", "docs/live.md",
           rf"steps with prefill chunks took [0-9.]+ / {N} ms", W6, step_ms(W6, LEARNED, "with_prefill"), 0.06,
           "gpu"),
    Figure("stale table: vllm-table steps with chunks, window 5 (ms)", "docs/live.md",
           rf"against the vllm-table's {N} / ", W5, step_ms(W5, "vllm-table", "with_prefill"), 0.06, "gpu"),
    Figure("stale table: learned decode-only steps, window 5 (ms)", "docs/live.md",
           rf"decode-only steps tied \({N} / ", W5, step_ms(W5, LEARNED, "decode_only"), 0.06, "gpu"),
    Figure("stale table: old table's MoE geomean gap", "docs/live.md", rf"fused-MoE choices are {N}x the", GAP,
           at(GAP, "tables", LEARNED[len("table:"):], "fused_moe", "geomean"), 0.0005, "json"),
    Figure("stale table: old table's worst MoE gap at 256-4096 tokens", "README.md",
           rf"at 256-4096 tokens take 1.06-{N}x the measured best", GAP, lambda: gap_at_chunks(max), 0.005, "json"),
    Figure("stale table: old table's best MoE gap at 256-4096 tokens", "README.md",
           rf"at 256-4096 tokens take {N}-", GAP, lambda: gap_at_chunks(min), 0.005, "json"),
    Figure("live e2e profiled window 1 (session 49) TPOT p50 (ms)", "docs/live.md",
           rf"timed steps only\): 196.9 tok/s, TTFT p50 58.8 ms, TPOT p50 {N} ms", PROF5,
           at(PROF5, "measured", "vllm-table", "tpot_p50_s", scale=1e3), 0.006, "gpu"),
    Figure("chunk routing: Mixtral's mean balance at 512 tokens", "docs/live.md", rf"\| 512 \| {N} \(1.10\) \|",
           ROUTING, lambda: chunk_balance("mixtral-8x7b", "512"), 0.006, "json"),
    Figure("live check with the eager tables: runs within the TTFT target", "docs/live.md",
           rf"\| TTFT p50 within 10% \| 39 \| {N} \|", BEFORE, within(BEFORE, "ttft_p50_s", 0.10), 0.0, "gpu"),
    Figure("live check with the eager tables: runs within the TPOT target", "docs/live.md",
           rf"\| TPOT p50 within 5% \(within 10%\) \| 26 \(45\) \| {N} \(", BEFORE,
           within(BEFORE, "tpot_p50_s", 0.05), 0.0, "gpu"),
    Figure("decode waves: live check before, runs within 10% of TPOT", "docs/live.md",
           rf"\| TPOT p50 within 10% \(range\) \| {N} \(", BEFORE, within(BEFORE, "tpot_p50_s", 0.10), 0.0, "gpu"),
    Figure("decode waves: live check with the wave model, runs within 10% of TPOT", "docs/live.md",
           rf"\| TPOT p50 within 10% \(range\) \| [0-9]+ \([^)]*\) \| {N} \(", WAVES_CHECK,
           within(WAVES_CHECK, "tpot_p50_s", 0.10), 0.0, "gpu"),
    Figure("live check now, runs within 10% of TPOT (README)", "README.md",
           rf"within 10% on {N}; within 10% on 46 of the 65 runs", CHECK, within(CHECK, "tpot_p50_s", 0.10), 0.0,
           "gpu"),
    Figure("decode waves: live check with the wave model, runs within 10% of TTFT", "docs/live.md",
           rf"\| TTFT p50 within 10% \(range\) \| [0-9]+ \([^)]*\) \| {N} \(", WAVES_CHECK,
           within(WAVES_CHECK, "ttft_p50_s", 0.10), 0.0, "gpu"),
    *[Figure(f"live check without compiles timed (session 51): runs within the {metric} target", "docs/live.md",
             rf"\| {label} within {pct}% of measured \(range\) \| [0-9]+ \([^)]*\) \| {N} \(", WAVES_CHECK,
             (lambda metric=metric: float(committed(WAVES_CHECK)["without_compiles_timed"][metric]["within"])), 0.0,
             "gpu")
      for metric, label, pct in (("tokens_per_s", "tokens/s", 5), ("ttft_p50_s", "TTFT p50", 10),
                                 ("tpot_p50_s", "TPOT p50", 5))],
    Figure("decode waves: Mixtral-shape configs the model fits", "docs/live.md",
           rf"the model fits {N} of the 721 Mixtral-shape configs", FITS,
           at(FITS, "shapes", "32/8/128/bfloat16", "fitted"), 0.0, "json"),
    Figure("decode waves: held-out error on Mixtral-shape rows (%)", "docs/simulator.md",
           rf"the fit grid it is off by {N}% / ", FITS,
           at(FITS, "shapes", "32/8/128/bfloat16", "held_out_abs_error", "median", scale=100), 0.06, "json"),
    Figure("decode waves: default configs' decode price / profiled time", "docs/live.md",
           rf"\| window1_spans, default configs \| 59 \| 0.742 \| {N} \|", PROFILED,
           at(PROFILED, "runs", "graph_5ebaec4/window1_spans default", "on", "price_over_measured"), 0.0006, "json"),
    Figure("decode waves: largest move of the README's replay (%)", "docs/simulator.md",
           rf"It moves the README's replay by up to {N}%", WAVES_REPLAY[1], waves_replay_shift, 0.06, "json"),
    *[Figure(f"host issue: {run} vllm-table TTFT error, {which} (%)", "docs/live.md", pattern, HOST_ISSUE,
             host_ttft(run, which), 0.06, "json")
      for run, which, pattern in (
          ("window6_01d3818/olmoe_w6", "calibration_run_issue", rf"TTFT p50 error goes from -{N}% to\n-3.3% on"),
          ("window6_01d3818/olmoe_w6", "own_issue", rf"goes from -21.7% to\n-{N}% on `olmoe_w6`"),
          ("window5_f269e69/olmoe_prof", "calibration_run_issue", rf"and from -{N}% to -13.2% on `olmoe_prof`"),
          ("window5_f269e69/olmoe_prof", "own_issue", rf"and from -18.7% to -{N}% on `olmoe_prof`"))],
    *[Figure(f"host issue: code540_olmoe {spec} ms per layer, {what}", "docs/live.md", pattern, HOST_ISSUE,
             at(HOST_ISSUE, "runs", "heldout_bffac01/code540_olmoe", spec, *keys, scale=scale), 0.006, "json")
      for spec, what, keys, scale, pattern in (
          ("vllm-table", "replay", ("issue_ms_per_layer_median",), 1.0, rf"eager steps took {N} ms per layer"),
          ("default", "replay", ("issue_ms_per_layer_median",), 1.0, rf"\(vllm-table\) and {N} ms \(default\)"),
          ("vllm-table", "calibration", ("calibration_before_replay", "per_layer_s"), 1e3,
           rf"calibration \({N} ms per layer against the fitted 1.10\)"))],
    # session 55: decode configs that depended on earlier calls, and the mixed calibration on an H100 host
    *[Figure(f"dispatch order: {run} steps served another config", "docs/live.md", pattern, DISPATCH_ORDER,
             at(DISPATCH_ORDER, "runs", run, spec, "served_another_config"), 0.0, "json")
      for run, spec, pattern in (
          ("graphs/window1", "table:benchmarks/live_replay/inputs/dispatch_table.json", rf"\({N} of 1,332 in"),
          ("heldout_bffac01/code540_mixtral", LEARNED_SEED0, rf"; {N} of 427 in `heldout_bffac01"))],
    Figure("dispatch fix: held-out 540 s learned TPOT error (%)", "docs/live.md",
           rf"`heldout_bffac01/code540_mixtral`\n  \+12.0% → \+{N}%", SIBLING_BEFORE,
           lambda: 100 * next(r["tpot_p50_s"] for r in committed(SIBLING_BEFORE)["rows"]
                              if r["run"].endswith("heldout_bffac01/code540_mixtral") and r["policy"] == LEARNED_SEED0),
           0.06, "json"),
    *[Figure(f"host issue (H100): {run} vllm-table ms per layer, {what}", "docs/live.md", pattern, HOST_ISSUE,
             at(HOST_ISSUE, "runs", f"issue_h100_8588b1f/{run}", "vllm-table", *keys, scale=scale), 0.0006, "json")
      for run, what, keys, scale, pattern in (
          ("code540_olmoe", "replay", ("issue_ms_per_layer_median",), 1.0, rf"the replay took {N} and"),
          ("code_olmoe", "replay", ("issue_ms_per_layer_median",), 1.0, rf"the replay took [0-9.]+ and {N} ms per"),
          ("code540_olmoe", "mixed", ("calibration_before_replay", "per_layer_s"), 1e3,
           rf"mixed calibration measured {N} and"),
          ("code_olmoe", "mixed", ("calibration_before_replay", "per_layer_s"), 1e3,
           rf"mixed calibration measured [0-9.]+ and {N} \("))],
    Figure("host issue: olmoe_w6 vllm-table ms per layer", "docs/live.md", rf"{N} in `window6_01d3818/olmoe_w6`",
           HOST_ISSUE, at(HOST_ISSUE, "runs", "window6_01d3818/olmoe_w6", "vllm-table", "issue_ms_per_layer_median"),
           0.006, "json"),
    Figure("host issue: olmoe_prof vllm-table ms per layer", "docs/live.md",
           rf"and {N} in `window5_f269e69/olmoe_prof`",
           HOST_ISSUE, at(HOST_ISSUE, "runs", "window5_f269e69/olmoe_prof", "vllm-table", "issue_ms_per_layer_median"),
           0.006, "json"),
    *[Figure(f"chunk tables: {label} runs within the {metric} target, with them", "docs/live.md",
             rf"\| {label} \| [0-9]+ \| (?:[0-9]+ / [0-9]+ \| ){{{col}}}[0-9]+ / {N} \|", CHUNK_CHECK,
             at(CHUNK_CHECK, "by_group", group, "after", metric, "within"), 0.0, "json")
      for label, group in (("Mixtral, vllm-table", "mixtral-8x7b vllm-table"),
                           ("Mixtral, learned tables", "mixtral-8x7b learned table"),
                           ("OLMoE, default configs", "olmoe-1b-7b default"))
      for col, metric in ((1, "ttft_p50_s"), (2, "tpot_p50_s"))],
    # session 56: the decode-only price by decode batch band, and each part's price beside its profiled kernels
    *[Figure(f"decode bands: {group} {band} median error (%)", "docs/live.md", pattern, BANDS,
             lambda group=group, band=band: abs(100 * committed(BANDS)["groups"][group][band]["median"]), 0.06, "json")
      for group, band, pattern in (
          ("mixtral-8x7b default", "9-16", rf"\| Mixtral, default configs \(11 runs\) \| (?:[^|]+\| ){{3}}\*\*-{N}%"),
          ("mixtral-8x7b default", "25-32", rf"\*\*-{N}%\*\* \(-14.0..-7.3\) \|"),
          ("mixtral-8x7b vllm-table", "5-8", rf"\| Mixtral, vllm-table \(21 runs\) \| (?:[^|]+\| ){{2}}\+{N}% \|"),
          ("mixtral-8x7b learned table", "17-24", rf"\| \+{N}% \(\+0.8..\+41.4\) \|"))],
    *[Figure(f"index: decode bands, Mixtral default {band} median error (%)", "benchmarks/README.md",
             figure_at("steps at 9-32 sequences priced -{}% / -{}% / -{}% \\(median of 11 runs\\)", i), BANDS,
             lambda band=band: abs(100 * committed(BANDS)["groups"]["mixtral-8x7b default"][band]["median"]), 0.06,
             "json") for i, band in enumerate(("9-16", "17-24", "25-32"))],
    *[Figure(f"decode bands: window1_spans default fused MoE price / kernels at {band}", "docs/live.md", pattern,
             BANDS, lambda band=band: (lambda c: c["priced_ms"] / c["measured_ms"])(
                 committed(BANDS)["profiled"]["policies"]["default"][band]["parts"]["fused_moe"]), 0.006, "json")
      for band, pattern in (("9-16", rf"\| default: fused MoE \| (?:[^|]+\| ){{3}}\*\*{N}\*\*"),
                            ("17-24", rf"\| default: fused MoE \| (?:[^|]+\| ){{4}}\*\*{N}\*\*"))],
    *[Figure(f"graph profile (H100): dense ops span / durations, {which}", "docs/live.md", pattern, PAIRS,
             lambda pick=pick: pick(c["parts"]["dense"]["graph_span_ms"] / c["parts"]["dense"]["graph_ms"]
                                    for bands in committed(PAIRS)["policies"].values() for c in bands.values()),
             0.006, "json")
      for which, pick, pattern in (("lowest", min, rf"over its kernels' durations: dense ops {N}-"),
                                   ("highest", max, rf"durations: dense ops [0-9.]+-{N}, routing"))],
    # session 57: one H100's tables against its own replay, and the ragged decode launches
    *[Figure(f"same GPU: {policy} {part} at {band}", "docs/live.md", pattern, SAME_GPU,
             profiled_ratio(SAME_GPU, policy, band, part), 0.006, "json")
      for policy, part, band, pattern in (
          ("default", "decode_attention", "9-16", rf"\| default: decode attention \| (?:[^|]+\| ){{4}}\*\*{N}\*\*"),
          ("default", "decode_attention", "1", rf"\| default: decode attention \| {N} \(113\)"),
          ("default", "dense_and_moe", "1", rf"\| default: dense ops \+ MoE \| {N} \|"),
          ("vllm-table", "dense_and_moe", "9-16", rf"\| vllm-table: dense ops \+ MoE \| (?:[^|]+\| ){{4}}{N} \|"))],
    Figure("session 56's H100 run, ragged factor: default decode attention at 9-16", "docs/live.md",
           rf"0.78 without the factor, \*\*{N}\*\* with it", SAME_GPU_S56,
           profiled_ratio(SAME_GPU_S56, "default", "9-16", "decode_attention"), 0.006, "json"),
    Figure("same GPU, ragged factor: default decode attention at 9-16", "docs/live.md",
           rf"goes from 0.78 to \*\*{N}\*\*", SAME_GPU_RAGGED,
           profiled_ratio(SAME_GPU_RAGGED, "default", "9-16", "decode_attention"), 0.006, "json"),
    *[Figure(f"ragged launches: {model} {case} at {batch}", "docs/live.md", pattern, RAGGED.format(model),
             ragged_ratio(model, batch, case), 0.006, "json")
      for model, batch, case, pattern in (
          ("olmoe-1b-7b", 9, "padded", rf"\| OLMoE, `padded` \| (?:[^|]+\| ){{3}}{N} \|"),
          ("olmoe-1b-7b", 20, "padded", rf"\| OLMoE, `padded` \| (?:[^|]+\| ){{8}}{N} \|"),
          ("mixtral-8x7b", 10, "padded", rf"\| Mixtral, `padded` \| (?:[^|]+\| ){{4}}{N} \|"),
          ("mixtral-8x7b", 24, "long_first", rf"\| Mixtral, `padded` \| (?:[^|]+\| ){{9}}{N} \|"))],
    # session 58: the same on window 5 at 9-64 sequences, with the same machine's probe
    *[Figure(f"same GPU, window 5: default {part} at {band}{' (ragged)' if path == SAME_GPU_W5_RAGGED else ''}",
             "docs/live.md", pattern, path, profiled_ratio(path, "default", band, part), 0.006, "json")
      for path, part, band, pattern in (
          (SAME_GPU_W5, "decode_attention", "17-24", rf"\| decode attention \| (?:[^|]+\| ){{4}}{N} \|"),
          (SAME_GPU_W5_RAGGED, "decode_attention", "9-16",
           rf"\| decode attention, with this machine's ragged factor \| (?:[^|]+\| ){{3}}\*\*{N}\*\*"),
          (SAME_GPU_W5_RAGGED, "decode_attention", "17-24",
           rf"\| decode attention, with this machine's ragged factor \| (?:[^|]+\| ){{4}}\*\*{N}\*\*"),
          (SAME_GPU_W5_RAGGED, "decode_attention", "25-32",
           rf"\| decode attention, with this machine's ragged factor \| (?:[^|]+\| ){{5}}\*\*{N}\*\*"),
          (SAME_GPU_W5, "dense_and_moe", "17-24", rf"\| dense ops \+ MoE \| (?:[^|]+\| ){{4}}{N} \|"))],
    # the held-out trace's table: each measured figure's error against the prediction committed before the run
    *[Figure(f"held-out trace: {label} {metric} error (%)", "docs/live.md",
             rf"\| {label} \| (?:[^|]+\| ){{{col}}}[0-9.,]+ m?s? ?\([+-]{N}%\)", HELDOUT,
             lambda run=run, spec=spec, metric=metric: abs(100 * committed(HELDOUT)[run]["policies"][spec]
                                                          ["error_preregistered"][metric]), 0.06, "json")
      for label, run, spec in (("Mixtral, vllm-table", "code_mixtral", "vllm-table"),
                               ("Mixtral, learned table \\(seed 0\\)", "code_mixtral",
                                "table:benchmarks/live_e2e/tables/mixtral_seed0/dispatch_table.json"),
                               ("Mixtral, default configs", "code_mixtral", "default"),
                               ("OLMoE x1.5, default configs", "code_olmoe", "default"),
                               ("OLMoE x1.5, vllm-table", "code_olmoe", "vllm-table"))
      for col, metric in ((0, "tokens_per_s"), (1, "ttft_p50_s"), (2, "tpot_p50_s"))],
    # the second window (session 54): the preregistered error, and after the arrow today's --predict's of the run
    *[Figure(f"held-out 540 s: {label} {metric} error{' after' if after else ''} (%)", "docs/live.md",
             rf"\| 540 s: {label} \| (?:[^|]+\| ){{{col}}}[0-9.,]+ m?s? ?\("
             + (rf"[+-][0-9.]+% → [+-]{N}%\)" if after else rf"[+-]{N}%"), HELDOUT,
             lambda run=run, spec=spec, metric=metric, after=after: abs(100 * committed(HELDOUT)[run]["policies"][spec]
                                                                ["error_after" if after else "error_preregistered"]
                                                                [metric]), 0.06, "json")
      for label, run, spec in (
          ("Mixtral, vllm-table", "code540_mixtral", "vllm-table"),
          ("Mixtral, learned table \\(seed 0\\)", "code540_mixtral",
           "table:benchmarks/live_e2e/tables/mixtral_seed0/dispatch_table.json"),
          ("Mixtral, default configs", "code540_mixtral", "default"),
          ("OLMoE, default configs", "code540_olmoe", "default"),
          ("OLMoE, vllm-table", "code540_olmoe", "vllm-table"))
      for col, metric in ((0, "tokens_per_s"), (1, "ttft_p50_s"), (2, "tpot_p50_s"))
      for after in (False, True)],
    # the second window's OLMoE with the host calibration alone (--decode-graph none: calibration_only/)
    *[Figure(f"held-out 540 s, calibration alone: OLMoE {spec} {metric} error (%)", where, pattern, CAL_ONLY,
             lambda spec=spec, metric=metric: abs(100 * committed(CAL_ONLY)["code540_olmoe"]["policies"][spec]
                                                  ["error_after"][metric]), 0.06, "json")
      for where, spec, metric, pattern in (
          ("docs/live.md", "vllm-table", "ttft_p50_s", rf"the TTFT error\s+halves\s+\(-28.6% → -{N}%\)"),
          ("docs/live.md", "vllm-table", "tpot_p50_s", rf"TPOT comes within target\s+\(-8.4% → -{N}%\)"),
          ("docs/live.md", "default", "ttft_p50_s", rf"TTFT went from -11.6% to -{N}%"),
          ("docs/live.md", "default", "tpot_p50_s", rf"TPOT from\s+-7.7% to -{N}%"))],
    Figure("held-out trace: runs within the TTFT target", "docs/live.md", rf"- Held-out trace: [0-9]+, {N} and",
           SIBLING_BEFORE,
           lambda: float(committed(SIBLING_BEFORE)["by_trace"][HELDOUT_TRACE]["ttft_p50_s"]["within"]), 0.0, "gpu"),
    # the 65 runs session 52's check covered, with the chunk tables (its comparison's "after", summed over groups)
    Figure("chunk tables: runs within the TTFT target then", "docs/live.md",
           rf"\| all \| 65 \| 65 / 65 \| 44 / {N} \|", CHUNK_CHECK, chunk_check_total("ttft_p50_s"), 0.0, "json"),
    Figure("chunk tables: runs within the TPOT target then", "docs/live.md",
           rf"\| all \| 65 \| 65 / 65 \| 44 / [0-9]+ \| 30 / {N} \|", CHUNK_CHECK, chunk_check_total("tpot_p50_s"),
           0.0, "json"),
    # session 54's comparison: every run predicted with the decode graph table, against the check without it
    *[Figure(f"decode graph default: all runs within the {metric} target, {side}", "docs/live.md",
             rf"\| all \| 75 \| (?:[0-9]+ → [0-9]+ \| ){{{col}}}" + (rf"{N} → [0-9]+ \|" if side == "before" else
                                                                     rf"[0-9]+ → {N} \|"), DECODE_GRAPH_CHECK,
             decode_graph_total(metric, side), 0.0, "json")
      for col, metric in ((0, "tokens_per_s"), (1, "ttft_p50_s"), (2, "tpot_p50_s")) for side in ("before", "after")],
    # session 59's comparison: untimed decode choices priced from their nearest timed sibling
    *[Figure(f"sibling price: all runs within the {metric} target, {side}", "docs/live.md",
             rf"\| all policy runs \| 75 \| (?:[0-9]+ → [0-9]+ \| ){{{col}}}"
             + (rf"{N} → [0-9]+ \|" if side == "before" else rf"[0-9]+ → {N} \|"), SIBLING_CHECK,
             _group_total(SIBLING_CHECK, side, metric), 0.0, "json")
      for col, metric in ((0, "tokens_per_s"), (1, "ttft_p50_s"), (2, "tpot_p50_s")) for side in ("before", "after")],
    *[Figure(f"sibling check: sibling price / own time, {which} median", "docs/live.md", pattern, SIBLING_PRICES,
             lambda pick=pick: pick(r["sibling_price_over_measured"]["median"]
                                    for r in committed(SIBLING_PRICES)["models"]["mixtral-8x7b"]), 0.006, "json")
      for which, pick, pattern in (("lowest", min, rf"The sibling's price is {N}-[0-9.]+x"),
                                   ("highest", max, rf"The sibling's price is [0-9.]+-{N}x"))],
    # ---- benchmarks/README.md, the index: each study's headline figure, equal to its committed results file ----
    Figure("index: live check (session 49), runs within the TTFT target", BENCH,
           rf"within 10% of TTFT p50 on {N} of 65 graphed policy runs, within 5%", BEFORE,
           within(BEFORE, "ttft_p50_s", 0.10), 0.0, "gpu"),
    Figure("index: live check with the wave model, runs within 10% of TPOT", BENCH,
           rf"within 10% of TPOT p50 on {N} of 65", WAVES_CHECK, within(WAVES_CHECK, "tpot_p50_s", 0.10), 0.0, "gpu"),
    Figure("index: chunk tables, runs within the TTFT target", BENCH,
           rf"within 10% of TTFT p50 on {N} of 65 graphed policy runs \(44 before\)", CHUNK_CHECK,
           chunk_check_total("ttft_p50_s"), 0.0, "json"),
    Figure("index: chunk tables, runs within the TPOT target", BENCH, rf"within 5% of TPOT p50 on {N} \(30 before\)",
           CHUNK_CHECK, chunk_check_total("tpot_p50_s"), 0.0, "json"),
    Figure("index: h200_kernels records", BENCH, rf"`h200_kernels\.json` \({N} records\)", KERNELS,
           lambda: float(len(committed(KERNELS))), 0.0, "gpu"),
    *[Figure(f"index: stand-in {key}", BENCH, figure_at(STANDIN_TEXT, i), STANDIN, at(STANDIN, "bench", key), 0.0005,
             "json") for i, key in enumerate(STATS)],
    Figure("index: short-prefill bench best / SDPA at B1 N8192", BENCH, rf"best / SDPA {N} at B1 N8192", SHORT_PREFILL,
           lambda: prefill_ratio(lambda r: r["case"] == "prefill_b1_h32_n8192_d128"), 0.0005, "json"),
    *[Figure(f"index: short-prefill bench, short cases' {name}", BENCH, pattern, SHORT_PREFILL,
             (lambda agg=agg: prefill_ratio(lambda r: "n512" in r["case"] or "n128" in r["case"], agg)), 0.005, "json")
      for name, pattern, agg in (("lowest", rf"{N}-[0-9.]+ at the short cases", min),
                                 ("highest", rf"[0-9.]+-{N} at the short cases", max))],
    *[Figure(f"index: packed GQA, short prefill cases' {name}", BENCH, pattern, PACK,
             (lambda key=key, agg=agg: pack_ratio(key, agg)), 0.0005, "json")
      for name, key, pattern, agg in (
          ("packed lowest", "pack1_ratio", rf"packed best / SDPA {N}-[0-9.]+ at the short", min),
          ("packed highest", "pack1_ratio", rf"packed best / SDPA [0-9.]+-{N} at the short", max),
          ("unpacked lowest", "pack0_ratio", rf"\(unpacked {N}-[0-9.]+\)", min),
          ("unpacked highest", "pack0_ratio", rf"\(unpacked [0-9.]+-{N}\)", max))],
    *[Figure(f"index: resident programs at {tokens}, {name}", BENCH, pattern, RESIDENT,
             (lambda tokens=tokens, agg=agg: knob_gain(RESIDENT, tokens, agg)), 0.0005, "gpu")
      for tokens, name, pattern, agg in (
          ("n512", "lowest", rf"{N}-[0-9.]+x at 16 x 512", min),
          ("n512", "highest", rf"[0-9.]+-{N}x at 16 x 512", max),
          ("n128", "lowest", rf"{N}-[0-9.]+x at 64 x 128", min),
          ("n128", "highest", rf"[0-9.]+-{N}x at 64 x 128", max))],
    Figure("index: LAZY_RESCALE lowest", BENCH, rf"with LAZY_RESCALE {N}-[0-9.]+x", LAZY,
           lambda: knob_gain(LAZY, "", min), 0.005, "gpu"),
    Figure("index: LAZY_RESCALE highest", BENCH, rf"with LAZY_RESCALE [0-9.]+-{N}x", LAZY,
           lambda: knob_gain(LAZY, "", max), 0.005, "gpu"),
    *[Figure(f"index: lookahead, {name}", BENCH, pattern, LOOKAHEAD,
             (lambda num=num, den=den, agg=agg: lookahead_ratio(num, den, agg)), 0.005, "gpu")
      for name, num, den, pattern, agg in (
          ("lookahead's speedup lowest", "persistent", "lookahead", rf"lookahead schedule {N}-[0-9.]+x faster", min),
          ("lookahead's speedup highest", "persistent", "lookahead", rf"lookahead schedule [0-9.]+-{N}x faster", max),
          ("lookahead / anchor lowest", "anchor", "lookahead", rf"lookahead / anchor {N}-[0-9.]+ there", min),
          ("lookahead / anchor highest", "anchor", "lookahead", rf"lookahead / anchor [0-9.]+-{N} there", max))],
    *[Figure(f"README: prefill records, {name}", "README.md", pattern, KERNELS,
             (lambda pick=pick, agg=agg: prefill_record(pick, agg)), 0.005, "gpu")
      for name, pattern, pick, agg in (
          ("B1 N8192", rf"holds\): {N} at B1 N8192", lambda c: "n8192" in c, max),
          ("N2048 lowest", rf"{N}-[0-9.]+ at N2048, [0-9.]+-[0-9.]+ at 16 x 512", lambda c: "n2048" in c, min),
          ("N2048 highest", rf"[0-9.]+-{N} at N2048, [0-9.]+-[0-9.]+ at 16 x 512", lambda c: "n2048" in c, max),
          ("short lowest", rf"at N2048, {N}-[0-9.]+ at 16 x 512", lambda c: "n512" in c or "n128" in c, min),
          ("short highest", rf"at N2048, [0-9.]+-{N} at 16 x 512", lambda c: "n512" in c or "n128" in c, max))],
    Figure("index: L2_PREFETCH lowest", BENCH, rf"with L2_PREFETCH {N}-[0-9.]+x", PREFETCH,
           lambda: knob_gain(PREFETCH, "", min), 0.005, "gpu"),
    Figure("index: L2_PREFETCH highest", BENCH, rf"with L2_PREFETCH [0-9.]+-{N}x", PREFETCH,
           lambda: knob_gain(PREFETCH, "", max), 0.005, "gpu"),
    Figure("index: copy waits, Triton at 64 x 128", BENCH, rf"table copies for {N}% of its", STALLS,
           lambda: copy_wait_share("prefill_b64_h32kv8_n128_d128", "triton"), 0.5, "gpu"),
    Figure("index: copy waits, PACK_GQA at 64 x 128", BENCH, rf"warp samples \({N}% with PACK_GQA\)", STALLS,
           lambda: copy_wait_share("prefill_b64_h32kv8_n128_d128", "triton_pack"), 0.5, "gpu"),
    Figure("index: shape generality gpu cases", BENCH, rf"\| {N} gpu cases passed, none failed", SHAPES,
           lambda: junit_count(SHAPES, "tests") - junit_count(SHAPES, "failures") - junit_count(SHAPES, "errors")
           - junit_count(SHAPES, "skipped"), 0, "gpu"),
    Figure("docs: shape generality gpu cases", "docs/integrity.md", rf"included: {N} cases, all passed", SHAPES,
           lambda: junit_count(SHAPES, "tests") - junit_count(SHAPES, "failures") - junit_count(SHAPES, "errors")
           - junit_count(SHAPES, "skipped"), 0, "gpu"),
    Figure("docs: Gluon persistent's idle warps", "docs/benchmarks.md", rf"start to end: {N}% of its warp", STALLS,
           lambda: idle_warp_share("prefill_b64_h32kv8_n128_d128", "gluon"), 0.05, "gpu"),
    *[Figure(f"index: torch decode, {name}", BENCH, pattern, TORCH_DECODE,
             (lambda key=key, batches=batches, agg=agg: torch_decode(key, batches, agg)), 0.005, "gpu")
      for name, pattern, key, batches, agg in (
          ("speedup at batch 1, lowest", rf"torch's fastest / ours {N}-[0-9.]+ at batch 1,", "kernel_speedup", (1,),
           min),
          ("speedup at batch 1, highest", rf"torch's fastest / ours [0-9.]+-{N} at batch 1,", "kernel_speedup", (1,),
           max),
          ("speedup at batch 2-4, lowest", rf"at batch 1, {N}-[0-9.]+ at batch\s+2-4", "kernel_speedup", (2, 4), min),
          ("speedup at batch 2-4, highest", rf"at batch 1, [0-9.]+-{N} at batch\s+2-4", "kernel_speedup", (2, 4),
           max),
          ("floor lowest", rf"torch's fastest / floor at batch 1-4 {N}-[0-9.]+, within", "ratio_to_floor", (1, 2, 4),
           min),
          ("floor highest", rf"torch's fastest / floor at batch 1-4 [0-9.]+-{N}, within", "ratio_to_floor",
           (1, 2, 4), max))],
    *[Figure(f"README: torch decode, {name}", "README.md", pattern, TORCH_DECODE,
             (lambda key=key, batches=batches, agg=agg: torch_decode(key, batches, agg)), 0.005, "gpu")
      for name, pattern, key, batches, agg in (
          ("speedup at batch 1, lowest", rf"torch's time / ours {N}-[0-9.]+ at batch 1", "kernel_speedup", (1,), min),
          ("speedup at batch 1, highest", rf"torch's time / ours [0-9.]+-{N} at batch 1", "kernel_speedup", (1,), max),
          ("speedup at batch 2-4, lowest", rf"at batch 1 and {N}-[0-9.]+ at batch 2-4", "kernel_speedup", (2, 4), min),
          ("speedup at batch 2-4, highest", rf"at batch 1 and [0-9.]+-{N} at batch 2-4", "kernel_speedup", (2, 4),
           max),
          ("floor lowest", rf"torch's\s+fastest takes {N}-[0-9.]+x the floor", "ratio_to_floor", (1, 2, 4), min),
          ("floor highest", rf"torch's\s+fastest takes [0-9.]+-{N}x the floor", "ratio_to_floor", (1, 2, 4), max))],
    Figure("index: MAXNREG lowest", BENCH, rf"with MAXNREG {N}-[0-9.]+x", REGCAP,
           lambda: knob_gain(REGCAP, "", min), 0.005, "gpu"),
    Figure("index: MAXNREG highest", BENCH, rf"with MAXNREG [0-9.]+-{N}x", REGCAP,
           lambda: knob_gain(REGCAP, "", max), 0.005, "gpu"),
    Figure("index: decode floor lowest", BENCH, rf"best / floor from {N} to", FLOOR, lambda: floor_ratio(min), 0.005,
           "gpu"),
    Figure("index: decode floor highest", BENCH, rf"best / floor from [0-9.]+ to {N}", FLOOR, lambda: floor_ratio(max),
           0.005, "gpu"),
    *floor4_figures("index: ", BENCH, (rf"run 4: {N}-[0-9.]+ at batch 1-4", rf"run 4: [0-9.]+-{N} at batch 1-4",
                                       rf"copy alone is {N}-[0-9.]+x the floor",
                                       rf"copy alone is [0-9.]+-{N}x the floor",
                                       rf"{N}-[0-9.]+ at batch 16-64", rf"[0-9.]+-{N} at batch 16-64")),
    *floor4_figures("", "README.md", (rf"empty launch\): {N}-[0-9.]+ at batch 1-4",
                                      rf"empty launch\): [0-9.]+-{N} at batch 1-4",
                                      rf"bytes alone takes {N}-[0-9.]+x that floor",
                                      rf"bytes alone takes [0-9.]+-{N}x that floor",
                                      rf"short programs\), {N}-[0-9.]+ at batch 16-64",
                                      rf"short programs\), [0-9.]+-{N} at batch 16-64")),
    Figure("index: clean flush, us off (lowest)", BENCH, rf"the clean flush takes {N}-[0-9.]+ us off", FLUSH,
           lambda: flush_gain(min, False), 0.05, "gpu"),
    Figure("index: clean flush, us off (highest)", BENCH, rf"the clean flush takes [0-9.]+-{N} us off", FLUSH,
           lambda: flush_gain(max, False), 0.05, "gpu"),
    Figure("index: clean flush / write (lowest)", BENCH, rf"the best time \({N}-[0-9.]+x\)", FLUSH,
           lambda: flush_gain(min, True), 0.005, "gpu"),
    Figure("index: clean flush / write (highest)", BENCH, rf"the best time \([0-9.]+-{N}x\)", FLUSH,
           lambda: flush_gain(max, True), 0.005, "gpu"),
    *flush_figures(BENCH, (rf"best / floor at batch 1-4 {N}-[0-9.]+ clean",
                           rf"best / floor at batch 1-4 [0-9.]+-{N} clean",
                           rf"clean against {N}-[0-9.]+ written", rf"clean against [0-9.]+-{N} written")),
    *flush_figures("README.md", (rf"clean L2 flush[^|]*?: {N}-[0-9.]+ at batch 1-4",
                                 rf"clean L2 flush[^|]*?: [0-9.]+-{N} at batch 1-4",
                                 rf"with the dataset's write flush {N}-[0-9.]+\)",
                                 rf"with the dataset's write flush [0-9.]+-{N}\)",
                                 rf"within 1\.25 at {N} of the 9")),
    *[Figure(f"index: {name}", BENCH, figure_at(GEN_TEXT, i), GEN, at(GEN, *keys), 0.0005, "gpu")
      for i, (name, keys) in enumerate((("zero-shot MoE", (*ZS, "fused_moe", "geomean")),
                                        ("zero-shot MoE p5", (*ZS, "fused_moe", "p5")),
                                        ("zero-shot decode", (*ZS, "decode_attention", "geomean")),
                                        ("zero-shot decode p5", (*ZS, "decode_attention", "p5")),
                                        ("far2 zero-shot", ("far2_test", "fused_moe", "geomean")),
                                        ("far2 zero-shot p5", ("far2_test", "fused_moe", "p5"))))],
    *[Figure(f"index: lomo {kernel} {key}", BENCH, figure_at(LOMO_TEXT, i), LOMO, at(LOMO, "summary", kernel, key),
             0.0005, "json")
      for i, (kernel, key) in enumerate((("fused_moe", "geomean"), ("fused_moe", "p5"), ("decode_attention", "geomean"),
                                         ("decode_attention", "p5")))],
    Figure("index: design folds", BENCH, rf"folds: geomean {N}", LOO, at(LOO, "folds_summary", "geomean"), 0.0005,
           "json"),
    Figure("index: design folds p5", BENCH, rf"folds: geomean [0-9.]+ \(p5 {N}\)", LOO, at(LOO, "folds_summary", "p5"),
           0.0005, "json"),
    *[Figure(f"index: policy quality {env} {model}", BENCH, figure_at(PQ_TEXT, i),
             "benchmarks/policy_quality.json", (lambda env=env, model=model: policy_geomean(env, model, False)), 0.0005,
             "json")
      for i, (env, model) in enumerate((env, model) for env in ("KernelGym/MoE-v0", "KernelGym/DecodeAttention-v0",
                                                                "KernelGym/PrefillAttention-v0")
                                        for model in ("mixtral-8x7b", "olmoe-1b-7b"))],
    Figure("index: vllm export lowest speedup", BENCH, rf"over the shipped one {N} in", EXPORT,
           lambda: export_speedups()[0], 0.0005, "gpu"),
    Figure("index: vllm export keys", BENCH, rf"over the shipped one [0-9.]+ in {N} keys", EXPORT,
           lambda: export_speedups()[1], 0.0, "gpu"),
    Figure("index: engine lookup intended", BENCH, rf"intended entry at {N} of", LOOKUP,
           at(LOOKUP, "exports_M_intended"), 0.0, "json"),
    Figure("index: engine lookup checked", BENCH, rf"intended entry at [0-9]+ of {N} exported", LOOKUP,
           at(LOOKUP, "exports_M_checked"), 0.0, "json"),
    Figure("index: warm lookups/s", BENCH, rf"{N} warm lookups/s", SPEED_LOOKUP, at(SPEED_LOOKUP, "lookups_per_s_warm"),
           0.5, "json"),
    # ---- the replay benchmark (benchmarks/replay: CPU replays on the recorded data, committed JSON) ----
    Figure("replay: targets met", "README.md", rf"every target met in all 4 runs \({N} of", "benchmarks/replay/*.json",
           lambda: replay_targets(True), 0.0, "json"),
    Figure("replay: targets", "README.md", rf"every target met in all 4 runs \([0-9]+ of {N};",
           "benchmarks/replay/*.json", lambda: replay_targets(False), 0.0, "json"),
    *[Figure(f"replay: learned same-traffic kernel speed {run}", "README.md", figure_at(REPLAY_RATIO_TEXT, i),
             f"benchmarks/replay/{run}_zipf1.2.json", (lambda run=run: replay_same_traffic(run)), 0.0005, "json")
      for i, run in enumerate(REPLAY_RUNS)],
    *[Figure(f"replay: {who} estimated share {run} (%)", "README.md", figure_at(REPLAY_SHARE_TEXT, 4 * j + i),
             f"benchmarks/replay/{run}_zipf1.2.json",
             at(f"benchmarks/replay/{run}_zipf1.2.json", "policies", who, "estimated_share", scale=100), 0.5, "json")
      for j, who in enumerate(("learned", "oracle")) for i, run in enumerate(REPLAY_RUNS)],
    Figure("index: replay speed", BENCH, rf"default configs: {N} s \(met\)", SPEED_REPLAY,
           lambda: replay_wall("recorded", "default"), 0.05, "json"),
    Figure("index: live e2e (graphs) learned TPOT (ms)", BENCH, rf"learned table: TPOT p50 {N} ms", GRAPHS,
           at(GRAPHS, "policies", LEARNED, "measured", "tpot_p50_s", scale=1e3), 0.06, "gpu"),
    Figure("index: live e2e (eager) learned TTFT (ms)", BENCH, rf"\(eager: TTFT p50 {N} ms\)", LIVE,
           at(LIVE, "policies", LEARNED, "measured", "ttft_p50_s", scale=1e3), 0.6, "gpu"),
    Figure("index: live training held-out", BENCH, rf"the policy's configs at {N} of the recorded oracle", LIVE_TRAIN,
           at(LIVE_TRAIN, "summary", "heldout_live_geomean_policy_vs_recorded_oracle"), 0.0005, "gpu"),
    Figure("index: Serving-v0 agent", BENCH, rf"agent at {N} of the oracle's tokens/s", SERVING,
           at(SERVING, "agent_over_oracle"), 0.0005, "json"),
    Figure("index: Serving-v0 default", BENCH, rf"oracle's tokens/s \(default {N}\)", SERVING,
           at(SERVING, "default_over_oracle"), 0.0005, "json"),
    Figure("index: cycle cycled", BENCH, rf"cycled geomean {N} vs", CYCLE, at(CYCLE, "summary", "cycled_geomean"),
           0.0005, "json"),
    Figure("index: cycle kept", BENCH, rf"cycled geomean [0-9.]+ vs {N} for keeping", CYCLE,
           at(CYCLE, "summary", "kept_geomean"), 0.0005, "json"),
    Figure("index: cycle windows", BENCH, rf"for keeping the first files, {N} windows", CYCLE,
           at(CYCLE, "summary", "windows"), 0.0, "json"),
    Figure("plan / engine default, own load", "docs/parallelism.md", rf"\| trace's own \| {N}; 2 of 48 \|", PLAN,
           lambda: plan_ratio("own", "plan_vs_engine_default"), 0.0005, "json"),
    Figure("plan / engine default, saturating", "docs/parallelism.md", rf"\| saturating \| {N}; 15 of 44", PLAN,
           lambda: plan_ratio("saturated", "plan_vs_engine_default"), 0.0005, "json"),
    Figure("plan / aiconfigurator (same simulator), saturating", "docs/parallelism.md",
           rf"serve nothing\) \| {N}; 15 of 45 \|", PLAN, lambda: plan_ratio("saturated", "plan_vs_aiconfigurator"),
           0.0005, "json"),
    Figure("index: serving plan profiles", BENCH, rf"`serving_plan\.json` \({N} profiles\)", PLAN,
           lambda: float(len(committed(PLAN)["profiles"])), 0.0, "json"),
    Figure("index: fault injection restarts", BENCH, rf"passed, {N} worker restarts", FAULTS, at(FAULTS, "restarts"),
           0.0, "gpu"),
]


def printed(fig: Figure) -> float:
    """The number the file prints for the figure; LookupError when its text is not there exactly once."""
    text = (ROOT / fig.file).read_text()
    hits = list(re.finditer(fig.pattern, text))
    if len(hits) != 1:
        raise LookupError(f"{fig.file}: the text of {fig.name!r} (/{fig.pattern}/) occurs {len(hits)} times, not "
                          "once: the file changed; update FIGURES in scripts/check_readme_figures.py")
    return float(hits[0].group("v").replace(",", ""))


def check(figures: list[Figure]) -> tuple[list[dict[str, Any]], int]:
    rows, rc = [], 0
    for fig in figures:
        try:
            shown = printed(fig)
        except LookupError as exc:
            rows.append({"figure": fig.name, "file": fig.file, "ok": False, "error": str(exc)})
            rc = max(rc, 2)
            continue
        actual = fig.value()
        ok = abs(shown - actual) <= fig.tolerance + 1e-12
        rc = rc if ok else max(rc, 1)
        rows.append({"figure": fig.name, "file": fig.file, "printed": shown, "actual": actual,
                     "tolerance": fig.tolerance, "source": fig.source, "tier": fig.tier, "ok": ok})
    return rows, rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--all", action="store_true", help="also the expensive CPU figures (training runs)")
    ap.add_argument("--list", action="store_true", help="list the checked figures and exit")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)
    tiers = ("ci", "json", "gpu", "all") if args.all else ("ci", "json", "gpu")
    figures = [f for f in FIGURES if f.tier in tiers]
    if args.list:
        for f in FIGURES:
            print(f"{f.tier:4s} {f.file}: {f.name} <- {f.source} (tolerance {f.tolerance:g})")
        return 0
    rows, rc = check(figures)
    print(f"{'figure':52s} {'file':24s} {'printed':>10s} {'actual':>12s}  ok")
    for r in rows:
        if "error" in r:
            print(f"{r['figure']:52s} {r['file']:24s} {'-':>10s} {'-':>12s}  TEXT MISSING: {r['error']}")
        else:
            print(f"{r['figure']:52s} {r['file']:24s} {r['printed']:10g} {r['actual']:12.6g}  "
                  f"{'yes' if r['ok'] else 'NO (' + r['source'] + ')'}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    bad = sum(not r["ok"] for r in rows)
    print(f"{len(rows) - bad} of {len(rows)} figures reproduce" + ("" if args.all else
          " (cheap and GPU-file figures; --all adds the training runs)"))
    return rc


if __name__ == "__main__":
    sys.exit(main())
