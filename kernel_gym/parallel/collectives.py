"""The measured collectives table: NCCL all-reduce (tensor parallelism) and all-to-all (expert-parallel dispatch and
combine) times per GPU count and message size, as benchmarks/multigpu/run_collectives.py writes them on a multi-GPU
host.

Why a table and not a formula: NVLink/NVSwitch collectives are latency-bound for small messages and bandwidth-bound
for large ones, with protocol switches (LL, LL128, Simple) in between; the step times of TP and EP layouts differ by
exactly these costs, so they come from measurements on the machine, interpolated in log(time) vs log(bytes) between
measured sizes, never extrapolated further than a factor 2 beyond the measured range.

Table schema (JSON, `FORMAT`, version 1):

    {"format": "kernel_gym-collectives", "version": 1,
     "created": ISO-8601 time, "device": CUDA device name, "gpu_counts": [2, 4, 8],
     "torch": torch version, "nccl": "major.minor.patch", "backend": "nccl" ("gloo" for the CPU dry run),
     "topology": {"text": `nvidia-smi topo -m` output, "gpu0_links": {"GPU1": "NV18", ...}, "link_types": [...]},
     "env": {"NCCL_NVLS_ENABLE": "0", ...}, "timing": {"warmup": n, "repeats": n, "max_inner": n, "method": ...},
     "complete": bool (false: the budget or a failing rank ended the run; "stopped" says why, per GPU count),
     "stopped": {"8": "why", ...},
     "results": [{"op": "all_reduce" | "all_to_all", "gpus": n, "bytes": per-rank buffer bytes,
                  "median_s": float, "p10_s": float, "p90_s": float, "repeats": n, "inner": calls per sample,
                  "host_bound_samples": n, "correct": true}, ...]}

Times are seconds per call with calls back to back (kernel_gym.parallel.launch.time_closure), the slowest rank per
sample; `host_bound_samples` counts samples where Python enqueued slower than the GPU spin lasted (the time may
hold host overhead). An incomplete table is read as is: sizes and GPU counts it lacks are refused as usual.

`bytes` is the buffer each rank passes: all_reduce of a [tokens, hidden] bf16 tensor (tokens x hidden x 2), or
all_to_all_single of a [tokens x top_k, hidden] bf16 tensor split evenly over the ranks.

A PRIOR table (`"prior": {...}` in the file: source, package version, files, what is not known) has the same
schema; its rows carry no correctness check ("correct": null) and may hold more ops (PRIOR_OPS). The packaged prior
`kernel_gym/data/collectives/h200_aic_prior.json` (scripts/aic_prior.py converts aiconfigurator's H200 tables) is
what `resolve_table(None)` answers with when no measured table exists; a measured table always replaces it.
Every figure priced from a prior reports the share of its step time that rests on it (`prior_share`).

Imports only the standard library (and kernel_gym.zoo for the message sizes): the GPU script uses this module.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = "kernel_gym-collectives"
VERSION = 1
OPS = ("all_reduce", "all_to_all")  # what benchmarks/multigpu/run_collectives.py measures
# a prior may carry more: NCCL's own all-reduce beside the engines' custom one, all-reduce outside CUDA graphs, and
# the all-gather / reduce-scatter pair of data-parallel attention in front of tensor-parallel experts
PRIOR_OPS = (*OPS, "all_reduce_nccl", "all_reduce_eager", "all_gather", "reduce_scatter")
GPU_COUNTS = (2, 4, 8)
TOKEN_GRID = tuple(2 ** i for i in range(14))  # 1 .. 8192 tokens per rank
DTYPE_BYTES = 2  # bf16 activations
EXTRAPOLATION = 2.0  # answer up to this factor beyond the measured sizes, refuse further
TABLE_ENV = "KERNEL_GYM_COLLECTIVES"
DEFAULT_TABLE = Path(__file__).resolve().parents[2] / "benchmarks" / "multigpu" / "collectives.json"
MEASURE_COMMAND = "python3 benchmarks/multigpu/run_collectives.py --gpus 8 --out benchmarks/multigpu"
PRIOR_TABLE = Path(__file__).resolve().parents[1] / "data" / "collectives" / "h200_aic_prior.json"
PRIOR_COMMAND = "python3 scripts/aic_prior.py (in a venv with kernel_gym[aic])"
# NVLink multicast (NVLS) stays off: the deployments this models run without it, and it changes all-reduce times.
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


class CollectivesMissing(FileNotFoundError):
    """No measured collectives table: the message names the command that measures one."""


class CollectivesError(ValueError):
    """A table that cannot answer (bad schema, GPU count not measured, size far outside the measured range)."""


def message_sizes(op: str, min_ratio: float = 1.25) -> list[int]:
    """Per-rank buffer bytes the zoo's models produce over TOKEN_GRID: all_reduce hidden x tokens x 2, all_to_all
    tokens x top_k x hidden x 2; sorted, thinned so neighbours differ by at least `min_ratio` (log-log
    interpolation is accurate between them)."""
    from kernel_gym.zoo import ZOO

    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}; use one of {list(OPS)}")
    sizes = set()
    for spec in ZOO.values():
        fan = 1 if op == "all_reduce" else spec.top_k
        sizes.update(t * fan * spec.hidden * DTYPE_BYTES for t in TOKEN_GRID)
    out: list[int] = []
    for s in sorted(sizes):
        if not out or s >= out[-1] * min_ratio:
            out.append(s)
    if out[-1] != max(sizes):
        out.append(max(sizes))  # the largest size is always measured (no extrapolation at the top)
    return out


@dataclass(frozen=True)
class _Curve:
    log_bytes: tuple[float, ...]
    log_s: tuple[float, ...]


class CollectiveTable:
    """A validated collectives table; `time_s(op, gpus, nbytes)` interpolates."""

    def __init__(self, data: dict[str, Any], source: str = "<dict>") -> None:
        self.source = source
        self.data = data
        self.meta = {k: v for k, v in data.items() if k != "results"}
        self.curves: dict[tuple[str, int], _Curve] = {}
        self.prior: dict[str, Any] | None = data.get("prior") if isinstance(data, dict) else None
        self._validate()

    def _fail(self, why: str) -> None:
        raise CollectivesError(f"collectives table {self.source}: {why}; measure it again ({MEASURE_COMMAND})")

    def _validate(self) -> None:
        d = self.data
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            self._fail(f"not a {FORMAT} table (format {d.get('format') if isinstance(d, dict) else None!r})")
        if d.get("version") != VERSION:
            self._fail(f"version {d.get('version')!r}, this code reads version {VERSION}")
        rows = d.get("results")
        if not isinstance(rows, list) or not rows:
            self._fail("no results")
        points: dict[tuple[str, int], dict[int, float]] = {}
        for i, r in enumerate(rows):
            try:
                op, gpus, nbytes, t = r["op"], int(r["gpus"]), int(r["bytes"]), float(r["median_s"])
            except (KeyError, TypeError, ValueError):
                self._fail(f"result {i} lacks op, gpus, bytes or median_s")
            known = PRIOR_OPS if self.prior else OPS
            if op not in known or gpus < 2 or nbytes < 1 or not (t > 0 and math.isfinite(t)):
                self._fail(f"result {i} ({r}) has an unknown op, fewer than 2 GPUs, no bytes or a bad time")
            if r.get("correct") is not True and not self.prior:
                self._fail(f"result {i} ({op}, {gpus} GPUs, {nbytes} B) did not pass its correctness check")
            points.setdefault((op, gpus), {})[nbytes] = t
        for (op, gpus), pts in points.items():
            if len(pts) < 2:
                self._fail(f"{op} on {gpus} GPUs has {len(pts)} measured size (need >= 2 to interpolate)")
            xs = sorted(pts)
            self.curves[(op, gpus)] = _Curve(tuple(math.log(x) for x in xs), tuple(math.log(pts[x]) for x in xs))
        declared = d.get("gpu_counts")
        counts = sorted({g for _, g in self.curves})
        if declared is not None and counts != sorted(declared):
            self._fail(f"gpu_counts {declared} differ from the GPU counts in results {counts}")

    @property
    def is_prior(self) -> bool:
        """True for a labelled prior (not this project's measurement): its seconds count in prior_share."""
        return bool(self.prior)

    def has(self, op: str, gpus: int) -> bool:
        return gpus == 1 or (op, gpus) in self.curves

    @property
    def gpu_counts(self) -> list[int]:
        return sorted({g for _, g in self.curves})

    def sizes(self, op: str, gpus: int) -> list[int]:
        return [round(math.exp(x)) for x in self._curve(op, gpus).log_bytes]

    def _curve(self, op: str, gpus: int) -> _Curve:
        c = self.curves.get((op, gpus))
        if c is None:
            have = sorted(g for o, g in self.curves if o == op)
            raise CollectivesError(
                f"collectives table {self.source} has no {op} on {gpus} GPUs (measured: {have or 'none'}); measure "
                f"that count: python3 benchmarks/multigpu/run_collectives.py --gpus {gpus} --out DIR"
            )
        return c

    def measured_at(self, op: str, gpus: int, nbytes: float) -> bool:
        """Whether `nbytes` is a measured size (else time_s interpolates: an estimate, as replay reports count it)."""
        return gpus == 1 or any(abs(x - math.log(nbytes)) < 1e-9 for x in self._curve(op, gpus).log_bytes)

    def time_s(self, op: str, gpus: int, nbytes: float) -> float:
        """Seconds of one `op` over `gpus` ranks with a per-rank buffer of `nbytes`: log-log interpolation between the
        measured sizes; below the smallest size the smallest size's time (a collective never gets faster for less
        data; latency-bound), above the largest the last segment's slope; refused beyond a factor 2 either way."""
        if gpus == 1:
            return 0.0
        c = self._curve(op, gpus)
        if not nbytes > 0:
            raise CollectivesError(f"{op}: message of {nbytes} bytes; a collective moves > 0 bytes")
        x = math.log(nbytes)
        lo, hi = c.log_bytes[0], c.log_bytes[-1]
        if x < lo - math.log(EXTRAPOLATION) - 1e-9 or x > hi + math.log(EXTRAPOLATION) + 1e-9:
            raise CollectivesError(
                f"{op} on {gpus} GPUs: {nbytes:.0f} B is more than {EXTRAPOLATION:g}x outside the measured sizes "
                f"{math.exp(lo):.0f}..{math.exp(hi):.0f} B of {self.source}; measure sizes that cover it "
                "(benchmarks/multigpu/run_collectives.py --sizes)"
            )
        if x <= lo:
            return math.exp(c.log_s[0])
        i = next((j for j in range(1, len(c.log_bytes)) if c.log_bytes[j] >= x), len(c.log_bytes) - 1)
        x0, x1, y0, y1 = c.log_bytes[i - 1], c.log_bytes[i], c.log_s[i - 1], c.log_s[i]
        return math.exp(y0 + (y1 - y0) * (x - x0) / (x1 - x0))


def table_path(path: str | Path | None = None) -> Path:
    """The table to read: `path`, else $KERNEL_GYM_COLLECTIVES, else benchmarks/multigpu/collectives.json."""
    if path:
        return Path(path)
    env = os.environ.get(TABLE_ENV)
    return Path(env) if env else DEFAULT_TABLE


def load_table(path: str | Path | None = None) -> CollectiveTable:
    """The measured table, or CollectivesMissing naming the command that measures it."""
    p = table_path(path)
    if not p.is_file():
        raise CollectivesMissing(
            f"no measured collectives table at {p}: run `{MEASURE_COMMAND}` on a multi-GPU machine (or point "
            f"{TABLE_ENV} at one); multi-GPU step times are never guessed"
        )
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CollectivesError(f"collectives table {p}: cannot read JSON ({exc})") from exc
    if isinstance(data, dict) and data.get("backend") != "nccl":
        raise CollectivesError(f"collectives table {p} was measured with backend {data.get('backend')!r} (a dry run "
                               f"or a fixture), not NCCL on GPUs; run `{MEASURE_COMMAND}`")
    return CollectiveTable(data, str(p))


def load_prior(path: str | Path | None = None) -> CollectiveTable:
    """The packaged labelled prior (aiconfigurator's H200 tables), or CollectivesMissing naming how to make it."""
    p = Path(path) if path else PRIOR_TABLE
    if not p.is_file():
        raise CollectivesMissing(f"no collectives prior at {p}: run {PRIOR_COMMAND}, or measure a table: "
                                 f"`{MEASURE_COMMAND}`")
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CollectivesError(f"collectives prior {p}: cannot read JSON ({exc})") from exc
    if not isinstance(data, dict) or not data.get("prior"):
        raise CollectivesError(f"{p} carries no 'prior' label (source, version, what is not known); convert it "
                               f"with {PRIOR_COMMAND}")
    return CollectiveTable(data, str(p))


def default_table() -> CollectiveTable:
    """The measured table when one exists (table_path's default), else the packaged prior (labelled)."""
    p = table_path()
    return load_table(p) if p.is_file() else load_prior()


def resolve_table(table: Any = None) -> CollectiveTable:
    """A CollectiveTable as is, a dict, a path, "prior" (the packaged prior), or None: the measured table, else the
    packaged prior (default_table)."""
    if isinstance(table, CollectiveTable):
        return table
    if isinstance(table, dict):
        return CollectiveTable(table)
    if table is None:
        return default_table()
    if str(table) == "prior":
        return load_prior()
    return load_table(table)
