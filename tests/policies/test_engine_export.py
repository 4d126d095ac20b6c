"""Engine exports (kernel_gym.policies.engine_export): the file each engine looks for is the file written, every M the
engine can ask for finds an entry, measured choices never replace the engine's entry without a measured gain, and
exports without measurements for the device are refused unless --force (then a sidecar says so)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kernel_gym.kernels import vllm_moe as vm
from kernel_gym.kernels import vllm_tables
from kernel_gym.measure.store import Context, MeasurementStore
from kernel_gym.measure.types import OK, Measurement
from kernel_gym.models import BUILTIN_MODELS
from kernel_gym.policies import engine_export as ee
from kernel_gym.policies import export

MIXTRAL = BUILTIN_MODELS["mixtral-8x7b"]
OLMOE = BUILTIN_MODELS["olmoe-1b-7b"]


# ---- the engines' lookups, re-implemented from their source (vLLM fused_moe.py / SGLang fused_moe_triton_config.py)


def vllm_lookup(folder: Path, e: int, n: int, torch_device_name: str, dtype: str | None, m: int) -> dict | None:
    name = torch_device_name.replace(" ", "_")
    if "H200" in name.split("_"):
        name = "NVIDIA_H200"
    path = folder / (f"E={e},N={n},device_name={name}" + (f",dtype={dtype}" if dtype else "") + ".json")
    if not path.exists():
        return None
    tuned = json.loads(path.read_text())
    tuned.pop("triton_version", None)
    configs = {int(k): v for k, v in tuned.items()}
    return configs[min(configs, key=lambda x: abs(x - m))]


def sglang_lookup(config_dir: Path, triton_version: str, e: int, n: int, torch_device_name: str, m: int) -> dict | None:
    name = f"E={e},N={n},device_name={torch_device_name.replace(' ', '_')}.json"
    path = config_dir / "configs" / f"triton_{triton_version.replace('.', '_')}" / name
    if not path.exists():
        return None
    configs = {int(k): v for k, v in json.loads(path.read_text()).items()}
    return configs[min(configs, key=lambda x: abs(x - m))]


def store_with(tmp_path: Path, shape: ee.MoEShape, times: dict[tuple[int, float, vm.Config], float],
               device: str = "NVIDIA H200") -> Path:
    path = tmp_path / "m.sqlite"
    ctx = Context(device, "2.11", "3.6.0", "vllm_fused_moe", vm.source_hash())
    rows = [Measurement("vllm_fused_moe", shape.workload(m, s).key(), str(c), OK, t, 0.01, 10)
            for (m, s, c), t in times.items()]
    with MeasurementStore(path) as st:
        st.put_many(ctx, rows)
    return path


def test_names_and_every_m_finds_an_entry_in_both_engines(tmp_path):
    shape = ee.shard_shape(MIXTRAL, tp=2)
    assert shape.n == 7168
    base1, _ = ee.baseline(shape, 1, "NVIDIA H200")
    faster = base1.replace(num_stages=4 if base1["num_stages"] != 4 else 3)
    store = store_with(tmp_path, shape, {(1, 0.0, base1): 1.0, (1, 0.0, faster): 0.5})
    vpath, note = ee.export(MIXTRAL, "vllm", tmp_path / "v", "NVIDIA H200", tp=2, stores=[store])
    spath, _ = ee.export(MIXTRAL, "sglang", tmp_path / "s", "NVIDIA H200", tp=2, stores=[store])
    assert vpath.name == "E=8,N=7168,device_name=NVIDIA_H200.json" and not note["estimate"]
    assert spath.parent.name == "triton_3_6_0" and spath.parent.parent.name == "configs"
    for m in [*range(1, 4097), 5000, 8192, 65536]:
        v = vllm_lookup(tmp_path / "v", 8, 7168, "NVIDIA H200", None, m)
        s = sglang_lookup(tmp_path / "s", "3.6.0", 8, 7168, "NVIDIA H200", m)
        assert v is not None and v == s and set(v) == set(vllm_tables.CONFIG_KEYS)
    assert vllm_lookup(tmp_path / "v", 8, 7168, "NVIDIA H200 NVL", None, 1) is not None  # vLLM folds H200 variants
    data = json.loads(vpath.read_text())
    assert [int(k) for k in data] == list(vllm_tables.VLLM_M_KEYS)  # nothing but int keys: vLLM's int(key) loads it
    assert vm.to_config(data["1"]) == faster  # measured 2x faster than the shipped entry
    shipped = vllm_tables.shipped_table(8, 7168, "NVIDIA H200")
    assert all(data[str(m)] == shipped[m] for m in vllm_tables.VLLM_M_KEYS if m != 1)  # unmeasured keys: shipped
    side = json.loads((tmp_path / "v" / ee.SIDECAR).read_text())
    assert side["files"][vpath.name]["keys"][0]["changed"] is True


def test_the_engine_entry_stays_without_a_measured_gain(tmp_path):
    shape = ee.shard_shape(MIXTRAL)
    base, _ = ee.baseline(shape, 64, "NVIDIA H200")
    other = base.replace(GROUP_SIZE_M=1 if base["GROUP_SIZE_M"] != 1 else 16)
    times = {(64, 0.0, base): 1.0, (64, 0.0, other): 0.995,  # 0.5%: below --min-gain
             (16, 0.0, other): 0.5}  # the baseline unmeasured at M=16: never replaced
    store = store_with(tmp_path, shape, times)
    path, note = ee.export(MIXTRAL, "vllm", tmp_path / "o", "NVIDIA H200", stores=[store])
    data = json.loads(path.read_text())
    assert vm.to_config(data["64"]) == base and vm.to_config(data["16"]) == ee.baseline(shape, 16, "NVIDIA H200")[0]
    assert not any(k["changed"] for k in note["keys"])
    assert ee.pick({base: 1.0, other: 0.9}, base, 0.01) == (other, pytest.approx(1 / 0.9))


def test_no_table_uses_vllms_default_rule_and_zipf_routing(tmp_path):
    shape = ee.shard_shape(OLMOE)
    base, src = ee.baseline(shape, 64, "NVIDIA H200")
    assert src == "default" and base == vm.to_config(vllm_tables.default_entry(64, 64))
    alt = vm.to_config({**vllm_tables.default_entry(64, 64), "BLOCK_SIZE_N": 64})
    store = store_with(tmp_path, shape, {(64, 1.2, base): 1.0, (64, 1.2, alt): 0.8})
    path, note = ee.export(OLMOE, "vllm", tmp_path / "o", "NVIDIA H200", routing="zipf:1.2", stores=[store])
    assert vm.to_config(json.loads(path.read_text())["64"]) == alt and note["routing"] == "zipf-1.2"
    with pytest.raises(ValueError, match="no vllm_fused_moe measurements"):  # measured at zipf only
        ee.export(OLMOE, "vllm", tmp_path / "u", "NVIDIA H200", routing="uniform", stores=[store])


def test_refusals_and_force(tmp_path):
    shape = ee.shard_shape(MIXTRAL)
    base, _ = ee.baseline(shape, 1, "NVIDIA H200")
    store = store_with(tmp_path, shape, {(1, 0.0, base): 1.0})
    with pytest.raises(ValueError, match="measured .* on NVIDIA H200, not on 'NVIDIA A100-SXM4-80GB'"):
        ee.export(MIXTRAL, "vllm", tmp_path / "a", "NVIDIA A100-SXM4-80GB", stores=[store])
    with pytest.raises(ValueError, match="no vllm_fused_moe measurements of E=8,N=3584"):
        ee.export(MIXTRAL, "vllm", tmp_path / "b", "NVIDIA H200", tp=4, stores=[store])
    with pytest.raises(ValueError, match="equal shards"):
        ee.shard_shape(MIXTRAL, tp=3)
    with pytest.raises(ValueError, match="zipf:S"):
        ee.parse_routing("zipf")
    path, note = ee.export(MIXTRAL, "vllm", tmp_path / "c", "NVIDIA A100-SXM4-80GB", stores=[store], force=True)
    assert note["estimate"] and "A100" in path.name and note["measured_on"] == "NVIDIA H200"
    side = json.loads((tmp_path / "c" / ee.SIDECAR).read_text())
    assert side["files"][path.name]["estimate"] is True
    assert all(isinstance(int(k), int) for k in json.loads(path.read_text()))  # the config file itself stays clean


def test_cli_export_formats(tmp_path, monkeypatch):
    shape = ee.shard_shape(MIXTRAL)
    base, _ = ee.baseline(shape, 1, "NVIDIA H200")
    store = store_with(tmp_path, shape, {(1, 0.0, base): 1.0})
    assert export.main(["--format", "vllm", "--store", str(store), "--out", str(tmp_path / "v")]) == 0
    assert (tmp_path / "v" / "E=8,N=14336,device_name=NVIDIA_H200.json").exists()
    assert export.main(["--format", "sglang", "--store", str(store), "--out", str(tmp_path / "s"),
                        "--triton-version", "3.4.0"]) == 0
    assert os.path.exists(tmp_path / "s/configs/triton_3_4_0/E=8,N=14336,device_name=NVIDIA_H200.json")
    with pytest.raises(ValueError, match="refusing to export"):
        export.main(["--format", "vllm", "--store", str(store), "--tp", "2", "--out", str(tmp_path / "x")])


def test_a_lead_inside_the_rows_noise_is_not_taken():
    """pick: a 3% sweep lead with 8% spreads stays the engine's entry; the same lead with 1% spreads is taken."""
    shape = ee.shard_shape(MIXTRAL)
    base, _ = ee.baseline(shape, 4, "NVIDIA H200")
    other = base.replace(num_warps=8 if base["num_warps"] != 8 else 4)
    times = {base: 1.0, other: 0.97}
    assert ee.pick(times, base, 0.01, {base: 0.08, other: 0.08}) == (base, 1.0)
    assert ee.pick(times, base, 0.01, {base: 0.01, other: 0.01})[0] == other
