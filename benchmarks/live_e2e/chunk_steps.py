"""Each step with prefill chunks of one live run beside the simulator's price for it (CPU): the step's tokens, kind
(piecewise graphs up to 512 tokens, eager above), decode batch, measured and priced ms and their ratio, and for a
profiled step (run.py --profile-every) each part's profiled kernel time beside its price (us). The price is
run.py --predict's (the same flags; the step overheads as --predict's plain prediction charges them).

    python benchmarks/live_e2e/chunk_steps.py benchmarks/live_e2e/eager_ab2db7d/window1_prof5 vllm-table
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.live_e2e import run as le  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        raise SystemExit("usage: chunk_steps.py RUN POLICY [run.py --predict flags]")
    out, spec, extra = Path(argv[0]), argv[1], argv[2:]
    args = le.build_parser().parse_args(["--out", str(out), "--predict", *extra])
    _, meta, model, trace, backend, timer, _ = le.predict_setup(args)
    priced = le.priced_steps(out, spec, model, trace, timer, backend, args, meta)
    overheads = getattr(args, "step_host_s", None) or dict.fromkeys(le.STEP_KINDS, le.STEP_OVERHEAD_S)
    steps = le.read_steps(out, spec) or []
    rows = sorted((r["tokens"], kind, batch, measured, price + overheads[kind], parts, kernels)
                  for (kind, chunks, measured, price, batch, parts, kernels), r in zip(priced, steps, strict=True)
                  if chunks)
    print(f"{out} {spec}: {len(rows)} steps with prefill chunks")
    for tokens, kind, batch, measured, price, parts, kernels in rows:
        line = (f"T={tokens:5d} {kind:9s} decode {batch:3d}  measured {measured * 1e3:7.2f} ms  "
                f"price {price * 1e3:7.2f} ms  ratio {measured / price:.3f}")
        if kernels:
            line += "  profiled/priced us: " + " ".join(
                f"{k}={v:.0f}/{parts.get(k, 0.0) * 1e6:.0f}" for k, v in sorted(kernels.get("by_part_us", {}).items()))
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
