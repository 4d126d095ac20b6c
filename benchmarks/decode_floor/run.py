"""Decode at batch 1-4 against its floor (issue 29, point 2): the best checked config's time beside the bytes it must
read over copy bandwidth plus one measured empty-kernel launch.

Per workload (Mixtral's attention shape, GQA 32/8, head dim 128; batch 1, 2, 4; context 1k, 4k, 16k): the recorded
dataset's fastest config there, the default and `--sample` configs drawn from the valid space, each checked against the
torch reference first, then timed (CUDA events, the dataset's timing options); the floor is
bytes_moved / COPY_BW + the median time of an empty Triton kernel timed the same way. Target: best / floor <= 1.25.

    python3 benchmarks/decode_floor/run.py --out $OUT/decode_floor.json  # GPU; imports torch, triton, numpy, kernel_gym

`--grid` times, instead of a sample, every valid grouped config with pages of 32-128 tokens and keeps each config's
time in the output (`times`), so knob values (split counts, PRELOAD_PAGES) can be compared config by config. Beside the
floor, each workload also times a device-to-device copy of the same bytes (half read, half written) the same way
(`copy_ms`): what the floor's bandwidth gives at that size. The tree's commit is read from KERNEL_GYM_COMMIT (the
device machine's copy has no history).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TARGET = 1.25


def floor_ms(family, workload, empty_ms: float) -> float:
    """The target's floor: the bytes one call must move over COPY_BW, plus one empty launch (ms)."""
    from kernel_gym.measure.roofline import COPY_BW

    return family.bytes_moved(workload) / COPY_BW * 1e3 + empty_ms


def read_floor(path: Path) -> dict:
    """A decode_floor.json as written, plain or gzipped (the committed grids are .json.gz)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def _empty_kernel():
    """A Triton kernel that does nothing: one launch's fixed cost, timed as the configs are."""
    import triton

    @triton.jit
    def _empty(x):
        pass

    return _empty


def main(argv: list[str] | None = None) -> int:
    import torch

    from kernel_gym.kernels import get_family
    from kernel_gym.kernels.space import Config
    from kernel_gym.kernels.workloads import DecodeWorkload
    from kernel_gym.measure import make_backend
    from kernel_gym.measure.compiler import CompilePool
    from kernel_gym.measure.power import read_once
    from kernel_gym.measure.timing import time_launch
    from kernel_gym.measure.worker import compare

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--sample", type=int, default=48,
                   help="valid configs sampled per workload (besides the recorded best)")
    p.add_argument("--grid", action="store_true",
                   help="every valid grouped config with PAGE_SIZE >= 32 instead of a sample")
    p.add_argument("--batches", default="1,2,4", help="comma-separated batch sizes")
    p.add_argument("--contexts", default="1024,4096,16384", help="comma-separated context lengths")
    p.add_argument("--compile-workers", type=int, default=12,
                   help="CPU processes compiling the configs ahead of the timing (0: compile on first call)")
    args = p.parse_args(argv)
    if args.compile_workers > 0:  # one cache for the compile pool and this process, set before the first compile
        os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="decode_floor_triton_"))

    _empty = _empty_kernel()
    dummy = torch.empty(1, device="cuda")
    _empty[(1,)](dummy)
    torch.cuda.synchronize()
    empty_ms = time_launch(lambda: _empty[(1,)](dummy)).median_ms
    fam = get_family("decode_attention")
    backend = make_backend("recorded")
    plan = []  # (workload, recorded rows, configs)
    for batch in (int(b) for b in args.batches.split(",")):
        for context in (int(c) for c in args.contexts.split(",")):
            w = DecodeWorkload(32, 8, 128, batch, context)
            recorded = {c: m for c, m in backend.rows("decode_attention").get(w.key(), {}).items()
                        if m.status == "ok" and m.median_ms}
            configs = []
            if recorded:
                best_c = min(recorded, key=lambda c: recorded[c].median_ms)
                configs.append(best_c if not isinstance(best_c, str) else Config.parse(best_c))
            configs.append(fam.default_config(w))
            if args.grid:
                configs += [c for c in fam.space.valid_configs(w)
                            if int(c["GQA_GROUPED"]) and int(c["PAGE_SIZE"]) >= 32]
            else:
                configs += list(fam.space.sample(w, args.sample, seed=0))
            # every split config's one-launch twin (COMBINE=1: the last split program combines), so the two
            # combine paths are timed on the same tiles
            configs += [t for c in configs if int(fam.space.value(c, "COMBINE")) == 0
                        for t in [fam.space.config({**dict(c), "COMBINE": 1})] if fam.space.is_valid(t, w)]
            plan.append((w, recorded, list(dict.fromkeys(configs))))
    pool = None
    if args.compile_workers > 0:  # compile everything ahead (a cold compile is 0.5-2 s; timing a config ~50 ms)
        pool = CompilePool(args.compile_workers, {"TRITON_CACHE_DIR": os.environ["TRITON_CACHE_DIR"]})
        pending = [pool.submit("decode_attention", w.key(), [str(c) for c in configs], chunk=4)
                   for w, _, configs in plan]
    rows = []
    for i, (w, recorded, configs) in enumerate(plan):
        batch, context = w.batch, w.context_len
        t_compile = time.time()
        if pool is not None:
            CompilePool.collect(pending[i])
        t_compile = time.time() - t_compile
        power = read_once()  # the clock state each workload was timed in (the H200 throttles under load)
        inputs = fam.make_inputs(w, "cuda")
        ref = fam.reference(inputs)
        times, wrong_after_timing, failed = {}, [], {}
        t0 = time.time()
        for c in configs:
            try:
                fn = fam.prepare(inputs, c)
                out = fn()
                torch.cuda.synchronize()
                wrong = compare(fam, out, ref, w.dtype)
                if wrong is not None:
                    failed[str(c)] = f"wrong: {wrong}"
                    continue
                t = time_launch(fn).median_ms
                if compare(fam, fn(), ref, w.dtype) is not None:  # right again after hundreds of launches
                    wrong_after_timing.append(str(c))
                    continue
                times[str(c)] = t
            except Exception as exc:  # noqa: BLE001 - a config that fails to compile or run is kept with its reason
                failed[str(c)] = f"{type(exc).__name__}: {str(exc).strip()[:200]}"
        copy_ms = _copy_ms(int(fam.bytes_moved(w)), time_launch)
        best = min(times.values())
        one = {c: t for c, t in times.items() if '"COMBINE":1' in c}
        two = {c: t for c, t in times.items() if c not in one}
        floor = floor_ms(fam, w, empty_ms)
        rows.append({"batch": batch, "context": context, "configs_ok": len(times), "configs_tried": len(configs),
                     "best_ms": best, "best_config": min(times, key=times.get), "floor_ms": floor,
                     "bytes": fam.bytes_moved(w), "ratio_to_floor": best / floor, "copy_ms": copy_ms,
                     "recorded_best_ms": min((m.median_ms for m in recorded.values()), default=None),
                     "wrong_after_timing": wrong_after_timing, "failed": failed,
                     "best_two_launch_ms": min(two.values(), default=None),
                     "best_one_launch_ms": min(one.values(), default=None),
                     "power_before": dataclasses.asdict(power) if power is not None else None,
                     **({"times": times} if args.grid else {})})
        t2, t1 = (min(d.values(), default=float("nan")) * 1e3 for d in (two, one))
        print(f"batch {batch} context {context}: best {best * 1e3:.1f} us (two launches {t2:.1f}, one {t1:.1f}), "
              f"floor {floor * 1e3:.1f} us, same-size copy {copy_ms * 1e3:.1f} us "
              f"(empty launch {empty_ms * 1e3:.1f} us), ratio {best / floor:.2f} ({len(times)} ok configs, "
              f"{time.time() - t0:.0f} s timing, {t_compile:.0f} s waiting for compiles)", flush=True)
        if args.grid:  # the best config of each split count, PRELOAD_PAGES and KV_TMA value
            for knob in ("NUM_SPLITS", "PRELOAD_PAGES", "KV_TMA"):
                by: dict[int, float] = {}
                for c, t in times.items():
                    n = json.loads(c).get(knob, 0)
                    by[n] = min(t, by.get(n, t))
                best_by = ", ".join(f"{n}: {t * 1e3:.1f} us" for n, t in sorted(by.items()))
                print(f"  best by {knob}: {best_by}", flush=True)
        _write(args.out, rows, empty_ms)  # after every workload: a run cut off keeps what finished
    if pool is not None:
        pool.close()
    print(f"{sum(r['ratio_to_floor'] <= TARGET for r in rows)} of {len(rows)} workloads within {TARGET}x of the floor")
    return 0


def _copy_ms(nbytes: int, time_launch) -> float:
    """A device-to-device copy moving nbytes (half read, half written), timed as the configs are."""
    import torch

    src = torch.randn(nbytes // 4, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    return time_launch(lambda: dst.copy_(src)).median_ms


def _write(out: Path, rows: list[dict], empty_ms: float) -> None:
    import torch
    import triton

    from kernel_gym.measure.roofline import COPY_BW

    res = {"commit": os.environ.get("KERNEL_GYM_COMMIT"), "device": torch.cuda.get_device_name(),
           "torch": torch.__version__,
           "triton": triton.__version__, "copy_bw": COPY_BW, "empty_launch_ms": empty_ms, "target_ratio": TARGET,
           "rows": rows, "met": all(r["ratio_to_floor"] <= TARGET for r in rows)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    sys.exit(main())
