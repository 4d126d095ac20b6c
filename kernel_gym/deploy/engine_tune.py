"""`kernel-gym tune --engine vllm|sglang --model SPEC [--tp N] [--ep N]`: a minute of GPU that writes the engine's own
fused-MoE config file for a model, each key confirmed against what the engine already runs and never slower than it.

The search runs in the engine's own kernel design (`vllm_fused_moe`: vLLM's kernel and tunables; vLLM 0.33's
small-batch path where it applies), per vLLM M key (1 ... 4096) at one routing, within one --budget-s:
1. the engine's own entry (its shipped table's nearest-M entry, else its default rule: kernels/vllm_tables.py, for
   the named engine version) is always measured first: the reference every other candidate must beat;
2. the winners of the nearest measured shapes: the fastest stored vllm_fused_moe configs (packaged dataset and
   --store) of the 2 measured shapes nearest in the coverage measure's unit cube (dispatch/shape_coverage.AXES), at
   their nearest M and routing, kept where the knob rules allow them here;
3. one local-search round: the valid one-knob neighbours (vllm_moe.neighbours) of the fastest so far;
4. the fastest is then timed paired and interleaved against the engine entry (kernel_gym.measure.engine_timing, the
   rule benchmarks/vllm_export/run.py applies) and kept only if it still leads by --min-gain; otherwise the key keeps
   the engine entry. So no key is slower than the engine's own entry within that paired measurement.
Every measurement goes to OUT/vllm_fused_moe.sqlite (joins the dataset), progress to OUT/engine_tune_state.json after
each key (--resume continues a stopped run), results and paired confirmations to OUT/engine_tune.json (`kernel-gym
export --confirmations` reads them), and the engine file with its exact name and folder + sidecar to OUT/files/
(vLLM: VLLM_TUNED_CONFIG_FOLDER=OUT/files; SGLang: SGLANG_MOE_CONFIG_DIR=OUT/files, configs/triton_X_Y_Z/).

    kernel-gym tune --engine vllm --model olmoe-1b-7b --budget-s 60 --out out/tune_olmoe        # GPU
    kernel-gym tune --engine sglang --model spec.json --tp 2 --dry-run --out out/x               # CPU: the plan

GPU-side imports: torch, triton, the standard library and kernel_gym (no MLflow, no gymnasium): runs on the GPU
machine as it is.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from kernel_gym.deploy import engine_export as ee
from kernel_gym.kernels import vllm_tables
from kernel_gym.kernels.space import Config

STATE = "engine_tune_state.json"
RESULT = "engine_tune.json"
NEAREST_SHAPES = 2
WINNERS_PER_SHAPE = 3
SMOKE_SHAPE = ee.MoEShape(16, 48, 64, 1, "float32")  # CPU interpreter: the small-batch path at M <= 4
SMOKE_M_KEYS = (1, 3, 16, 40)


def _cube(key: tuple) -> tuple[float, ...]:
    """A shape's point in the coverage measure's unit cube (experts, top-k, hidden, per-shard N)."""
    from kernel_gym.dispatch.shape_coverage import AXES

    e, k, h, n = key[0], key[1], key[2], key[3]
    return tuple((math.log2(max(v, 1)) - lo) / (hi - lo) for v, (_, lo, hi) in zip((e, k, h, n), AXES))


def nearest_shapes(rows: Sequence[ee.Row], shape: ee.MoEShape, device: str,
                   k: int = NEAREST_SHAPES) -> list[tuple[tuple, float]]:
    """The k measured shapes (fixed keys, same dtype, on `device`) nearest to this one, with their distance."""
    here = _cube(shape.fixed_key())
    keys = {(r.workload.num_experts, r.workload.top_k, r.workload.hidden, r.workload.intermediate, r.workload.dtype)
            for r in rows if r.device == device and r.workload.dtype == shape.dtype}
    dist = sorted((math.dist(here, _cube(key)), key) for key in keys)
    return [(key, round(d, 4)) for d, key in dist[:k]]


def nearest_winners(rows: Sequence[ee.Row], shape: ee.MoEShape, m: int, skew: float, device: str,
                    near: list[tuple[tuple, float]], per_shape: int = WINNERS_PER_SHAPE) -> list[Config]:
    """The fastest stored configs (median of repeats) of each nearby shape at its M nearest to m (log scale) and
    its skew nearest to ours, valid at this workload."""
    from kernel_gym.kernels import vllm_moe as vm

    wl = shape.workload(m, skew)
    by_shape: dict[tuple, dict[tuple[int, float], dict[Config, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list)))
    wanted = {key for key, _ in near}
    for r in rows:
        w = r.workload
        key = (w.num_experts, w.top_k, w.hidden, w.intermediate, w.dtype)
        if r.device == device and key in wanted and r.path == ee.ALIGNED:
            by_shape[key][(w.num_tokens, w.skew)][r.config].append(r.median_ms)
    out: list[Config] = []
    for key, _ in near:
        cells = by_shape.get(key)
        if not cells:
            continue
        cell = min(cells, key=lambda c: (abs(math.log2(c[0]) - math.log2(m)), abs(c[1] - skew)))
        times = {c: statistics.median(v) for c, v in cells[cell].items()}
        ranked = sorted(times, key=lambda c: (times[c], str(c)))
        out += [c for c in ranked if vm.SPACE.is_valid(c, wl)][:per_shape]
    return list(dict.fromkeys(out))


def plan(shape: ee.MoEShape, engine: str, device: str, skew: float, rows: Sequence[ee.Row],
         m_keys: Sequence[int], triton_version: str = "") -> dict[str, Any]:
    """What the run will measure per key before any local search (the --dry-run output)."""
    near = nearest_shapes(rows, shape, device)
    keys = []
    for m in m_keys:
        base, source = ee.baseline(shape, m, device, engine, triton_version)
        seeds = [c for c in nearest_winners(rows, shape, m, skew, device, near) if c != base]
        keys.append({"M": m, "engine_entry": {k: base[k] for k in vllm_tables.CONFIG_KEYS}, "engine_source": source,
                     "engine_path": ee.engine_path_kind(shape, m, engine), "seeds": [dict(c) for c in seeds]})
    return {"nearest_shapes": [{"shape": list(k), "distance": d} for k, d in near], "keys": keys}


def _atomic_json(path: Path, data: Any) -> None:
    ee.write_atomic(path, json.dumps(data, indent=1) + "\n")


@dataclass(frozen=True)
class EngineTuneOptions:
    """One `kernel-gym tune --engine` run (module docstring; the options: kernel_gym/cli/tune.py)."""

    engine: str  # vllm or sglang, optionally with a version: vllm-0.33.0
    model: str  # model spec: built-in / zoo name or a JSON file
    out: Path
    tp: int = 1
    ep: int = 1
    routing: str = "uniform"  # uniform or zipf:S
    device: str = ""  # the GPU's name as torch reports it ("": this GPU's)
    triton_version: str = ""  # sglang: the Triton its server runs ("": pinned)
    budget_s: float = 60.0  # seconds for the whole run (compiles included)
    min_gain: float = ee.DEFAULT_MIN_GAIN
    pair_rounds: int = 6
    m_keys: str = ""  # comma-separated subset of vLLM's M keys ("": all)
    stores: tuple[str, ...] = ()  # more vllm_fused_moe rows (besides the packaged)
    no_packaged: bool = False  # use only `stores`' rows
    resume: bool = False  # continue the run in `out`
    dry_run: bool = False  # print the plan (CPU), measure nothing
    smoke: bool = False  # CPU interpreter, a tiny shape: checks the logic
    seed: int = 0


def _setup(opts: EngineTuneOptions) -> tuple[Any, ee.MoEShape, vllm_tables.Engine, str, float, tuple[int, ...]]:
    from kernel_gym.models import load_model

    eng = vllm_tables.parse_engine(opts.engine)
    label, skew = ee.parse_routing(opts.routing)
    if opts.smoke:
        model, shape = None, SMOKE_SHAPE
        m_keys = SMOKE_M_KEYS
    else:
        model = load_model(opts.model)
        shape = ee.shard_shape(model, opts.tp, ep=opts.ep)
        m_keys = vllm_tables.VLLM_M_KEYS
    if opts.m_keys:
        try:
            m_keys = tuple(int(x) for x in opts.m_keys.split(","))
        except ValueError:
            raise ValueError(f"--m-keys {opts.m_keys!r}: give comma-separated batch sizes, e.g. 1,16,256") from None
        if any(m < 1 for m in m_keys):
            raise ValueError(f"--m-keys {opts.m_keys!r}: batch sizes are >= 1")
    if opts.budget_s <= 0:
        raise ValueError(f"--budget-s {opts.budget_s}: give the seconds the run may take, e.g. 60")
    return model, shape, eng, label, skew, m_keys


def tune_engine(opts: EngineTuneOptions) -> int:
    """The run (module docstring): --dry-run prints the plan; otherwise the GPU run (or the CPU smoke)."""
    start = time.time()
    model, shape, eng, label, skew, m_keys = _setup(opts)
    from kernel_gym.measure.store import PACKAGED_SNAPSHOT

    stores = [*opts.stores, *([] if opts.no_packaged else [str(PACKAGED_SNAPSHOT)])]
    rows = ee.measured_rows(stores)
    device = opts.device or ("NVIDIA H200" if opts.dry_run or opts.smoke else "")
    tv = vllm_tables.sglang_triton_version(eng, opts.triton_version) if eng.name == "sglang" else ""
    if opts.dry_run:
        pl = plan(shape, eng.id, device, skew, rows, m_keys, tv)
        path = ee.engine_path(opts.out / "files", eng.name, shape, device, tv or "0.0.0")
        print(f"plan: {eng.id} file {path} for {opts.model} tp{opts.tp} ep{opts.ep} "
              f"(E={shape.num_experts}, N={shape.n}, H={shape.hidden}, top_k={shape.top_k}), routing {label}, "
              f"budget {opts.budget_s:.0f} s")
        print("nearest measured shapes (E, top_k, H, N, dtype; unit-cube distance): " + ", ".join(
            f"{tuple(s['shape'][:4])} {s['distance']:.3f}" for s in pl["nearest_shapes"]) or "none")
        for k in pl["keys"]:
            print(f"  M={k['M']:5d}: engine entry ({k['engine_source']}, {k['engine_path']} path; M/N/K/group/"
                  f"warps/stages {','.join(str(v) for v in k['engine_entry'].values())}) + {len(k['seeds'])} "
                  "nearest-shape winners, then one round of its best's neighbours, then paired vs the engine entry")
        print(f"the run stops at --budget-s {opts.budget_s:.0f} s (compiles included); keys it does not reach keep the "
              "engine entry; nothing measured (--dry-run)")
        return 0
    return _run(opts, model, shape, eng, label, skew, m_keys, rows, tv, start)


def _run(opts: EngineTuneOptions, model: Any, shape: ee.MoEShape, eng: vllm_tables.Engine, label: str, skew: float,
         m_keys: tuple[int, ...], rows: Sequence[ee.Row], tv: str, start: float) -> int:
    """The GPU run (or the CPU smoke): per key sweep, local search, paired confirmation; state after each key."""
    import torch
    import triton

    from kernel_gym.kernels import fused_moe as fm
    from kernel_gym.kernels import vllm_moe as vm
    from kernel_gym.measure.engine_timing import Timer, gpu_state, log
    from kernel_gym.measure.store import Context, MeasurementStore

    cuda = torch.cuda.is_available() and not opts.smoke
    if not cuda and not opts.smoke:
        raise SystemExit("tune --engine: no CUDA GPU here; run it on the GPU, or pass --dry-run for the plan "
                         "(or --smoke under TRITON_INTERPRET=1 to check the logic)")
    dev = "cuda" if cuda else "cpu"
    gpu = torch.cuda.get_device_name() if cuda else "cpu-interpreter"
    device = opts.device or (gpu if cuda else "NVIDIA H200")
    out: Path = opts.out
    out.mkdir(parents=True, exist_ok=True)
    ident = {"engine": eng.id, "model": opts.model, "tp": opts.tp, "ep": opts.ep, "routing": label,
             "shape": shape.describe(), "device": device}
    state: dict[str, Any] = {"ident": ident, "keys": {}}
    if opts.resume and (out / STATE).exists():
        old = json.loads((out / STATE).read_text())
        if old.get("ident") != ident:
            raise ValueError(f"--resume: {out / STATE} is another run ({old.get('ident')}); use another --out")
        state = old
    elif (out / STATE).exists():
        raise ValueError(f"{out / STATE} exists: pass --resume to continue that run, or another --out")
    store = MeasurementStore(out / "vllm_fused_moe.sqlite")
    ctxs = {ee.ALIGNED: Context(gpu, torch.__version__, triton.__version__, vm.FAMILY.name, vm.store_key()),
            ee.SMALL_BATCH: Context(gpu, torch.__version__, triton.__version__, vm.FAMILY.name,
                                    vm.small_batch_store_key())}
    timer = Timer(cuda)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    near = nearest_shapes(rows, shape, device)
    log(f"{eng.id} tune: {opts.model} E={shape.num_experts} N={shape.n} H={shape.hidden} top_k={shape.top_k} "
        f"{label} on {gpu}; {len(m_keys)} keys, budget {opts.budget_s:.0f} s; nearest measured shapes "
        f"{[k[:4] for k, _ in near]}")
    todo = [m for m in m_keys if str(m) not in state["keys"]]
    compiler = None
    if cuda and todo:  # the aligned path's likely candidates compile ahead in CPU processes (one compile serves all M)
        from kernel_gym.measure.compiler import CompilePool

        likely: list[Config] = []
        for m in todo:
            wl = shape.workload(m, skew)
            base = ee.baseline(shape, m, device, eng.id, tv)[0]
            likely += [base, *nearest_winners(rows, shape, m, skew, device, near), *vm.neighbours(base, wl)]
        likely = list(dict.fromkeys(likely))
        workers = max(1, min(12, (os.cpu_count() or 4) - 2))
        compiler = CompilePool(workers, {k: os.environ[k] for k in ("TRITON_CACHE_DIR",) if k in os.environ})
        futures = compiler.submit(vm.FAMILY.name, shape.workload(256, skew).key(), [str(c) for c in likely], chunk=4)
        t0 = time.time()
        done = compiler.collect(futures, timeout_s=max(5.0, min(60.0, 0.3 * opts.budget_s)))
        log(f"compiled {len(done)} of {len(likely)} likely configs ahead in {time.time() - t0:.1f} s "
            f"({workers} processes)")
    weights = None
    if cuda:
        first = fm.make_inputs(shape.workload(1, skew), dev, opts.seed)
        weights = (first.w1, first.w2)
    end = start + opts.budget_s
    for i, m in enumerate(todo):
        if time.time() > end - 2:
            log(f"budget spent: {len(todo) - i} keys left at the engine entry (--resume continues)")
            break
        # the sweep's share of this key's time; the paired confirmation takes the rest
        key_deadline = time.time() + max(1.0, 0.75 * (end - time.time()) / (len(todo) - i))
        wl = shape.workload(m, skew)
        if weights is None:
            inputs = fm.make_inputs(wl, dev, opts.seed)
        else:
            gen = torch.Generator(device=dev).manual_seed(opts.seed + m)
            x = torch.randn(m, shape.hidden, generator=gen, device=dev, dtype=weights[0].dtype)
            inputs = fm.MoEInputs(wl, x, fm.router_logits(wl, opts.seed + m).to(dev), *weights)
        ref = vm.FAMILY.reference(inputs)
        base, source = ee.baseline(shape, m, device, eng.id, tv)
        kind = ee.engine_path_kind(shape, m, eng.id)
        before = gpu_state()
        rec, measured = _tune_key(inputs, ref, base, wl, rows, near, device, timer, sync, eng.id, key_deadline, opts)
        rec.update(engine_source=source, engine_path=kind)
        store.put_many(ctxs[kind], measured)
        rec.update(gpu_before=before, gpu_after=gpu_state())
        state["keys"][str(m)] = rec
        _atomic_json(out / STATE, state)
        log(f"  M={m:5d} ({kind}): {rec.get('configs_timed', 0)} timed; {rec['basis']}"
            + (f" x{rec['paired_gain']:.3f}" if rec["basis"] == ee.CONFIRMED else "")
            + (f" (pick x{rec['paired_engine_ms'] / rec['paired_pick_ms']:.3f} paired: dropped)"
               if "pick" in rec and rec["basis"] != ee.CONFIRMED else ""))
        del inputs, ref
        if cuda:
            torch.cuda.empty_cache()
    store.close()
    if compiler is not None:
        compiler.close()
    return _finish(opts, shape, eng, label, skew, state, device, tv, timer, gpu, start, triton.__version__)


def _tune_key(inputs: Any, ref: Any, base: Config, wl: Any, rows: Sequence[ee.Row], near: list, device: str,
              timer: Any, sync: Any, engine: str, deadline: float, opts: EngineTuneOptions) -> tuple[dict, list]:
    """One key: the engine entry, the nearest shapes' winners, one local-search round, paired confirmation."""
    from kernel_gym.kernels import vllm_moe as vm
    from kernel_gym.measure.engine_timing import confirm, measure_config

    times: dict[Config, float] = {}
    fns: dict[Config, Any] = {}
    measured: list = []

    def run(c: Config) -> None:
        meas, fn = measure_config(inputs, ref, c, timer, sync, engine)
        measured.append(meas)
        if fn is not None:
            times[c], fns[c] = meas.median_ms, fn

    run(base)
    m, skew = wl.num_tokens, wl.skew
    rec: dict[str, Any] = {"M": m, "engine_entry": dict(base)}
    if base not in fns:
        rec.update(chosen=dict(base), basis=ee.ENGINE, configs_timed=0, failed=len(measured), error=next(
            (x.reason for x in measured if x.config == str(base)), "engine entry failed"))
        return rec, measured
    shape = ee.MoEShape(wl.num_experts, wl.hidden, wl.intermediate, wl.top_k, wl.dtype)
    for c in nearest_winners(rows, shape, m, skew, device, near):  # 2. nearest-shape winners
        if time.time() > deadline:
            break
        if c not in times:
            run(c)
    tried = {x.config for x in measured}
    best = min(times, key=lambda c: (times[c], str(c)))
    for c in vm.neighbours(best, wl):  # 3. one local-search round around the best so far
        if time.time() > deadline:
            break
        if str(c) not in tried:
            run(c)
    best = min(times, key=lambda c: (times[c], str(c)))
    rec.update(configs_timed=len(times), failed=sum(not x.ok for x in measured), sweep_engine_ms=times[base],
               sweep_best_ms=times[best])
    chosen, gain = base, 1.0
    if best != base:  # 4. paired, interleaved against the engine entry
        kept, t_base, t_pick = confirm(timer, fns[base], fns[best], opts.pair_rounds, opts.min_gain)
        rec.update(paired_engine_ms=t_base, paired_pick_ms=t_pick, pick=dict(best))
        if kept:
            chosen, gain = best, t_base / t_pick
    rec.update(chosen=dict(chosen), paired_gain=round(gain, 4), basis=ee.CONFIRMED if chosen != base else ee.ENGINE)
    fns.clear()
    return rec, measured


def _finish(opts: EngineTuneOptions, shape: ee.MoEShape, eng: vllm_tables.Engine, label: str, skew: float,
            state: dict[str, Any], device: str, tv: str, timer: Any, gpu: str, start: float,
            measured_tv: str) -> int:
    """The engine file over every vLLM key (keys not reached keep the engine entry), its sidecar, engine_tune.json."""
    from kernel_gym.kernels import vllm_moe as vm

    content, report, confirmations = {}, [], []
    keys = sorted({*vllm_tables.VLLM_M_KEYS, *(int(k) for k in state["keys"])})
    for m in keys:
        rec = state["keys"].get(str(m))
        base, source = ee.baseline(shape, m, device, eng.id, tv)
        if rec and rec["basis"] == ee.CONFIRMED:
            content[str(m)] = vm.to_entry(Config(rec["chosen"]))
            confirmations.append({"shape": shape.describe(), "M": m, "routing": label, "skew": skew,
                                  "device": device, "engine": eng.id, "engine_path": rec["engine_path"],
                                  "engine_entry": rec["engine_entry"], "config": rec["chosen"],
                                  "gain": rec["paired_gain"]})
        else:
            content[str(m)] = vm.to_entry(base)
        report.append({"M": m, "baseline": source, "basis": rec["basis"] if rec else ee.ENGINE,
                       "changed": bool(rec and rec["basis"] == ee.CONFIRMED),
                       "confirmed_by": "paired (kernel-gym tune --engine)" if rec and rec["basis"] == ee.CONFIRMED
                       else None, "measured_gain": rec.get("paired_gain", 1.0) if rec else 1.0,
                       "tuned": rec is not None, "engine_path": ee.engine_path_kind(shape, m, eng.id)})
    summary = {b: sum(k["basis"] == b for k in report) for b in (ee.CONFIRMED, ee.SINGLE, ee.ENGINE)}
    note = {"estimate": False, "why": "", "engine": eng.id, "engine_name": eng.name, "engine_version": eng.version,
            "model": opts.model, "tp": opts.tp, "ep": opts.ep, "shape": shape.describe(), "device": device,
            "measured_on": gpu, "measured_triton_version": measured_tv, "routing": label, "skew": skew,
            "min_gain": opts.min_gain, "summary": summary, "keys": report,
            "source": "kernel-gym tune --engine (kernel_gym/deploy/engine_tune.py)",
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if eng.name == "sglang":
        note["triton_version"] = tv
    path = ee.write_engine_file(opts.out / "files", eng.name, shape, device, content, tv or "0.0.0", note)
    gpu_s = round(timer.gpu_s, 1)
    wall = round(time.time() - start, 1)
    result = {"meta": {"engine": eng.id, "model": opts.model, "tp": opts.tp, "ep": opts.ep, "routing": label,
                       "routings": {label: skew}, "device": device, "engine_device_name": device, "gpu": gpu,
                       "budget_s": opts.budget_s, "seconds": wall, "gpu_timing_s": gpu_s,
                       "keys_tuned": len(state["keys"]), "smoke": opts.smoke,
                       "source_hash": vm.store_key(), "small_batch_source_hash": vm.small_batch_store_key()},
              "file": str(path.relative_to(opts.out)), "summary": summary, "keys": state["keys"],
              "confirmations": confirmations}
    _atomic_json(opts.out / RESULT, result)
    print(f"\n{eng.id} {opts.model} tp{opts.tp} ep{opts.ep} {label}: {len(state['keys'])} of "
          f"{len(keys)} keys tuned; {summary[ee.CONFIRMED]} changed (paired-confirmed), "
          f"{summary[ee.ENGINE]} keep the engine entry")
    print("    M  path         basis               paired gain  configs")
    for m in keys:
        rec = state["keys"].get(str(m))
        if rec:
            print(f"{m:5d}  {rec['engine_path']:11s}  {rec['basis']:18s}  {rec.get('paired_gain', 1.0):>11.3f}  "
                  f"{rec.get('configs_timed', 0):>7d}")
    print(f"wrote {path} (+ {ee.SIDECAR}), {opts.out / RESULT}; {wall:.0f} s wall, {gpu_s:.0f} GPU-s timing")
    return 0
