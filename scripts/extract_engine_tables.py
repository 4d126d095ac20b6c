"""Read an engine's shipped H200 fused-MoE config tables (unquantised experts) out of its wheel into a small JSON data
file of kernel_gym (kernel_gym/data/engine_tables/ENGINE-VERSION.json), so that the numbers kernel_gym uses as
"what the engine runs" carry the engine name and version they come from.

    pip download --no-deps vllm==0.34.0 sglang==0.5.23 -d /tmp/wheels
    python3 scripts/extract_engine_tables.py --wheel /tmp/wheels/vllm-0.34.0-*.whl
    python3 scripts/extract_engine_tables.py --wheel /tmp/wheels/sglang-0.5.23-*.whl

Only the numbers are copied (vLLM and SGLang are Apache-2.0); the rules (default config, file naming, folder search)
are re-implemented in kernel_gym/kernels/vllm_tables.py. The entries keep every key the engine file has, so
that extra keys (SPLIT_K, USE_TMA) are visible; kernel_gym keeps the six Triton launch knobs.

Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "kernel_gym" / "data" / "engine_tables"
# where each engine keeps its fused-MoE tables inside its wheel
VLLM_DIR = "vllm/model_executor/layers/fused_moe/configs/"
SGLANG_DIR = "sglang/srt/layers/moe/moe_runner/triton_utils/configs/"
# an unquantised (bf16/fp16) H200-family table: no dtype / block_shape / per_channel part; SGLang's "_down" files
# (a separate config for the second GEMM) are kept apart
NAME = re.compile(r"^E=(\d+),N=(\d+),device_name=(NVIDIA_H200[A-Za-z0-9_]*?)(_down)?\.json$")


def _wheel_meta(path: Path) -> tuple[str, str]:
    m = re.match(r"^([a-z_]+)-([0-9][^-]*)-", path.name)
    if not m:
        sys.exit(f"{path.name}: not a wheel file name (name-version-...whl); pass the wheel pip downloaded")
    return m.group(1), m.group(2)


def extract(wheel: Path) -> dict:
    engine, version = _wheel_meta(wheel)
    if engine not in ("vllm", "sglang"):
        sys.exit(f"{wheel.name}: engine {engine!r} is not vllm or sglang")
    prefix = VLLM_DIR if engine == "vllm" else SGLANG_DIR
    tables: list[dict] = []
    with zipfile.ZipFile(wheel) as z:
        for info in sorted(z.infolist(), key=lambda i: i.filename):
            if not info.filename.startswith(prefix):
                continue
            rel = info.filename[len(prefix):]
            folder, _, name = rel.rpartition("/")
            if engine == "vllm" and folder:
                continue
            if engine == "sglang" and not folder.startswith("triton_"):
                continue
            m = NAME.match(name)
            if not m:
                continue
            raw = json.loads(z.read(info))
            raw.pop("triton_version", None)
            entries = {str(int(k)): v for k, v in raw.items()}
            tables.append({"file": name, "folder": folder, "E": int(m.group(1)), "N": int(m.group(2)),
                           "device_name": m.group(3), "down": bool(m.group(4)),
                           "sha256": hashlib.sha256(z.read(info)).hexdigest()[:16], "entries": entries})
    return {"engine": engine, "version": version, "source": f"{wheel.name} (PyPI), {prefix}",
            "licence": "Apache-2.0; copyright the vLLM / SGLang contributors; numbers only",
            "selection": "unquantised experts (no dtype / block_shape in the name), device NVIDIA_H200*",
            "tables": tables}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wheel", type=Path, required=True, help="the engine's wheel (pip download --no-deps ...)")
    p.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = p.parse_args(argv)
    if not args.wheel.is_file():
        sys.exit(f"--wheel {args.wheel}: no such file; pip download --no-deps vllm==VERSION -d DIR first")
    data = extract(args.wheel)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"{data['engine']}-{data['version']}.json"
    # one table per line: small diffs, still plain JSON
    body = ",\n".join("  " + json.dumps(t, separators=(",", ":")) for t in data["tables"])
    head = {k: v for k, v in data.items() if k != "tables"}
    text = json.dumps(head, indent=1)[:-2] + ',\n "tables": [\n' + body + "\n ]\n}\n"
    json.loads(text)
    out.write_text(text)
    print(f"wrote {out}: {len(data['tables'])} tables of {data['engine']} {data['version']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
