"""Launches the short-prefill bench cases' fastest configs and their SDPA anchors once each for Nsight Compute: what
cuDNN's kernel does at many short sequences that ours does not (grid, threads, registers, occupancy, warp stalls),
which CUDA events cannot say (issue 29, item 2).

Per case: the fastest Triton config, the fastest with PACK_GQA=1 and the fastest Gluon config of a run's details file
(`kernel-gym bench` or knob_ab.py, plain or .gz), then SDPA's cuDNN and FlashAttention variants. Each is checked
against the family's fp32 reference, then launched once inside an NVTX range named "profile", so ncu profiles only
those launches (their times are ncu's; a variant that is refused or wrong is listed with why):

    ncu --clock-control none --nvtx --nvtx-include "profile/" --section LaunchStats --section Occupancy ... \\
        python3 benchmarks/short_prefill/ncu_profile.py --details prefill_attention_details.json.gz --out launched.json

The launches, in order, with the GPU's clock state just before each, are written to --out (JSON), so the profiles
can be matched to them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

CASES = ("prefill_b64_h32kv8_n128_d128", "prefill_b16_h32kv8_n512_d128")
SDPA = ("cudnn_causal_gqa", "cudnn_causal_mha", "flash_causal_mha")


def read_details(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)["details"]


def picks(tried: list[dict], runnable=lambda config: True) -> dict[str, str]:
    """label -> config string: the fastest correct Triton config without and with PACK_GQA=1, and the fastest Gluon
    config, among those `runnable` accepts (a config of a reverted experiment no longer is)."""
    ok = [t for t in tried if t["status"] == "ok" and runnable(t["config"])]
    groups = {
        "triton": lambda c: c.get("IMPL", "triton") == "triton" and c.get("PACK_GQA", 0) == 0,
        "triton_pack": lambda c: c.get("PACK_GQA", 0) == 1,
        "gluon": lambda c: c.get("IMPL", "triton") != "triton",
    }
    out = {}
    for label, keep in groups.items():
        chosen = [t for t in ok if keep(json.loads(t["config"]))]
        if chosen:
            out[label] = min(chosen, key=lambda t: t["median_ms"])["config"]
    return out


def main(argv: list[str] | None = None) -> int:
    import torch

    from kernel_gym import bench
    from kernel_gym.kernels import get_family
    from kernel_gym.kernels.prefill_attention import bench_cases
    from kernel_gym.kernels.space import Config
    from kernel_gym.measure.power import read_once
    from kernel_gym.measure.worker import compare

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--details", type=Path, required=True, help="a prefill bench run's details file")
    p.add_argument("--cases", default=",".join(CASES), help="bench case names, comma-separated")
    p.add_argument("--out", type=Path, required=True, help="JSON list of the launches profiled, in order")
    args = p.parse_args(argv)
    details = read_details(args.details)
    workloads = dict(bench_cases())
    fam = get_family("prefill_attention")
    launched = []

    def profile_once(label: str, fn, case: str) -> None:
        """One launch inside the NVTX range ncu profiles (no CUDA-event timing here: under ncu it measures the
        profiler, not the kernel)."""
        torch.cuda.synchronize()
        state = read_once()  # the clock state the launch met (ncu runs with --clock-control none)
        torch.cuda.nvtx.range_push("profile")
        fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        launched.append({"case": case, "what": label, "power_before": state.__dict__ if state is not None else None})
        print(f"{case}: {label}", flush=True)

    for case in args.cases.split(","):
        w = workloads[case]
        tried = details[case]["tried"] if case in details else None
        if tried is None:
            raise SystemExit(f"{args.details} has no results for {case}; give the details file of a run that has")
        inputs = fam.make_inputs(w, "cuda")
        ref = fam.reference(inputs)
        for label, config in picks(tried, lambda c, w=w: fam.space.is_valid(Config.parse(c), w)).items():
            fn = fam.prepare(inputs, Config.parse(config))
            wrong = compare(fam, fn(), ref, w.dtype)
            if wrong is not None:
                raise SystemExit(f"{case}: {config} is wrong: {wrong}")
            profile_once(f"{label} {config}", fn, case)
        b, n = len(w.seq_lens), w.seq_lens[0]
        q, k, v = (bench._heads_first(x, b, n) for x in (inputs.q, inputs.k, inputs.v))
        from torch.nn.attention import SDPBackend

        causal = {"is_causal": True}
        specs = {"cudnn_causal": (SDPBackend.CUDNN_ATTENTION, causal),
                 "flash_causal": (SDPBackend.FLASH_ATTENTION, causal)}
        variants = bench.sdpa_variants(q, k, v, specs)
        check = bench._reference_check(fam, inputs)
        for name in SDPA:
            if name not in variants:  # e.g. a *_gqa variant of an MHA case
                launched.append({"case": case, "what": name, "skipped": "no such SDPA variant for this case"})
                continue
            try:
                wrong = check(variants[name]())
            except Exception as exc:  # noqa: BLE001 - a backend refusing the shape is recorded, not fatal
                launched.append({"case": case, "what": name, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
                continue
            if wrong is None:
                profile_once(name, variants[name], case)
            else:
                launched.append({"case": case, "what": name, "error": f"wrong result, not profiled: {wrong}"})
    args.out.write_text(json.dumps(launched, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
