"""Run vLLM's and SGLang's OWN config-lookup functions on files kernel_gym exports, and on kernel_gym's copies of
their rules and shipped tables (issue 24): does each engine find the file under the name and folder we write, parse
it, and pick the entry we intended at every M? Do `vllm_tables`' default rules and shipped tables equal the engine's?

The engines' functions are taken verbatim from the engine's source (an installed package, found without importing it,
or the wheel given with --vllm-wheel / --sglang-wheel) and executed with small stand-ins for what they import
(vLLM's envs and logger, the device name, Triton's version): `get_config_file_name`, `get_moe_configs`,
`get_default_config`, `try_get_optimal_moe_config` of vllm/model_executor/layers/fused_moe/fused_moe.py and of
sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py. Nothing of their code is stored here; the
output records the sha256 of the file read.

    pip download --no-deps vllm==0.34.0 sglang==0.5.23 -d /tmp/wheels     # or pip install kernel_gym[engines]
    python3 scripts/check_engine_lookup.py --vllm-wheel /tmp/wheels/vllm-0.34.0-*.whl \\
        --sglang-wheel /tmp/wheels/sglang-0.5.23-*.whl --out benchmarks/engine_lookup

Writes OUT/vllm-<version>.json and OUT/sglang-<version>.json; prints a short table. CPU only, standard library +
kernel_gym.
"""

from __future__ import annotations
import __future__

import argparse
import ast
import functools
import hashlib
import importlib.util
import json
import logging
import os
import sys
import tempfile
import types
import zipfile
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernel_gym.deploy import engine_export as ee  # noqa: E402
from kernel_gym.kernels import vllm_tables  # noqa: E402
from kernel_gym.models import load_model  # noqa: E402

SOURCES = {"vllm": "vllm/model_executor/layers/fused_moe/fused_moe.py",
           "sglang": "sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py"}
CONFIG_DIRS = {"vllm": "vllm/model_executor/layers/fused_moe/configs/",
               "sglang": "sglang/srt/layers/moe/moe_runner/triton_utils/configs/"}
FUNCTIONS = ("get_config_file_name", "get_moe_configs", "get_default_config", "try_get_optimal_moe_config")
DEVICE = "NVIDIA H200"
# the exports checked: (model, tp, ep); run 6's shapes, an expert-parallel layout, a model without a shipped table
EXPORTS = (("mixtral-8x7b", 1, 1), ("mixtral-8x7b", 2, 1), ("mixtral-8x22b", 4, 1), ("olmoe-1b-7b", 1, 1),
           ("qwen2-57b-a14b", 1, 1), ("qwen2-57b-a14b", 2, 1), ("mixtral-8x7b", 1, 2), ("phi-3.5-moe", 1, 1))
M_VALUES = sorted({*range(1, 257), *range(256, 4097, 61), *vllm_tables.VLLM_M_KEYS, 5000, 8192, 65536})


class Log(logging.Handler):
    """Collects the engine's log lines (the INFO / WARNING lines users are told to look for)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelname, record.getMessage()))


def locate(engine: str, wheel: Path | None, work: Path) -> tuple[str, Path, str]:
    """(source text, configs folder, where from) of the engine's lookup module."""
    rel = SOURCES[engine]
    if wheel is not None:
        with zipfile.ZipFile(wheel) as z:
            text = z.read(rel).decode()
            for info in z.infolist():
                if info.filename.startswith(CONFIG_DIRS[engine]) and not info.is_dir():
                    z.extract(info, work / engine)
        return text, work / engine / CONFIG_DIRS[engine], wheel.name
    spec = importlib.util.find_spec(engine)  # the package's location only: nothing of it is imported
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{engine} is neither installed nor given as a wheel: pip install kernel_gym[engines], or "
                         f"pip download --no-deps {engine}==VERSION and pass --{engine}-wheel")
    base = Path(list(spec.submodule_search_locations)[0]).parent
    return (base / rel).read_text(), base / CONFIG_DIRS[engine], str(base / rel)


def wheel_version(engine: str, wheel: Path | None) -> str:
    if wheel is not None:
        return wheel.name.split("-")[1]
    from importlib.metadata import version

    return version(engine)


def helpers_called(defs: dict[str, ast.FunctionDef], roots: tuple[str, ...]) -> set[str]:
    """The roots and every module-level function they call, transitively (vLLM 0.34 split
    `try_get_optimal_moe_config` into `_get_configured_moe_config` and `_moe_config_shape`)."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += [c.func.id for c in ast.walk(defs[name]) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                 and c.func.id in defs]
    return seen


def load_functions(engine: str, text: str, configs: Path, device: str, triton_version: str,
                   log: Log) -> tuple[dict[str, Callable], types.SimpleNamespace]:
    """The engine's own lookup functions, compiled from its source, with stand-ins for their imports."""
    tree = ast.parse(text)
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    missing = set(FUNCTIONS) - set(defs)
    if missing:
        raise SystemExit(f"{engine}: {sorted(missing)} not found in {SOURCES[engine]}: another release's layout")
    keep = [defs[n] for n in sorted(helpers_called(defs, FUNCTIONS))]
    module = ast.Module(body=keep, type_ignores=[])
    code = compile(module, SOURCES[engine], "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
    logger = logging.getLogger(f"engine_lookup.{engine}")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(log)
    logger.propagate = False
    for name in ("info_once", "warning_once"):
        setattr(logger, name, functools.partial(
            lambda lvl, msg, *a, scope=None: logger.log(lvl, msg, *a), logging.INFO if "info" in name else
            logging.WARNING))
    envs = types.SimpleNamespace(VLLM_TUNED_CONFIG_FOLDER=None, VLLM_BATCH_INVARIANT=False)
    ns: dict[str, Any] = {
        "__name__": f"engine_lookup_{engine}", "__file__": str(configs.parent / Path(SOURCES[engine]).name),
        "functools": functools, "json": json, "os": os, "logger": logger, "envs": envs,
        "get_device_name_as_file_name": lambda: device.replace(" ", "_"), "get_device_name": lambda: device,
        "current_platform": types.SimpleNamespace(is_rocm=lambda: False),
        "triton": types.SimpleNamespace(__version__=triton_version), "_is_hip": False,
        "_use_low_smem_fp8_default": lambda: False,
        "get_exec": lambda: types.SimpleNamespace(deterministic=types.SimpleNamespace(
            enable_deterministic_inference=False)),
    }
    override = types.ModuleType("override")
    override.get_config = lambda: None  # type: ignore[attr-defined]
    for mod in ("vllm.model_executor.layers.fused_moe", "sglang.srt.layers.moe.moe_runner.triton_utils"):
        sys.modules.setdefault(mod, override)
        sys.modules[mod].get_config = lambda: None  # type: ignore[attr-defined]
    exec(code, ns)  # noqa: S102 - the engine's own lookup functions, read from its published source
    return {n: ns[n] for n in FUNCTIONS}, envs


def intended(content: dict[str, dict], m: int) -> dict:
    return content[str(vllm_tables.nearest_key([int(k) for k in content], m))]


def check(engine: str, wheel: Path | None, out_dir: Path) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"lookup_{engine}_"))
    text, configs, where = locate(engine, wheel, work)
    version = wheel_version(engine, wheel)
    eng = vllm_tables.parse_engine(f"{engine}-{version}")
    tv = vllm_tables.sglang_triton_version(eng) if engine == "sglang" else "3.6.0"
    log = Log()
    fns, envs = load_functions(engine, text, configs, DEVICE, tv, log)
    res: dict[str, Any] = {"engine": engine, "version": version, "source": where,
                           "source_sha256": hashlib.sha256(text.encode()).hexdigest()[:16],
                           "triton_version_assumed": tv if engine == "sglang" else None, "device": DEVICE,
                           "exports": [], "mismatches": []}
    # 1. exported files: found under our name and folder, parsed, the intended entry at every M
    checked = matched = 0
    rows = ee.measured_rows([ROOT / "kernel_gym" / "data" / "h200_measurements.jsonl.gz"])
    for model_name, tp, ep in EXPORTS:
        model = load_model(model_name)
        out = work / "exports" / f"{model_name}-tp{tp}-ep{ep}"
        path, note = ee.export(model, engine, out, DEVICE, tp=tp, ep=ep, rows=rows, force=True, engine_version=version)
        content = json.loads(path.read_text())
        shape = ee.shard_shape(model, tp, ep=ep)
        w1, w2 = (shape.num_experts, 2 * shape.n, shape.hidden), (shape.num_experts, shape.hidden, shape.n)
        if engine == "vllm":
            envs.VLLM_TUNED_CONFIG_FOLDER = str(out)
        else:
            os.environ["SGLANG_MOE_CONFIG_DIR"] = str(out)
        fns["get_moe_configs"].cache_clear()
        log.lines.clear()
        ok = 0
        for m in M_VALUES:
            got = fns["try_get_optimal_moe_config"](w1, w2, shape.top_k, None, m)
            want = intended(content, m)
            if dict(got) == want:
                ok += 1
            elif len(res["mismatches"]) < 20:
                res["mismatches"].append({"file": str(path.relative_to(out)), "M": m, "engine": got, "ours": want})
        found = [msg for lvl, msg in log.lines if str(path) in msg]
        res["exports"].append({"model": model_name, "tp": tp, "ep": ep, "file": str(path.relative_to(out)),
                               "estimate": note["estimate"], "M_checked": len(M_VALUES), "M_intended": ok,
                               "engine_log": [f"{lvl}: {msg}"[:200] for lvl, msg in log.lines[:2]],
                               "found_by_engine": bool(found),
                               "log_level": sorted({lvl for lvl, msg in log.lines if str(path) in msg})})
        checked += len(M_VALUES)
        matched += ok
    res["exports_M_checked"], res["exports_M_intended"] = checked, matched
    envs.VLLM_TUNED_CONFIG_FOLDER = None
    os.environ.pop("SGLANG_MOE_CONFIG_DIR", None)
    # 2. kernel_gym's copy of the default rule against the engine's own, every vLLM key, several expert counts
    agree = total = 0
    for e in (8, 16, 60, 64, 128, 256, 512):
        for m in (*vllm_tables.VLLM_M_KEYS, 33, 97, 513, 8192, 65536):
            got = fns["get_default_config"](m, e, 1024, 2048, 8, None, *([False] if engine == "sglang" else []))
            ours = vllm_tables.default_entry(m, e, eng)
            total += 1
            if vllm_tables._entry(got) == ours:
                agree += 1
            elif len(res["mismatches"]) < 40:
                res["mismatches"].append({"default_rule": True, "E": e, "M": m, "engine": got, "ours": ours})
    res["default_rule_checked"], res["default_rule_agree"] = total, agree
    # 3. kernel_gym's copy of the shipped tables: the engine's own lookup with no user folder, every table's shape
    fns["get_moe_configs"].cache_clear()
    shapes = {(t["E"], t["N"]) for t in vllm_tables.engine_data(eng.id)["tables"] if not t.get("down")}
    tab_ok = 0
    for e, n in sorted(shapes):
        theirs = fns["get_moe_configs"](e, n, None, *([0, 0] if engine == "sglang" else []))
        ours = vllm_tables.shipped_table(e, n, DEVICE, engine=eng)
        same = theirs is not None and ours is not None and {int(k): vllm_tables._entry(v) for k, v in
                                                             theirs.items()} == ours
        tab_ok += same
        if not same and len(res["mismatches"]) < 60:
            res["mismatches"].append({"shipped_table": f"E={e},N={n}", "engine_has": theirs is not None})
    res["shipped_tables_checked"], res["shipped_tables_agree"] = len(shapes), tab_ok
    if engine == "sglang":  # a folder without configs/: SGLang's lookup raises (docs/deployment.md says so)
        empty = work / "empty"
        empty.mkdir()
        os.environ["SGLANG_MOE_CONFIG_DIR"] = str(empty)
        fns["get_moe_configs"].cache_clear()
        try:
            fns["get_moe_configs"](999, 999, None, 0, 0)
            res["folder_without_configs"] = "no error"
        except FileNotFoundError as exc:
            res["folder_without_configs"] = f"FileNotFoundError: {str(exc)[:120]}"
        os.environ.pop("SGLANG_MOE_CONFIG_DIR", None)
    res["ok"] = not res["mismatches"] and all(x["found_by_engine"] for x in res["exports"])
    out_dir.mkdir(parents=True, exist_ok=True)
    ee.write_atomic(out_dir / f"{engine}-{version}.json", json.dumps(res, indent=1) + "\n")
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vllm-wheel", type=Path, default=None)
    p.add_argument("--sglang-wheel", type=Path, default=None)
    p.add_argument("--engines", default="vllm,sglang")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "engine_lookup")
    args = p.parse_args(argv)
    results = []
    for engine in args.engines.split(","):
        wheel = getattr(args, f"{engine}_wheel")
        if wheel is not None and not wheel.is_file():
            p.error(f"--{engine}-wheel {wheel}: no such file")
        results.append(check(engine, wheel, args.out))
    print("engine          exports M intended   default rule   shipped tables  files found (log)")
    for r in results:
        levels = ",".join(sorted({lvl for x in r["exports"] for lvl in x["log_level"]}))
        print(f"{r['engine'] + '-' + r['version']:16s}{r['exports_M_intended']:>7d}/{r['exports_M_checked']:<7d}"
              f"{r['default_rule_agree']:>7d}/{r['default_rule_checked']:<7d}{r['shipped_tables_agree']:>7d}/"
              f"{r['shipped_tables_checked']:<7d}{sum(x['found_by_engine'] for x in r['exports'])}/"
              f"{len(r['exports'])} ({levels})")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
