"""vLLM's shipped fused-MoE config tables for the H200, vLLM's file naming and its config lookup rules, as data.

What vLLM does for an unquantised fused-MoE layer (vllm/model_executor/layers/fused_moe/fused_moe.py,
`try_get_optimal_moe_config`; read, then re-implemented here):
- N is the expert intermediate size per tensor-parallel shard (`w2.shape[2]`), E the number of experts;
- the file name is `E={E},N={N},device_name={device}[,dtype={dtype}][,block_shape=[bn,bk]].json`, where device is
  `torch.cuda.get_device_name()` with spaces replaced by underscores, and any name whose underscore-separated words
  include "H200" is read as `NVIDIA_H200`; dtype is absent for bf16/fp16 and "float32" for fp32 experts;
- the folder `VLLM_TUNED_CONFIG_FOLDER` is searched first, then vLLM's own `configs/`; the JSON is read as
  `{int(key): value}` (a top-level key other than an integer, except "triton_version" which newer vLLM pops, breaks it);
- a table's entry for batch size M is the one whose key is nearest: min over keys of |key - M| (ties: the smaller key,
  the first in the file's order);
- without a table, `get_default_config`: M <= E -> BLOCK 16/32/64, GROUP 1; else 64/64/32, GROUP 8; it sets no
  num_warps / num_stages, so Triton's launch defaults apply (4 warps, 3 stages).

The tables below are the numbers of vLLM's shipped files `E=..,N=..,device_name=NVIDIA_H200.json` for the shapes of
the models kernel_gym benchmarks (Mixtral-8x7B and its TP shards N = 14336/7168/3584/1792, Mixtral-8x22B TP4/TP8
N = 4096/2048, Qwen2-57B-A14B and its shards E=64, N = 2560/1280/640/320). No H200 file exists upstream for OLMoE
(E=64, N=1024), DBRX (E=16) or Qwen1.5-MoE (E=60): those get `get_default_config` in vLLM. Each entry is
(BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_warps, num_stages).

Source and licence: vLLM (https://github.com/vllm-project/vllm), Copyright contributors to the vLLM project,
Apache License 2.0; files at the commits in SHIPPED_SOURCES. Only the numbers are reproduced.

Imports only the standard library.
"""

from __future__ import annotations

# vLLM's batch-size keys: the M values its tuner (benchmarks/kernels/benchmark_moe.py) writes into every table.
VLLM_M_KEYS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)
CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")

# (device file name, E, N, dtype selector) -> {M: entry tuple}
SHIPPED: dict[tuple[str, int, int, str | None], dict[int, tuple[int, int, int, int, int, int]]] = {
    ("NVIDIA_H200", 8, 14336, None): {
        1: (16, 128, 128, 16, 4, 5), 2: (32, 64, 128, 1, 4, 5), 4: (16, 64, 64, 1, 4, 5),
        8: (16, 128, 128, 1, 4, 5), 16: (16, 64, 256, 16, 4, 3), 24: (16, 128, 256, 16, 4, 2),
        32: (16, 128, 128, 16, 8, 3), 48: (32, 128, 128, 16, 4, 3), 64: (32, 128, 128, 64, 4, 3),
        96: (32, 128, 128, 64, 4, 3), 128: (64, 128, 128, 1, 8, 4), 256: (128, 256, 64, 1, 8, 4),
        512: (128, 256, 64, 16, 8, 4), 1024: (128, 256, 64, 16, 8, 4), 1536: (128, 256, 64, 16, 8, 4),
        2048: (128, 256, 64, 32, 8, 4), 3072: (128, 256, 64, 16, 8, 4), 4096: (128, 256, 64, 16, 8, 4),
    },
    ("NVIDIA_H200", 8, 7168, None): {
        1: (16, 128, 128, 64, 4, 5), 2: (16, 128, 256, 16, 4, 3), 4: (16, 128, 128, 32, 8, 4),
        8: (32, 128, 128, 1, 4, 3), 16: (16, 128, 128, 16, 4, 5), 24: (16, 64, 256, 16, 4, 3),
        32: (16, 128, 128, 1, 4, 5), 48: (32, 128, 128, 1, 4, 5), 64: (32, 128, 128, 1, 4, 4),
        96: (64, 128, 128, 1, 8, 4), 128: (64, 128, 128, 1, 8, 4), 256: (128, 256, 64, 1, 8, 4),
        512: (128, 256, 64, 32, 8, 4), 1024: (128, 256, 64, 64, 8, 4), 1536: (128, 256, 64, 16, 8, 4),
        2048: (128, 256, 64, 16, 8, 4), 3072: (128, 256, 64, 64, 8, 4), 4096: (128, 256, 64, 16, 8, 3),
    },
    ("NVIDIA_H200", 8, 3584, None): {
        1: (16, 128, 128, 16, 4, 5), 2: (16, 128, 128, 1, 4, 3), 4: (16, 64, 128, 16, 4, 5),
        8: (16, 64, 128, 16, 4, 5), 16: (16, 128, 128, 32, 8, 3), 24: (16, 128, 128, 1, 8, 3),
        32: (16, 128, 128, 1, 8, 3), 48: (32, 128, 128, 1, 4, 3), 64: (64, 128, 64, 64, 4, 4),
        96: (64, 128, 64, 1, 4, 4), 128: (64, 64, 64, 1, 4, 3), 256: (128, 256, 64, 32, 8, 4),
        512: (128, 256, 64, 16, 8, 4), 1024: (128, 256, 64, 32, 8, 4), 1536: (128, 256, 64, 16, 8, 4),
        2048: (128, 256, 64, 16, 8, 4), 3072: (128, 256, 64, 32, 8, 4), 4096: (128, 256, 64, 32, 8, 4),
    },
    ("NVIDIA_H200", 8, 1792, None): {
        1: (16, 64, 256, 1, 4, 4), 2: (16, 128, 64, 1, 4, 5), 4: (16, 128, 64, 16, 4, 5),
        8: (16, 64, 64, 64, 4, 4), 16: (16, 64, 64, 1, 4, 3), 24: (16, 128, 64, 1, 4, 5),
        32: (16, 64, 64, 1, 4, 3), 48: (32, 128, 128, 1, 4, 3), 64: (64, 64, 64, 64, 4, 3),
        96: (64, 128, 64, 1, 4, 4), 128: (64, 128, 64, 1, 4, 4), 256: (64, 128, 64, 16, 4, 3),
        512: (128, 256, 64, 16, 8, 4), 1024: (128, 256, 64, 16, 8, 4), 1536: (128, 256, 64, 16, 8, 4),
        2048: (128, 256, 64, 16, 8, 4), 3072: (128, 256, 64, 64, 8, 4), 4096: (128, 256, 64, 1, 8, 4),
    },
    ("NVIDIA_H200", 8, 4096, None): {
        1: (16, 64, 128, 16, 4, 5), 2: (32, 256, 64, 32, 4, 5), 4: (16, 128, 256, 16, 8, 3),
        8: (32, 128, 128, 64, 4, 5), 16: (16, 256, 128, 16, 8, 2), 24: (16, 128, 128, 64, 4, 2),
        32: (16, 128, 128, 1, 4, 2), 48: (32, 256, 128, 64, 4, 2), 64: (32, 128, 128, 1, 4, 4),
        96: (64, 128, 128, 1, 8, 4), 128: (64, 128, 128, 1, 8, 4), 256: (128, 256, 64, 1, 8, 4),
        512: (128, 256, 64, 64, 8, 4), 1024: (128, 256, 64, 32, 8, 4), 1536: (128, 256, 64, 64, 8, 4),
        2048: (128, 256, 64, 64, 8, 3), 3072: (128, 256, 64, 64, 8, 4), 4096: (128, 256, 64, 32, 8, 4),
    },
    ("NVIDIA_H200", 8, 2048, None): {
        1: (16, 128, 128, 64, 4, 5), 2: (16, 128, 64, 1, 4, 5), 4: (16, 64, 128, 16, 4, 5),
        8: (16, 128, 64, 32, 4, 3), 16: (16, 128, 256, 32, 8, 2), 24: (16, 64, 128, 32, 4, 5),
        32: (16, 128, 128, 1, 4, 3), 48: (64, 128, 64, 32, 4, 3), 64: (64, 128, 64, 32, 4, 3),
        96: (64, 128, 64, 32, 4, 3), 128: (64, 128, 64, 64, 4, 3), 256: (128, 256, 64, 32, 8, 4),
        512: (128, 256, 64, 32, 8, 4), 1024: (128, 256, 64, 32, 8, 4), 1536: (128, 256, 64, 32, 8, 4),
        2048: (128, 256, 64, 64, 8, 4), 3072: (128, 256, 64, 64, 8, 4), 4096: (128, 256, 64, 32, 8, 4),
    },
    ("NVIDIA_H200", 64, 2560, None): {
        1: (16, 64, 128, 32, 4, 2), 2: (16, 128, 128, 32, 4, 5), 4: (16, 64, 64, 16, 4, 5),
        8: (16, 64, 256, 1, 4, 3), 16: (16, 128, 128, 16, 4, 5), 24: (16, 64, 256, 16, 4, 3),
        32: (16, 64, 128, 1, 4, 5), 48: (16, 128, 256, 1, 4, 2), 64: (16, 128, 128, 1, 8, 3),
        96: (32, 128, 128, 1, 4, 3), 128: (32, 128, 128, 1, 4, 3), 256: (64, 64, 64, 1, 4, 3),
        512: (128, 256, 64, 1, 8, 4), 1024: (128, 256, 64, 16, 8, 4), 1536: (128, 256, 64, 16, 8, 4),
        2048: (128, 256, 64, 1, 8, 4), 3072: (128, 256, 64, 1, 8, 4), 4096: (128, 256, 64, 16, 8, 4),
    },
    ("NVIDIA_H200", 64, 1280, None): {
        1: (16, 64, 64, 1, 4, 4), 2: (16, 128, 128, 16, 4, 2), 4: (16, 64, 128, 32, 4, 5),
        8: (16, 128, 128, 32, 4, 3), 16: (16, 64, 128, 16, 4, 2), 24: (16, 128, 256, 32, 4, 2),
        32: (16, 128, 128, 1, 4, 4), 48: (16, 128, 128, 32, 8, 3), 64: (16, 128, 128, 1, 8, 3),
        96: (32, 128, 128, 1, 4, 3), 128: (32, 128, 128, 1, 4, 3), 256: (64, 64, 64, 1, 4, 3),
        512: (128, 256, 64, 1, 8, 4), 1024: (128, 256, 64, 1, 8, 4), 1536: (128, 256, 64, 1, 8, 4),
        2048: (128, 256, 64, 1, 8, 4), 3072: (128, 256, 64, 16, 8, 4), 4096: (128, 256, 64, 16, 8, 4),
    },
    ("NVIDIA_H200", 64, 640, None): {
        1: (16, 128, 128, 32, 4, 5), 2: (16, 64, 64, 1, 4, 4), 4: (64, 128, 64, 32, 4, 3),
        8: (16, 128, 128, 32, 4, 4), 16: (16, 128, 128, 32, 4, 3), 24: (16, 64, 128, 16, 4, 3),
        32: (16, 64, 128, 16, 4, 3), 48: (16, 64, 128, 16, 4, 3), 64: (16, 64, 128, 1, 4, 3),
        96: (16, 64, 128, 32, 4, 2), 128: (64, 128, 64, 1, 4, 3), 256: (64, 128, 64, 1, 4, 3),
        512: (128, 256, 64, 16, 8, 4), 1024: (128, 256, 64, 1, 8, 4), 1536: (128, 256, 64, 16, 8, 4),
        2048: (128, 256, 64, 1, 8, 4), 3072: (128, 256, 64, 16, 8, 4), 4096: (128, 256, 64, 1, 8, 4),
    },
    ("NVIDIA_H200", 64, 320, None): {
        1: (16, 64, 128, 1, 4, 4), 2: (16, 64, 128, 1, 4, 4), 4: (16, 64, 64, 32, 4, 4),
        8: (16, 64, 64, 16, 4, 3), 16: (16, 64, 64, 1, 4, 3), 24: (16, 64, 64, 16, 4, 3),
        32: (16, 64, 64, 16, 4, 3), 48: (16, 64, 64, 32, 4, 3), 64: (16, 64, 64, 16, 4, 3),
        96: (64, 128, 64, 32, 4, 3), 128: (64, 128, 64, 64, 4, 3), 256: (64, 128, 64, 64, 4, 3),
        512: (64, 128, 64, 16, 4, 2), 1024: (128, 128, 64, 1, 8, 3), 1536: (128, 256, 64, 16, 8, 4),
        2048: (128, 128, 64, 1, 8, 3), 3072: (128, 128, 64, 1, 8, 3), 4096: (128, 128, 64, 16, 8, 3),
    },
}

SHIPPED_SOURCES = {  # the vllm-project/vllm commit each table was read at
    ("NVIDIA_H200", 8, 14336, None): "432a38c440655622ff7875c4877f0756c44e1fbf",
    ("NVIDIA_H200", 8, 7168, None): "c6991a3bffc217a79a1c2413da13be7ce923dbf0",
    ("NVIDIA_H200", 8, 3584, None): "b56f185f55e03959caa8451e0137afcd69d7ae05",
    ("NVIDIA_H200", 8, 1792, None): "5a6541db9bfa77756459722f69e8c89a0b47a14d",
    ("NVIDIA_H200", 8, 4096, None): "0f17ee061e413bf8ab7927f926f69cdff24dc63e",
    ("NVIDIA_H200", 8, 2048, None): "8a8be3dcc35e02e60c940f7aff3aef8cc7524259",
    ("NVIDIA_H200", 64, 2560, None): "c6991a3bffc217a79a1c2413da13be7ce923dbf0",
    ("NVIDIA_H200", 64, 1280, None): "5acdf01b7141777a23a5fdf3845d6ee34f757911",
    ("NVIDIA_H200", 64, 640, None): "c215d1e62d7394f965f92676143fc9c5b4913ad2",
    ("NVIDIA_H200", 64, 320, None): "c6991a3bffc217a79a1c2413da13be7ce923dbf0",
}


def vllm_device_name(device: str) -> str:
    """The device part of vLLM's file name: spaces -> underscores; any H200 variant -> NVIDIA_H200."""
    name = device.replace(" ", "_")
    return "NVIDIA_H200" if "H200" in name.split("_") else name


def sglang_device_name(device: str) -> str:
    """The device part of SGLang's file name: spaces -> underscores (no H200 folding)."""
    return device.replace(" ", "_")


def dtype_selector(dtype: str) -> str | None:
    """vLLM's / SGLang's dtype part for unquantised experts: none for bf16/fp16, "float32" for fp32."""
    if dtype in ("bfloat16", "float16"):
        return None
    if dtype == "float32":
        return "float32"
    raise ValueError(f"dtype {dtype!r}: use bfloat16, float16 or float32")


def config_file_name(num_experts: int, n: int, device: str, dtype: str = "bfloat16",
                     block_shape: tuple[int, int] | None = None, engine: str = "vllm") -> str:
    """The file name the engine looks for. vLLM writes block_shape as [bn,bk], SGLang as Python prints a list."""
    if engine not in ("vllm", "sglang"):
        raise ValueError(f"engine {engine!r}: use vllm or sglang")
    dev = vllm_device_name(device) if engine == "vllm" else sglang_device_name(device)
    sel = dtype_selector(dtype)
    name = f"E={num_experts},N={n},device_name={dev}" + (f",dtype={sel}" if sel else "")
    if block_shape and all(block_shape):
        shape = str(list(block_shape))
        name += ",block_shape=" + (shape.replace(" ", "") if engine == "vllm" else shape)
    return name + ".json"


def shipped_table(num_experts: int, n: int, device: str, dtype: str = "bfloat16") -> dict[int, dict[str, int]] | None:
    """vLLM's shipped table for this shape and device as {M: entry dict}, or None where vLLM ships none."""
    table = SHIPPED.get((vllm_device_name(device), num_experts, n, dtype_selector(dtype)))
    if table is None:
        return None
    return {m: dict(zip(CONFIG_KEYS, v)) for m, v in table.items()}


def nearest_key(keys: object, m: int) -> int:
    """vLLM's and SGLang's rule: the key nearest to M (min over keys of |key - M|; ties go to the first key)."""
    return min(keys, key=lambda k: abs(k - m))  # type: ignore[call-overload]


def default_entry(m: int, num_experts: int) -> dict[str, int]:
    """vLLM's get_default_config for unquantised experts, with Triton's launch defaults made explicit."""
    if m <= num_experts:
        return {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
                "num_stages": 3}
    return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8, "num_warps": 4,
            "num_stages": 3}


def engine_entry(num_experts: int, n: int, m: int, dtype: str = "bfloat16",
                 device: str = "NVIDIA H200") -> tuple[dict[str, int], str]:
    """(entry, where from) vLLM uses for M tokens with no tuned folder: its shipped table's nearest key, else the
    default rule. `where from` is "shipped" or "default"."""
    table = shipped_table(num_experts, n, device, dtype)
    if table is None:
        return default_entry(m, num_experts), "default"
    return dict(table[nearest_key(table, m)]), "shipped"
