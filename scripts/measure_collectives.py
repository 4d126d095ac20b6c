"""Measure NCCL all-reduce and all-to-all on 2, 4 and 8 GPUs of one host: the table the multi-GPU simulator reads.

    python3 scripts/measure_collectives.py --gpus 8 --out benchmarks/multigpu     # GPU host; writes collectives.json
    python3 scripts/measure_collectives.py --dry-run --out /tmp/coll              # CPU: 2 gloo processes, tiny sizes

One process per GPU (torch.multiprocessing, NCCL, a file:// rendezvous), for every power-of-two GPU count <= --gpus.
NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1, set here
before torch initialises anything and asserted in every child). Message sizes (kernel_gym.parallel.collectives
.message_sizes): all_reduce of tokens x hidden bf16 and all_to_all_single of tokens x top_k x hidden bf16 (split
evenly over the ranks) for every zoo model's hidden size and top-k over 1..8192 tokens. Each collective is checked
once against known values before it is timed; times are CUDA events around one call, after warm-ups, with a barrier
between sizes; per repeat the slowest rank counts; median, p10 and p90 over the repeats. The output schema is in
kernel_gym/parallel/collectives.py. Imports only torch, numpy and the standard library (and the package's
standard-library modules for the sizes).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernel_gym.parallel.collectives import FORMAT, NO_MULTICAST_ENV, OPS, VERSION, message_sizes  # noqa: E402

os.environ.update(NO_MULTICAST_ENV)  # before torch: NCCL reads these when it initialises

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
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


def _time_op(dist, torch, op: str, n: int, nbytes: int, device, warmup: int, repeats: int, cuda: bool) -> dict:
    """Check the collective once against known values, then time it; per repeat the slowest rank's time."""
    rank = dist.get_rank()
    numel = -(-nbytes // 2)
    numel = -(-numel // n) * n  # all_to_all_single splits evenly
    dtype = torch.bfloat16 if cuda else torch.float32
    if op == "all_reduce":
        x = torch.full((numel,), float(rank + 1), dtype=dtype, device=device)
        dist.all_reduce(x)
        correct = bool(torch.all(x == n * (n + 1) / 2).item())
        x.zero_()  # repeated sums would overflow bf16; NCCL's time does not depend on the values
        run = lambda: dist.all_reduce(x)  # noqa: E731
    else:
        chunk = numel // n  # chunk j of rank r holds r * n + j (< 256: exact in bf16); rank r receives i * n + r
        src = (torch.arange(n, device=device) + rank * n).repeat_interleave(chunk).to(dtype)
        dst = torch.empty_like(src)
        dist.all_to_all_single(dst, src)
        want = (torch.arange(n, device=device) * n + rank).repeat_interleave(chunk).to(dtype)
        correct = bool(torch.equal(dst, want))
        run = lambda: dist.all_to_all_single(dst, src)  # noqa: E731
    ok = torch.tensor([1 if correct else 0], device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    correct = bool(ok.item())
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        dist.barrier()
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        else:
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
    t = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # a collective ends when its slowest rank does
    ts = sorted(t.tolist())
    q = lambda p: ts[min(len(ts) - 1, int(round(p * (len(ts) - 1))))]  # noqa: E731
    return {"op": op, "gpus": n, "bytes": numel * x_bytes(dtype), "median_s":
            statistics.median(ts), "p10_s": q(0.1), "p90_s": q(0.9), "repeats": repeats, "correct": correct}


def x_bytes(dtype) -> int:
    return 2 if "16" in str(dtype) else 4


def worker(rank: int, n: int, init: str, sizes: dict, opts: dict, out_file: str) -> None:
    import torch
    import torch.distributed as dist

    for k, v in NO_MULTICAST_ENV.items():
        assert os.environ.get(k) == v, f"{k} must be {v} in every rank (NVLink multicast stays off)"
    cuda = opts["backend"] == "nccl"
    if cuda:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(opts["backend"], init_method=init, rank=rank, world_size=n,
                            **({"device_id": device} if cuda else {}))
    try:
        rows = []
        for op in OPS:
            for nbytes in sizes[op]:
                rows.append(_time_op(dist, torch, op, n, nbytes, device, opts["warmup"], opts["repeats"], cuda))
                dist.barrier()
        if rank == 0:
            Path(out_file).write_text(json.dumps(rows))
    finally:
        dist.destroy_process_group()


def measure(n: int, sizes: dict, opts: dict, scratch: Path) -> list[dict]:
    import torch.multiprocessing as mp

    init = f"file://{scratch / f'rendezvous_{n}'}"
    out_file = scratch / f"rows_{n}.json"
    mp.spawn(worker, args=(n, init, sizes, opts, str(out_file)), nprocs=n, join=True)
    return json.loads(out_file.read_text())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, default=8, help="largest GPU count; every power of two from 2 up is measured")
    p.add_argument("--out", required=True, help="folder for collectives.json")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--sizes", default="", help="comma list of per-rank bytes instead of the zoo's sizes (both ops)")
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
        counts = [c for c in (2, 4, 8, 16) if c <= have]
        custom = [int(x) for x in args.sizes.split(",") if x.strip()]
        sizes = {op: custom or message_sizes(op) for op in OPS}
        device = torch.cuda.get_device_name(0)
    opts = {"backend": backend, "repeats": args.repeats, "warmup": args.warmup}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    t0 = time.time()
    with tempfile.TemporaryDirectory() as scratch:
        for n in counts:
            rows += measure(n, sizes, opts, Path(scratch))
            print(f"[collectives] {n} ranks: {len(sizes['all_reduce']) + len(sizes['all_to_all'])} sizes in "
                  f"{time.time() - t0:.0f} s", file=sys.stderr)
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if backend == "nccl" else ""
    table = {"format": FORMAT, "version": VERSION,
             "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "device": device, "gpu_counts": counts, "torch": torch.__version__, "nccl": nccl, "backend": backend,
             "topology": topology() if backend == "nccl" else {}, "env": dict(NO_MULTICAST_ENV),
             "timing": {"warmup": args.warmup, "repeats": args.repeats,
                        "method": "cuda events around one call" if backend == "nccl" else "perf_counter"},
             "results": rows}
    bad = [r for r in rows if not r["correct"]]
    (out / "collectives.json").write_text(json.dumps(table, indent=1) + "\n")
    print(f"[collectives] wrote {out / 'collectives.json'} ({len(rows)} rows; {len(bad)} failed their check)",
          file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
