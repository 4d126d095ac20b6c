"""Issue 28's check of the packaged dataset's re-key: the recorded backend's answers on a fixed sample (150 stored
workloads x 4 stored configs per kernel, and Mixtral grid shapes moved off the grid, answered by interpolation), as
JSON. Run with the code and data before and after; the two files must be identical:

    python benchmarks/refactor_check/issue28/recorded_sample.py SNAPSHOT.jsonl.gz OUT.json
"""
import dataclasses
import json
import random
import sys

from kernel_gym.kernels.space import Config
from kernel_gym.kernels.workloads import model_workloads
from kernel_gym.measure.recorded import RecordedBackend
from kernel_gym.models import load_model

b = RecordedBackend(sys.argv[1])
rng = random.Random(0)
out = {"describe_rows": {k: v["rows"] for k, v in b.describe()["kernels"].items()}}
for kernel in sorted(b._rows):
    table = b._rows[kernel]
    wkeys = sorted(table)
    ans = []
    for wk in rng.sample(wkeys, min(150, len(wkeys))):
        cfgs = sorted(table[wk])
        for c in rng.sample(cfgs, min(4, len(cfgs))):
            w = b._workloads[kernel][wk]
            m = b.measure(kernel, w, Config.parse(c))
            ans.append([wk, c, m.status, m.median_ms, m.source])
    # interpolated: model grid shapes moved off the grid
    if kernel in ("fused_moe", "decode_attention", "prefill_attention", "prefix_prefill"):
        for w in model_workloads(kernel, load_model("mixtral-8x7b"))[:60]:
            if kernel == "fused_moe":
                w = dataclasses.replace(w, num_tokens=w.num_tokens + 3, skew=w.skew + 0.1)
            elif kernel == "decode_attention":
                w = dataclasses.replace(w, batch=w.batch + 1, context_len=w.context_len + 100)
            cfgs = sorted(str(c) for c in b.available_configs(kernel, w))
            for c in cfgs[:: max(1, len(cfgs) // 5)]:
                m = b.measure(kernel, w, Config.parse(c))
                ans.append([w.key(), c, m.status, m.median_ms, m.source])
    out[kernel] = ans
json.dump(out, open(sys.argv[2], "w"))
print({k: len(v) for k, v in out.items() if k != "describe_rows"}, out["describe_rows"])
