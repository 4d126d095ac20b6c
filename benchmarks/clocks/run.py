"""How configs' rankings and paired ratios move between a cool and a hot GPU (GPU, one command, issue 24 item 4).

The H200 here is power-capped (about 700 W): under sustained large-M MoE its SM clock falls from 1,980 to about
1,500 MHz within seconds. This study times the same configs of both MoE kernels (vllm_fused_moe, kernel_gym's own
fused_moe) at Mixtral-8x7B's layer (E=8, top-2, hidden 4096, N 14336; M = 4096, 1024, 64, uniform routing) in three
states, each with every config of a (kernel, M) group timed interleaved, sample by sample (timing.time_interleaved:
L2 flushed, GPU spin, CUDA events), so a drift within a group falls on every config alike:
  cool   after --idle-s seconds of idle;
  hot    after the warm-up rule (timing.heat_to_steady: back-to-back bf16 matmuls until the temperature stops rising,
         at most --heat-s), with a --reheat-s top-up before every group so each group starts equally hot;
  cool2  after another idle, the cool pass again: the noise floor of the comparison (same state twice).
Configs (the same set at every M of a kernel): the engine's entry (vLLM's shipped H200 table at each M, or fused_moe's
default), the packaged dataset's fastest stored configs at each M, then a seeded sample, --configs in all; compiled
ahead in a pool of CPU processes (kernel_gym.measure.compiler), then checked against the reference at every M.
vllm_fused_moe runs from CUDA-graph replays; fused_moe eagerly (its TMA configs cannot be replayed, run 5).
measure.power samples SM / memory clock, power, temperature and throttle reasons every 100 ms through the whole run.

Reported per (kernel, M): Kendall tau of the configs' rankings cool vs hot and cool vs cool2, the hot / cool time of
every config (median, min, max), the shift of every config's paired ratio to the engine entry (hot ratio / cool ratio
- 1), whether the winner changes and what the cool winner costs when run hot, and each state's power summary.
Writes $OUT/clock_study.json (everything, with the power samples) and prints a table last.

    python3 benchmarks/clocks/run.py --out $OUT/clocks --budget-s 150
    TRITON_INTERPRET=1 python3 benchmarks/clocks/run.py --out /tmp/clocks --smoke   # CPU: logic only, tiny shapes

Imports only torch, triton, numpy, the standard library and kernel_gym.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from kernel_gym.kernels import fused_moe as fm  # noqa: E402
from kernel_gym.kernels import vllm_moe as vm  # noqa: E402
from kernel_gym.kernels.space import Config  # noqa: E402
from kernel_gym.kernels.workloads import MoEWorkload  # noqa: E402
from kernel_gym.measure import power  # noqa: E402
from kernel_gym.measure.worker import compare  # noqa: E402

SHAPE = dict(num_experts=8, top_k=2, hidden=4096, intermediate=14336)  # Mixtral-8x7B, TP1
SMOKE_SHAPE = dict(num_experts=4, top_k=2, hidden=64, intermediate=96, dtype="float32")
M_VALUES = (4096, 1024, 64)
SMOKE_M = (16, 4)
KERNELS = ("vllm_fused_moe", "fused_moe")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- statistics (pure Python: tested on the CPU) -------------------------------------------------------------------


def kendall_tau(a: list[float], b: list[float]) -> float | None:
    """Kendall's tau-b of two paired lists (ties counted as neither concordant nor discordant); None below 2 items."""
    if len(a) != len(b):
        raise ValueError(f"kendall_tau needs paired lists, got {len(a)} and {len(b)} values")
    n = len(a)
    if n < 2:
        return None
    conc = disc = ties_a = ties_b = 0
    for i in range(n):
        for j in range(i + 1, n):
            da, db = a[i] - a[j], b[i] - b[j]
            if da == 0 and db == 0:
                continue
            if da == 0:
                ties_a += 1
            elif db == 0:
                ties_b += 1
            elif (da > 0) == (db > 0):
                conc += 1
            else:
                disc += 1
    denom = math.sqrt((conc + disc + ties_a) * (conc + disc + ties_b))
    return (conc - disc) / denom if denom else None


def compare_states(configs: list[str], ref: str, a: dict[str, float], b: dict[str, float]) -> dict[str, Any]:
    """State b against state a for one (kernel, M) group: rankings, absolute shifts, paired-ratio shifts, winners."""
    both = [c for c in configs if a.get(c) and b.get(c)]
    if not both:
        return {"configs": 0}
    abs_shift = [b[c] / a[c] - 1 for c in both]
    out: dict[str, Any] = {
        "configs": len(both),
        "kendall_tau": kendall_tau([a[c] for c in both], [b[c] for c in both]),
        "abs_shift": {"median": statistics.median(abs_shift), "min": min(abs_shift), "max": max(abs_shift)},
    }
    if ref in both:
        ratio_shift = {c: (b[c] / b[ref]) / (a[c] / a[ref]) - 1 for c in both if c != ref}
        if ratio_shift:
            vals = list(ratio_shift.values())
            out["ratio_shift"] = {"median": statistics.median(vals), "max_abs": max(abs(v) for v in vals),
                                  "per_config": ratio_shift}
    win_a, win_b = min(both, key=lambda c: a[c]), min(both, key=lambda c: b[c])
    out["winner_a"], out["winner_b"] = win_a, win_b
    out["winner_same"] = win_a == win_b
    out["a_winner_regret_in_b"] = b[win_a] / b[win_b]  # what picking in state a costs when the GPU runs in state b
    return out


def window_summary(samples: list[power.PowerSample], t0: float, t1: float, source: str) -> dict[str, Any]:
    """The power summary of the samples taken in [t0, t1] (monotonic seconds)."""
    inside = [s for s in samples if t0 <= s.t <= t1]
    if not inside and samples:  # a window shorter than the sampling interval: the nearest sample
        inside = [min(samples, key=lambda s: abs(s.t - (t0 + t1) / 2))]
    if not inside:
        return power.PowerSummary.unavailable(source or "no power samples").to_dict()
    return power.PowerSummary.of(inside, source).to_dict()


# ---- timing (GPU, or wall clock under the CPU smoke) ---------------------------------------------------------------


def interleaved_medians(fns: list[Callable[[], Any]], reps: int, cuda: bool) -> list[float]:
    if cuda:
        from kernel_gym.measure.timing import time_interleaved

        return [statistics.median(s) for s in time_interleaved(fns, reps, heat=False)]
    out = [[] for _ in fns]
    for r in range(reps):
        for i in (range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))):
            t = time.perf_counter()
            fns[i]()
            out[i].append((time.perf_counter() - t) * 1e3)
    return [statistics.median(s) for s in out]


def heat(max_s: float, cuda: bool, reader: Any, min_s: float = 2.0) -> dict[str, Any]:
    if not cuda or max_s <= 0:
        return {"heated_s": 0.0, "plateau": False, "note": "no GPU: not heated" if not cuda else "off"}
    from kernel_gym.measure.timing import heat_to_steady

    return heat_to_steady(max_s, reader=reader, min_s=min_s).to_dict()


# ---- configs and closures -----------------------------------------------------------------------------------------


def workload(m: int, smoke: bool) -> MoEWorkload:
    return MoEWorkload(num_tokens=m, **(SMOKE_SHAPE if smoke else SHAPE))


def pick_configs(kernel: str, ms: tuple[int, ...], n: int, recorded: int, seed: int, smoke: bool) -> tuple[list[Config],
                                                                                                            dict]:
    """(configs valid at every M, {M: reference config string}); the engine entry / default first."""
    family = vm.FAMILY if kernel == "vllm_fused_moe" else fm.FAMILY
    wls = [workload(m, smoke) for m in ms]
    refs = {m: family.default_config(wl) for m, wl in zip(ms, wls)}
    picks = list(refs.values())
    if recorded and not smoke:
        from kernel_gym.bench import recorded_best

        for wl in wls:
            picks += recorded_best(family, wl, recorded)
    rest = family.space.sample(wls[0], 4 * n, seed=seed)
    random.Random(seed).shuffle(rest)
    picks += rest
    ref_set = set(refs.values())
    valid = [c for c in dict.fromkeys(picks)
             if c in ref_set or all(family.space.is_valid(c, wl) for wl in wls)]  # a reference: valid at its own M
    return valid[:max(n, len(ref_set))], {m: str(c) for m, c in refs.items()}


def build_group(kernel: str, m: int, configs: list[Config], weights: tuple, cuda: bool, smoke: bool,
                seed: int) -> tuple[list[str], list[Callable[[], Any]], dict[str, str]]:
    """Checked, warm launch closures of every config at M (graph replays for vllm_fused_moe on the GPU); a config that
    fails is left out with its reason."""
    family = vm.FAMILY if kernel == "vllm_fused_moe" else fm.FAMILY
    wl = workload(m, smoke)
    dev = weights[0].device
    gen = torch.Generator(device=dev).manual_seed(seed + m)
    x = torch.randn(m, wl.hidden, generator=gen, device=dev, dtype=weights[0].dtype)
    inputs = fm.MoEInputs(wl, x, fm.router_logits(wl, seed + m).to(dev), *weights)
    ref = family.reference(inputs)
    names, fns, failed = [], [], {}
    for c in configs:
        if not family.space.is_valid(c, wl):
            continue  # another M's reference, invalid here
        try:
            fn = family.prepare(inputs, c)
            out = fn()
            if cuda:
                torch.cuda.synchronize()
            wrong = compare(family, out, ref, wl.dtype)
            if wrong:
                failed[str(c)] = f"wrong result: {wrong}"
                continue
            if cuda and kernel == "vllm_fused_moe":
                from kernel_gym.measure.timing import capture_graph

                fn = capture_graph(fn)
            fn()
        except Exception as exc:  # noqa: BLE001 - recorded and left out
            failed[str(c)] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            if cuda:
                torch.cuda.synchronize()
            continue
        names.append(str(c))
        fns.append(fn)
    return names, fns, failed


# ---- the study ---------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace, result: dict[str, Any] | None = None,
        save: Callable[[], None] | None = None) -> dict[str, Any]:
    """Fills `result` as it goes (main writes it even when a step fails; `save` after every phase)."""
    start = time.monotonic()
    deadline = start + args.budget_s
    cuda = torch.cuda.is_available() and not args.smoke
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ms = SMOKE_M if args.smoke else M_VALUES
    n_cfg = 3 if args.smoke else args.configs
    reps = {m: (1 if args.smoke else (args.reps_large if m >= 1024 else args.reps_small)) for m in ms}
    result = {} if result is None else result
    result.update({"meta": {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__, "triton": __import__("triton").__version__, "smoke": args.smoke,
        "shape": SMOKE_SHAPE if args.smoke else SHAPE, "m_values": list(ms), "args": vars(args),
        "timing": "timing.time_interleaved: every config of a (kernel, M) group in turn, sample by sample, L2 flushed "
                  "and GPU spin before each; vllm_fused_moe as CUDA-graph replays, fused_moe eager; medians",
    }, "groups": {}, "phases": []})

    mon = power.PowerMonitor(0, interval_s=0.1)
    mon.__enter__()
    reader = None
    try:
        reader = power.open_reader(0)
    except power.PowerUnavailable as exc:
        log(f"no power reader: {exc}")
    log(f"device {result['meta']['device']}; {mon.summary().line()}")

    weights_shape = workload(ms[0], args.smoke)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    dtype = torch.float32 if args.smoke else torch.bfloat16
    e, h, i = weights_shape.num_experts, weights_shape.hidden, weights_shape.intermediate
    weights = (torch.randn(e, 2 * i, h, generator=gen, device=dev, dtype=dtype).mul_(1 / math.sqrt(h)),
               torch.randn(e, h, i, generator=gen, device=dev, dtype=dtype).mul_(1 / math.sqrt(i)))

    groups: dict[tuple[str, int], tuple[list[str], list[Callable[[], Any]]]] = {}
    picked = {k: pick_configs(k, ms, n_cfg, 0 if args.smoke else args.recorded, args.seed, args.smoke)
              for k in args.kernels.split(",")}
    pool, futures = None, {}
    if cuda and args.compile_workers > 0:  # compile every config into Triton's cache on CPU cores at once
        import os

        from kernel_gym.measure.compiler import CompilePool

        try:
            pool = CompilePool(args.compile_workers,
                               {k: os.environ[k] for k in ("TRITON_CACHE_DIR",) if k in os.environ})
            for k, (configs, _) in picked.items():
                for m in (ms[0], ms[-1]):
                    futures[(k, m)] = pool.submit(k, workload(m, args.smoke).key(), [str(c) for c in configs],
                                                  chunk=2)
        except Exception as exc:  # noqa: BLE001 - the pool only saves time: compile in this process instead
            log(f"compile pool failed ({type(exc).__name__}: {exc}); compiling in this process")
            if pool is not None:
                pool.close()
            pool, futures = None, {}
    for kernel, (configs, refs) in picked.items():
        log(f"{kernel}: {len(configs)} configs; reference per M: {refs}")
        if pool is not None:
            from kernel_gym.measure.compiler import CompilePool

            for m in (ms[0], ms[-1]):
                CompilePool.collect(futures[(kernel, m)], timeout_s=max(10.0, deadline - time.monotonic() - 100))
            log(f"  compiled in the pool ({time.monotonic() - start:.1f} s since the start)")
        for m in ms:
            t0 = time.monotonic()
            names, fns, failed = build_group(kernel, m, configs, weights, cuda, args.smoke, args.seed)
            groups[(kernel, m)] = (names, fns)
            result["groups"][f"{kernel}/M={m}"] = {"kernel": kernel, "M": m, "reference": refs[m], "configs": names,
                                                   "failed": failed, "times_ms": {}, "power": {}}
            log(f"  M={m}: {len(names)} ready, {len(failed)} failed ({time.monotonic() - t0:.1f} s)")
            if refs[m] not in names:
                log(f"  M={m}: the reference config failed ({failed.get(refs[m])}); ratios at this M are skipped")
    if pool is not None:
        pool.close()
    result["meta"]["setup_s"] = round(time.monotonic() - start, 1)

    def timed_pass(state: str, reheat_s: float) -> None:
        for (kernel, m), (names, fns) in groups.items():
            if not fns:
                continue
            if reheat_s > 0:
                heat(reheat_s, cuda, reader, min_s=reheat_s)
            t0 = time.monotonic()
            medians = interleaved_medians(fns, reps[m], cuda)
            t1 = time.monotonic()
            g = result["groups"][f"{kernel}/M={m}"]
            g["times_ms"][state] = dict(zip(names, medians))
            g["power"][state] = window_summary(list(mon.samples), t0, t1, mon.source or mon.summary().reason)
            log(f"  {state} {kernel} M={m}: best {min(medians):.4f} ms; "
                f"{power.monitor_summary_line(g['power'][state])}")

    def phase(name: str, fn: Callable[[], Any], **info: Any) -> None:
        t0 = time.monotonic()
        out = fn()
        t1 = time.monotonic()
        entry = {"phase": name, "start_s": round(t0 - start, 2), "end_s": round(t1 - start, 2), **info,
                 "power": window_summary(list(mon.samples), t0, t1, mon.source or mon.summary().reason)}
        if isinstance(out, dict):
            entry["heat"] = out
        result["phases"].append(entry)
        log(f"{name} ({t1 - t0:.1f} s): {power.monitor_summary_line(entry['power'])}")
        if save is not None:
            save()

    idle = 0.0 if args.smoke else args.idle_s
    phase("idle", lambda: time.sleep(idle), seconds=idle)
    phase("cool", lambda: timed_pass("cool", 0.0))
    phase("heat", lambda: heat(0.0 if args.smoke else args.heat_s, cuda, reader), max_s=args.heat_s)
    phase("hot", lambda: timed_pass("hot", 0.0 if args.smoke else args.reheat_s), reheat_s=args.reheat_s)
    needed = idle + 10.0
    if time.monotonic() + needed <= deadline:
        phase("idle2", lambda: time.sleep(idle), seconds=idle)
        phase("cool2", lambda: timed_pass("cool2", 0.0))
    else:
        log(f"budget: cool2 skipped ({deadline - time.monotonic():.0f} s left, {needed:.0f} s needed)")
    mon.__exit__(None, None, None)

    for g in result["groups"].values():
        t = g["times_ms"]
        g["hot_vs_cool"] = compare_states(g["configs"], g["reference"], t.get("cool", {}), t.get("hot", {}))
        if "cool2" in t:
            g["cool2_vs_cool"] = compare_states(g["configs"], g["reference"], t["cool"], t["cool2"])
    result["power_run"] = mon.summary().to_dict()
    step = max(1, int(0.25 / mon.interval_s))
    result["power_samples"] = [[round(s.t - start, 2), s.sm_mhz, s.mem_mhz, s.power_w, s.temp_c, s.throttle]
                               for s in mon.samples[::step]]
    result["power_samples_fields"] = ["t_s", "sm_mhz", "mem_mhz", "power_w", "temp_c", "throttle_mask"]
    result["meta"]["wall_s"] = round(time.monotonic() - start, 1)
    return result


def table(result: dict[str, Any]) -> str:
    rows = ["| kernel | M | configs | tau hot/cool | tau cool2/cool | hot/cool time med (min..max) | ratio shift "
            "med / max abs | winner same | cool-pick regret hot | SM MHz cool / hot | W cool / hot |",
            "|---|---:|---:|---:|---:|---|---|---|---:|---|---|"]

    def f(x: Any, fmt: str = "{:.3f}") -> str:
        return "-" if x is None else fmt.format(x)

    for g in result["groups"].values():
        hc, c2 = g.get("hot_vs_cool", {}), g.get("cool2_vs_cool", {})
        if not hc.get("configs"):
            continue
        a, rs = hc["abs_shift"], hc.get("ratio_shift", {})
        def med(state: str, key: str, pw: dict = g["power"]) -> str:
            v = pw.get(state, {}).get(key)
            return f"{v[1]:.0f}" if v else "-"

        rows.append(
            f"| {g['kernel']} | {g['M']} | {hc['configs']} | {f(hc['kendall_tau'])} | {f(c2.get('kendall_tau'))} | "
            f"{a['median']:+.1%} ({a['min']:+.1%}..{a['max']:+.1%}) | "
            f"{f(rs.get('median'), '{:+.1%}')} / {f(rs.get('max_abs'), '{:.1%}')} | {hc['winner_same']} | "
            f"{hc['a_winner_regret_in_b']:.3f} | {med('cool', 'sm_mhz')} / {med('hot', 'sm_mhz')} | "
            f"{med('cool', 'power_w')} / {med('hot', 'power_w')} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder for clock_study.json")
    p.add_argument("--budget-s", type=float, default=150.0, help="cool2 (the last phase) is skipped past this")
    p.add_argument("--configs", type=int, default=12, help="configs per kernel (the same at every M)")
    p.add_argument("--recorded", type=int, default=3, help="the dataset's fastest stored configs per M that join")
    p.add_argument("--idle-s", type=float, default=12.0, help="idle before each cool pass")
    p.add_argument("--heat-s", type=float, default=25.0, help="cap of the warm-up before the hot pass")
    p.add_argument("--reheat-s", type=float, default=2.0, help="heat before every hot group")
    p.add_argument("--reps-large", type=int, default=8, help="interleaved samples per config at M >= 1024")
    p.add_argument("--reps-small", type=int, default=12, help="interleaved samples per config at M < 1024")
    p.add_argument("--compile-workers", type=int, default=8, help="CPU processes compiling ahead (0: none)")
    p.add_argument("--kernels", default=",".join(KERNELS), help="comma-separated, of " + ", ".join(KERNELS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="CPU: tiny shapes under TRITON_INTERPRET=1, logic only")
    args = p.parse_args(argv)
    bad = [k for k in args.kernels.split(",") if k not in KERNELS]
    if bad:
        p.error(f"unknown kernel(s) {bad}: choose from {list(KERNELS)}")
    if args.configs < 2:
        p.error(f"--configs must be >= 2 to rank anything, got {args.configs}")
    if not args.smoke and not torch.cuda.is_available():
        p.error("no CUDA device: run on the GPU machine, or pass --smoke (with TRITON_INTERPRET=1) for the logic")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {}
    path = out / "clock_study.json"

    def save() -> None:
        path.write_text(json.dumps(result, indent=1, default=str))

    try:
        run(args, result, save)
    finally:  # a failing step still leaves what was measured
        save()
    print(table(result))
    print(f"power over the run: {power.monitor_summary_line(result['power_run'])}")
    print(f"wrote {path} ({result['meta']['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
