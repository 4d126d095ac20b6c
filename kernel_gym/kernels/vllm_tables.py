"""The engines' fused-MoE config rules and shipped H200 tables, per engine version, as data.

Each engine version kernel_gym targets is an `Engine` ("vllm-0.34.0", "vllm-0.33.0", "sglang-0.5.23"); its shipped
tables for unquantised experts on the H200 are the JSON file kernel_gym/data/engine_tables/<engine>-<version>.json,
copied out of that version's wheel by scripts/extract_engine_tables.py (numbers only; vLLM and SGLang are Apache-2.0,
copyright their contributors). The rules below were read in those versions and re-implemented:

vLLM 0.33.0 (vllm/model_executor/layers/fused_moe/fused_moe.py):
- file name `E={E},N={N},device_name={device}[,dtype={dtype}][,block_shape=[bn,bk]].json`; E and N are
  w2.shape[0] and w2.shape[2]: the LOCAL expert count (E / EP size under expert parallelism) and the per-shard
  intermediate size; device = torch.cuda.get_device_name() with spaces as underscores, any name whose
  underscore-separated words include "H200" folded to NVIDIA_H200; no dtype part for bf16/fp16, "float32" for fp32;
- folders: VLLM_TUNED_CONFIG_FOLDER first, then vLLM's own configs/ (so a shape without a user file keeps vLLM's
  shipped table); the JSON is read as {int(key): value} after popping "triton_version";
- entry for M: the key nearest to M (min over keys of |key - M|, ties to the first key);
- without a table, `get_default_config` (bf16/fp16, CUDA): BLOCK_M 16 (M <= 32) / 32 (<= 96) / 64 (<= 512) / 128,
  BLOCK_N 64 (M <= 64) else 128, BLOCK_K 128 (M <= 64) else 64, GROUP_M 16 if M // E > 128 else 1, 4 warps
  (M <= 128) else 8, 4 stages (M <= 32) else 3 (`default_entry`);
- small batches: when M * top_k * 4 <= E (and no expert map, i.e. no expert parallelism) `_prepare_expert_assignment`
  skips moe_align_block_size and the kernel runs one (token, expert) slot per row block (`naive_block_assignment`).

vLLM 0.34.0 (the default release): for unquantised experts the same file name, folders, nearest key, default rule,
small-batch path and the same 22 H200 tables (entry for entry). What changed is outside them: a `..._down.json` file
beside a table configures the second GEMM, read for fp8 w8a8 experts with 128x128 blocks only, and
`try_get_optimal_moe_config` was split into helpers (scripts/check_engine_lookup.py runs them from the wheel).

SGLang 0.5.23 (sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py):
- the same file name without the H200 folding; block_shape printed as a Python list ("[128, 128]");
- folder: `SGLANG_MOE_CONFIG_DIR` (REPLACES SGLang's own folder; default the module's folder), then
  configs/triton_{X_Y_Z}/ of the Triton it runs; if that file is missing, every other configs/triton_*/ folder,
  newest version first, with a WARNING ("Fallback to triton version ..."); configs/ must exist under the folder
  (os.listdir raises otherwise). SGLang 0.5.23 pins torch 2.14.1, which runs Triton 3.8.0 (`SGLANG_PINNED_TRITON`);
- nearest key as vLLM; without a table its default rule: M <= E -> 16/32/64, GROUP 1; else 64/64/32, GROUP 8; no
  num_warps / num_stages, so Triton's launch defaults (4 warps, 3 stages). This is also the rule vLLM had before its
  0.33 rewrite, the anchor of kernel_gym's H200 runs up to run 6;
- a "..._down.json" file beside a table configures the second GEMM; kernel_gym writes none, and SGLang then reuses the
  first GEMM's config for both (as kernel_gym's vllm_fused_moe does). SGLang always aligns (no small-batch path).

Imports only the standard library.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# vLLM's batch-size keys: the M values its tuner (benchmarks/kernels/benchmark_moe.py) writes into every table.
VLLM_M_KEYS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)
CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "engine_tables"
FORMATS = ("vllm", "sglang")
DEFAULT_VERSIONS = {"vllm": "0.34.0", "sglang": "0.5.23"}
DEFAULT_ENGINE = "vllm-0.34.0"  # what "vLLM's own entry" means when no engine is named
SGLANG_PINNED_TRITON = {"0.5.23": "3.8.0"}  # sglang 0.5.23 pins torch==2.14.1, whose wheel requires triton==3.8.0
TRITON_DEFAULT_WARPS, TRITON_DEFAULT_STAGES = 4, 3


@dataclass(frozen=True)
class Engine:
    """One engine release whose rules and shipped tables kernel_gym models."""

    name: str  # "vllm" | "sglang"
    version: str

    @property
    def id(self) -> str:
        return f"{self.name}-{self.version}"

    def __str__(self) -> str:
        return self.id


def known_engines() -> list[str]:
    return sorted(p.stem for p in DATA_DIR.glob("*.json"))


def parse_engine(text: str | Engine) -> Engine:
    """'vllm' / 'vllm-0.33.0' / 'vllm==0.33.0' / 'sglang' ... -> Engine; a version without data is refused."""
    if isinstance(text, Engine):
        return text
    name, version = split_engine_text(str(text))
    if name not in FORMATS:
        raise ValueError(f"engine {text!r}: use vllm or sglang, optionally with a version (e.g. vllm-0.33.0)")
    version = version or DEFAULT_VERSIONS[name]
    if "+" in version and (DATA_DIR / f"{name}-{version.split('+')[0]}.json").is_file():
        version = version.split("+")[0]  # a local build label ('0.34.0+cu128', as __version__ prints it): same release
    eng = Engine(name, version)
    if not (DATA_DIR / f"{eng.id}.json").is_file():
        raise ValueError(f"engine {text!r}: kernel_gym has no tables of {eng.id} (known: {', '.join(known_engines())});"
                         f" name the known release nearest yours ({nearest_known(name, version)} for {version}: its "
                         f"rules and shipped tables are then the ones assumed), or add yours with "
                         f"scripts/extract_engine_tables.py --wheel {name}-{version}-*.whl")
    return eng


def nearest_known(name: str, version: str) -> str:
    """The known release of the engine nearest an unknown version: the same release for a pre-release, dev or post
    build ('0.34.0rc1', '0.34.0.dev12+gabc'), else the newest known at or below it, else the oldest; the newest for a
    version without numbers ('nightly'). Named in the refusal, so that the user need not work it out."""
    def release(v: str) -> tuple[int, ...]:
        m = re.match(r"\d+(?:\.\d+)*", v)
        return (tuple(int(x) for x in m.group(0).split(".")) + (0, 0))[:3] if m else ()  # '0.34' is 0.34.0

    known = sorted((release(e.split("-", 1)[1]), e) for e in known_engines() if e.split("-", 1)[0] == name)
    if not known:
        return f"{name}-{DEFAULT_VERSIONS[name]}"
    want = release(version)
    if not want:
        return known[-1][1]
    same = [e for r, e in known if r == want]
    below = [e for r, e in known if r <= want]
    return (same or below or [known[0][1]])[-1]


def split_engine_text(text: str) -> tuple[str, str]:
    """'vllm-0.33.0' / 'vllm==0.33.0' / 'vllm 0.33.0' / 'vLLM-v0.33.0' -> ('vllm', '0.33.0'); ('vllm', '') without a
    version. Release notes and git tags write versions these ways; the name is not checked here."""
    raw = str(text).strip().lower().replace("==", "-").replace(" ", "-")
    name, _, version = raw.partition("-")
    version = version.strip("-")
    return name, version[1:] if version[:1] == "v" and version[1:2].isdigit() else version


def engine_with_version(name: str, version: str) -> str:
    """--engine NAME (or --format NAME) with --engine-version VERSION -> 'NAME-VERSION'. The version may repeat the
    engine's name ('vllm-0.33.0', as `tune --engine` takes it); another engine's name there is refused, because
    'vllm-sglang-0.5.23' would otherwise be refused as an unknown vLLM release, naming neither mistake."""
    if not str(version).strip():
        return name
    vname, vversion = split_engine_text(version)
    if vname in FORMATS:
        if vname != name:
            raise ValueError(f"--engine-version {version!r} names {vname}, but the engine is {name}: pass --engine "
                             f"{vname} (export: --format {vname}), or a {name} release such as "
                             f"{DEFAULT_VERSIONS[name]}")
        version = vversion
    else:
        version = split_engine_text(f"{name}-{version}")[1]
    return f"{name}-{version}" if version else name


@functools.lru_cache(maxsize=None)
def engine_data(engine_id: str) -> dict[str, Any]:
    """The engine version's data file (tables with their folder, file name, sha256 and entries)."""
    return json.loads((DATA_DIR / f"{engine_id}.json").read_text())


def _entry(e: dict[str, Any]) -> dict[str, int]:
    """An engine file entry with Triton's launch defaults made explicit, in kernel_gym's key order."""
    return {"BLOCK_SIZE_M": int(e["BLOCK_SIZE_M"]), "BLOCK_SIZE_N": int(e["BLOCK_SIZE_N"]),
            "BLOCK_SIZE_K": int(e["BLOCK_SIZE_K"]), "GROUP_SIZE_M": int(e["GROUP_SIZE_M"]),
            "num_warps": int(e.get("num_warps", TRITON_DEFAULT_WARPS)),
            "num_stages": int(e.get("num_stages", TRITON_DEFAULT_STAGES))}


def vllm_device_name(device: str) -> str:
    """The device part of vLLM's file name: spaces -> underscores; any H200 variant -> NVIDIA_H200."""
    name = device.replace(" ", "_")
    return "NVIDIA_H200" if "H200" in name.split("_") else name


def sglang_device_name(device: str) -> str:
    """The device part of SGLang's file name: spaces -> underscores (no H200 folding)."""
    return device.replace(" ", "_")


def dtype_selector(dtype: str) -> str | None:
    """vLLM's / SGLang's dtype part: none for bf16/fp16, "float32" for fp32, "fp8_w8a8" for fp8 experts (the name
    plan shows for an fp8 checkpoint; kernel_gym writes bf16 files only)."""
    if dtype in ("bfloat16", "float16"):
        return None
    if dtype in ("float32", "fp8_w8a8"):
        return dtype
    raise ValueError(f"dtype {dtype!r}: use bfloat16, float16 or float32")


def config_file_name(num_experts: int, n: int, device: str, dtype: str = "bfloat16",
                     block_shape: tuple[int, int] | None = None, engine: str | Engine = "vllm") -> str:
    """The file name the engine looks for. vLLM writes block_shape as [bn,bk], SGLang as Python prints a list.
    num_experts is the LOCAL expert count (E / EP size), n the per-shard intermediate size."""
    name_ = engine.name if isinstance(engine, Engine) else str(engine).replace("==", "-").partition("-")[0]
    if name_ not in FORMATS:
        raise ValueError(f"engine {engine!r}: use vllm or sglang")
    dev = vllm_device_name(device) if name_ == "vllm" else sglang_device_name(device)
    sel = dtype_selector(dtype)
    name = f"E={num_experts},N={n},device_name={dev}" + (f",dtype={sel}" if sel else "")
    if block_shape and all(block_shape):
        shape = str(list(block_shape))
        name += ",block_shape=" + (shape.replace(" ", "") if name_ == "vllm" else shape)
    return name + ".json"


def triton_folder(triton_version: str) -> str:
    """SGLang's version folder: '3.8.0' -> 'triton_3_8_0'."""
    parts = triton_version.strip().split("+")[0].split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"--triton-version {triton_version!r}: give X.Y.Z as triton.__version__ prints it, e.g. 3.8.0")
    return "triton_" + "_".join(parts)


def sglang_triton_version(engine: str | Engine, triton_version: str = "") -> str:
    """The Triton whose folder SGLang reads: the given one, else the one the SGLang version pins."""
    eng = parse_engine(engine)
    if triton_version:
        triton_folder(triton_version)
        return triton_version
    if eng.name != "sglang":
        raise ValueError(f"{eng.id} is not SGLang: no Triton version folder")
    if eng.version not in SGLANG_PINNED_TRITON:
        raise ValueError(f"{eng.id}: kernel_gym does not know which Triton it pins; pass --triton-version X.Y.Z")
    return SGLANG_PINNED_TRITON[eng.version]


def sglang_search_order(folders: list[str], triton_version: str) -> list[str]:
    """SGLang's folder order: the running Triton's folder, then every other triton_* folder newest first."""
    own = triton_folder(triton_version)

    def ver(f: str) -> tuple[int, ...]:
        return tuple(int(x) for x in f.removeprefix("triton_").split("_"))

    rest = sorted((f for f in set(folders) if f.startswith("triton_") and f != own), key=ver, reverse=True)
    return [own, *rest]


def _tables(eng: Engine, down: bool = False) -> list[dict[str, Any]]:
    return [t for t in engine_data(eng.id)["tables"] if bool(t.get("down")) == down]


def shipped_lookup(num_experts: int, n: int, device: str, dtype: str = "bfloat16", engine: str | Engine = "vllm",
                   triton_version: str = "") -> tuple[dict[int, dict[str, int]], dict[str, Any]] | None:
    """(table {M: entry}, where from: engine, folder, file, sha256, fallback) of the engine's own shipped files
    that the engine reads for this shape with no user folder, or None (it then runs its default rule)."""
    eng = parse_engine(engine)
    name = config_file_name(num_experts, n, device, dtype, engine=eng.name)
    tables = {(t["folder"], t["file"]): t for t in _tables(eng)}
    if eng.name == "vllm":
        order = [""]
    else:
        tv = sglang_triton_version(eng, triton_version)
        order = sglang_search_order([f for f, _ in tables], tv)
    for i, folder in enumerate(order):
        t = tables.get((folder, name))
        if t is not None:
            table = {int(m): _entry(e) for m, e in t["entries"].items()}
            return table, {"engine": eng.id, "folder": folder, "file": name, "sha256": t["sha256"],
                           "fallback": i > 0}
    return None


def shipped_table(num_experts: int, n: int, device: str, dtype: str = "bfloat16", engine: str | Engine = "vllm",
                  triton_version: str = "") -> dict[int, dict[str, int]] | None:
    """The engine's shipped table for this shape and device as {M: entry dict}, or None where it ships none."""
    found = shipped_lookup(num_experts, n, device, dtype, engine, triton_version)
    return None if found is None else found[0]


def nearest_key(keys: object, m: int) -> int:
    """vLLM's and SGLang's rule: the key nearest to M (min over keys of |key - M|; ties go to the first key)."""
    return min(keys, key=lambda k: abs(k - m))  # type: ignore[call-overload]


def default_entry(m: int, num_experts: int, engine: str | Engine = "vllm") -> dict[str, int]:
    """The engine's default config for unquantised experts (no table), Triton's launch defaults made explicit.
    num_experts is the local expert count (w2.shape[0])."""
    eng = parse_engine(engine)
    if eng.name == "sglang":
        if m <= num_experts:
            return _entry({"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1})
        return _entry({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8})
    block_m = 16 if m <= 32 else 32 if m <= 96 else 64 if m <= 512 else 128
    return {"BLOCK_SIZE_M": block_m, "BLOCK_SIZE_N": 64 if m <= 64 else 128, "BLOCK_SIZE_K": 128 if m <= 64 else 64,
            "GROUP_SIZE_M": 16 if m // max(num_experts, 1) > 128 else 1, "num_warps": 4 if m <= 128 else 8,
            "num_stages": 4 if m <= 32 else 3}


def engine_entry(num_experts: int, n: int, m: int, dtype: str = "bfloat16", device: str = "NVIDIA H200",
                 engine: str | Engine = "vllm", triton_version: str = "") -> tuple[dict[str, int], str]:
    """(entry, where from) the engine uses for M tokens with no user folder: its shipped table's nearest key
    ("shipped"), else its default rule ("default")."""
    table = shipped_table(num_experts, n, device, dtype, engine, triton_version)
    if table is None:
        return default_entry(m, num_experts, engine), "default"
    return dict(table[nearest_key(table, m)]), "shipped"


def naive_block_assignment(m: int, top_k: int, num_experts: int, engine: str | Engine = "vllm",
                           ep: int = 1) -> bool:
    """Does the engine skip the alignment at this batch (vLLM 0.33: M * top_k * 4 <= E and no expert map, i.e.
    no expert parallelism)? SGLang 0.5.23 always aligns. num_experts: the global expert count."""
    eng = parse_engine(engine)
    if eng.name != "vllm" or ep != 1:
        return False
    major, minor = (int(x) for x in eng.version.split(".")[:2])
    return (major, minor) >= (0, 33) and m * top_k * 4 <= num_experts


# the default vLLM release's shipped tables as {(device, E, N, dtype selector): {M: entry tuple}} (the form older code
# used)
SHIPPED: dict[tuple[str, int, int, str | None], dict[int, tuple[int, ...]]] = {
    (t["device_name"], t["E"], t["N"], None): {int(m): tuple(_entry(e)[k] for k in CONFIG_KEYS)
                                               for m, e in t["entries"].items()}
    for t in engine_data(DEFAULT_ENGINE)["tables"]
}
