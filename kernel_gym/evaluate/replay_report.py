"""Replay reporting: what `kernel-gym replay` (kernel_gym/evaluate/replay.py, the harness) writes from a
report: the markdown table per policy (`markdown`), the check of the project's targets on a report (`target_checks`,
`summary_markdown` for benchmarks/replay/summary.md), the plots of tokens/s over time and config switches (`plot`),
the JSON + .md + .png files beside each other (`write_outputs`) and the MLflow run holding them (`log_mlflow`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from kernel_gym.traffic.simulator import _C, KERNELS, SimResult

COLUMNS = (  # (heading, definition): the table's footnote and docs/simulator.md ("Reading the replay table")
    ("tokens/s", "output tokens served per second of simulated time, over the whole replay"),
    ("tokens/s / oracle", "this policy's tokens/s divided by the oracle's (1.000 = as many tokens as the oracle)"),
    ("tuned kernels (s)", "seconds of tuned-kernel time (prefill attention, decode attention, fused MoE) in this "
                          "policy's own run; its run batches requests its own way, so runs differ in work too"),
    ("same-traffic kernels (s)", "the tuned-kernel seconds this policy's configs take on the reference run's calls "
                                 "(the oracle's when it ran, else the first policy's: same_traffic_reference in the "
                                 "JSON): every policy priced on identical workloads"),
    ("kernel speed / oracle", "oracle's same-traffic kernel seconds divided by this policy's (1.000 = kernels as fast "
                              "as the oracle's on the same calls)"),
    ("tuning (GPU-s)", "GPU seconds spent measuring configs during the replay (autotune, random, tpe), charged as "
                       "stalls; 0 for policies that only look up"),
    ("TTFT p50 / p99 (s)", "time to first token, median and 99th percentile over requests"),
    ("TPOT p50 / p99 (ms)", "time per output token after the first, median and 99th percentile"),
    ("switches", "times a kernel's config differed from its previous call's (a config's first use is also "
                 "charged its compile time, as a stall)"),
    ("fallbacks", "kernel calls whose chosen config had no time in the data: the family default (else the slowest "
                  "config) was charged instead"),
    ("estimated kernel time", "share of the policy's tuned-kernel seconds whose times are estimates (interpolated "
                              "between measured shapes, proxied from a nearest measured shape, or borrowed from "
                              "another shape and roofline-scaled) rather than measurements of that exact workload "
                              "and config; overall, then prefill/decode/MoE"),
)
ESTIMATED_WARN = 0.5  # above this estimated share, differences between policies rest mostly on estimates


def markdown(rep: dict[str, Any]) -> str:
    """The replay table, readable on its own: load and routing in the header, one footnote line per column, and a
    note when most kernel time rests on estimates (then the ranking between close policies is not a measurement)."""
    pols = rep["policies"]
    ref = pols.get("oracle", {}).get("tokens_per_s")
    routing = rep.get("routing") or "?"
    lines = [f"# Replay: {rep['trace']} on {rep['model']}", "",
             *([f"Load: {rep['load']}", ""] if rep.get("load") else []),
             f"Expert routing: {routing} (`--routing`; default {DEFAULT_ROUTING}, as in the demo and the README)", "",
             "| policy | " + " | ".join(h for h, _ in COLUMNS) + " |",
             "|---|" + "---|" * len(COLUMNS)]
    kref = pols.get("oracle", {}).get("tuned_kernel_s_same_traffic")
    undefined = False

    def q(v: Any, scale: float, digits: int) -> str:  # a latency quantile; n/a where no request defines it
        nonlocal undefined
        if v is None or not math.isfinite(v):
            undefined = True
            return "n/a"
        return f"{v * scale:.{digits}f}"

    for n, m in pols.items():
        rel = f"{m['tokens_per_s'] / ref:.3f}" if ref else "-"
        same = m.get("tuned_kernel_s_same_traffic")
        krel = f"{kref / same:.3f}" if kref and same else "-"
        same_s = f"{same:.2f}" if same is not None else "-"
        lines.append(f"| {n} | {m['tokens_per_s']:.1f} | {rel} | {m['tuned_kernel_s']:.2f} | {same_s} | {krel} | "
                     f"{m['tuning_gpu_s']:.1f} | "
                     f"{q(m['ttft_p50_s'], 1, 3)} / {q(m['ttft_p99_s'], 1, 3)} | {q(m['tpot_p50_s'], 1e3, 2)} / "
                     f"{q(m['tpot_p99_s'], 1e3, 2)} | {m.get('config_switches', 0):.0f} | "
                     f"{m.get('fallbacks', 0):.0f} | "
                     f"{_estimated(m)} |")
    lines += ["", "Columns:"]
    lines += [f"- {h}: {d}." for h, d in COLUMNS]
    if undefined:
        lines += ["", "n/a: no request defines that figure in this replay (TPOT needs a finished request with at "
                  "least 2 output tokens; TTFT a finished request); null in the JSON."]
    cached = {n: m for n, m in pols.items() if "prefix_hit_rate" in m}
    if cached:  # a trace that carries prefix-cache blocks (Mooncake, Bailian hash_ids)
        lines += ["", "Prefix cache (the trace's hash_ids; prompt tokens found cached / looked up): " + ", ".join(
            f"{n} {100 * m['prefix_hit_rate']:.1f}% ({m['prefix_block_tokens']:.0f}-token blocks, "
            f"{m.get('prefix_evicted_blocks', 0):.0f} evicted)" for n, m in cached.items())
                  + ". A policy's KV page size sets the blocks it caches (a page at a time), so rates can differ."]
    note = estimate_note(rep)
    if note:
        lines += ["", note]
    waves = {n: m for n, m in pols.items() if "decode_waves_s" in m}
    if waves:
        lines += ["", "Decode priced from each batch's own contexts (`--decode-waves`: the wave model, fitted per "
                  "config on the measured rows; docs/simulator.md). The same-traffic kernel seconds stay at the "
                  "mean-context prices. Seconds the model moved against those, and the seconds of choices the data "
                  "has no time for (estimates, where a fallback was charged before; in the estimated share; a "
                  "choice with no times of its own is priced from its nearest timed sibling's): "
                  + ", ".join(f"{n} {m['decode_waves_s']:+.1f} s ({m['decode_waves_untimed_s']:.1f} s untimed"
                              + (f", {m['decode_waves_sibling_configs']:.0f} configs by a sibling"
                                 if m.get("decode_waves_sibling_configs") else "") + ")"
                              for n, m in waves.items()) + "."]
    live = live_check_note(decode_waves=bool(waves))
    if live:
        lines += ["", live]
    return "\n".join(lines) + "\n"


LIVE_CHECK = Path(__file__).resolve().parent.parent / "data" / "live_check.json"


def live_check_note(path: Path = LIVE_CHECK, decode_waves: bool = True) -> str:
    """How far this simulator was from live H200 serving runs (kernel_gym/data/live_check.json, written from the
    committed runs by benchmarks/live_e2e/run.py --live-check): printed under every replay table, beside its figures."""
    if not path.exists():
        return ""
    check = json.loads(path.read_text())
    span = _live_span(check)
    counts = check.get("within_target")
    within = ("; within 5% / 10% / 5% on " + ", ".join(f"{counts[k]['within']}" for k in
                                                        ("tokens_per_s", "ttft_p50_s", "tpot_p50_s"))
              + f" of {len(check['rows'])}") if counts else ""
    return (f"Simulator vs live: against {len(check['rows'])} policy runs in {len(check['runs'])} live replays on one "
            f"H200 ({', '.join(check['models'])}; "
            f"continuous batching with CUDA graphs, real trace windows) this simulator's predictions, with the live "
            f"stack's own measured price tables and decode priced as `--decode-waves` prices it, were off by "
            f"{span}{within} (docs/live.md). Read every tokens/s, TTFT and TPOT figure above with that error."
            + ("" if decode_waves else " This replay priced decode at each batch's mean context, not as the check "
               "did: pass --decode-waves to price it the same way."))


def live_check_line(path: Path = LIVE_CHECK) -> str:
    """live_check_note in one line, for the commands that print a prediction beside other output (plan): the check's
    runs were one H200 each (TP 1), so a layout over several GPUs adds collectives that check never priced."""
    if not path.exists():
        return ""
    check = json.loads(path.read_text())
    return (f"the simulator against {len(check['rows'])} live runs on one H200 ({', '.join(check['models'])}, TP 1, "
            f"priced from the live stack's own tables with decode by each batch's contexts; docs/live.md): "
            f"{_live_span(check)}. "
            "This plan prices from the recorded store with decode at each batch's mean context, and multi-GPU layouts "
            "add collectives: neither was in that check")


def _live_span(check: dict[str, Any]) -> str:
    """The live check's error range per metric, e.g. 'tokens/s -2% to +5%, TTFT p50 ...'."""
    return ", ".join(f"{label} {100 * check['range'][k][0]:+.0f}% to {100 * check['range'][k][1]:+.0f}%"
                     for k, label in (("tokens_per_s", "tokens/s"), ("ttft_p50_s", "TTFT p50"),
                                      ("tpot_p50_s", "TPOT p50")))


DEFAULT_ROUTING = "zipf:1.2"  # replay's --routing default (cli/replay.py), the demo's and the README figures'


def _seconds(x: float) -> str:
    """1,070 or 0.0421: whole seconds from 100 up, three digits below (a short trace's are under a second)."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def estimate_note(rep: dict[str, Any]) -> str:
    """When most of the compared kernel time is estimated: say so beside the ratios it qualifies, with the shares,
    so a learned policy below a baseline there is read as a difference between estimates, not between kernels."""
    pols = rep["policies"]
    shares = {n: m["estimated_share"] for n, m in pols.items() if "estimated_share" in m}
    high = {n: v for n, v in shares.items() if v > ESTIMATED_WARN}
    if not high:
        return ""
    which = ", ".join(f"{n} {100 * v:.0f}%" for n, v in high.items())
    who = "learned" if "learned" in high else next(iter(high))
    m = pols[who]
    parts = {k: m.get(f"tuned_kernel_s.{k}", 0.0) * m.get(f"estimated_share.{k}", 0.0)
             for k in KERNELS}
    top = max(parts, key=parts.__getitem__)
    where = (f"; the largest estimated part of {who}'s is {top}: {_seconds(parts[top])} of its "
             f"{_seconds(m.get('tuned_kernel_s', 0.0))} s" if parts[top] > 0 else "")
    return (f"Note: most tuned-kernel time here rests on estimates ({which}{where}): this trace's workloads lie "
            "mostly outside the measured shapes (for long prompts: MoE over more tokens than the largest measured "
            "M, prefill over longer sequences), so the oracle is only the best config under the same estimates and "
            "the ratios between policies compare estimated times. Read differences of a few percent as unmeasured; "
            "`--steps-json` and benchmarks/live_replay/run.py time the chosen kernels on a GPU (docs/simulator.md, "
            "'Reading the replay table').")


def _estimated(m: dict[str, Any]) -> str:
    if "estimated_share" not in m:
        return "-"
    parts = "/".join(f"{100 * m.get(f'estimated_share.{k}', 0.0):.0f}%"
                     for k in KERNELS)
    return f"{100 * m['estimated_share']:.1f}% ({parts})"


TARGET_RATIO = 0.97  # the bar: learned >= 0.97 x oracle


def target_checks(rep: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets on one report: each {target, value, bar, met, margin}. margin > 0: met by that much
    (relative), < 0: missed by that much. Kernel time ratios are oracle/learned (1 = as fast as the oracle)."""
    p = rep["policies"]
    if "learned" not in p:
        return []
    lr = p["learned"]
    out: list[dict[str, Any]] = []

    def add(target: str, value: float, bar: float, strict: bool = False) -> None:
        met = value > bar if strict else value >= bar
        out.append({"target": target, "value": value, "bar": bar, "met": bool(met),
                    "margin": (value - bar) / bar if bar else 0.0})

    if "oracle" in p:
        o = p["oracle"]
        add("tokens/s >= 0.97 x oracle", lr["tokens_per_s"] / o["tokens_per_s"], TARGET_RATIO)
        add("tuned-kernel time (own run) >= 0.97 x oracle speed", o["tuned_kernel_s"] / lr["tuned_kernel_s"],
            TARGET_RATIO)
        if lr.get("tuned_kernel_s_same_traffic") and o.get("tuned_kernel_s_same_traffic"):
            add("tuned-kernel time (same traffic) >= 0.97 x oracle speed",
                o["tuned_kernel_s_same_traffic"] / lr["tuned_kernel_s_same_traffic"], TARGET_RATIO)
    if "vllm-table" in p:
        v = p["vllm-table"]
        add("tokens/s > vllm-table", lr["tokens_per_s"] / v["tokens_per_s"], 1.0, strict=True)
        if lr.get("tuned_kernel_s_same_traffic") and v.get("tuned_kernel_s_same_traffic"):
            add("kernel time (same traffic) < vllm-table",
                v["tuned_kernel_s_same_traffic"] / lr["tuned_kernel_s_same_traffic"], 1.0, strict=True)
    if "static" in p:
        add("tokens/s >= static", lr["tokens_per_s"] / p["static"]["tokens_per_s"], 1.0)
    for n in ("autotune", "random", "tpe"):
        if n in p:
            s = p[n]
            out.append({"target": f"tuning GPU-s < {n}", "value": lr["tuning_gpu_s"], "bar": s["tuning_gpu_s"],
                        "met": lr["tuning_gpu_s"] < s["tuning_gpu_s"],
                        # GPU-s saved, relative to the baseline's (the dataset's one-off collection is not counted)
                        "margin": (s["tuning_gpu_s"] - lr["tuning_gpu_s"]) / s["tuning_gpu_s"] if s["tuning_gpu_s"]
                        else 0.0})
            add(f"tokens/s >= {n}", lr["tokens_per_s"] / s["tokens_per_s"], 1.0)
    return out


def summary_markdown(reports: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """benchmarks/replay/summary.md: per report, the load and the target check table (met / missed by how much)."""
    lines = ["# Replay on the recorded H200 data: target check", "",
             "Ratios are learned / reference for tokens/s and reference / learned for kernel time (1.0 = equal). "
             "Margin: relative distance to the bar (negative = missed by that much).", ""]
    for name, rep in reports:
        lines += [f"## {name}: {rep['trace']} on {rep['model']}, routing {rep.get('routing', '?')}", "",
                  f"Load: {rep.get('load', '?')}", "",
                  "| target | value | bar | met | margin |", "|---|---|---|---|---|"]
        for c in target_checks(rep):
            lines.append(f"| {c['target']} | {c['value']:.3f} | {c['bar']:.3f} | {'met' if c['met'] else 'MISSED'} | "
                         f"{c['margin']:+.1%} |")
        lines.append("")
    return "\n".join(lines)


def tokens_over_time(res: SimResult, bins: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """(bin centres, output tokens/s per bin): decode tokens at each step's end plus first tokens."""
    steps = res.steps
    t_end = steps[:, _C["t_start"]] + steps[:, _C["duration_s"]]
    first = res.first_token_s[~np.isnan(res.first_token_s)]
    hi = float(max(t_end.max() if len(t_end) else 1.0, first.max() if len(first) else 1.0))
    edges = np.linspace(0.0, hi, bins + 1)
    h, _ = np.histogram(t_end, edges, weights=steps[:, _C["decode_batch"]])
    f, _ = np.histogram(first, edges)
    return (edges[:-1] + edges[1:]) / 2, (h + f) / np.diff(edges)


def _finish(plt: Any, fig: Any, ax: Any, ylabel: str, path: Path) -> None:
    """Label, lay out, save and close one of plot's two figures (they share everything but the y axis)."""
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot(runs: dict[str, Any],  # replay.PolicyRun values (not imported: replay imports this module)
         path_tokens: Path, path_switches: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for n, r in runs.items():
        x, y = tokens_over_time(r.result)
        ax.plot(x, y, label=n, lw=1.2)
    _finish(plt, fig, ax, "output tokens/s", path_tokens)
    fig, ax = plt.subplots(figsize=(8, 4))
    for n, r in runs.items():
        times = sorted(t for t, *_ in r.result.switch_log)
        ax.step([0.0, *times], np.arange(len(times) + 1), where="post", label=f"{n} ({len(times)})")
    _finish(plt, fig, ax, "config switches (cumulative)", path_switches)


def json_safe(obj: Any) -> Any:
    """`obj` with every NaN or infinite float as None: JSON has no NaN (Python writes one that strict parsers such as
    JSON.parse and jq reject); a latency no request defines (TPOT of one-token outputs) is null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, np.generic):
        return json_safe(obj.item())
    return obj


def write_outputs(rep: dict[str, Any], runs: dict[str, Any], json_path: Path) -> list[Path]:
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(json_safe(rep), indent=1, allow_nan=False))
    md = json_path.with_suffix(".md")
    md.write_text(markdown(rep))
    p1 = json_path.with_name(json_path.stem + "_tokens.png")
    p2 = json_path.with_name(json_path.stem + "_switches.png")
    plot(runs, p1, p2)
    return [json_path, md, p1, p2]


def log_mlflow(rep: dict[str, Any], paths: list[Path], params: dict[str, Any], tracking_uri: str | None) -> str:
    import mlflow

    from kernel_gym.train import tracking

    uri = tracking.setup_tracking(tracking_uri)
    exp = tracking.get_or_create_experiment("kernel-gym-replay", uri)
    with mlflow.start_run(experiment_id=exp, run_name=f"replay-{rep['trace']}-{rep['model']}") as run:
        mlflow.log_params({k: str(v)[:500] for k, v in params.items()})
        mlflow.set_tag("git_commit", tracking.git_commit())
        metrics = {f"{n}/{k}": float(v) for n, m in rep["policies"].items() for k, v in m.items()
                   if isinstance(v, (int, float)) and np.isfinite(v)}
        mlflow.log_metrics(metrics)
        for p in paths:
            mlflow.log_artifact(str(p), artifact_path="plots" if p.suffix == ".png" else None)
        return run.info.run_id
