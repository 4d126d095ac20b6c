"""Engine exports that never slow a deployment down: vLLM / SGLang fused-MoE config files from configs MEASURED in the
`vllm_fused_moe` family (vLLM's own kernel design and tunables), with the engine's own choice always a candidate.

`kernel-gym export --format vllm|sglang --model mixtral-8x7b [--tp 2] [--routing uniform|zipf:1.2] --store S.sqlite
--out DIR` writes, for the model's MoE shape at tensor-parallel degree tp (N = intermediate // tp):
- vllm: DIR/E={E},N={N},device_name={dev}[,dtype=float32].json: vLLM's naming (spaces -> underscores, any H200
  variant -> NVIDIA_H200), read by vLLM from VLLM_TUNED_CONFIG_FOLDER=DIR;
- sglang: DIR/configs/triton_{X_Y_Z}/E={E},N={N},device_name={dev}.json: SGLang's layout under
  SGLANG_MOE_CONFIG_DIR=DIR, in the folder of the Triton version it runs (--triton-version, default the measured one).
Keys are vLLM's batch sizes (VLLM_M_KEYS, 1 ... 4096); both engines take the nearest key for any M.

Per key, the entry is chosen among the configs measured at that (M, routing) on --device: the engine's own entry
(its shipped table's nearest-M entry, else its default rule) is the baseline and stays unless a measured config beat
it by at least --min-gain in the same data. An unmeasured key keeps the baseline. So the file is never slower than
what the engine runs without it, within the measurement's noise (scripts/bench_vllm_export.py re-times the choices
against the shipped table, paired, on the GPU).

Refused (one-line ValueError) unless --force: a device without measurements of this shape (measured on another GPU,
or never). With --force the file is written anyway (other-device measurements, else the engine's own entries) and
its sidecar `DIR/kernel_gym_export.json` says it is an estimate. The engines never read the sidecar: vLLM opens only
the exact file name and turns every top-level key into int(key), so no note can go inside the config file itself.

Imports only the standard library and kernel_gym's standard-library modules (no torch): runs anywhere.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from kernel_gym.kernels import vllm_tables
from kernel_gym.kernels.space import Config
from kernel_gym.kernels.workloads import MoEWorkload

KERNEL = "vllm_fused_moe"
SIDECAR = "kernel_gym_export.json"
FORMATS = ("vllm", "sglang")
DEFAULT_MIN_GAIN = 0.01


@dataclass(frozen=True)
class MoEShape:
    """One tensor-parallel shard's fused-MoE shape: N is the per-shard intermediate size (vLLM's N)."""

    num_experts: int
    hidden: int
    n: int
    top_k: int
    dtype: str = "bfloat16"

    def workload(self, m: int, skew: float) -> MoEWorkload:
        return MoEWorkload(m, self.num_experts, self.top_k, self.hidden, self.n, skew, self.dtype)

    def fixed_key(self) -> tuple:
        return (self.num_experts, self.top_k, self.hidden, self.n, self.dtype)


def shard_shape(model: Any, tp: int = 1, dtype: str = "bfloat16") -> MoEShape:
    """The shape one GPU runs at tensor-parallel degree tp: N = intermediate // tp (vLLM's and SGLang's N)."""
    if tp < 1 or model.intermediate % tp:
        raise ValueError(f"--tp {tp}: the intermediate size {model.intermediate} of {model.name} must split into "
                         f"{tp} equal shards")
    return MoEShape(model.num_experts, model.hidden, model.intermediate // tp, model.top_k, dtype)


def parse_routing(text: str) -> tuple[str, float]:
    """'uniform' -> ('uniform', 0.0); 'zipf:1.2' -> ('zipf-1.2', 1.2): the skew of MoEWorkload (Zipf exponent)."""
    if text == "uniform":
        return "uniform", 0.0
    head, sep, tail = text.partition(":")
    try:
        skew = float(tail)
    except ValueError:
        skew = -1.0
    if head != "zipf" or not sep or not (0 <= skew <= 4) or not math.isfinite(skew):
        raise ValueError(f"--routing {text!r}: use uniform or zipf:S with S the Zipf exponent in [0, 4], e.g. zipf:1.2")
    return ("uniform", 0.0) if skew == 0 else (f"zipf-{skew:g}", round(skew, 3))


def baseline(shape: MoEShape, m: int, device: str) -> tuple[Config, str]:
    """(config, 'shipped' | 'default'): what the engine runs for M tokens without a tuned file."""
    from kernel_gym.kernels.vllm_moe import to_config

    entry, source = vllm_tables.engine_entry(shape.num_experts, shape.n, m, shape.dtype, device)
    return to_config(entry), source


def pick(times: dict[Config, float], base: Config, min_gain: float = DEFAULT_MIN_GAIN,
         spreads: dict[Config, float] | None = None) -> tuple[Config, float]:
    """(chosen config, measured gain = base time / chosen time): the fastest measured config if it beats the
    baseline by at least min_gain and, given the rows' spreads ((p90 - p10) / median of their samples), by more than
    their mean spread: a lead inside the measurements' own noise is not a lead (H200 run 2: picks with a 1-3% sweep
    lead at M <= 64 came out slower paired). An unmeasured baseline cannot be beaten (gain 1.0)."""
    if base not in times or not times:
        return base, 1.0
    best = min(times, key=lambda c: (times[c], str(c)))
    gain = times[base] / times[best]
    margin = min_gain
    if spreads:
        margin = max(margin, 0.5 * (spreads.get(base, 0.0) + spreads.get(best, 0.0)))
    return (best, gain) if gain >= 1.0 + margin else (base, 1.0)


# ---- measurements ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    device: str
    triton_version: str
    workload: MoEWorkload
    config: Config
    median_ms: float
    spread: float = 0.0


def measured_rows(sources: Iterable[str | Path], source_hash: str | None = None) -> list[Row]:
    """The ok vllm_fused_moe rows of these stores / snapshots (rows of another kernel source are stale: left out)."""
    from kernel_gym.measure.store import load_rows

    if source_hash is None:
        from kernel_gym.kernels.vllm_moe import source_hash as current

        source_hash = current()
    out = []
    for src in sources:
        for ctx, ms in load_rows(src):
            if ctx.kernel != KERNEL or ctx.source_hash != source_hash:
                continue
            for m in ms:
                if m.ok and m.median_ms:
                    data = json.loads(m.workload)
                    data.pop("kernel", None)
                    out.append(Row(ctx.device, ctx.triton_version, MoEWorkload(**data), Config.parse(m.config),
                                   float(m.median_ms), float(m.spread or 0.0)))
    return out


Times = dict[tuple[int, float], dict[Config, float]]


def times_by_workload(rows: Sequence[Row], shape: MoEShape, device: str) -> tuple[Times, Times]:
    """((M, skew) -> {config: median of its stored times}, the same -> {config: largest stored spread}) of this
    shape's rows measured on `device`. The median, not the fastest: the fastest of repeats is biased low (the
    winner's curse) and would flatter a config measured more often."""
    samples: dict[tuple[int, float], dict[Config, list[Row]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        w = r.workload
        if r.device != device or (w.num_experts, w.top_k, w.hidden, w.intermediate, w.dtype) != shape.fixed_key():
            continue
        samples[(w.num_tokens, w.skew)][r.config].append(r)
    times: Times = {k: {c: statistics.median(x.median_ms for x in rs) for c, rs in cell.items()}
                    for k, cell in samples.items()}
    spreads: Times = {k: {c: max(x.spread for x in rs) for c, rs in cell.items()} for k, cell in samples.items()}
    return times, spreads


# ---- the table -----------------------------------------------------------------------------------------------------


def build_entries(shape: MoEShape, device: str, skew: float, times: Times, min_gain: float = DEFAULT_MIN_GAIN,
                  spreads: Times | None = None) -> tuple[dict[str, dict[str, int]], list[dict[str, Any]]]:
    """({str(M): entry} over vLLM's keys, per-key report: chosen config, baseline source, measured gain)."""
    from kernel_gym.kernels.vllm_moe import to_entry

    content, report = {}, []
    for m in vllm_tables.VLLM_M_KEYS:
        base, source = baseline(shape, m, device)
        cell = times.get((m, round(skew, 3)), {})
        chosen, gain = pick(cell, base, min_gain, (spreads or {}).get((m, round(skew, 3))))
        content[str(m)] = to_entry(chosen)
        report.append({"M": m, "baseline": source, "measured_configs": len(cell), "baseline_measured": base in cell,
                       "changed": chosen != base, "measured_gain": round(gain, 4)})
    return content, report


def engine_path(out: Path, fmt: str, shape: MoEShape, device: str, triton_version: str) -> Path:
    name = vllm_tables.config_file_name(shape.num_experts, shape.n, device, shape.dtype, engine=fmt)
    if fmt == "vllm":
        return out / name
    return out / "configs" / f"triton_{triton_version.replace('.', '_')}" / name


def write_engine_file(out: Path, fmt: str, shape: MoEShape, device: str, content: dict[str, dict[str, int]],
                      triton_version: str, note: dict[str, Any]) -> Path:
    """Write the config file (plain {M: entry} JSON, nothing else in it) and record it in the sidecar."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r}: use one of {FORMATS}")
    path = engine_path(out, fmt, shape, device, triton_version)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content, indent=4) + "\n")
    side = out / SIDECAR
    data = json.loads(side.read_text()) if side.exists() else {"files": {}}
    data["files"][str(path.relative_to(out))] = note
    side.write_text(json.dumps(data, indent=1) + "\n")
    return path


def export(model: Any, fmt: str, out: Path, device: str, tp: int = 1, routing: str = "uniform",
           stores: Sequence[str | Path] = (), force: bool = False, min_gain: float = DEFAULT_MIN_GAIN,
           triton_version: str = "", dtype: str = "bfloat16", rows: Sequence[Row] | None = None) -> tuple[Path, dict]:
    """Choose and write one engine file (module docstring); returns (path, the sidecar note)."""
    shape = shard_shape(model, tp, dtype)
    label, skew = parse_routing(routing)
    if rows is None:
        rows = measured_rows(stores)
    here, spread = times_by_workload(rows, shape, device)
    shape_desc = f"E={shape.num_experts},N={shape.n},H={shape.hidden},top_k={shape.top_k},{dtype} ({model.name} tp{tp})"
    others = sorted({r.device for r in rows if r.device != device
                     and (r.workload.num_experts, r.workload.top_k, r.workload.hidden, r.workload.intermediate,
                          r.workload.dtype) == shape.fixed_key()})
    estimate, why, source_device = False, "", device
    if not any(k[1] == skew for k in here):
        if others:
            why = f"vllm_fused_moe was measured for {shape_desc} on {', '.join(others)}, not on {device!r}"
        else:
            why = f"no vllm_fused_moe measurements of {shape_desc} at routing {label} on {device!r}"
        if not force:
            raise ValueError(f"refusing to export: {why}; measure it (python3 scripts/bench_vllm_export.py, or "
                             "kernel-gym collect --kernels vllm_fused_moe), pass --store, or --force to write an "
                             "estimate")
        estimate = True
        if others:
            source_device = others[0]
            here, spread = times_by_workload(rows, shape, source_device)
    content, report = build_entries(shape, device, skew, here, min_gain, spread)
    tv = triton_version or next((r.triton_version for r in rows if r.device == source_device), "")
    if fmt == "sglang" and not tv:
        raise ValueError("--format sglang needs --triton-version (SGLang reads configs/triton_X_Y_Z/ of the Triton "
                         "it runs) when no measurement gives one")
    note = {"estimate": estimate, "why": why, "model": model.name, "tp": tp, "shape": shape.__dict__,
            "device": device, "measured_on": source_device if any(r["measured_configs"] for r in report) else None,
            "routing": label, "skew": skew, "min_gain": min_gain, "triton_version": tv, "keys": report,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "engine_reads": "VLLM_TUNED_CONFIG_FOLDER=DIR" if fmt == "vllm" else "SGLANG_MOE_CONFIG_DIR=DIR"}
    path = write_engine_file(out, fmt, shape, device, content, tv or "unknown", note)
    return path, note


def main_from_args(args: Any) -> int:
    """`kernel-gym export --format vllm|sglang` (export.py's parser)."""
    from kernel_gym.models import load_model

    routing = args.routing or (f"zipf:{args.skew:g}" if args.skew else "uniform")
    path, note = export(load_model(args.model), args.format, args.out, args.device, args.tp, routing,
                        args.store, args.force, args.min_gain, args.triton_version)
    changed = sum(k["changed"] for k in note["keys"])
    print(json.dumps({"format": args.format, "path": str(path), "estimate": note["estimate"],
                      "keys_changed_from_engine_default": changed, "keys": len(note["keys"]),
                      "sidecar": str(args.out / SIDECAR)}, indent=1))
    return 0
