"""How the live stack routes a prefill chunk, and the dataset's skew that matches it (CPU, no GPU needed).

The live stack (run.py: random weights at the model's shapes) routes a prefill chunk's tokens to few experts: they
attend to the same earlier tokens, so their hidden states grow alike layer by layer (moe_graph_table.chunk_inputs).
Every MoE price table was timed with even routings, so the steps with chunks were under-priced (docs/live.md, session
49). The routing is arithmetic, not timing: this script runs the model-shaped forward of one fresh chunk on the CPU at
the model's real shapes, per chunk length, and writes each layer's busiest-expert balance (its share of the routed
slots over an even share) and the Zipf skew of the dataset's routings (MoEWorkload.skew, the axis every fused_moe row
is measured on: 0, 0.6, 1.2) whose expected balance at that length is the same. `run.py --predict --chunk-routing`
prices a step with chunks at those skews, from the H200 rows of the config the step ran.

    python benchmarks/live_e2e/chunk_routing.py --out benchmarks/live_e2e/chunk_routing.json    # ~40 min, 2 cores
    # the committed file: OLMoE at every length, Mixtral to 1,024 tokens (~25 min together)
    python benchmarks/live_e2e/chunk_routing.py --models olmoe-1b-7b
    python benchmarks/live_e2e/chunk_routing.py --models mixtral-8x7b --lengths 16,32,64,128,256,512,1024
    python benchmarks/live_e2e/chunk_routing.py --smoke --out /tmp/cr.json                       # the tiny model
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.live_e2e.moe_graph_table import chunk_inputs, routing_balance  # noqa: E402

HERE = Path(__file__).resolve().parent
OUT_PATH = HERE / "chunk_routing.json"
MODELS = ("olmoe-1b-7b", "mixtral-8x7b")  # the models the live runs serve
LENGTHS = (16, 32, 64, 128, 256, 512, 1024, 2048)  # chunk lengths; longer ones take the last (prices clamp there)
SKEWS = tuple(round(0.05 * i, 2) for i in range(25))  # 0 .. 1.2: the dataset's skew range
MAX_SKEW = SKEWS[-1]


def log(msg: str) -> None:
    print(f"[chunk_routing {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def even_balance(num_tokens: int, num_experts: int, top_k: int, skew: float, seeds: int = 8) -> float:
    """The mean busiest-expert balance of the dataset's routing (fused_moe.router_logits) at this skew and length."""
    from kernel_gym.kernels import fused_moe as fm
    from kernel_gym.kernels.workloads import MoEWorkload

    wl = MoEWorkload(num_tokens, num_experts, top_k, 64, 64, skew, "float32")
    layers = [fm.MoEInputs(wl, None, fm.router_logits(wl, seed=s), None, None) for s in range(seeds)]
    return sum(routing_balance(layers)) / seeds


def matching_skew(balance: float, curve: list[float]) -> float:
    """The skew on SKEWS whose balance (curve, increasing) equals `balance`, linear between grid points; 0 below the
    even routing's own balance, MAX_SKEW above the dataset's range."""
    if balance <= curve[0]:
        return 0.0
    for i in range(1, len(curve)):
        if balance <= curve[i]:
            lo, hi = curve[i - 1], curve[i]
            return round(SKEWS[i - 1] + (SKEWS[i] - SKEWS[i - 1]) * (balance - lo) / max(hi - lo, 1e-12), 3)
    return MAX_SKEW


def model_routing(spec: dict, lengths: tuple[int, ...], seeds: int, done: dict | None = None,
                  save: Any = None) -> dict:
    """Per chunk length: every layer's balance (mean over `seeds` chunks up to 128 tokens, one above: a long chunk's
    balance is an average over many tokens already) and matching skew; lengths in `done` are kept, `save(out)` is
    called after each new one (a long run keeps what it has)."""
    import torch

    from kernel_gym.kernels.workloads import MoEWorkload

    e, k, hidden, inter = spec["num_experts"], spec["top_k"], spec["hidden"], spec["intermediate"]
    out = dict(done or {})
    todo = [t for t in lengths if str(t) not in out]
    balances: dict[int, list[list[float]]] = {t: [] for t in todo}
    for seed in range(seeds):  # one set of expert weights per seed, shared by every length
        gen = torch.Generator().manual_seed(seed)
        weights = [(torch.randn(e, 2 * inter, hidden, generator=gen) * hidden ** -0.5,
                    torch.randn(e, hidden, inter, generator=gen) * inter ** -0.5)]
        for t in todo:
            if seed and t > 128:
                continue
            t0 = time.monotonic()
            wl = MoEWorkload(t, e, k, hidden, inter, 0.0, "float32")
            balances[t].append(routing_balance(chunk_inputs(spec, wl, weights, gen, "cpu", torch.float32)))
            if seed == (seeds - 1 if t <= 128 else 0):
                balance = [sum(col) / len(balances[t]) for col in zip(*balances[t])]
                curve = [even_balance(t, e, k, s) for s in SKEWS]
                skews = [matching_skew(b, curve) for b in balance]
                out[str(t)] = {"balance": [round(b, 3) for b in balance], "skew": skews,
                               "even_balance": round(curve[0], 3), "chunks": len(balances[t])}
                log(f"{spec['name']} T={t}: balance mean {sum(balance) / len(balance):.2f} (even {curve[0]:.2f}), "
                    f"skew mean {sum(skews) / len(skews):.2f} ({time.monotonic() - t0:.0f} s)")
                if save is not None:
                    save(out)
        del weights
    return {str(t): out[str(t)] for t in sorted(map(int, out))}


def load_table(path: Path | str) -> dict:
    doc = json.loads(Path(path).read_text())
    if doc.get("what") != "chunk_routing":
        raise ValueError(f"{path}: not a chunk_routing.py table (write one with benchmarks/live_e2e/chunk_routing.py)")
    return doc


def main(argv: list[str] | None = None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=OUT_PATH)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--seeds", type=int, default=2,
                   help="chunks (distinct random weights) averaged per length up to 128 tokens (one above)")
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)),
                   help="chunk lengths (a chunk is priced at the nearest one in log2)")
    p.add_argument("--smoke", action="store_true", help="the tiny model at two lengths")
    args = p.parse_args(argv)
    from benchmarks.live_e2e import run as le
    from kernel_gym.models import load_model

    specs = [le.TINY] if args.smoke else [load_model(m) for m in args.models.split(",")]
    lengths = (8, 16) if args.smoke else tuple(int(n) for n in args.lengths.split(","))
    doc: dict[str, Any] = {"what": "chunk_routing", "skews": list(SKEWS),
                           "seeds": args.seeds, "torch": torch.__version__, "models": {}}
    start = time.monotonic()
    if args.out.exists():  # a run that stopped part way: keep what it wrote
        old = json.loads(args.out.read_text())
        if old.get("what") == "chunk_routing":
            doc["models"] = old.get("models", {})

    def write() -> None:
        doc["seconds"] = round(time.monotonic() - start, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")

    for spec in specs:
        def save(out: dict, name: str = spec.name) -> None:
            doc["models"][name] = out
            write()

        doc["models"][spec.name] = model_routing(asdict(spec), lengths, args.seeds, doc["models"].get(spec.name),
                                                 save)
    write()
    log(f"wrote {args.out} ({doc['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
