"""`kernel-gym data --json`: what the embedded (or a given) measurement dataset holds.

Device and software versions, rows per kernel, shapes covered, the fraction of each config space measured (per
workload: configs stored / configs valid for that workload, averaged), and failures by status and reason.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from kernel_gym.measure.power import power_states
from kernel_gym.measure.recorded import MAX_SPREAD
from kernel_gym.measure.store import PACKAGED_SNAPSHOT, load_rows
from kernel_gym.measure.types import OK


def dataset_summary(path: str | Path | None = None, coverage: bool = True,
                    progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Summary of a snapshot (.jsonl.gz) or store (.sqlite); None = the packaged H200 dataset. `coverage=False` skips
    the share of each config space measured (the slow part: every valid config of every stored workload is
    enumerated); `progress` gets one line per stage, since the whole summary takes about a minute on 2 cores."""
    say = progress or (lambda msg: None)
    t0 = time.time()
    path = Path(path) if path else PACKAGED_SNAPSHOT
    say(f"reading {path.name} ...")
    groups = load_rows(path)
    say(f"read {sum(len(ms) for _, ms in groups)} rows in {time.time() - t0:.0f} s")
    devices = sorted({c.device for c, _ in groups})
    kernels: dict[str, Any] = {}
    for ctx, ms in groups:
        k = kernels.setdefault(ctx.kernel, {"rows": 0, "ok": 0, "noisy": 0, "contexts": [], "workloads": {},
                                            "status": Counter(), "reasons": Counter(), "power": []})
        k["rows"] += len(ms)
        k["contexts"].append({"device": ctx.device, "torch": ctx.torch_version, "triton": ctx.triton_version,
                              "source_hash": ctx.source_hash, "rows": len(ms)})
        for m in ms:
            k["workloads"].setdefault(m.workload, set()).add(m.config)
            k["status"][m.status] += 1
            if m.status == OK:
                k["ok"] += 1
                k["noisy"] += int(m.spread is not None and m.spread > MAX_SPREAD)
                if m.power:
                    k["power"].append(m.power)
            else:
                k["reasons"][f"{m.status}: {_NUMBERS.sub('N', m.reason)[:80]}"] += 1
    out_kernels = {}
    for i, (name, k) in enumerate(sorted(kernels.items())):
        if coverage:
            say(f"[{i + 1}/{len(kernels)}] {name}: config-space coverage of {len(k['workloads'])} shapes "
                f"({time.time() - t0:.0f} s so far)")
        fractions = _space_fractions(name, k["workloads"]) if coverage else \
            {"space": None, "mean": None, "exhaustive": None}
        out_kernels[name] = {
            "rows": k["rows"],
            "ok": k["ok"],
            "ok_noisy": k["noisy"],  # ok rows the recorded backend leaves out (spread > recorded.MAX_SPREAD)
            "contexts": k["contexts"],
            "shapes": len(k["workloads"]),
            "workloads": sorted(k["workloads"]),
            "config_space_size": fractions["space"],
            "fraction_of_valid_configs_measured": fractions["mean"],
            "shapes_measured_exhaustively": fractions["exhaustive"],
            "status": dict(k["status"]),
            "failures_by_reason": dict(k["reasons"].most_common(20)),
            "power": power_states(k["power"]),
        }
    return {
        "path": str(path),
        "zoo_models_with_rows": zoo_models_with_rows({k: v["workloads"] for k, v in kernels.items()}),
        "devices": devices,
        "torch_versions": sorted({c.torch_version for c, _ in groups}),
        "triton_versions": sorted({c.triton_version for c, _ in groups}),
        "rows": sum(len(ms) for _, ms in groups),
        "ok_rows": sum(k["ok"] for k in kernels.values()),
        "kernels": out_kernels,
    }


def zoo_models_with_rows(workloads: dict[str, Any]) -> list[str]:
    """The zoo models (kernel_gym/zoo.py, built-ins included) with stored rows, of a kernel the zoo is measured for
    (MoE, decode), at any of their tensor-parallel shards' shapes (the kernel profile's fixed fields)."""
    from kernel_gym import zoo
    from kernel_gym.kernels.profiles import profile
    from kernel_gym.measure.worker import resolve_family, workload_from_key

    SHAPE_FIELDS = {k: profile(k).fixed_fields for k in zoo.TEST_MODELS}  # noqa: N806
    shapes: set[tuple[str, tuple]] = set()
    for kernel, fields in SHAPE_FIELDS.items():
        if kernel in workloads:
            fam = resolve_family(kernel)
            for key in workloads[kernel]:
                w = _workload(fam, kernel, key, workload_from_key)
                shapes.add((kernel, tuple(getattr(w, f) for f in fields)))
    out = []
    for name, spec in zoo.ZOO.items():
        for tp in zoo.TP_DEGREES:
            try:
                shard = zoo.shard(spec, tp)
            except ValueError:
                continue
            if any((k, tuple(getattr(shard, f) for f in fields)) in shapes for k, fields in SHAPE_FIELDS.items()):
                out.append(name)
                break
    return sorted(out)


def _workload(fam: Any, kernel: str, key: str, workload_from_key: Any) -> Any:
    """A stored workload key as the family's workload; a key the kernel does not know (another version's fields, a
    hand-edited row) is named with the fix instead of a TypeError."""
    try:
        return workload_from_key(fam, key)
    except (TypeError, KeyError, ValueError) as exc:
        raise ValueError(f"a stored {kernel} row has workload {key!r}, which this kernel_gym cannot read ({exc}): "
                         "find its id (sqlite3 STORE \"select id from measurements where workload = '...'\") and "
                         "remove it with kernel-gym data --db STORE --drop-row ID, or read the store with the "
                         "kernel_gym version that wrote it") from exc


def _space_fractions(kernel: str, workloads: dict[str, set[str]]) -> dict[str, Any]:
    """Mean over workloads of stored configs / valid configs (needs the kernel module; None without it)."""
    try:
        from kernel_gym.measure.worker import resolve_family, workload_from_key

        fam = resolve_family(kernel)
    except Exception:  # noqa: BLE001 - a summary without the kernel module still reports the rest
        return {"space": None, "mean": None, "exhaustive": None}
    fractions, exhaustive = [], 0
    for wkey, cfgs in workloads.items():
        valid = {str(c) for c in fam.space.valid_configs(_workload(fam, kernel, wkey, workload_from_key))}
        if valid:
            frac = len(cfgs & valid) / len(valid)
            fractions.append(frac)
            exhaustive += frac >= 1.0
    return {"space": len(fam.space), "mean": sum(fractions) / len(fractions) if fractions else None,
            "exhaustive": exhaustive}


_NUMBERS = re.compile(r"\d+(\.\d+)?(e[-+]?\d+)?")  # reasons differ only in numbers (sizes, errors): group them


def format_summary(info: dict[str, Any]) -> str:
    zoo_rows = info.get("zoo_models_with_rows", [])
    lines = [f"dataset {info['path']}: {info['rows']} rows ({info['ok_rows']} ok) on {', '.join(info['devices'])}; "
             f"torch {', '.join(info['torch_versions'])}, triton {', '.join(info['triton_versions'])}; "
             f"{len(zoo_rows)} zoo models with MoE or decode rows"]
    for name, k in info["kernels"].items():
        frac = k["fraction_of_valid_configs_measured"]
        exhaustive = k["shapes_measured_exhaustively"]
        lines.append(f"  {name}: {k['rows']} rows, {k['ok']} ok ({k['ok_noisy']} too noisy to rank), "
                     f"{k['shapes']} shapes"
                     + ("" if exhaustive is None else f" ({exhaustive} exhaustive)")
                     + ("" if frac is None else f", valid configs measured {100 * frac:.0f}%"))
        lines.append("      status: " + ", ".join(f"{st} {n}" for st, n in sorted(k["status"].items())))
        for reason, n in list(k["failures_by_reason"].items())[:5]:
            lines.append(f"      {n:6d}  {reason}")
        pw = k.get("power") or {}
        if pw.get("rows_recorded") or pw.get("rows_unavailable"):
            sm, temp, slow = pw["sm_mhz_p10_p50_p90"], pw["temp_c_p10_p50_p90"], pw["share_slowed"]
            lines.append(f"      power state: {pw['rows_recorded']} of {k['ok']} ok rows"
                         + (f", SM clock p10/p50/p90 {sm[0]:.0f}/{sm[1]:.0f}/{sm[2]:.0f} MHz" if sm else "")
                         + (f", max temperature p50 {temp[1]:.0f} C" if temp else "")
                         + (f", {slow:.0%} timed under a power or thermal slowdown" if slow is not None else "")
                         + (f" ({pw['rows_unavailable']} rows: no reader)" if pw["rows_unavailable"] else ""))
    return "\n".join(lines)
