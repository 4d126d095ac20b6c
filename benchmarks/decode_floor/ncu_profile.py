"""Replays chosen decode configs of a decode_floor.json for Nsight Compute: where one program's time goes at batch 1-4
(DRAM throughput against its peak, achieved occupancy, warp stall reasons), which CUDA events cannot say.

Per workload named (batch:context), the fastest config overall, the fastest with KV_TMA=1 and the fastest with
KV_TMA=0 in the file's `times` (a --grid decode_floor.json, plain or .gz): each is checked against the torch reference,
then launched once more. Run under ncu, which profiles every launch of the grouped decode kernel (both launches of each
config):

    ncu --clock-control none --kernel-name regex:_decode_grouped_kernel --launch-skip 0 ... \\
        python3 benchmarks/decode_floor/ncu_profile.py --floor decode_floor.json --workloads 1:16384,4:1024

The configs launched, in order, are written to --out (JSON), so the profiles can be matched to configs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def picks(times: dict[str, float]) -> list[str]:
    """The fastest config, the fastest with KV_TMA=1 and with KV_TMA=0 (each once, in that order)."""
    def fastest(keep) -> list[str]:
        chosen = [c for c in times if keep(json.loads(c))]
        return [min(chosen, key=times.get)] if chosen else []

    every = fastest(lambda c: True) + fastest(lambda c: c.get("KV_TMA", 0) == 1) + \
        fastest(lambda c: c.get("KV_TMA", 0) == 0)
    return list(dict.fromkeys(every))


def main(argv: list[str] | None = None) -> int:
    import torch

    from benchmarks.decode_floor.run import read_floor
    from kernel_gym.kernels import get_family
    from kernel_gym.kernels.space import Config
    from kernel_gym.kernels.workloads import DecodeWorkload
    from kernel_gym.measure.power import read_once
    from kernel_gym.measure.worker import compare

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--floor", type=Path, required=True, help="decode_floor.json of a --grid run")
    p.add_argument("--workloads", default="1:16384,1:1024,4:4096", help="batch:context, comma-separated")
    p.add_argument("--out", type=Path, required=True, help="JSON list of the configs launched, in order")
    args = p.parse_args(argv)
    rows = {(r["batch"], r["context"]): r for r in read_floor(args.floor)["rows"]}
    fam = get_family("decode_attention")
    launched = []
    for item in args.workloads.split(","):
        batch, context = (int(x) for x in item.split(":"))
        row = rows.get((batch, context))
        if row is None or "times" not in row:
            raise SystemExit(f"{args.floor} has no --grid row for batch {batch} context {context}; run decode_floor "
                             "with --grid over it first")
        w = DecodeWorkload(32, 8, 128, batch, context)
        inputs = fam.make_inputs(w, "cuda")
        ref = fam.reference(inputs)
        for c in picks(row["times"]):
            fn = fam.prepare(inputs, Config.parse(c))
            wrong = compare(fam, fn(), ref, w.dtype)
            torch.cuda.synchronize()
            if wrong is not None:
                raise SystemExit(f"{c} at batch {batch} context {context} is wrong: {wrong}")
            state = read_once()  # the clock state the profiled launch met
            fn()
            torch.cuda.synchronize()
            launched.append({"batch": batch, "context": context, "config": c, "event_ms": row["times"][c],
                             "power_before": state.__dict__ if state is not None else None})
            print(f"batch {batch} context {context}: {c} ({row['times'][c] * 1e3:.1f} us)", flush=True)
    args.out.write_text(json.dumps(launched, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
