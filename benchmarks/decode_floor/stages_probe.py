"""Probe (issue 29, item 2): would a third K/V stage help the TMA decode at batch 1-4? BLOCK_N=128 TMA configs with
num_stages 3 (outside the family's space, which has 2 and 4; 4 does not fit 128-token blocks) beside the grid's 4
fastest configs per workload, every one checked against the torch reference, timed interleaved after a clean and a
write L2 flush (benchmarks/flush_mode). Launched through decode_attention.paged_launch, which runs any config.

    python3 benchmarks/decode_floor/stages_probe.py --floor benchmarks/decode_floor/run5_tma/decode_floor.json.gz \\
        --out $OUT/stages_probe.json  # GPU
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv: list[str] | None = None) -> int:
    import torch

    from benchmarks.decode_floor.run import read_floor
    from benchmarks.flush_mode.run import MODES, interleaved_medians
    from kernel_gym.kernels import decode_attention as da
    from kernel_gym.kernels.space import Config
    from kernel_gym.kernels.workloads import DecodeWorkload
    from kernel_gym.measure.power import read_once
    from kernel_gym.measure.roofline import COPY_BW
    from kernel_gym.measure.worker import compare

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--floor", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--reps", type=int, default=24)
    args = p.parse_args(argv)
    floor_rows = [r for r in read_floor(args.floor)["rows"] if r["batch"] <= 4]
    fam = da.FAMILY
    rows = []
    for r in floor_rows:
        w = DecodeWorkload(32, 8, 128, r["batch"], r["context"])
        ranked = sorted(r["times"], key=r["times"].get)[:4]
        extra = []
        for layout in ("NHD", "HND"):
            for splits in (8, 16, 32):
                for warps in (4, 8):
                    for combine in (0, 1):
                        c = dict(PAGE_SIZE=128, LAYOUT=layout, NUM_SPLITS=splits, BLOCK_N=128, num_warps=warps,
                                 num_stages=3, GQA_GROUPED=1, KV_TMA=1, COMBINE=combine)
                        if splits * 128 <= w.context_len and w.batch * 8 * splits <= da.MAX_WAVES * da.NUM_SMS:
                            extra.append(json.dumps(c, sort_keys=True, separators=(",", ":")))
        configs = ranked + extra
        inputs = fam.make_inputs(w, "cuda")
        ref = fam.reference(inputs)
        caches: dict = {}
        fns, kept, failed = [], [], {}
        for c in configs:
            cfg = Config.parse(c)
            key = (int(cfg["PAGE_SIZE"]), str(cfg["LAYOUT"]))
            if key not in caches:
                caches[key] = da.page_kv_cache(inputs, *key)
            try:  # paged_launch runs any config (the space's rules are fam.prepare's)
                fn = da.paged_launch(inputs.q, caches[key], inputs.context_lens, cfg, inputs.sm_scale, 8)
                wrong = compare(fam, fn(), ref, w.dtype)
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - a config that does not compile (shared memory) is kept with why
                failed[c] = f"{type(exc).__name__}: {str(exc)[:200]}"
                continue
            if wrong is not None:
                failed[c] = f"wrong: {wrong}"
                continue
            fns.append(fn)
            kept.append(c)
        state = read_once()  # the clock state this workload was timed in
        med = interleaved_medians(fns, args.reps)
        floor_bytes = fam.bytes_moved(w) / COPY_BW * 1e3
        row = {"batch": w.batch, "context": w.context_len, "configs": kept, "failed": failed,
               "floor_bytes_ms": floor_bytes, "power_before": state.__dict__ if state is not None else None,
               **{m: med[m] for m in MODES}}
        for m in MODES:
            best3 = min((t for c, t in zip(kept, med[m]) if '"num_stages":3' in c), default=float("nan"))
            best = min(t for c, t in zip(kept, med[m]) if '"num_stages":3' not in c)
            print(f"batch {w.batch} context {w.context_len} {m}: grid's best {best * 1e3:.1f} us, "
                  f"3 stages {best3 * 1e3:.1f} us ({len(kept)} ok, {len(failed)} failed)", flush=True)
        rows.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"commit": os.environ.get("KERNEL_GYM_COMMIT"), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
