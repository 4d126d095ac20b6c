"""GPU: every valid persistent Gluon prefill config checked against the torch reference, each in its own process
with a timeout (a barrier bug hangs the GPU instead of failing), before `kernel-gym bench` times them.

    python3 benchmarks/short_prefill/probe.py --out $OUT/short_prefill/probe.json

Workloads: the short-prefill bench shapes (16 x 512 and 64 x 128 tokens, GQA 32/8 and 32/4), a ragged batch (1,
1000 and 300 tokens) and one shorter than a tile (5 + 40): persistent programs then run uneven work items. Prints
"ALL OK" last when every config matched on every workload. Imports only torch, triton and the standard library.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

WORKLOADS = [(32, 8, (512,) * 16), (32, 4, (128,) * 64), (32, 8, (1, 1000, 300)), (32, 4, (5, 40))]

_CHECK = """
import json, sys
from kernel_gym.kernels import prefill_attention as pa
from kernel_gym.kernels.space import Config
from kernel_gym.measure.worker import compare
config = Config.parse(sys.argv[1])
out = {}
for h, hkv, lens in json.loads(sys.argv[2]):
    w = pa.PrefillWorkload(h, hkv, 128, tuple(lens))
    inputs = pa.FAMILY.make_inputs(w, "cuda", seed=1)
    got = pa.FAMILY.prepare(inputs, config)()
    for _ in range(3):  # repeated launches reuse the barriers' fresh state each time
        got = pa.FAMILY.prepare(inputs, config)()
    wrong = compare(pa.FAMILY, got, pa.FAMILY.reference(inputs), w.dtype)
    out[str(lens[:3]) + ("..." if len(lens) > 3 else "")] = wrong or "ok"
print(json.dumps(out))
"""


def _one(config: str, timeout_s: float) -> dict:
    t = time.time()
    try:
        done = subprocess.run([sys.executable, "-c", _CHECK, config, json.dumps(WORKLOADS)], capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"config": config, "result": f"timed out after {timeout_s:.0f} s (hang)", "s": time.time() - t}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
        return {"config": config, "result": "error: " + last, "s": time.time() - t}
    return {"config": config, "result": json.loads(done.stdout.strip().splitlines()[-1]), "s": time.time() - t}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--timeout-s", type=float, default=60.0)
    args = ap.parse_args()
    from kernel_gym.kernels import prefill_attention as pa

    configs = sorted({str(c) for h, hkv, lens in WORKLOADS
                      for c in pa.FAMILY.space.valid_configs(pa.PrefillWorkload(h, hkv, 128, lens))
                      if str(pa.GLUON_SPACE.value(c, "IMPL")).endswith("_persistent")})
    print(f"{len(configs)} persistent configs", flush=True)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda c: _one(c, args.timeout_s), configs))
    bad = [r for r in results if not (isinstance(r["result"], dict) and set(r["result"].values()) == {"ok"})]
    for r in results:
        print(f"{r['s']:5.1f} s  {r['config']}: {r['result']}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"workloads": WORKLOADS, "results": results}, indent=1))
    print("ALL OK" if configs and not bad else f"{len(bad)} of {len(configs)} configs FAILED")
    return 0 if not bad else 1


if __name__ == "__main__":
    raise SystemExit(main())
