"""Engine exports that never slow a deployment down: vLLM / SGLang fused-MoE config files from configs MEASURED in the
`vllm_fused_moe` family (vLLM's own kernel design and tunables), with the engine's own entry always the default.

`kernel-gym export --format vllm|sglang --model mixtral-8x7b [--tp 2] [--ep N] [--routing uniform|zipf:1.2]
[--engine-version V] --store S.sqlite --out DIR` writes, for the shape one GPU runs (N = intermediate // tp; under
expert parallelism E = the LOCAL expert count, experts // ep, as the engines name their files):
- vllm: DIR/E={E},N={N},device_name={dev}[,dtype=float32].json: vLLM's naming (spaces -> underscores, any H200
  variant -> NVIDIA_H200), read by vLLM from VLLM_TUNED_CONFIG_FOLDER=DIR before its own configs/;
- sglang: DIR/configs/triton_{X_Y_Z}/E={E},N={N},device_name={dev}.json under SGLANG_MOE_CONFIG_DIR=DIR, in the folder
  of the Triton the user's SGLang runs (--triton-version; default the one the named SGLang version pins: 0.5.23 ->
  3.8.0). SGLANG_MOE_CONFIG_DIR replaces SGLang's own folder (docs/deployment.md: how to keep its shipped files).
Keys are vLLM's batch sizes (VLLM_M_KEYS, 1 ... 4096); both engines take the nearest key for any M.

The engine's own entry per key (kernel_gym.kernels.vllm_tables, for the named engine version: its shipped table's
nearest-M entry, else its default rule) stays unless a measured config has a CONFIRMED lead over it at that (M,
routing) on --device (issue 30):
- measured-confirmed: a paired confirmation (benchmarks/vllm_export/run.py or `kernel-gym tune --engine`, passed as
  --confirmations FILE; the packaged/--store rows are not paired) against this very engine entry, or repeated rows
  agreeing: at least two stored rows of the candidate, every one faster than every row of the engine entry by
  --min-gain (and by the rows' noise: `pick`);
- measured-single: a lead in one row only (or repeats that disagree): the engine entry is kept and the candidate is
  listed as unconfirmed in the summary and the sidecar;
- engine entry: nothing measured beats it (or nothing was measured).
Where the engine runs its small-batch path (vLLM 0.33+: M * top_k * 4 <= E, no EP; kernels/vllm_moe.py) only rows timed
on that path (small_batch_store_key) count; rows of the aligned path do not describe what runs there.

Refused (one-line ValueError) unless --force: a device without measurements of this shape (measured on another GPU,
or never). With --force the file is written anyway: the engine's own entries (its shipped table where it has one),
changed only on a confirmed lead measured on another GPU; the sidecar `DIR/kernel_gym_export.json` says it is an
estimate and marks each key estimated or not. The engines never read the sidecar: vLLM opens only the exact file name
and turns every top-level key into int(key), so no note can go inside the config file itself.

Files are written atomically (a temporary file in the same folder, fsync, rename): a full disk or a kill leaves the
previous file or the new one, never a truncated one.

Imports only the standard library and kernel_gym's standard-library modules (no torch): runs anywhere.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from kernel_gym.kernels import vllm_tables
from kernel_gym.kernels.space import Config
from kernel_gym.kernels.workloads import MoEWorkload, parse_key

KERNEL = "vllm_fused_moe"
SIDECAR = "kernel_gym_export.json"
FORMATS = ("vllm", "sglang")
DEFAULT_MIN_GAIN = 0.01
CONFIRMED, SINGLE, ENGINE = "measured-confirmed", "measured-single", "engine entry"
ALIGNED, SMALL_BATCH = "aligned", "small-batch"


@dataclass(frozen=True)
class MoEShape:
    """One GPU's fused-MoE shape: N is the per-shard intermediate size (vLLM's N), num_experts the local experts."""

    num_experts: int
    hidden: int
    n: int
    top_k: int
    dtype: str = "bfloat16"
    ep: int = 1  # expert-parallel degree: the model has num_experts * ep experts

    def workload(self, m: int, skew: float) -> MoEWorkload:
        return MoEWorkload(m, self.num_experts, self.top_k, self.hidden, self.n, skew, self.dtype)

    def fixed_key(self) -> tuple:
        return (self.num_experts, self.top_k, self.hidden, self.n, self.dtype)

    def describe(self) -> dict[str, Any]:
        return {"num_experts": self.num_experts, "hidden": self.hidden, "n": self.n, "top_k": self.top_k,
                "dtype": self.dtype, "ep": self.ep, "global_experts": self.num_experts * self.ep}


ENGINE_DTYPES = {2: "bfloat16", 4: "float32"}  # a spec's dtype_bytes -> the dtype its engine file is keyed on


def engine_dtype(model: Any) -> str:
    """The expert dtype the engine names the model's fused-MoE file by: bf16/fp16 (no dtype part) or float32
    (",dtype=float32"). An fp8 spec (dtype_bytes 1) is refused: the engines read an fp8 model's configs from the
    ",dtype=fp8_w8a8" file, tuned on the fp8 kernel, which kernel_gym does not measure; a bf16-keyed file would be
    written where the engine never looks."""
    quant = getattr(model, "expert_quant", "")
    if quant:
        raise ValueError(f"model {model.name}: its experts are {quant}-quantized (quantization_config): "
                         f"{quantized_moe_kernel(quant)}, not the bf16 fused-MoE kernel whose config files kernel_gym "
                         "measures and writes, so a file written here would never be read; for a bf16 deployment of "
                         "this model drop quantization_config from its config.json (or expert_quant from the spec)")
    size = getattr(model, "dtype_bytes", 2)
    if size not in ENGINE_DTYPES:
        raise ValueError(f"model {model.name}: dtype_bytes {size} (fp8) experts: vLLM and SGLang read an fp8 model's "
                         "fused-MoE configs from E=..,N=..,device_name=..,dtype=fp8_w8a8.json, tuned on the fp8 "
                         "kernel, which kernel_gym does not measure (bf16 and fp32 only); tune that file with vLLM's "
                         "benchmarks/kernels/benchmark_moe.py --dtype fp8_w8a8, or, for a bf16 deployment, drop "
                         "quantization_config from the config.json (a spec file: set \"dtype_bytes\": 2)")
    return ENGINE_DTYPES[size]


def quantized_moe_kernel(method: str) -> str:
    """What the engines run for experts quantized by `method` instead of the bf16 fused MoE (their MoE method
    classes by quant_method), for the messages that refuse or skip an engine file."""
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin"):
        return ("vLLM and SGLang run such experts through their 4/8-bit MoE kernels (Marlin, or the Triton fused MoE "
                "from a ',dtype=int4_w4a16' / 'int8_w8a16' config file that vLLM's benchmarks/kernels/"
                "benchmark_moe.py tunes)")
    if method == "mxfp4":
        return "vLLM and SGLang run mxfp4 experts through their own mxfp4 MoE path (no fused-MoE config file)"
    return f"vLLM and SGLang run {method} experts through that method's own MoE kernel"


def shard_shape(model: Any, tp: int = 1, dtype: str = "", ep: int = 1) -> MoEShape:
    """The shape one GPU runs: N = intermediate // tp (vLLM's and SGLang's N), E = experts // ep (their E); dtype
    (default: the spec's, `engine_dtype`) keys the engine file."""
    dtype = dtype or engine_dtype(model)
    for flag, degree in (("--tp", tp), ("--ep", ep)):
        if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
            raise ValueError(f"{flag} {degree}: a parallel degree is an integer >= 1 (1: not split)")
    if tp > 1 and "@tp" in model.name:  # the spec is one GPU's shard already: a second split would name neither
        raise ValueError(f"--model {model.name} already names a shard and --tp {tp} another: pass one of them")
    if model.intermediate % tp:
        raise ValueError(f"--tp {tp}: the intermediate size {model.intermediate} of {model.name} must split into "
                         f"{tp} equal shards")
    if tp > 1:
        from kernel_gym.zoo import tp_problem

        why = tp_problem(model, tp)
        if why:  # a file for a degree the engine cannot launch the model at would never be read
            raise ValueError(f"--tp {tp}: {why}")
    if model.num_experts % ep:
        raise ValueError(f"--ep {ep}: the {model.num_experts} experts of {model.name} must split evenly over {ep} "
                         "GPUs (the engines name the file by the local expert count)")
    return MoEShape(model.num_experts // ep, model.hidden, model.intermediate // tp, model.top_k, dtype, ep)


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


def baseline(shape: MoEShape, m: int, device: str, engine: str = vllm_tables.DEFAULT_ENGINE,
             triton_version: str = "") -> tuple[Config, str]:
    """(config, 'shipped' | 'default'): what the engine runs for M tokens without the user's file."""
    from kernel_gym.kernels.vllm_moe import to_config

    entry, source = vllm_tables.engine_entry(shape.num_experts, shape.n, m, shape.dtype, device, engine,
                                             triton_version)
    return to_config(entry), source


def engine_path_kind(shape: MoEShape, m: int, engine: str = vllm_tables.DEFAULT_ENGINE) -> str:
    """'small-batch' where the engine skips the alignment at this M (vLLM 0.33 and later), else 'aligned'."""
    small = vllm_tables.naive_block_assignment(m, shape.top_k, shape.num_experts * shape.ep, engine, shape.ep)
    return SMALL_BATCH if small else ALIGNED


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


def repeats_agree(samples: dict[Config, list[float]], cand: Config, base: Config, min_gain: float) -> bool:
    """Repeated rows agreeing: >= 2 rows of the candidate, each faster than every row of the engine entry by
    min_gain."""
    c, b = samples.get(cand, []), samples.get(base, [])
    return len(c) >= 2 and bool(b) and max(c) * (1.0 + min_gain) <= min(b)


# ---- measurements ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    device: str
    triton_version: str
    workload: MoEWorkload
    config: Config
    median_ms: float
    spread: float = 0.0
    path: str = ALIGNED  # which launch path timed it: aligned (store_key) or small-batch


def measured_rows(sources: Iterable[str | Path], source_hash: str | None = None) -> list[Row]:
    """The ok vllm_fused_moe rows of these stores / snapshots: the aligned path's (store_key()) and the small-batch
    path's (small_batch_store_key()); rows of another kernel version are stale: left out."""
    from kernel_gym.kernels import vllm_moe
    from kernel_gym.measure.store import load_rows

    paths = {source_hash or vllm_moe.store_key(): ALIGNED, vllm_moe.small_batch_store_key(): SMALL_BATCH}
    out = []
    for src in sources:
        for ctx, ms in load_rows(src):
            if ctx.kernel != KERNEL or ctx.source_hash not in paths:
                continue
            for m in ms:
                if m.ok and m.median_ms:
                    out.append(Row(ctx.device, ctx.triton_version, parse_key(MoEWorkload, m.workload),
                                   Config.parse(m.config),
                                   float(m.median_ms), float(m.spread or 0.0), paths[ctx.source_hash]))
    return out


Times = dict[tuple[int, float], dict[Config, float]]
Samples = dict[tuple[int, float], dict[Config, list[float]]]


def samples_by_workload(rows: Sequence[Row], shape: MoEShape, device: str,
                        engine: str = vllm_tables.DEFAULT_ENGINE) -> tuple[Samples, Times]:
    """((M, skew) -> {config: every stored time}, the same -> {config: largest stored spread}) of this shape's rows
    measured on `device` on the launch path the engine runs at that M."""
    samples: dict[tuple[int, float], dict[Config, list[Row]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        w = r.workload
        if r.device != device or (w.num_experts, w.top_k, w.hidden, w.intermediate, w.dtype) != shape.fixed_key():
            continue
        if r.path != engine_path_kind(shape, w.num_tokens, engine):
            continue
        samples[(w.num_tokens, w.skew)][r.config].append(r)
    times = {k: {c: [x.median_ms for x in rs] for c, rs in cell.items()} for k, cell in samples.items()}
    spreads: Times = {k: {c: max(x.spread for x in rs) for c, rs in cell.items()} for k, cell in samples.items()}
    return times, spreads


def times_by_workload(rows: Sequence[Row], shape: MoEShape, device: str,
                      engine: str = vllm_tables.DEFAULT_ENGINE) -> tuple[Times, Times]:
    """((M, skew) -> {config: median of its stored times}, the same -> {config: largest stored spread}). The median,
    not the fastest: the fastest of repeats is biased low (the winner's curse) and would flatter a config measured
    more often."""
    samples, spreads = samples_by_workload(rows, shape, device, engine)
    return {k: {c: statistics.median(v) for c, v in cell.items()} for k, cell in samples.items()}, spreads


# ---- paired confirmations ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Confirmation:
    """A config that beat the engine entry in a paired, interleaved timing (benchmarks/vllm_export/run.py or tune
    --engine)."""

    fixed_key: tuple
    m: int
    skew: float
    device: str
    engine_entry: Config
    config: Config
    gain: float
    source: str
    path: str = ALIGNED  # the launch path both were timed on (runs before vLLM 0.33 support: aligned everywhere)


def load_confirmations(paths: Iterable[str | Path]) -> list[Confirmation]:
    """Paired confirmations from benchmarks/vllm_export/run.py's bench_vllm_export.json (its per-key `exported`
    differs from `engine_entry` only where the pick kept its lead paired) or from `kernel-gym tune --engine`'s
    engine_tune.json (`confirmations`)."""
    out: list[Confirmation] = []
    for p in paths:
        path = Path(p)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"--confirmations {path}: not a readable JSON file ({exc}); pass bench_vllm_export.json "
                             "or engine_tune.json") from None
        device = (data.get("meta") or {}).get("engine_device_name") or (data.get("meta") or {}).get("device", "")
        for c in data.get("confirmations", []):
            s = c["shape"]
            out.append(Confirmation((s["num_experts"], s["top_k"], s["hidden"], s["n"], s["dtype"]), int(c["M"]),
                                    round(float(c["skew"]), 3), c.get("device", device),
                                    Config(c["engine_entry"]), Config(c["config"]), float(c["gain"]), str(path),
                                    c.get("engine_path", ALIGNED)))
        skews = {str(k): v for k, v in ((data.get("meta") or {}).get("routings") or {}).items()}
        for name, det in (data.get("details") or {}).items():
            s = det.get("shape") if isinstance(det, dict) else None
            if not s:
                continue
            speed = {(r["M"], r["routing"]): r.get("speedup", 1.0) for r in data.get("models", {}).get(name, {})
                     .get("rows", [])}
            for k in det.get("per_key", []):
                if "exported" not in k or k["exported"] == k.get("engine_entry"):
                    continue
                skew = skews.get(k["routing"], 1.2 if k["routing"] != "uniform" else 0.0)
                out.append(Confirmation((s["num_experts"], s["top_k"], s["hidden"], s["n"], s["dtype"]), int(k["M"]),
                                        round(float(skew), 3), device, Config(k["engine_entry"]),
                                        Config(k["exported"]), float(speed.get((k["M"], k["routing"]), 1.0)),
                                        str(path), k.get("engine_path", ALIGNED)))
    return out


# ---- the table -----------------------------------------------------------------------------------------------------


def build_entries(shape: MoEShape, device: str, skew: float, samples: Samples, min_gain: float = DEFAULT_MIN_GAIN,
                  spreads: Times | None = None, engine: str = vllm_tables.DEFAULT_ENGINE, triton_version: str = "",
                  confirmations: Sequence[Confirmation] = (), measured_device: str | None = None,
                  ) -> tuple[dict[str, dict[str, int]], list[dict[str, Any]]]:
    """({str(M): entry} over vLLM's keys, per-key report: basis, chosen config, engine entry's source, gains, the
    unconfirmed candidate if any). `samples` maps (M, skew) to every stored time per config."""
    from kernel_gym.kernels.vllm_moe import to_entry

    dev = measured_device or device
    content, report = {}, []
    for m in vllm_tables.VLLM_M_KEYS:
        base, source = baseline(shape, m, device, engine, triton_version)
        cell = samples.get((m, round(skew, 3)), {})
        medians = {c: statistics.median(v) for c, v in cell.items()}
        cand, gain = pick(medians, base, min_gain, (spreads or {}).get((m, round(skew, 3))))
        paired = [c for c in confirmations if c.fixed_key == shape.fixed_key() and c.m == m
                  and c.skew == round(skew, 3) and c.device == dev and c.engine_entry == base
                  and c.gain >= 1.0 + min_gain and c.path == engine_path_kind(shape, m, engine)]
        row: dict[str, Any] = {"M": m, "baseline": source, "engine_path": engine_path_kind(shape, m, engine),
                               "measured_configs": len(cell), "baseline_measured": base in cell,
                               "engine_entry": to_entry(base), "confirmed_by": None, "unconfirmed_candidate": None}
        chosen = base
        if paired:
            best = max(paired, key=lambda c: c.gain)
            chosen, gain, row["confirmed_by"] = best.config, best.gain, f"paired ({Path(best.source).name})"
        elif cand != base and repeats_agree(cell, cand, base, min_gain):
            chosen, row["confirmed_by"] = cand, f"repeated rows ({len(cell[cand])} of the candidate)"
        elif cand != base:
            row["unconfirmed_candidate"] = {"config": to_entry(cand), "measured_gain": round(gain, 4),
                                            "rows": len(cell[cand]), "engine_entry_rows": len(cell.get(base, []))}
        row["basis"] = CONFIRMED if chosen != base else SINGLE if row["unconfirmed_candidate"] else ENGINE
        row["changed"] = chosen != base
        row["measured_gain"] = round(gain, 4) if chosen != base else 1.0
        if row["engine_path"] == SMALL_BATCH and not cell:
            row["note"] = ("the engine skips the alignment at this M (small-batch path); no row timed that path, so "
                           "its own entry stays")
        content[str(m)] = to_entry(chosen)
        report.append(row)
    return content, report


def engine_path(out: Path, fmt: str, shape: MoEShape, device: str, triton_version: str) -> Path:
    name = vllm_tables.config_file_name(shape.num_experts, shape.n, device, shape.dtype, engine=fmt)
    if fmt == "vllm":
        return out / name
    return out / "configs" / vllm_tables.triton_folder(triton_version) / name


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` so that a reader (or a crash, or a full disk) sees the old file or the new one, never a
    part: a temporary file in the same folder, flushed and fsynced, then renamed over the target."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:  # the rename itself survives a power loss once the folder is synced
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def write_engine_file(out: Path, fmt: str, shape: MoEShape, device: str, content: dict[str, dict[str, int]],
                      triton_version: str, note: dict[str, Any]) -> Path:
    """Write the config file (plain {M: entry} JSON, nothing else in it) and record it in the sidecar, both
    atomically."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r}: use one of {FORMATS}")
    path = engine_path(out, fmt, shape, device, triton_version)
    text = json.dumps(content, indent=4) + "\n"
    json.loads(text)
    write_atomic(path, text)
    side = out / SIDECAR
    try:
        data = json.loads(side.read_text()) if side.exists() else {"files": {}}
    except ValueError:
        data = {"files": {}}  # an unreadable sidecar (not ours to trust) is rebuilt
    data.setdefault("files", {})[str(path.relative_to(out))] = note
    write_atomic(side, json.dumps(data, indent=1) + "\n")
    return path


def export(model: Any, fmt: str, out: Path, device: str, tp: int = 1, routing: str = "uniform",
           stores: Sequence[str | Path] = (), force: bool = False, min_gain: float = DEFAULT_MIN_GAIN,
           triton_version: str = "", dtype: str = "", rows: Sequence[Row] | None = None, ep: int = 1,
           engine_version: str = "", confirmations: Sequence[str | Path] = ()) -> tuple[Path, dict]:
    """Choose and write one engine file (module docstring); returns (path, the sidecar note). dtype: the experts'
    (default: the spec's dtype_bytes, `engine_dtype`)."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r}: use one of {FORMATS}")
    dtype = dtype or engine_dtype(model)
    engine = vllm_tables.parse_engine(vllm_tables.engine_with_version(fmt, engine_version))
    if not 0 <= min_gain < 1:
        raise ValueError(f"--min-gain {min_gain:g}: give the share a measured config must beat the engine's entry by, "
                         "in [0, 1) (default 0.01: 1%)")
    if fmt == "vllm" and tp > 1 and ep > 1:  # parallel/deploy.why_invalid_deployment masks it in plan too
        raise ValueError(f"--tp {tp} --ep {ep}: vLLM runs the experts either sliced over TP (the file's N = "
                         "intermediate / tp) or whole over expert-parallel ranks (--enable-expert-parallel: E = "
                         "experts / ep, N whole), never both; pass one of --tp and --ep (SGLang's --tp/--ep layout "
                         "slices experts inside expert-parallel groups: --format sglang)")
    shape = shard_shape(model, tp, dtype, ep)
    label, skew = parse_routing(routing)
    tv = vllm_tables.sglang_triton_version(engine, triton_version) if fmt == "sglang" else triton_version
    if rows is None:
        rows = measured_rows(stores)
    conf = load_confirmations(confirmations)
    samples, spread = samples_by_workload(rows, shape, device, engine.id)
    shape_desc = (f"E={shape.num_experts},N={shape.n},H={shape.hidden},top_k={shape.top_k},{dtype} "
                  f"({model.name} tp{tp}{f' ep{ep}' if ep > 1 else ''})")
    others = sorted({r.device for r in rows if r.device != device
                     and (r.workload.num_experts, r.workload.top_k, r.workload.hidden, r.workload.intermediate,
                          r.workload.dtype) == shape.fixed_key()})
    estimate, why, source_device = False, "", device
    measured_here = any(k[1] == skew for k in samples) or any(
        c.fixed_key == shape.fixed_key() and c.skew == skew and c.device == device for c in conf)
    if not measured_here:
        if others:
            why = f"vllm_fused_moe was measured for {shape_desc} on {', '.join(others)}, not on {device!r}"
        else:
            why = f"no vllm_fused_moe measurements of {shape_desc} at routing {label} on {device!r}"
        if not force:
            raise ValueError(f"refusing to export: {why}; measure it (python3 benchmarks/vllm_export/run.py, or "
                             "kernel-gym tune --engine, or kernel-gym collect --kernels vllm_fused_moe), pass --store, "
                             "or --force to write the engine's own entries as an estimate")
        estimate = True
        if others:
            source_device = others[0]
            samples, spread = samples_by_workload(rows, shape, source_device, engine.id)
    content, report = build_entries(shape, device, skew, samples, min_gain, spread, engine.id, tv, conf,
                                    source_device)
    for k in report:  # what rests on nothing measured on this device
        k["estimated"] = estimate and (k["changed"] or k["baseline"] == "default")
    shipped = vllm_tables.shipped_lookup(shape.num_experts, shape.n, device, dtype, engine, tv)
    measured_tv = next((r.triton_version for r in rows if r.device == source_device), "")
    summary = {b: sum(k["basis"] == b for k in report) for b in (CONFIRMED, SINGLE, ENGINE)}
    note = {"estimate": estimate, "why": why, "engine": engine.id, "engine_name": engine.name,
            "engine_version": engine.version, "model": model.name, "tp": tp, "ep": ep, "shape": shape.describe(),
            "device": device,
            "measured_on": source_device if any(r["measured_configs"] for r in report) else None,
            "measured_triton_version": measured_tv, "routing": label, "skew": skew, "min_gain": min_gain,
            "engine_table": shipped[1] if shipped else None, "summary": summary,
            "unconfirmed": [{"M": k["M"], **k["unconfirmed_candidate"]} for k in report if k["unconfirmed_candidate"]],
            "keys": report, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if ep > 1:
        note["ep_note"] = (f"file named by the local expert count ({shape.num_experts} of {shape.num_experts * ep}); "
                           "kernel_gym times the local shape with every token's top-k slots on local experts, while "
                           "a rank sees about 1/ep of them (the rest are blocks of other ranks' experts that write "
                           "zeros): measured leads at EP are an approximation")
    if fmt == "vllm":
        note["engine_reads"] = "VLLM_TUNED_CONFIG_FOLDER=DIR (then vLLM's own configs/)"
    else:
        note["triton_version"] = tv
        note["engine_reads"] = (f"SGLANG_MOE_CONFIG_DIR=DIR: configs/{vllm_tables.triton_folder(tv)}/ first; it "
                                "replaces SGLang's own folder, so copy SGLang's configs/ into DIR to keep its "
                                "shipped files for other shapes")
        down = [t for t in vllm_tables.engine_data(engine.id)["tables"] if t.get("down") and t["E"] ==
                shape.num_experts and t["N"] == shape.n and t["device_name"] == vllm_tables.sglang_device_name(device)]
        if down:  # SGLang would take this second-GEMM file (any Triton folder) beside our first-GEMM entries
            note["sglang_down_files"] = [f"configs/{t['folder']}/{t['file']}" for t in down]
            note["warning"] = ("SGLang ships a separate second-GEMM (_down) table for this shape: if you copied its "
                               "configs/ into DIR, delete " + ", ".join(note["sglang_down_files"]) + " there, or "
                               "SGLang pairs those entries with this file's")
    kept = keep_users_file(out, engine_path(out, fmt, shape, device, tv or "0.0.0"), content)
    if kept:
        note["replaced"] = kept
    path = write_engine_file(out, fmt, shape, device, content, tv or "0.0.0", note)
    return path, note


def keep_users_file(out: Path, path: Path, content: dict[str, dict[str, int]]) -> str:
    """Before an export replaces a config file that kernel_gym did not write (its sidecar does not list it: a
    hand-tuned file, the engine's own copy), the file is kept beside it as NAME.bak (NAME.bak.N if taken): the
    engines read the exact name only, so the copy is inert, and nothing a user stored is lost. Returns what was done,
    for the note and the printed summary; '' when there was nothing to keep."""
    if not path.exists():
        return ""
    try:
        same = json.loads(path.read_text()) == json.loads(json.dumps(content))
    except ValueError:
        same = False
    if same:
        return ""
    side = out / SIDECAR
    try:
        ours = str(path.relative_to(out)) in json.loads(side.read_text()).get("files", {}) if side.exists() else False
    except ValueError:
        ours = False
    if ours:
        return f"replaced the file an earlier export wrote ({path.name})"
    backup = path.with_name(path.name + ".bak")
    n = 1
    while backup.exists():
        backup, n = path.with_name(f"{path.name}.bak.{n}"), n + 1
    path.rename(backup)
    return f"an existing {path.name} that kernel_gym did not write was kept as {backup.name}"


def summary_lines(note: dict[str, Any]) -> list[str]:
    """One line per key: its basis (measured-confirmed / measured-single / engine entry) and why."""
    lines = []
    for k in note["keys"]:
        text = f"  M={k['M']:5d}: {k['basis']}"
        if k["basis"] == CONFIRMED:
            text += f" ({k['confirmed_by']}, x{k['measured_gain']:.3f})"
        elif k["basis"] == SINGLE:
            u = k["unconfirmed_candidate"]
            text += (f" (engine entry kept; unconfirmed candidate x{u['measured_gain']:.3f} in {u['rows']} row(s): "
                     f"{','.join(str(v) for v in u['config'].values())})")
        else:
            text += f" ({k['baseline']})"
        if k.get("estimated"):
            text += " [estimate]"
        if k.get("note"):
            text += f" [{k['note']}]"
        lines.append(text)
    return lines


def export_and_print(*, model: str, fmt: str, out: Path, device: str = "NVIDIA H200", tp: int = 1, ep: int = 1,
                     routing: str = "", skew: float = 0.0, stores: Sequence[str | Path] = (), force: bool = False,
                     min_gain: float = DEFAULT_MIN_GAIN, triton_version: str = "", engine_version: str = "",
                     confirmations: Sequence[str | Path] = ()) -> int:
    """`kernel-gym export --format vllm|sglang`: `export` for the model spec `model` (routing default: zipf:skew, or
    uniform at skew 0), the per-key summary on stderr and the result as JSON on stdout."""
    import sys

    from kernel_gym.models import load_model

    routing = routing or (f"zipf:{skew:g}" if skew else "uniform")
    path, note = export(load_model(model), fmt, out, device, tp, routing, stores, force, min_gain, triton_version,
                        ep=ep, engine_version=engine_version, confirmations=confirmations)
    print("\n".join([f"{note['engine']} file {path} ({note['routing']}, {'ESTIMATE: ' + note['why'] if note['estimate'] else 'measured on ' + str(note['measured_on'])}):",  # noqa: E501
                     *summary_lines(note), *([f"WARNING: {note['warning']}"] if note.get("warning") else []),
                     *([f"note: {note['replaced']}"] if note.get("replaced") else [])]),
          file=sys.stderr)
    print(json.dumps({"format": fmt, "engine": note["engine"], "path": str(path),
                      "estimate": note["estimate"], "keys": len(note["keys"]), **note["summary"],
                      "keys_changed_from_engine_entry": sum(k["changed"] for k in note["keys"]),
                      "unconfirmed_candidates": len(note["unconfirmed"]),
                      "sidecar": str(out / SIDECAR)}, indent=1))
    return 0
