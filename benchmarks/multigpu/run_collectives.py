"""Measure NCCL all-reduce and all-to-all on 2, 4 and 8 GPUs of one host: the table the multi-GPU simulator reads.

    python3 benchmarks/multigpu/run_collectives.py --gpus 8 --out benchmarks/multigpu  # GPU host: collectives.json
    python3 benchmarks/multigpu/run_collectives.py --dry-run --out /tmp/coll           # CPU: 2 gloo ranks, tiny sizes

One process per GPU (torch.multiprocessing, NCCL, a file:// rendezvous), for every power-of-two GPU count <= --gpus.
NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1, set here
before torch initialises anything and asserted in every child). Message sizes (kernel_gym.parallel.collectives
.message_sizes): all_reduce of tokens x hidden bf16 and all_to_all_single of tokens x top_k x hidden bf16 (split
evenly over the ranks) for every zoo model's hidden size and top-k over 1..8192 tokens. Each collective is checked
once against known values before it is timed (a failed check is not timed, and the table is written to
collectives_failed.json, which the simulator never reads). Timing (kernel_gym.parallel.launch.time_closure): CUDA
events around back-to-back calls (as many as make a sample last ~1 ms, at most --max-inner) after a GPU spin that
hides the host's enqueueing, so neither Python launch overhead nor the ranks' skew leaving the barrier enters a small
message's time; per sample the slowest rank counts; median, p10 and p90 over --repeats samples. GPU counts run
largest first; --budget-s stops between sizes (all ranks together) and the table keeps what was measured, marked
"complete": false; a rank that raises, dies or hangs past --timeout-s ends the whole job (never a silent wait).
Progress: one line per size on stderr. The output schema is in kernel_gym/parallel/collectives.py. Imports only
torch and the standard library (and the package's standard-library modules for the sizes and the launcher).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kernel_gym.parallel.collectives import FORMAT, NO_MULTICAST_ENV, OPS, VERSION, message_sizes  # noqa: E402

os.environ.update(NO_MULTICAST_ENV)  # before torch: NCCL reads these when it initialises

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

DRY_SIZES = (1024, 4096, 16384)


def topology() -> dict:
    """`nvidia-smi topo -m` as text, and GPU0's link to every other GPU (NV#, PIX, SYS, ...) parsed from it."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"text": "", "gpu0_links": {}, "link_types": [], "note": "nvidia-smi not found"}
    out = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=60).stdout
    return {"text": out, **parse_topology(out)}


def parse_topology(text: str) -> dict:
    """GPU0's row of a `nvidia-smi topo -m` matrix: {"gpu0_links": {"GPU1": "NV18", ...}, "link_types": [...]}."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln) for ln in text.splitlines() if ln.strip()]
    header = next((ln.split() for ln in lines if ln.split() and ln.split()[0] == "GPU0" and "X" not in ln.split()),
                  None)
    row = next((ln.split() for ln in lines if ln.split()[:2] == ["GPU0", "X"]), None)
    links: dict[str, str] = {}
    if header and row:
        for name, val in zip(header, row[1:]):
            if re.fullmatch(r"GPU\d+", name) and name != "GPU0":
                links[name] = val
    return {"gpu0_links": links, "link_types": sorted(set(links.values()))}


def _buffers(torch, op: str, n: int, nbytes: int, rank: int, device, dtype) -> tuple:
    """The buffers of one size and a check against known values: (run closure, correct on this rank)."""
    import torch.distributed as dist

    elem = torch.empty((), dtype=dtype).element_size()
    numel = -(-nbytes // elem)
    numel = -(-numel // n) * n  # all_to_all_single splits evenly
    if op == "all_reduce":
        x = torch.full((numel,), float(rank + 1), dtype=dtype, device=device)
        dist.all_reduce(x)
        correct = bool(torch.all(x == n * (n + 1) / 2).item())  # <= 36 for 8 ranks: exact in bf16
        x.zero_()  # repeated sums would overflow bf16; NCCL's time does not depend on the values
        return (lambda: dist.all_reduce(x)), correct, numel * elem
    chunk = numel // n  # chunk j of rank r holds r * n + j (< 256: exact in bf16); rank r receives i * n + r
    vals = (torch.arange(n, device=device) + rank * n).to(dtype)
    src = vals[:, None].expand(n, chunk).reshape(-1)
    dst = torch.empty_like(src)
    dist.all_to_all_single(dst, src)
    want = (torch.arange(n, device=device) * n + rank).to(dtype)[:, None].expand(n, chunk).reshape(-1)
    correct = bool(torch.equal(dst, want))
    del vals, want
    return (lambda: dist.all_to_all_single(dst, src)), correct, numel * elem


def _time_op(torch, op: str, n: int, nbytes: int, device, opts: dict) -> dict:
    """Check the collective once against known values (all ranks agree on the verdict), then time it
    (kernel_gym.parallel.launch.time_closure: back-to-back calls after a GPU spin, slowest rank per repeat)."""
    import torch.distributed as dist

    from kernel_gym.parallel.launch import time_closure

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    run, correct, buf_bytes = _buffers(torch, op, n, nbytes, dist.get_rank(), device, dtype)
    ok = torch.tensor([1 if correct else 0], device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    correct = bool(ok.item())
    if not correct:  # a wrong collective is not timed: the table refuses it anyway
        return {"op": op, "gpus": n, "bytes": buf_bytes, "correct": False}
    t = time_closure(run, device, opts["repeats"], opts["warmup"], max_inner=opts["max_inner"])
    return {"op": op, "gpus": n, "bytes": buf_bytes, **{k: t[k] for k in ("median_s", "p10_s", "p90_s", "repeats")},
            "inner": t["inner"], "host_bound_samples": t["host_bound_samples"], "correct": True}


def worker(rank: int, n: int, init: str, sizes: dict, opts: dict, rows_file: str) -> None:
    """One rank: every (op, size), checked then timed; rank 0 appends each row to `rows_file` as it is measured (a run
    stopped by the budget or a failure keeps what it measured) and prints progress."""
    import torch
    import torch.distributed as dist

    from kernel_gym.parallel.launch import agree_to_stop, init_rank

    device = init_rank(rank, n, init, opts["backend"], opts["timeout_s"])
    try:
        jobs = [(op, b) for op in OPS for b in sizes[op]]
        t0 = time.time()
        for i, (op, nbytes) in enumerate(jobs):
            if agree_to_stop(device, opts["deadline"]):
                if rank == 0:
                    print(f"[collectives] {n} GPUs: budget spent, stopping after {i} of {len(jobs)} sizes",
                          file=sys.stderr, flush=True)
                break
            row = _time_op(torch, op, n, nbytes, device, opts)
            if rank == 0:
                with open(rows_file, "a") as f:
                    f.write(json.dumps(row) + "\n")
                took = f"{row['median_s'] * 1e6:9.1f} us (x{row['inner']})" if row["correct"] else "FAILED ITS CHECK"
                print(f"[collectives] {n} GPUs {i + 1:3d}/{len(jobs)} {op:<10} {row['bytes'] / 1e6:10.3f} MB "
                      f"{took}  [{time.time() - t0:.0f} s]", file=sys.stderr, flush=True)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def measure(n: int, sizes: dict, opts: dict, scratch: Path) -> tuple[list[dict], str]:
    """Rows measured on n ranks, and '' or why the run ended early (its rows so far are kept)."""
    from kernel_gym.parallel.launch import RankFailure, run_ranks

    init = f"file://{scratch / f'rendezvous_{n}'}"
    rows_file = scratch / f"rows_{n}.jsonl"
    why = ""
    try:
        run_ranks(worker, n, (n, init, sizes, opts, str(rows_file)), opts["deadline"], grace_s=opts["timeout_s"])
    except RankFailure as exc:
        why = str(exc)
    rows = [json.loads(ln) for ln in rows_file.read_text().splitlines() if ln.strip()] if rows_file.exists() else []
    want = sum(len(v) for v in sizes.values())
    if not why and len(rows) < want:
        why = f"budget: {len(rows)} of {want} sizes measured"
    return rows, why


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, default=8, help="largest GPU count; every power of two from 2 up is measured")
    p.add_argument("--out", required=True, help="folder for collectives.json")
    p.add_argument("--repeats", type=int, default=20, help="timed samples per size")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--max-inner", type=int, default=64, help="most back-to-back calls in one timed sample")
    p.add_argument("--sizes", default="", help="comma list of per-rank bytes instead of the zoo's sizes (both ops)")
    p.add_argument("--budget-s", type=float, default=420.0,
                   help="stop measuring after this many seconds (the table keeps what was measured; 0 = none)")
    p.add_argument("--timeout-s", type=float, default=120.0,
                   help="a collective (or NCCL init) waiting this long ends the job; also the grace after the budget")
    p.add_argument("--dry-run", action="store_true", help="CPU: 2 gloo processes, tiny sizes (tests the code path)")
    args = p.parse_args(argv)
    import torch

    if args.dry_run:
        backend, counts = "gloo", [2]
        sizes = {op: list(DRY_SIZES) for op in OPS}
        args.repeats, args.warmup = min(args.repeats, 3), 1
        device = "cpu (gloo dry run: not a GPU measurement)"
    else:
        if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
            print("measure_collectives: needs >= 2 CUDA GPUs (or --dry-run on the CPU)", file=sys.stderr)
            return 2
        backend = "nccl"
        have = min(args.gpus, torch.cuda.device_count())
        counts = [c for c in (16, 8, 4, 2) if c <= have]  # largest first: a budget that runs out loses the small ones
        custom = [int(x) for x in args.sizes.split(",") if x.strip()]
        sizes = {op: custom or message_sizes(op) for op in OPS}
        device = torch.cuda.get_device_name(0)
    t0 = time.time()
    deadline = t0 + args.budget_s if args.budget_s > 0 else float("inf")
    opts = {"backend": backend, "repeats": args.repeats, "warmup": args.warmup, "max_inner": args.max_inner,
            "timeout_s": args.timeout_s, "deadline": deadline}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    n_sizes = sum(len(v) for v in sizes.values())
    print(f"[collectives] {backend}: {counts} GPUs x {n_sizes} sizes ({sizes['all_reduce'][0]} .. "
          f"{max(max(v) for v in sizes.values()) / 1e6:.0f} MB per rank), {args.repeats} samples each; budget "
          f"{args.budget_s:.0f} s; NVLink multicast off ({NO_MULTICAST_ENV})", file=sys.stderr, flush=True)
    rows: list[dict] = []
    stopped: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for n in counts:
            if time.time() > deadline:
                stopped[str(n)] = "budget spent before this GPU count started"
                continue
            got, why = measure(n, sizes, opts, Path(scratch))
            rows += got
            if why:
                stopped[str(n)] = why
            print(f"[collectives] {n} GPUs: {len(got)} of {n_sizes} sizes in {time.time() - t0:.0f} s"
                  + (f" -- ENDED EARLY: {why.splitlines()[0]}" if why else ""), file=sys.stderr, flush=True)
            if why and not why.startswith("budget"):
                print(why, file=sys.stderr)
                break  # a failing rank: do not start the next count on a broken setup
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if backend == "nccl" else ""
    bad = [r for r in rows if not r["correct"]]
    table = {"format": FORMAT, "version": VERSION,
             "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "device": device, "gpu_counts": sorted({r["gpus"] for r in rows}), "torch": torch.__version__,
             "nccl": nccl, "backend": backend,
             "topology": topology() if backend == "nccl" else {}, "env": dict(NO_MULTICAST_ENV),
             "timing": {"warmup": args.warmup, "repeats": args.repeats, "max_inner": args.max_inner,
                        "method": "cuda events around back-to-back calls after a GPU spin, slowest rank per sample"
                        if backend == "nccl" else "perf_counter, slowest rank per sample"},
             "complete": not stopped and not bad, "stopped": stopped, "results": rows}
    # a run that ended early keeps its correct rows (the simulator refuses sizes and GPU counts they do not cover);
    # rows that failed their check make the table unreadable, so they go to a file the simulator never reads
    name = "collectives.json" if rows and not bad else "collectives_failed.json"
    (out / name).write_text(json.dumps(table, indent=1) + "\n")
    ended = "; ".join(f"{k} GPUs: {v.splitlines()[0]}" for k, v in stopped.items())
    print(f"[collectives] wrote {out / name} ({len(rows)} rows; {len(bad)} failed their check; "
          f"{'complete' if table['complete'] else 'INCOMPLETE: ' + (ended or 'see failed rows')})", file=sys.stderr)
    return 0 if table["complete"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
