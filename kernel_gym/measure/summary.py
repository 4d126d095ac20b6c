"""`kernel-gym data --json`: what the embedded (or a given) measurement dataset holds.

Device and software versions, rows per kernel, shapes covered, the fraction of each config space measured (per
workload: configs stored / configs valid for that workload, averaged), and failures by status and reason.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from kernel_gym.measure.recorded import MAX_SPREAD
from kernel_gym.measure.store import PACKAGED_SNAPSHOT, load_rows
from kernel_gym.measure.types import OK


def dataset_summary(path: str | Path | None = None) -> dict[str, Any]:
    """Summary of a snapshot (.jsonl.gz) or store (.sqlite); None = the packaged H200 dataset."""
    path = Path(path) if path else PACKAGED_SNAPSHOT
    groups = load_rows(path)
    devices = sorted({c.device for c, _ in groups})
    kernels: dict[str, Any] = {}
    for ctx, ms in groups:
        k = kernels.setdefault(ctx.kernel, {"rows": 0, "ok": 0, "noisy": 0, "contexts": [], "workloads": {},
                                            "status": Counter(), "reasons": Counter()})
        k["rows"] += len(ms)
        k["contexts"].append({"device": ctx.device, "torch": ctx.torch_version, "triton": ctx.triton_version,
                              "source_hash": ctx.source_hash, "rows": len(ms)})
        for m in ms:
            k["workloads"].setdefault(m.workload, set()).add(m.config)
            k["status"][m.status] += 1
            if m.status == OK:
                k["ok"] += 1
                k["noisy"] += int(m.spread is not None and m.spread > MAX_SPREAD)
            else:
                k["reasons"][f"{m.status}: {_NUMBERS.sub('N', m.reason)[:80]}"] += 1
    out_kernels = {}
    for name, k in sorted(kernels.items()):
        fractions = _space_fractions(name, k["workloads"])
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
        }
    return {
        "path": str(path),
        "devices": devices,
        "torch_versions": sorted({c.torch_version for c, _ in groups}),
        "triton_versions": sorted({c.triton_version for c, _ in groups}),
        "rows": sum(len(ms) for _, ms in groups),
        "ok_rows": sum(k["ok"] for k in kernels.values()),
        "kernels": out_kernels,
    }


def _space_fractions(kernel: str, workloads: dict[str, set[str]]) -> dict[str, Any]:
    """Mean over workloads of stored configs / valid configs (needs the kernel module; None without it)."""
    try:
        from kernel_gym.measure.worker import resolve_family, workload_from_key

        fam = resolve_family(kernel)
    except Exception:  # noqa: BLE001 - a summary without the kernel module still reports the rest
        return {"space": None, "mean": None, "exhaustive": None}
    fractions, exhaustive = [], 0
    for wkey, cfgs in workloads.items():
        valid = {str(c) for c in fam.space.valid_configs(workload_from_key(fam, wkey))}
        if valid:
            frac = len(cfgs & valid) / len(valid)
            fractions.append(frac)
            exhaustive += frac >= 1.0
    return {"space": len(fam.space), "mean": sum(fractions) / len(fractions) if fractions else None,
            "exhaustive": exhaustive}


_NUMBERS = re.compile(r"\d+(\.\d+)?(e[-+]?\d+)?")  # reasons differ only in numbers (sizes, errors): group them


def format_summary(info: dict[str, Any]) -> str:
    lines = [f"dataset {info['path']}: {info['rows']} rows ({info['ok_rows']} ok) on {', '.join(info['devices'])}; "
             f"torch {', '.join(info['torch_versions'])}, triton {', '.join(info['triton_versions'])}"]
    for name, k in info["kernels"].items():
        frac = k["fraction_of_valid_configs_measured"]
        lines.append(f"  {name}: {k['rows']} rows, {k['ok']} ok ({k['ok_noisy']} too noisy to rank), "
                     f"{k['shapes']} shapes "
                     f"({k['shapes_measured_exhaustively']} exhaustive), "
                     f"valid configs measured {'?' if frac is None else f'{100 * frac:.0f}%'}")
        lines.append("      status: " + ", ".join(f"{st} {n}" for st, n in sorted(k["status"].items())))
        for reason, n in list(k["failures_by_reason"].items())[:5]:
            lines.append(f"      {n:6d}  {reason}")
    return "\n".join(lines)
