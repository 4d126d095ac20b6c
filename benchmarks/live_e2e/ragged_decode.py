"""Decode attention on the ragged batches live steps hold, launched as the stack's graphs launch them.

The decode wave model (kernel_gym/traffic/decode_waves.py) is fitted per config on batches whose contexts spread
evenly over 0.5-1.5x their mean (DecodeWorkload.context_lens) and prices a live batch from its own contexts. On one
H100 (same_gpu_h100_298d0ec/) it priced the default config (one program per q head, no split) at 0.77-0.79 of its
profiled kernels on every graphed step of 9-16 sequences, and within 0.96-1.04 at 1-8; per token of the longest
context those kernels took 1.25x what they took at 1-8 sequences, while the grouped config's did not move. This
probe times the cases that separate the candidate causes, per config, at batch sizes around the capture sizes:

- `uniform`: every sequence at the long context L;
- `long_first` / `long_last`: one sequence at L, the others at the short context S (where the long one launches);
- `padded`: `long_first` plus the graph's padding rows (one-token contexts) up to the capture size, as run.py's
  graphs launch a step of that batch;
- `alone`: the same launch as `padded` with every other row a padding row (the long sequence among padding only).

Each case as decode_graph_table.py times a point: `--layers` layers with their own paged caches, layer 0 checked
against the fp32 reference (eagerly and through the replay), the layers' launches replayed in one CUDA graph without
the L2 flush; ms per layer. One JSON file, ragged_decode.json; a table last.

    python3 benchmarks/live_e2e/ragged_decode.py --out $OUT/ragged --model olmoe-1b-7b   # GPU (--budget-s 240)
    TRITON_INTERPRET=1 python3 benchmarks/live_e2e/ragged_decode.py --smoke --out /tmp/ragged  # CPU dry run

The GPU mode imports only torch, triton, numpy, the standard library and kernel_gym.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.live_e2e.decode_graph_table import time_point  # noqa: E402
from benchmarks.live_e2e.moe_price_check import Measurer, _gpu_state, write_doc  # noqa: E402
from kernel_gym.kernels.workloads import DecodeWorkload  # noqa: E402
from kernel_gym.traffic.simulator import capture_size  # noqa: E402  (the rows a graphed step of a batch launches)

OUT_NAME = "ragged_decode.json"
BATCHES = (1, 2, 4, 6, 8, 9, 10, 12, 14, 16, 20, 24, 32)
CASES = ("uniform", "long_first", "long_last", "padded", "alone")
# the decode configs of each model's live policies on the held-out runs (same_gpu_decode_plan.json's, Mixtral's from
# the committed decode graph tables): the default (one program per q head) and the vllm-table's grouped config
CONFIGS = {
    "olmoe-1b-7b": ('{"BLOCK_N":16,"GQA_GROUPED":0,"LAYOUT":"NHD","NUM_SPLITS":1,"PAGE_SIZE":16,"num_stages":2,'
                    '"num_warps":4}',
                    '{"BLOCK_N":16,"GQA_GROUPED":1,"LAYOUT":"NHD","NUM_SPLITS":1,"PAGE_SIZE":16,"num_stages":2,'
                    '"num_warps":4}'),
}
CONFIGS["mixtral-8x7b"] = CONFIGS["olmoe-1b-7b"]


@dataclass(frozen=True)
class RaggedDecode(DecodeWorkload):
    """A decode batch with these exact contexts (`lens`); context_len is their mean, batch their count."""

    lens: tuple[int, ...] = ()

    def context_lens(self) -> list[int]:
        return list(self.lens)


def case_lens(case: str, batch: int, long: int, short: int) -> tuple[int, ...]:
    """The contexts of one case (module docstring); padding rows have one token, as run.py's graphs pad."""
    pad = (1,) * (capture_size(batch) - batch)
    if case == "uniform":
        return (long,) * batch
    if case == "long_first":
        return (long,) + (short,) * (batch - 1)
    if case == "long_last":
        return (short,) * (batch - 1) + (long,)
    if case == "padded":
        return (long,) + (short,) * (batch - 1) + pad
    if case == "alone":  # the same launch as `padded`, every other row padding (before tree dc8db50: only the
        return (long,) + (1,) * (capture_size(batch) - 1)  # capture size's padding beside the long row)
    raise ValueError(f"case {case!r}: one of {', '.join(CASES)}")


def plan_points(batches: tuple[int, ...], long: int, short: int,
                cases: tuple[str, ...] = CASES) -> list[tuple[int, str, tuple[int, ...]]]:
    """(batch, case, contexts) with duplicates dropped (at batch 1 every case is one sequence at L; without padding
    `padded` is `long_first` and `alone` is batch 1); batch 1 always, the reference of every ratio."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for b in sorted(set(batches) | {1}):
        for case in cases if b > 1 else ("uniform",):
            lens = case_lens(case, b, long, short)
            if lens not in seen:
                seen.add(lens)
                out.append((b, case, lens))
    return out


def run_measure(model_name: str, configs: tuple[str, ...], points: list, out_dir: Path, layers: int,
                budget_s: float, smoke: bool = False) -> dict:
    import torch

    from kernel_gym.kernels.decode_attention import FAMILY
    from kernel_gym.kernels.space import Config
    from kernel_gym.models import load_model

    cuda = torch.cuda.is_available() and not smoke and os.environ.get("TRITON_INTERPRET") != "1"
    if not cuda and not smoke:
        raise SystemExit("no CUDA device (or TRITON_INTERPRET=1): the timings need the GPU; --smoke is the CPU dry run")
    device, dtype = ("cuda", "bfloat16") if cuda else ("cpu", "float32")
    if smoke:
        from benchmarks.live_e2e.run import TINY as m
    else:
        m = load_model(model_name)
    meas = Measurer(cuda)
    start = time.monotonic()
    doc: dict[str, Any] = {"meta": {
        "what": RaggedDecode.__doc__.splitlines()[0] + ": decode_attention for `layers` layers with their own caches "
                "in one CUDA graph, no L2 flush; ms per layer; layer 0 checked against the fp32 reference first",
        "model": model_name, "layers": layers, "dtype": dtype, "budget_s": budget_s,
        "device": torch.cuda.get_device_name() if cuda else "cpu-interpreter", "torch": torch.__version__,
        "triton": __import__("triton").__version__, "commit": os.environ.get("KERNEL_GYM_COMMIT"),
        "gpu_before": _gpu_state(cuda)}, "configs": {}}
    skipped = 0
    for cfg_text in configs:
        cfg = Config.parse(cfg_text)
        rows = doc["configs"].setdefault(cfg_text, [])
        for b, case, lens in points:
            if time.monotonic() - start > budget_s:
                skipped += 1
                continue
            wl = RaggedDecode(m.num_heads, m.num_kv_heads, m.head_dim, len(lens), max(1, round(sum(lens) / len(lens))),
                              dtype, lens=tuple(lens))
            try:
                res = time_point(meas, FAMILY, wl, cfg, layers, device)
            except Exception as exc:  # noqa: BLE001 - one failed point must not lose the others
                res = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            rows.append({"batch": b, "case": case, "contexts": list(lens), **res})
            if cuda:
                torch.cuda.empty_cache()
        log(f"{cfg_text}: {len(rows)} points ({time.monotonic() - start:.0f} s so far)")
    doc["meta"]["skipped_points"] = skipped
    path = write_doc(doc, out_dir / OUT_NAME, start, cuda)
    log(f"wrote {path} ({doc['meta']['wall_s']} s, {skipped} points skipped by the budget)")
    print(table(doc))
    return doc


def table(doc: dict) -> str:
    """Per config and batch: each case's us per layer and its time per token of the long context over batch 1's."""
    lines = []
    for cfg, rows in doc["configs"].items():
        lines.append(cfg)
        one = next((r["ms"] for r in rows if r["batch"] == 1 and "ms" in r), None)
        by_b: dict[int, list[str]] = {}
        for r in rows:
            cell = f"{r['case']} error" if "ms" not in r else (
                f"{r['case']} {1e3 * r['ms']:.1f} us" + (f" ({r['ms'] / one:.2f}x)" if one else ""))
            by_b.setdefault(r["batch"], []).append(cell)
        lines += [f"  b={b:>2}: " + ", ".join(cells) for b, cells in by_b.items()]
    return "\n".join(lines)


def ragged_factors(path: Path | str, model: str) -> dict[str, dict[int, float]] | None:
    """A ragged_decode.json's launch factors for `model`: {config: {capture size: the ragged launch's time over the
    long sequence's alone}}, from the cases a live graph launches (`padded`, and `long_first` where the batch is its
    own capture size: the same launch), the median where several batches share a capture size; None if the file
    holds another model. run.py --predict --decode-ragged reads these."""
    doc = json.loads(Path(path).read_text())
    if doc.get("meta", {}).get("model") != model:
        return None
    out: dict[str, dict[int, float]] = {}
    for cfg, rows in doc.get("configs", {}).items():
        one = next((r["ms"] for r in rows if r["batch"] == 1 and "ms" in r), None)
        by_rows: dict[int, list[float]] = {}
        for r in rows:
            rows_launched = len(r["contexts"])
            if ("ms" in r and one and r["batch"] > 1 and r["case"] in ("padded", "long_first")
                    and rows_launched == capture_size(r["batch"])):
                by_rows.setdefault(rows_launched, []).append(r["ms"] / one)
        if by_rows:
            out[cfg] = {b: statistics.median(v) for b, v in sorted(by_rows.items())}
    return out


def factor_at(factors: dict[int, float], rows: int) -> float | None:
    """The launch factor at a capture size: measured there, else linear between the measured sizes around it; None
    outside them (no correction: the step keeps the wave model's price)."""
    if rows in factors:
        return factors[rows]
    sizes = sorted(factors)
    for lo, hi in zip(sizes, sizes[1:]):
        if lo < rows < hi:
            return factors[lo] + (factors[hi] - factors[lo]) * (rows - lo) / (hi - lo)
    return None


def log(msg: str) -> None:
    print(f"[ragged_decode {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="the folder for ragged_decode.json")
    p.add_argument("--model", default="olmoe-1b-7b", help=f"a zoo model (--configs needed beyond {', '.join(CONFIGS)})")
    p.add_argument("--long", type=int, default=4096, help="the long sequence's context L")
    p.add_argument("--short", type=int, default=1024, help="the other sequences' context S")
    p.add_argument("--batches", default=",".join(map(str, BATCHES)), help="batch sizes (decode rows before padding)")
    p.add_argument("--cases", default=",".join(CASES), help=f"cases to time ({', '.join(CASES)})")
    p.add_argument("--configs", default="", metavar="CFG;CFG",
                   help="decode configs to time, ';'-separated (default: the model's live default and vllm-table "
                        "configs)")
    p.add_argument("--layers", type=int, default=4, help="layers with their own caches captured back to back")
    p.add_argument("--budget-s", type=float, default=240.0, help="start no new point after this many seconds")
    p.add_argument("--smoke", action="store_true", help="CPU dry run (TRITON_INTERPRET=1): tiny-moe, short contexts")
    args = p.parse_args(argv)
    if not args.smoke:
        from kernel_gym.models import load_model

        try:
            load_model(args.model)
        except (KeyError, ValueError, FileNotFoundError) as e:
            p.error(f"--model {args.model}: {e}")
        if args.model not in CONFIGS and not args.configs:
            p.error(f"--model {args.model}: the probe knows the live configs of {', '.join(CONFIGS)} only; pass the "
                    "decode configs to time with --configs")
    batches = tuple(int(x) for x in args.batches.split(","))
    cases = tuple(c for c in args.cases.split(",") if c)
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        p.error(f"--cases {','.join(unknown)}: the cases are {', '.join(CASES)}")
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        run_measure("tiny-moe", CONFIGS["olmoe-1b-7b"], plan_points((1, 3), 48, 16), args.out, 2, args.budget_s,
                    smoke=True)
        return 0
    configs = tuple(c for c in args.configs.split(";") if c) or CONFIGS[args.model]
    run_measure(args.model, configs, plan_points(batches, args.long, args.short, cases), args.out, args.layers,
                args.budget_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
