"""Check the multi-GPU simulator against a live run: a stack of L MoE layers of one zoo model under TP and EP on N
GPUs, timed end to end, beside the simulator's prediction for the same steps (target: error <= 10%).

    python3 benchmarks/multigpu/run_live_parallel.py plan --model mixtral-8x7b --gpus 8 --tokens 1024 \\
        --out plan.json                                                                   # CPU
    python3 benchmarks/multigpu/run_live_parallel.py run --plan plan.json --out live.json  # GPUs
    python3 benchmarks/multigpu/run_live_parallel.py report --plan plan.json --live live.json \\
        --table benchmarks/multigpu/collectives.json                                      # CPU

`plan` (CPU) draws one step's routing (Zipf popularity, Gumbel top-k, seeded), and per layout (TP = N, EP = N) the
shape every GPU runs and the config the simulator's pricer picks for it, with its predicted kernel time and whether
that time is measured or estimated. `run` (one process per GPU, NCCL, NVLink multicast off; imports only torch,
triton, numpy, the standard library and kernel_gym.kernels.fused_moe, which imports only torch and triton) builds
L layers of random weights, checks each rank's fused MoE against the fp32 reference (compiling it before any
collective, so no rank waits in NCCL on another's Triton compile) and the collectives against known values (the
uneven all-to-all splits included), then times with kernel_gym.parallel.launch.time_closure (CUDA events after a GPU
spin that hides Python's launch overhead, slowest rank per sample): TP = fused MoE on the intermediate / N shard then
an all-reduce, per layer; EP = all-to-all dispatch of each rank's tokens to the GPUs of their experts, the local
experts (one expert per received row), all-to-all combine, per layer; also each part alone. --budget-s stops between
layouts (the output keeps what was timed, "complete": false); a rank that raises, dies or hangs past --timeout-s
ends the whole job. `report` predicts L x (kernel + the collectives of the layer from the table) and prints the error
against the live stack (within the 10% target or not) and the error of the parts' sum (how much the composition
itself misses); exit 1 when a layout was not timed live.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kernel_gym.parallel.collectives import NO_MULTICAST_ENV  # noqa: E402

os.environ.update(NO_MULTICAST_ENV)


# ---- plan (CPU) ---------------------------------------------------------------------------------------------------

def sample_routing(num_tokens: int, num_experts: int, top_k: int, skew: float, seed: int) -> list[list[int]]:
    """Top-k experts per token: Gumbel-top-k over Zipf(skew) popularity (MoEWorkload's routing law)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    pop = (np.arange(1, num_experts + 1, dtype=np.float64) ** -skew)
    logits = np.log(pop / pop.sum())[None, :] + rng.gumbel(size=(num_tokens, num_experts))
    return np.argsort(-logits, axis=1)[:, :top_k].tolist()


def plan(args: argparse.Namespace) -> int:
    import numpy as np

    from kernel_gym.kernels import get_family
    from kernel_gym.kernels.workloads import MoEWorkload
    from kernel_gym.models import load_model
    from kernel_gym.parallel.layout import Layout, moe_shard, round_skew
    from kernel_gym.parallel.step_time import StepPricer
    from kernel_gym.traffic.routing import effective_skew
    from kernel_gym.traffic.simulator import round_count

    spec = load_model(args.model)
    n, t = args.gpus, args.tokens
    ids = sample_routing(t, spec.num_experts, spec.top_k, args.skew, args.seed)
    counts = np.bincount(np.asarray(ids).ravel(), minlength=spec.num_experts)
    fam = get_family("fused_moe")
    layouts = []
    for layout in (Layout(n, 1), Layout(1, n)):
        pricer = StepPricer(spec, layout, args.backend, kernels_only=True)  # collectives: from the table at report
        sh = moe_shard(spec, layout, t, args.skew, counts if layout.ep > 1 else None)
        ranks = []
        per = spec.num_experts // layout.ep
        for r in range(n):
            if layout.ep == 1:  # the exact shape runs on the GPU; the simulator prices it on its rounding grid
                wl = MoEWorkload(t, spec.num_experts, spec.top_k, spec.hidden, spec.intermediate // n, args.skew)
                priced = sh.workload
            else:
                local = counts[r * per:(r + 1) * per]
                rows = int(local.sum())
                if rows == 0:
                    ranks.append(None)
                    continue
                skew = round_skew(effective_skew(local, 1)) if per > 1 else 0.0
                wl = MoEWorkload(rows, per, 1, spec.hidden, spec.intermediate, skew)
                priced = MoEWorkload(round_count(rows), per, 1, spec.hidden, spec.intermediate, skew)
            cfg, sec, est = pricer.price("fused_moe", priced)
            if not fam.space.is_valid(cfg, wl):
                cfg, est = fam.default_config(wl), True
                m = pricer.backend.measure("fused_moe", priced, cfg)
                sec = m.median_ms * 1e-3 if m.ok and m.median_ms else None
            ranks.append({"workload": wl.key(), "priced_workload": priced.key(), "rows": wl.num_tokens * wl.top_k,
                          "config": str(cfg), "predicted_s": sec, "estimated": est})
        layouts.append({"layout": layout.name, "tp": layout.tp, "ep": layout.ep, "ranks": ranks,
                        "busiest_rank": max(range(n), key=lambda i: ranks[i]["rows"] if ranks[i] else -1),
                        "imbalance": sh.imbalance,
                        "all_reduce_bytes": t * spec.hidden * spec.dtype_bytes if layout.tp > 1 else 0,
                        "all_to_all_bytes": sh.all_to_all_bytes})
    out = {"model": spec.name, "hidden": spec.hidden, "intermediate": spec.intermediate,
           "num_experts": spec.num_experts, "top_k": spec.top_k, "gpus": n, "tokens": t, "layers": args.layers,
           "skew": args.skew, "seed": args.seed, "routing": ids, "layouts": layouts}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out) + "\n")
    print(f"[plan] {spec.name}, {t} tokens, {n} GPUs, {args.layers} layers -> {args.out}", file=sys.stderr)
    return 0


# ---- run (GPUs) ---------------------------------------------------------------------------------------------------

def _check_kernel(torch, FAMILY, inputs, launch, what: str) -> None:
    """The fused MoE output of one layer against the fp32 reference (before anything is timed)."""
    out = launch().float()
    ref = FAMILY.reference(inputs)
    atol, rtol = FAMILY.tolerance(inputs.workload.dtype)
    if not torch.allclose(out, ref, atol=atol, rtol=rtol):
        err = (out - ref).abs().max().item()
        raise RuntimeError(f"{what}: fused MoE output differs from the reference (max abs error {err:.3g}, atol "
                           f"{atol}, rtol {rtol}); not timing a wrong kernel")


def worker(rank: int, n: int, init: str, p: dict, opts: dict, out_file: str) -> None:
    """One rank: per layout, build L layers, check the kernel and the collectives, then time the stack and its parts.
    Rank 0 rewrites `out_file` after each layout (a run ended by the budget or a failure keeps what it timed)."""
    import torch
    import torch.distributed as dist

    from kernel_gym.kernels.fused_moe import FAMILY, MoEInputs
    from kernel_gym.kernels.space import Config
    from kernel_gym.kernels.workloads import MoEWorkload
    from kernel_gym.parallel.launch import agree_to_stop, init_rank, time_closure

    dev = init_rank(rank, n, init, "nccl", opts["timeout_s"])

    def say(msg: str) -> None:
        if rank == 0:
            print(f"[live] {msg}", file=sys.stderr, flush=True)

    def all_ok(ok: bool, what: str) -> None:
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=dev)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        if not flag.item():  # every rank raises: none is left waiting in a collective
            raise RuntimeError(f"{what}: check failed on some rank; nothing timed")

    try:
        h, L, t, e = p["hidden"], p["layers"], p["tokens"], p["num_experts"]
        ids = torch.tensor(p["routing"], dtype=torch.int64)
        results: dict[str, dict] = {}
        for lay in p["layouts"]:
            if agree_to_stop(dev, opts["deadline"]):
                say(f"budget spent: {lay['layout']} not timed")
                break
            name = lay["layout"]
            mine = lay["ranks"][rank]
            layers = []
            for layer in range(L):
                if mine is None:
                    layers.append(None)
                    continue
                wl = MoEWorkload(**{a: b for a, b in json.loads(mine["workload"]).items() if a != "kernel"})
                inputs = FAMILY.make_inputs(wl, "cuda", seed=layer)
                if lay["ep"] > 1:  # route every received row to its own local expert (top-1, weight 1)
                    per = e // n
                    local = ids.flatten()
                    local = local[(local // per) == rank] - rank * per
                    order = torch.sort(local, stable=True).values
                    logits = torch.full((wl.num_tokens, per), -30.0)
                    logits[torch.arange(wl.num_tokens), order] = 30.0
                    inputs = MoEInputs(wl, inputs.x, logits.to(dev), inputs.w1, inputs.w2)
                layers.append((inputs, FAMILY.prepare(inputs, Config.parse(mine["config"]))))
            # compile (Triton) and check on this rank alone, before any collective of the layout: a slow compile
            # must not leave the other ranks waiting in NCCL, and a wrong kernel is never timed
            if layers[0] is not None:
                _check_kernel(torch, FAMILY, *layers[0], f"rank {rank} {name}")
                for _, launch in layers[1:]:
                    launch()
            torch.cuda.synchronize()
            say(f"{name}: {L} layers built, kernels compiled and checked")
            if lay["ep"] == 1:
                y = torch.full((t, h), float(rank + 1), dtype=torch.bfloat16, device=dev)
                dist.all_reduce(y)
                all_ok(bool(torch.all(y == n * (n + 1) / 2).item()), f"{name} all-reduce")
                y.zero_()

                def kernels(layers=layers) -> None:
                    for _, launch in layers:
                        launch()

                def collectives(y=y) -> None:
                    for _ in range(L):
                        dist.all_reduce(y)

                def stack(layers=layers) -> None:
                    for _, launch in layers:
                        dist.all_reduce(launch())
            else:
                per, tok = e // n, t // n
                dest = (ids // per)  # [t, k] destination rank of every slot
                src_rank = torch.arange(t) // tok
                send = [int(((src_rank[:, None] == rank) & (dest == d)).sum()) for d in range(n)]
                recv = [int(((src_rank[:, None] == s) & (dest == rank)).sum()) for s in range(n)]
                x_send = torch.full((sum(send), h), float(rank), dtype=torch.bfloat16, device=dev)
                x_recv = layers[0][0].x if layers[0] is not None else torch.empty(0, h, dtype=torch.bfloat16,
                                                                                  device=dev)
                back = torch.empty_like(x_send)

                def a2a_in(x_recv=x_recv, x_send=x_send, send=send, recv=recv) -> None:
                    dist.all_to_all_single(x_recv, x_send, output_split_sizes=recv, input_split_sizes=send)

                def a2a_out(y, back=back, send=send, recv=recv) -> None:
                    dist.all_to_all_single(back, y, output_split_sizes=send, input_split_sizes=recv)

                # dispatch: rows from rank s carry s; combine sends them back, so every returned row carries rank
                a2a_in()
                want = torch.repeat_interleave(torch.arange(n, device=dev), torch.tensor(recv, device=dev))
                ok = torch.equal(x_recv, want[:, None].to(x_recv.dtype).expand_as(x_recv).contiguous())
                a2a_out(x_recv)
                all_ok(ok and bool(torch.all(back == rank).item()), f"{name} all-to-all dispatch and combine")
                x_recv.normal_()  # the experts' input again (the check wrote rank ids into it)
                x_send.normal_()

                def kernels(layers=layers) -> None:
                    for item in layers:
                        if item is not None:
                            item[1]()

                def collectives(x_recv=x_recv) -> None:
                    for _ in range(L):
                        a2a_in()
                        a2a_out(x_recv)

                def stack(layers=layers, x_recv=x_recv) -> None:
                    for item in layers:
                        a2a_in()
                        a2a_out(item[1]() if item is not None else x_recv)
            res = {}
            for part, fn in (("stack_s", stack), ("kernels_s", kernels), ("collectives_s", collectives)):
                r = time_closure(fn, dev, opts["repeats"], opts["warmup"])
                res[part] = r["median_s"]
                res[part.replace("_s", "_timing")] = {k: r[k] for k in ("p10_s", "p90_s", "repeats", "inner",
                                                                         "host_bound_samples")}
                say(f"{name} {part[:-2]}: {r['median_s'] * 1e3:.3f} ms (p10 {r['p10_s'] * 1e3:.3f}, p90 "
                    f"{r['p90_s'] * 1e3:.3f}; host-bound samples {r['host_bound_samples']}/{r['repeats']})")
            results[name] = res
            if rank == 0:
                Path(out_file).write_text(json.dumps(results))
            del layers, stack, kernels, collectives
            torch.cuda.empty_cache()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run(args: argparse.Namespace) -> int:
    import datetime
    import time

    import torch

    from kernel_gym.parallel.launch import RankFailure, run_ranks

    p = json.loads(Path(args.plan).read_text())
    n = p["gpus"]
    if torch.cuda.device_count() < n:
        print(f"live_parallel_check: the plan is for {n} GPUs, {torch.cuda.device_count()} visible", file=sys.stderr)
        return 2
    deadline = time.time() + args.budget_s if args.budget_s > 0 else float("inf")
    opts = {"repeats": args.repeats, "warmup": args.warmup, "timeout_s": args.timeout_s, "deadline": deadline}
    why = ""
    with tempfile.TemporaryDirectory() as scratch:
        rows = Path(scratch) / "rows.json"
        try:
            run_ranks(worker, n, (n, f"file://{scratch}/rendezvous", p, opts, str(rows)), deadline,
                      grace_s=args.timeout_s)
        except RankFailure as exc:
            why = str(exc)
            print(f"live_parallel_check: {why}", file=sys.stderr)
        results = json.loads(rows.read_text()) if rows.exists() else {}
    missing = [lay["layout"] for lay in p["layouts"] if lay["layout"] not in results]
    out = {"plan": str(args.plan), "device": torch.cuda.get_device_name(0), "gpus": n,
           "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
           "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "env": dict(NO_MULTICAST_ENV), "complete": not why and not missing, "not_timed": missing,
           "ended_early": why.splitlines()[0] if why else "", "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(results, indent=1))
    return 0 if out["complete"] else 1


# ---- report (CPU) -------------------------------------------------------------------------------------------------

TARGET_ERROR = 0.10


def report(args: argparse.Namespace) -> int:
    from kernel_gym.parallel.collectives import CollectivesError, CollectivesMissing, load_table

    p = json.loads(Path(args.plan).read_text())
    live = json.loads(Path(args.live).read_text())
    try:
        table = load_table(args.table or None)
    except (CollectivesMissing, CollectivesError) as exc:
        print(f"live_parallel_check: {exc}", file=sys.stderr)
        return 2
    L, n = p["layers"], p["gpus"]
    rows, skipped = [], []
    for lay in p["layouts"]:
        busiest = lay["ranks"][lay["busiest_rank"]]
        if busiest["predicted_s"] is None:
            print(f"{lay['layout']}: no kernel time for {busiest['priced_workload']} at {busiest['config']}: measure "
                  "it first (benchmarks/multigpu/run_parallel_replay.py plan, collect --plan)", file=sys.stderr)
            return 2
        m = live["results"].get(lay["layout"])
        if m is None:  # the live run ended before this layout (budget or failure): nothing to compare
            skipped.append(lay["layout"])
            continue
        kernel_s = busiest["predicted_s"]
        if lay["ep"] == 1:  # the live stack: one all-reduce per layer (after the MoE)
            coll = table.time_s("all_reduce", n, lay["all_reduce_bytes"])
        else:  # dispatch and combine
            coll = 2 * table.time_s("all_to_all", n, lay["all_to_all_bytes"])
        predicted = L * (kernel_s + coll)
        error = predicted / m["stack_s"] - 1
        host_bound = sum(m.get(f"{k}_timing", {}).get("host_bound_samples", 0) for k in ("stack", "kernels",
                                                                                         "collectives"))
        rows.append({"layout": lay["layout"], "measured_s": m["stack_s"], "predicted_s": predicted,
                     "predicted_kernel_s": L * kernel_s, "predicted_collectives_s": L * coll,
                     "live_kernels_s": m["kernels_s"], "live_collectives_s": m["collectives_s"],
                     "error": error, "within_target": abs(error) <= TARGET_ERROR,
                     "parts_sum_error": (m["kernels_s"] + m["collectives_s"]) / m["stack_s"] - 1,
                     "kernel_estimated": busiest["estimated"], "imbalance": lay["imbalance"],
                     "live_host_bound_samples": host_bound})
    for r in rows:
        print(f"{r['layout']:<6} live {r['measured_s'] * 1e3:8.3f} ms  simulator {r['predicted_s'] * 1e3:8.3f} ms  "
              f"error {r['error']:+.1%} ({'within' if r['within_target'] else 'OUTSIDE'} the 10% target)  "
              f"parts' sum {r['parts_sum_error']:+.1%}  kernel time "
              f"{'estimated' if r['kernel_estimated'] else 'measured'}  EP imbalance {r['imbalance']:.2f}"
              + (f"  ({r['live_host_bound_samples']} live samples host-bound)" if r["live_host_bound_samples"]
                 else ""))
    for name in skipped:
        print(f"{name:<6} not timed live ({live.get('ended_early') or 'run ended early'})")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "not_timed": skipped, "table": table.source,
                                               "target_error": TARGET_ERROR}, indent=1) + "\n")
    return 0 if rows and not skipped else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("plan", help="CPU: routing, shard shapes, configs and kernel predictions")
    a.add_argument("--model", default="mixtral-8x7b")
    a.add_argument("--gpus", type=int, default=8)
    a.add_argument("--tokens", type=int, default=1024, help="tokens in the step (divisible by --gpus)")
    a.add_argument("--layers", type=int, default=4)
    a.add_argument("--skew", type=float, default=1.2)
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--backend", default="recorded")
    a.add_argument("--out", required=True)
    b = sub.add_parser("run", help="GPUs: time the stacks")
    b.add_argument("--plan", required=True)
    b.add_argument("--out", required=True)
    b.add_argument("--repeats", type=int, default=20)
    b.add_argument("--warmup", type=int, default=3)
    b.add_argument("--budget-s", type=float, default=360.0, help="stop between layouts after this many seconds")
    b.add_argument("--timeout-s", type=float, default=120.0,
                   help="a collective (or NCCL init) waiting this long ends the job; also the grace after the budget")
    c = sub.add_parser("report", help="CPU: prediction vs live")
    c.add_argument("--plan", required=True)
    c.add_argument("--live", required=True)
    c.add_argument("--table", default="")
    c.add_argument("--json", default="")
    args = ap.parse_args(argv)
    if args.cmd == "plan" and args.gpus < 2:
        ap.error("--gpus must be >= 2 (on one GPU, TP and EP are the same layout)")
    if args.cmd == "plan" and args.tokens % args.gpus:
        ap.error("--tokens must divide by --gpus (each EP rank owns tokens / gpus)")
    return {"plan": plan, "run": run, "report": report}[args.cmd](args)


if __name__ == "__main__":
    raise SystemExit(main())
