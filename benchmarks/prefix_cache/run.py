"""The simulator's prefix cache on a trace with hash_ids (Mooncake), beside an offline LRU over the same requests (CPU).

Replays a window of the trace for a model with and without prefix caching under a config-blind roofline timer
(RooflineTimer(0.5): every tuned kernel at half its roofline; the cache model is what is shown, not kernel times),
and computes the hit rate of an LRU cache of the pool's size (and of an unbounded one) over the requests in arrival
order, with no concurrency: the simulator's first-admission hit rate should lie near the former.

    python3 benchmarks/prefix_cache/run.py --trace mooncake --window-s 120 --rate-scale 0.1
    (--trace takes a name read from $KERNEL_GYM_TRACES, or a file path)
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections import OrderedDict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kernel_gym.kernels.space import Config  # noqa: E402
from kernel_gym.measure.roofline import RooflineTimer  # noqa: E402
from kernel_gym.models import load_model  # noqa: E402
from kernel_gym.traffic.simulator import OverloadWarning, Simulator, StaticChooser  # noqa: E402
from kernel_gym.traffic.traces import load_trace  # noqa: E402

KEYS = ("tokens_per_s", "ttft_p50_s", "tpot_p50_s", "prefill_tokens", "prefix_hit_rate", "prefix_evicted_blocks",
        "prefix_cached_blocks_max", "preemptions", "overloaded", "offered_over_served", "kv_pages")


def offline_lru(trace, capacity_blocks: int) -> float:
    """Hit rate (cached prompt tokens / prompt tokens) of an LRU of capacity_blocks blocks, requests one at a time."""
    lru: OrderedDict[int, None] = OrderedDict()
    b, hit, total = trace.hash_block_tokens, 0, 0
    for ids, p in zip(trace.hash_ids, trace.prompt_tokens):
        limit, k = min(len(ids), p // b, (p - 1) // b), 0
        while k < limit and ids[k] in lru:
            k += 1
        hit, total = hit + k * b, total + int(p)
        for h in ids[: p // b]:
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > capacity_blocks:
            lru.popitem(last=False)
    return hit / total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default="mooncake")
    p.add_argument("--model", default="mixtral-8x7b")
    p.add_argument("--window-s", type=float, default=120.0, help="trace seconds from the start")
    p.add_argument("--rate-scale", type=float, default=0.1, help="arrival-rate factor (Trace.scale_rate)")
    args = p.parse_args(argv)
    trace = load_trace(args.trace)
    if trace.hash_ids is None:
        raise SystemExit(f"trace {args.trace!r} carries no hash_ids (prefix-cache blocks); use a Mooncake trace")
    window = trace.window(0.0, args.window_s).scale_rate(args.rate_scale)
    model = load_model(args.model)
    chooser = StaticChooser({"prefill_attention": Config(), "decode_attention": Config(PAGE_SIZE=16, LAYOUT="NHD"),
                             "fused_moe": Config()})
    out: dict = {"trace": window.name, "requests": len(window), "model": model.name}
    for cached in (True, False):
        sim = Simulator(model, window, RooflineTimer(0.5), chooser, None, prefix_caching=cached,
                        chunk_attention="equivalent")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", OverloadWarning)
            res = sim.run()
        out["cache" if cached else "no_cache"] = {k: res.summary[k] for k in KEYS if k in res.summary}
        out["cache" if cached else "no_cache"]["warnings"] = [str(w.message) for w in caught]
        if cached:
            blocks = int(sim.num_pages * sim.page_size // window.hash_block_tokens)
            out["offline_lru_blocks"] = blocks
            out["offline_lru_hit_rate"] = offline_lru(window, blocks)
            out["offline_unbounded_hit_rate"] = offline_lru(window, 1 << 62)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
