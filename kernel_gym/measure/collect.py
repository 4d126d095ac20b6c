"""`kernel-gym collect`: fill the measurement store on the GPU machine (plan, budget, progress, resume, multi-GPU).

The plan lists (kernel, workload, configs): for each kernel and model, every valid config on the evaluation shapes
(model_workloads(..., grid="eval")) and a seeded sample of valid configs (plus the family's default config) on the
other traffic shapes (grid="default"). Work is ordered by workload, so each workload's inputs and torch reference are
built once, and split into chunks (one store commit per chunk). Configs already stored for this device, software and
kernel source are skipped: a killed run resumes where it stopped. With several GPUs, one shard process per GPU
(CUDA_VISIBLE_DEVICES) takes every n-th workload; all append to the same SQLite file (WAL). A CPU pool compiles the
next chunks' configs while the GPU times the current one. The budget stops the run cleanly between chunks.

Imports only torch, triton, numpy and the standard library.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import random
import re
import socket
import sqlite3
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_gym.kernels import profiles
from kernel_gym.kernels.space import Config, KernelFamily
from kernel_gym.measure.store import Context, MeasurementStore
from kernel_gym.measure.timing import DEFAULT_TIMING, TimingOptions
from kernel_gym.measure.types import INVALID, OK
from kernel_gym.measure.worker import die_with_parent, family_store_key, resolve_family, workload_from_key

CHUNK = 64  # configs per unit of work (one store commit)
H200_PEAK_FLOPS = 700e12  # measured ceilings (docs/architecture.md), rounded down
H200_PEAK_BYTES = 3.5e12


@dataclass(frozen=True)
class PlanItem:
    """Configs of one workload to measure (one chunk)."""

    kernel: str  # family reference (kernel name or module:ATTR)
    workload_key: str
    configs: tuple[str, ...]
    grid: str


@dataclass
class CollectOptions:
    """Arguments of one collection (`kernel-gym collect`'s options: kernel_gym/cli/collect.py)."""

    models: list[str] = field(default_factory=lambda: ["mixtral-8x7b", "olmoe-1b-7b"])
    # the kernels a dispatch table serves (profiles with dispatch axes): fused_moe, decode_attention, prefill_attention
    kernels: list[str] = field(default_factory=lambda: list(profiles.names_with("dispatch_axes")))
    grids: list[str] = field(default_factory=lambda: ["eval", "default"])
    configs_per_shape: int = 48  # sampled configs per non-eval shape
    budget_s: float = 0.0  # 0 = no budget
    db: str = "measurements.sqlite"
    out: str = ""  # export a compressed snapshot here at the end
    gpus: int = 0  # 0 = every visible GPU
    compile_workers: int = -1  # -1 = CPU cores minus one per GPU
    device: str = "cuda"  # "cpu": interpreter (correctness only; tests)
    seed: int = 0
    timing: TimingOptions = field(default_factory=TimingOptions)
    remeasure_noisy: bool = False  # measure again the stored ok rows too noisy to rank (recorded.MAX_SPREAD)
    plan_file: str = ""  # measure exactly these (kernel, workload, configs) instead of the grids (load_plan_file)


# ---- the plan ---------------------------------------------------------------------------------------------------


def _workloads(fam: KernelFamily, kernel: str, model: Any, grid: str) -> list[Any]:
    hook = getattr(fam, "plan_workloads", None)  # optional hook for families outside model_workloads (tests)
    if hook is not None:
        return list(hook(model, grid))
    from kernel_gym.kernels.workloads import model_workloads

    return model_workloads(kernel, model, grid)


def _stable_seed(*parts: Any) -> int:
    return int(hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16], 16)


def _valid_configs(ref: str, wkey: str) -> list[str]:
    fam = resolve_family(ref)
    return [str(c) for c in fam.space.valid_configs(workload_from_key(fam, wkey))]


def _all_valid(jobs: list[tuple[str, str]], workers: int) -> dict[tuple[str, str], list[str]]:
    """Valid configs per (kernel, workload): checking every rule for every config is seconds of CPU per kernel, so
    it is spread over a process pool when there are many workloads."""
    if workers <= 1 or len(jobs) < 16:
        return {job: _valid_configs(*job) for job in jobs}
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        return dict(zip(jobs, pool.map(_valid_configs, *zip(*jobs), chunksize=4)))


def _chunks(kernel: str, wkey: str, configs: list[str], grid: str) -> list[PlanItem]:
    """One workload's configs (duplicates dropped) as chunks of CHUNK, configs sharing a KV layout back to back."""
    ordered = sorted(dict.fromkeys(configs), key=_layout_key)
    return [PlanItem(kernel, wkey, tuple(ordered[i:i + CHUNK]), grid) for i in range(0, len(ordered), CHUNK)]


def _layout_key(config: str) -> tuple:
    """Sort key that groups configs by their data-layout knobs (decode: PAGE_SIZE, LAYOUT), so a family can reuse
    the inputs it re-laid out for the previous config."""
    c = json.loads(config)
    return (c.get("PAGE_SIZE", 0), str(c.get("LAYOUT", "")))


def build_plan(opts: CollectOptions) -> list[list[PlanItem]]:
    """Per workload, its chunks; workloads ordered round-robin over (kernel, model) streams, eval shapes first, so a
    budget cut leaves every kernel and model covered."""
    from kernel_gym.models import load_model

    listed: list[tuple[str, Any, str, str]] = []  # (kernel, model name, grid, workload key)
    seen: set[tuple[str, str]] = set()
    for kernel in opts.kernels:
        fam = resolve_family(kernel)
        for model_name in opts.models:
            for grid in opts.grids:
                for wl in _workloads(fam, kernel, load_model(model_name), grid):
                    if (kernel, wl.key()) not in seen:
                        seen.add((kernel, wl.key()))
                        listed.append((kernel, model_name, grid, wl.key()))
    valid_of = _all_valid([(k, w) for k, _, _, w in listed], min(16, os.cpu_count() or 1))
    order_of: dict[str, list[str]] = {}
    for kernel in opts.kernels:
        order_of[kernel] = [str(c) for c in resolve_family(kernel).space.all_configs()]
        random.Random(_stable_seed(opts.seed, kernel)).shuffle(order_of[kernel])
    streams: list[list[list[PlanItem]]] = []
    for kernel in opts.kernels:
        fam = resolve_family(kernel)
        for model_name in opts.models:
            stream: list[list[PlanItem]] = []
            for k, m, grid, wkey in listed:
                if (k, m) != (kernel, model_name):
                    continue
                valid = valid_of[(k, wkey)]
                if grid == "eval":
                    chosen = valid
                else:
                    # The same seeded order of the whole space for every shape of a kernel: the sampled configs are
                    # (up to validity) the same at every shape, so the recorded backend can interpolate between
                    # shapes and a policy's choice is measured on every shape it may meet.
                    valid_set = set(valid)
                    chosen = [c for c in order_of[kernel] if c in valid_set][:opts.configs_per_shape]
                    wl = workload_from_key(fam, wkey)
                    default = fam.default_config(wl)
                    if str(default) not in chosen and fam.space.is_valid(default, wl):
                        chosen = [str(default), *chosen]
                stream.append(_chunks(kernel, wkey, chosen, grid))
            streams.append(stream)
    ordered: list[list[PlanItem]] = []
    for i in range(max((len(s) for s in streams), default=0)):
        ordered.extend(s[i] for s in streams if i < len(s))
    return ordered


def load_plan_file(path: str, kernels: list[str]) -> list[list[PlanItem]]:
    """A plan written by another tool (scripts/plan_coverage.py): a JSON (or .json.gz) list of {"kernel", "workload",
    "configs" (list of config JSON)}. Kernels outside `kernels` and configs the knob space rejects are an error that
    names them, so a stale plan cannot store rows the recorded backend would never answer."""
    try:
        if path.endswith(".gz"):
            import gzip

            with gzip.open(path, "rt") as f:
                entries = json.load(f)
        else:
            entries = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"--plan {path}: cannot read a JSON plan ({e})") from e
    if not isinstance(entries, list):
        raise SystemExit(f"--plan {path}: expected a JSON list of {{kernel, workload, configs}} entries")
    merged: dict[tuple[str, str], list[str]] = {}  # (kernel, workload key) -> configs; repeated entries merge
    for n, e in enumerate(entries):
        if not isinstance(e, dict) or not {"kernel", "workload", "configs"} <= set(e) or not isinstance(
                e["configs"], list):
            raise SystemExit(f"--plan {path}: entry {n} needs kernel, workload (a workload key) and configs (a list)")
        if e["kernel"] not in kernels:
            raise SystemExit(f"--plan {path}: entry {n} is for kernel {e['kernel']!r}, not one of --kernels {kernels}")
        fam = resolve_family(e["kernel"])
        try:
            if json.loads(e["workload"]).get("kernel", fam.name) != fam.name:
                raise ValueError(f"the workload key is for kernel {json.loads(e['workload'])['kernel']!r}")
            wl = workload_from_key(fam, e["workload"])
            configs = [str(Config.parse(c) if isinstance(c, str) else Config(c)) for c in e["configs"]]
        except (ValueError, TypeError, AttributeError) as exc:
            raise SystemExit(f"--plan {path}: entry {n} ({e['kernel']}): {type(exc).__name__}: {exc}") from exc
        for c in configs:
            why = fam.space.why_invalid(Config.parse(c), wl)
            if why:
                raise SystemExit(f"--plan {path}: entry {n}: config {c} is invalid for {e['workload']}: {why}")
        merged.setdefault((e["kernel"], wl.key()), []).extend(configs)
    return [_chunks(kernel, wkey, configs, "plan") for (kernel, wkey), configs in merged.items()]


def contexts_for(kernels: list[str], device_name: str) -> dict[str, Context]:
    out = {}
    for ref in kernels:
        fam = resolve_family(ref)
        out[ref] = Context.current(fam.name, family_store_key(fam), device=device_name)
    return out


def drop_done(plan: list[list[PlanItem]], store: MeasurementStore,
              contexts: dict[str, Context]) -> list[list[PlanItem]]:
    """The plan without what the store already holds (resume)."""
    return without_done(plan, {ref: store.done_keys(ctx) for ref, ctx in contexts.items()})


def without_done(plan: list[list[PlanItem]], done: dict[str, set[tuple[str, str]]]) -> list[list[PlanItem]]:
    """The plan without the (workload, config) pairs in `done` (per kernel)."""
    out = []
    for chunks in plan:
        kept = []
        for item in chunks:
            cfgs = tuple(c for c in item.configs if (item.workload_key, c) not in done.get(item.kernel, set()))
            if cfgs:
                kept.append(PlanItem(item.kernel, item.workload_key, cfgs, item.grid))
        if kept:
            out.append(kept)
    return out


def noisy_plan(store: MeasurementStore, contexts: dict[str, Context], max_spread: float) -> list[list[PlanItem]]:
    """The stored ok rows of these contexts whose spread exceeds max_spread, as a plan (one entry per workload)."""
    out = []
    for ref, ctx in contexts.items():
        by_workload: dict[str, list[str]] = {}
        for wkey, cfg in store.noisy_keys(ctx, max_spread):
            by_workload.setdefault(wkey, []).append(cfg)
        out.extend(_chunks(ref, wkey, cfgs, "noisy") for wkey, cfgs in by_workload.items())
    return out


# Wall seconds per measured config per GPU on past H200 runs (compiles on the host's pool included: they set the pace,
# and the committed runs' hosts gave each GPU 8-15 compile workers): the median and the 10th-90th percentile of the
# collect / tune logs committed under benchmarks/ (H200 runs of 500+ configs measured to the end), as
# `fit_projection(committed_logs())` refits them (tests/measure/test_projection.py checks them against it). The
# roofline alone projected those runs at 1/4 to 1/40 of their time.
SECONDS_PER_CONFIG = 0.043
SECONDS_PER_CONFIG_RANGE = (0.027, 0.12)
_PLAN_LINE = re.compile(r"device (.*?) x(\d+), compile pool \d+; plan: \d+ workloads, \d+ configs; already stored "
                        r"\d+; to measure (\d+)")
_WROTE_LINE = re.compile(r"wrote (\d+) rows in (?:(\d+)h)?(\d+)m(\d+)s")


def committed_logs(root: Path | None = None) -> list[Path]:
    """The collect / tune logs in the repository's benchmarks/ folder (empty in an installed package)."""
    root = root or Path(__file__).resolve().parents[2] / "benchmarks"
    return sorted(p for ext in ("*.log", "*.txt") for p in root.rglob(ext))


def fit_projection(logs: list[Path], min_configs: int = 500, device: str = "H200") -> dict[str, Any]:
    """Seconds per config per GPU of each finished run on `device` in `logs` (wall x GPUs / configs), their median and
    10th-90th percentile: what SECONDS_PER_CONFIG and its range are set from."""
    import numpy as np

    runs = []
    for path in logs:
        text = path.read_text(errors="replace")
        plan, wrote = _PLAN_LINE.search(text), _WROTE_LINE.search(text)
        if not plan or not wrote or device not in plan.group(1):
            continue
        gpus, todo = int(plan.group(2)), int(plan.group(3))
        wall = int(wrote.group(2) or 0) * 3600 + int(wrote.group(3)) * 60 + int(wrote.group(4))
        if int(wrote.group(1)) == todo >= min_configs:
            runs.append({"log": str(path), "device": plan.group(1), "gpus": gpus, "configs": todo, "wall_s": wall,
                         "s_per_config": wall * gpus / todo})
    rates = np.array([r["s_per_config"] for r in runs])
    return {"runs": runs, "median": float(np.median(rates)) if runs else None,
            "range": (float(np.percentile(rates, 10)), float(np.percentile(rates, 90))) if runs else None}


def estimate_seconds(plan: list[list[PlanItem]], opts: CollectOptions, n_gpus: int) -> dict[str, float]:
    """A projection. `gpu_s`: a roofline of the timing alone (kernel at 1/3 of peak on average, plus the 256 MB L2
    flush per sample and ~0.5 ms host overhead per config), which balances the farm's chunks. `projected_s` (and
    `projected_range_s`): the configs x SECONDS_PER_CONFIG of past H200 runs over the GPUs, never below the roofline.
    The past runs' pace already holds their hosts' compile pools, so the projecting machine's pool does not enter."""
    gpu_s = 0.0
    configs = 0
    fams: dict[str, KernelFamily] = {}
    kernel_s: dict[tuple[str, str], float] = {}  # per workload once: bytes_moved routes every token (M x E work)
    for chunks in plan:
        for item in chunks:
            fam = fams.setdefault(item.kernel, resolve_family(item.kernel))
            key = (item.kernel, item.workload_key)
            if key not in kernel_s:
                wl = workload_from_key(fam, item.workload_key)
                kernel_s[key] = 3 * max(fam.flops(wl) / H200_PEAK_FLOPS, fam.bytes_moved(wl) / H200_PEAK_BYTES)
            t_kernel = kernel_s[key]
            per_config = (1 + opts.timing.min_reps) * (t_kernel + 80e-6) + 0.5e-3
            gpu_s += per_config * len(item.configs)
            configs += len(item.configs)
    gpus = max(1, n_gpus)
    gpu_s /= gpus
    lo, hi = (max(gpu_s, configs * r / gpus) for r in SECONDS_PER_CONFIG_RANGE)
    return {"gpu_s": gpu_s, "projected_s": max(gpu_s, configs * SECONDS_PER_CONFIG / gpus),
            "projected_range_s": (lo, hi)}


# ---- shards (one per GPU) -----------------------------------------------------------------------------------------


def run_shard(items: list[PlanItem], db: str, contexts: dict[str, Context], gpu: int | None, device: str,
              compile_workers: int, deadline: float, timing: TimingOptions, replace: bool = False) -> int:
    """Measure the items in order, committing one chunk at a time; stops between chunks before the deadline: a chunk
    is not started when the chunks so far say it would end past it (a `--budget-s 60` run stays within 60 s instead
    of finishing the chunk in flight: tune overran its 60 s by 6 s that way). replace: the items are
    re-measurements that overwrite their stored rows."""
    die_with_parent()
    from kernel_gym.measure.live import LiveBackend

    store = MeasurementStore(db)
    written = 0
    origin = (socket.gethostname(), "" if gpu is None else str(gpu))  # stored with each row (host, gpu columns)
    fams = {ref: resolve_family(ref) for ref in contexts}
    lookahead = max(2, (2 * compile_workers * 8) // CHUNK)
    with LiveBackend(gpu=gpu, device=device, compile_workers=compile_workers, timing=timing) as backend:
        took: list[float] = []  # seconds per chunk so far
        for i, item in enumerate(items):
            expected = sorted(took)[len(took) // 2] if took else 0.0
            if deadline and time.time() + expected >= deadline:
                break
            started = time.time()
            for nxt in items[i + 1:i + 1 + lookahead]:
                fam = fams[nxt.kernel]
                backend.prefetch(fam, workload_from_key(fam, nxt.workload_key), [Config.parse(c) for c in nxt.configs])
            fam = fams[item.kernel]
            wl = workload_from_key(fam, item.workload_key)
            ms = backend.measure_many(fam, wl, [Config.parse(c) for c in item.configs])
            if replace:  # a re-measurement that fails keeps the stored ok row: nothing already measured is lost
                for m in (m for m in ms if m.status != OK):
                    print(f"\n[collect] re-measurement {m.status} ({m.reason}), stored row kept: {m.kernel} "
                          f"{m.workload} {m.config}" + (" (the knob space rejects it now; the recorded backend "
                                                        "answers it invalid)" if m.status == INVALID else ""),
                          file=sys.stderr)
                ms = [m for m in ms if m.status == OK]
            written += store.put_many(contexts[item.kernel], ms, replace=replace, origin=origin)
            took.append(time.time() - started)
    store.close()
    return written


def _shard_entry(*args: Any) -> None:
    run_shard(*args)


def _progress(db: str, remaining: int, t0: float, deadline: float, stop: threading.Event, log: Any) -> None:
    """Progress bar on stderr every 2 s, from the rows written since t0 (counts every shard's commits, inserted or
    replaced)."""
    store = MeasurementStore(db)
    try:
        while not stop.wait(2.0):
            done = store.count(since=t0)
            rate = done / max(1e-9, time.time() - t0)
            eta = _fmt((remaining - done) / rate) if rate > 0 else "?"
            pct = 100.0 * done / max(1, remaining)
            bar = "#" * int(pct / 4) + "." * (25 - int(pct / 4))
            left = f", budget left {_fmt(deadline - time.time())}" if deadline else ""
            print(f"\r[collect] [{bar}] {done}/{remaining} {pct:5.1f}% {rate:6.1f}/s ETA {eta}{left}"
                  f"{_last_clocks(store, t0)}   ", end="", file=log, flush=True)
    finally:
        store.close()


def _last_clocks(store: MeasurementStore, since: float) -> str:
    """", GPU 1512 MHz 688 W 61 C sw_power_cap": the state the latest row written since `since` was timed under
    (measure/power.py), or "" where none is recorded."""
    from kernel_gym.measure.power import PowerSummary

    try:
        row = store.conn.execute("SELECT power FROM measurements WHERE created >= ? AND power != '' "
                                 "ORDER BY id DESC LIMIT 1", (since,)).fetchone()
        p = PowerSummary.from_compact(row[0]) if row else None
    except (sqlite3.OperationalError, ValueError):  # a store without the column, or a state not written by us
        return ""
    return "" if p is None else f", GPU {p.short()}"


def _visible_gpus(device: str) -> list[int | None]:
    if device == "cpu":
        return [None]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip():
        return [int(x) for x in visible.split(",") if x.strip()]
    import torch

    n = torch.cuda.device_count()
    if n == 0:
        raise SystemExit("collect: no CUDA GPU visible; run on the GPU machine, or pass --device cpu (interpreter, "
                         "correctness only)")
    return list(range(n))


def _fmt(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s" if seconds >= 3600 else \
        f"{seconds // 60}m{seconds % 60:02d}s"


def collect(opts: CollectOptions, log: Any = sys.stderr) -> dict[str, Any]:
    """Run a collection; returns a summary dict (rows planned, written, seconds, stopped by budget)."""
    t0 = time.time()
    deadline = t0 + opts.budget_s if opts.budget_s > 0 else 0.0
    gpus = _visible_gpus(opts.device)
    if opts.gpus:
        if opts.gpus > len(gpus):
            raise SystemExit(f"collect: --gpus {opts.gpus} but only {len(gpus)} visible ({gpus})")
        gpus = gpus[:opts.gpus]
    pool = opts.compile_workers if opts.compile_workers >= 0 else max(0, (os.cpu_count() or 2) - len(gpus))
    pool = pool if opts.device == "cuda" else 0
    pool_per_gpu = pool // len(gpus)
    if opts.device == "cuda":
        import torch

        device_name = torch.cuda.get_device_name(0)
    else:
        device_name = "cpu-interpreter"
    contexts = contexts_for(opts.kernels, device_name)
    store = MeasurementStore(opts.db)
    from kernel_gym.measure.recorded import MAX_SPREAD

    if opts.remeasure_noisy:
        plan = todo = noisy_plan(store, contexts, MAX_SPREAD)
        total = remaining = sum(len(i.configs) for chunks in todo for i in chunks)
        print(f"[collect] re-measuring {remaining} stored ok rows with spread > {MAX_SPREAD}", file=log)
    else:
        plan = load_plan_file(opts.plan_file, opts.kernels) if opts.plan_file else build_plan(opts)
        total = sum(len(i.configs) for chunks in plan for i in chunks)
        todo = drop_done(plan, store, contexts)
        remaining = sum(len(i.configs) for chunks in todo for i in chunks)
    est = estimate_seconds(todo, opts, len(gpus))
    print(f"[collect] device {device_name} x{len(gpus)}, compile pool {pool}; plan: {len(plan)} workloads, "
          f"{total} configs; already stored {total - remaining}; to measure {remaining}", file=log)
    budget = _fmt(opts.budget_s) if opts.budget_s else "none"
    lo, hi = est["projected_range_s"]
    print(f"[collect] projected {_fmt(est['projected_s'])} ({_fmt(lo)} to {_fmt(hi)} at past H200 runs' pace per GPU; "
          f"the timing alone ~{_fmt(est['gpu_s'])}); budget {budget}", file=log)
    for ref, ctx in contexts.items():
        store.set_meta(f"context:{ref}", ctx.__dict__)
    shards: list[list[PlanItem]] = [[] for _ in gpus]
    for i, chunks in enumerate(todo):
        shards[i % len(gpus)].extend(chunks)
    stop = threading.Event()
    monitor = threading.Thread(target=_progress, args=(opts.db, remaining, t0, deadline, stop, log),
                               daemon=True)
    monitor.start()
    procs = []
    try:
        busy = [(gpu, items) for gpu, items in zip(gpus, shards) if items]
        if len(busy) == 1:  # one GPU: this process is the shard (one process fewer to start)
            run_shard(busy[0][1], opts.db, contexts, busy[0][0], opts.device, pool_per_gpu, deadline, opts.timing,
                      opts.remeasure_noisy)
        else:
            ctx = mp.get_context("spawn")
            for gpu, items in busy:
                p = ctx.Process(target=_shard_entry, args=(items, opts.db, contexts, gpu, opts.device, pool_per_gpu,
                                                           deadline, opts.timing, opts.remeasure_noisy))
                p.start()
                procs.append(p)
            for p in procs:
                p.join()
    except KeyboardInterrupt:
        for p in procs:
            p.terminate()
        raise
    finally:
        stop.set()
        monitor.join()
    # a shard stops at the deadline or before a chunk that would overrun it: with a budget, rows left unwritten
    # (every measured config writes a row, failures too) mean the budget cut the run
    budget_ran_out = bool(deadline)
    written = store.count(since=t0)
    if opts.remeasure_noisy:
        still = sum(len(store.noisy_keys(c, MAX_SPREAD)) for c in contexts.values())
        print(f"\n[collect] re-measured {written} of {remaining} rows; {still} are still too noisy", file=log)
    print(f"\n[collect] wrote {written} rows in {_fmt(time.time() - t0)}; store holds {store.count()} rows; "
          f"integrity {store.integrity_check()}", file=log)
    failed = [p.exitcode for p in procs if p.exitcode]
    if failed:
        print(f"[collect] WARNING: shard processes exited with {failed}; rerun to resume", file=log)
    if opts.out:
        n = store.export_snapshot(opts.out)
        print(f"[collect] exported {n} rows to {opts.out} ({Path(opts.out).stat().st_size / 1e6:.1f} MB)", file=log)
    store.close()
    return {"planned": total, "already_stored": total - remaining, "written": written,
            "seconds": time.time() - t0,
            "stopped_by_budget": budget_ran_out and written < remaining,
            "shard_exit_codes": [p.exitcode for p in procs]}


# ---- noise study ------------------------------------------------------------------------------------------------


def _noise_entry(items: list[tuple[str, str, list[str]]], gpu: int | None, device: str, out: Any,
                 timing: TimingOptions) -> None:
    die_with_parent()
    from kernel_gym.measure.live import LiveBackend

    rows = []
    with LiveBackend(gpu=gpu, device=device, timing=timing) as backend:
        for ref, wkey, cfgs in items:
            fam = resolve_family(ref)
            for m in backend.measure_many(fam, workload_from_key(fam, wkey), [Config.parse(c) for c in cfgs]):
                rows.append(m.to_dict())
    out.put(rows)


def noise_items(db: str, workloads_per_kernel: int = 12, configs_per_workload: int = 8,
                seed: int = 0) -> list[tuple[str, str, list[str]]]:
    """The noise study's subset: per kernel, random measured workloads and their fastest stored configs (where
    winners are decided). The farm's cross-GPU study times the same subset."""
    store = MeasurementStore(db)
    rng = random.Random(seed)
    by_kernel: dict[str, dict[str, list[tuple[float, str]]]] = {}
    for row in store.rows():
        if row["status"] == OK and row["median_ms"]:
            by_kernel.setdefault(row["kernel"], {}).setdefault(row["workload"], []).append((row["median_ms"],
                                                                                           row["config"]))
    store.close()
    items = []
    for kernel, wls in sorted(by_kernel.items()):
        keys = sorted(wls)
        for wkey in rng.sample(keys, min(workloads_per_kernel, len(keys))):
            items.append((kernel, wkey, [c for _, c in sorted(wls[wkey])[:configs_per_workload]]))
    return items


def noise_study(db: str, repeats: int, workloads_per_kernel: int = 12, configs_per_workload: int = 8,
                device: str = "cuda", seed: int = 0, timing: TimingOptions = DEFAULT_TIMING,
                log: Any = sys.stderr) -> dict[str, Any]:
    """Re-measure a subset in `repeats` separate worker processes: per (workload, config) the coefficient of variation
    of the medians across processes (median and p95 reported), and how often the winner among the subset's configs
    changes between processes. The subset per workload: the stored fastest configs (where winners are decided)."""
    import numpy as np

    items = noise_items(db, workloads_per_kernel, configs_per_workload, seed)
    if not items:
        raise SystemExit(f"noise study: no successful measurements in {db}; collect first")
    gpu = None if device == "cpu" else _visible_gpus(device)[0]
    ctx = mp.get_context("spawn")
    runs: list[list[dict[str, Any]]] = []
    for r in range(repeats):
        q = ctx.Queue()
        p = ctx.Process(target=_noise_entry, args=(items, gpu, device, q, timing))
        p.start()
        runs.append(q.get())
        p.join()
        print(f"[noise] repeat {r + 1}/{repeats} done", file=log)
    times: dict[tuple[str, str, str], list[float]] = {}
    for run in runs:
        for m in run:
            if m["status"] == "ok" and m["median_ms"]:
                times.setdefault((m["kernel"], m["workload"], m["config"]), []).append(m["median_ms"])
    cv_of = {k: float(np.std(v) / np.mean(v)) for k, v in times.items() if len(v) == repeats}
    cvs = np.array(list(cv_of.values()))
    per_kernel = {}
    for kernel in sorted({k[0] for k in cv_of}):
        a = np.array([cv for k, cv in cv_of.items() if k[0] == kernel])
        per_kernel[kernel] = {"n": int(a.size), "cv_median": float(np.median(a)), "cv_p95": float(np.percentile(a, 95))}
    changes = pairs = 0
    for kernel, wkey, _ in items:
        name = resolve_family(kernel).name
        winners = []
        for run in runs:
            ok = [(m["median_ms"], m["config"]) for m in run
                  if m["workload"] == wkey and m["kernel"] == name and m["status"] == "ok" and m["median_ms"]]
            if ok:
                winners.append(min(ok)[1])
        for i in range(len(winners)):
            for j in range(i + 1, len(winners)):
                pairs += 1
                changes += winners[i] != winners[j]
    return {
        "repeats": repeats,
        "workloads": len(items),
        "measurements_per_repeat": sum(len(c) for _, _, c in items),
        "cv_median": float(np.median(cvs)) if cvs.size else None,
        "cv_p95": float(np.percentile(cvs, 95)) if cvs.size else None,
        "winner_change_rate": changes / pairs if pairs else None,
        "winner_pairs": pairs,
        "per_kernel": per_kernel,
    }


def dry_run(opts: CollectOptions) -> dict[str, Any]:
    """`collect --dry-run`: the plan's size per kernel and the projected time, measuring nothing. What `--db`
    already holds is left out of the projection as a rerun would skip it (`stored_on`)."""
    plan = load_plan_file(opts.plan_file, opts.kernels) if opts.plan_file else build_plan(opts)
    n = sum(len(i.configs) for chunks in plan for i in chunks)
    todo, stored_on = plan, {}
    if opts.db and Path(opts.db).is_file():
        todo, stored_on = drop_stored_anywhere(plan, opts.db, interpreter=opts.device != "cuda")
    est = estimate_seconds(todo, opts, max(1, opts.gpus))
    per_kernel: dict[str, int] = {}
    for chunks in plan:
        for i in chunks:
            per_kernel[i.kernel] = per_kernel.get(i.kernel, 0) + len(i.configs)
    left = sum(len(i.configs) for chunks in todo for i in chunks)
    return {"workloads": len(plan), "configs": n, "per_kernel": per_kernel, "already_stored": n - left,
            "to_measure": left, "stored_on": stored_on, **est}


def drop_stored_anywhere(plan: list[list[PlanItem]], db: str,
                         interpreter: bool = False) -> tuple[list[list[PlanItem]], dict[str, str]]:
    """(the plan without what `db` holds, kernel -> the context it was measured in). A dry run has no GPU to name
    its context, so per kernel it takes the stored context (device, torch, triton; this kernel source) that holds
    the most of the plan: the machine a rerun with the same --db would resume on, a GPU's, or with `interpreter`
    (--device cpu) the interpreter's."""
    done: dict[str, set[tuple[str, str]]] = {}
    stored_on: dict[str, str] = {}
    store = MeasurementStore(db, read_only=True)
    try:
        for ref in sorted({i.kernel for chunks in plan for i in chunks}):
            fam = resolve_family(ref)
            wanted = {(i.workload_key, c) for chunks in plan for i in chunks if i.kernel == ref for c in i.configs}
            found = store.conn.execute(
                "SELECT DISTINCT device, torch_version, triton_version FROM measurements WHERE kernel=? AND "
                "source_hash=?", (fam.name, family_store_key(fam))).fetchall()
            for dev, tv, trv in found:
                if (dev == "cpu-interpreter") != interpreter:
                    continue
                held = store.done_keys(Context(dev, tv, trv, fam.name, family_store_key(fam))) & wanted
                if len(held) > len(done.get(ref, ())):
                    done[ref], stored_on[ref] = held, f"{dev}, torch {tv}, triton {trv}"
    finally:
        store.close()
    return without_done(plan, done), stored_on
