"""Engine exports (kernel_gym.deploy.engine_export): the file each engine looks for is the file written, every M the
engine can ask for finds an entry, measured choices never replace the engine's entry without a confirmed lead
(repeated rows agreeing or a paired confirmation), exports without measurements for the device are refused unless
--force (then a sidecar says so and the engine's shipped entries stay), files are written atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kernel_gym.cli import export as export_cli
from kernel_gym.deploy import engine_export as ee
from kernel_gym.kernels import vllm_moe as vm
from kernel_gym.kernels import vllm_tables
from kernel_gym.measure.store import Context, MeasurementStore
from kernel_gym.measure.types import OK, Measurement
from kernel_gym.models import BUILTIN_MODELS

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
               device: str = "NVIDIA H200", name: str = "m.sqlite", triton: str = "3.6.0") -> Path:
    path = tmp_path / name
    ctx = Context(device, "2.11", triton, "vllm_fused_moe", vm.store_key())
    rows = [Measurement("vllm_fused_moe", shape.workload(m, s).key(), str(c), OK, t, 0.01, 10)
            for (m, s, c), t in times.items()]
    with MeasurementStore(path) as st:
        st.put_many(ctx, rows)
    return path


def twice(tmp_path: Path, shape: ee.MoEShape, times: dict, device: str = "NVIDIA H200") -> list[Path]:
    """The same rows in two stores (two collection runs): repeated rows that agree."""
    return [store_with(tmp_path, shape, times, device, "a.sqlite", "3.6.0"),
            store_with(tmp_path, shape, {k: t * 1.002 for k, t in times.items()}, device, "b.sqlite", "3.5.1")]


def test_names_and_every_m_finds_an_entry_in_both_engines(tmp_path):
    shape = ee.shard_shape(MIXTRAL, tp=2)
    assert shape.n == 7168
    base4, _ = ee.baseline(shape, 4, "NVIDIA H200")
    faster = base4.replace(num_stages=4 if base4["num_stages"] != 4 else 3)
    stores = twice(tmp_path, shape, {(4, 0.0, base4): 1.0, (4, 0.0, faster): 0.5})
    vpath, note = ee.export(MIXTRAL, "vllm", tmp_path / "v", "NVIDIA H200", tp=2, stores=stores)
    spath, snote = ee.export(MIXTRAL, "sglang", tmp_path / "s", "NVIDIA H200", tp=2, stores=stores)
    assert vpath.name == "E=8,N=7168,device_name=NVIDIA_H200.json" and not note["estimate"]
    # SGLang 0.5.23 pins torch 2.14.1, so Triton 3.8.0: its folder by default
    assert spath.parent.name == "triton_3_8_0" and spath.parent.parent.name == "configs"
    assert note["engine"] == "vllm-0.34.0" and snote["engine"] == "sglang-0.5.23" and snote["triton_version"] == "3.8.0"
    for m in [*range(1, 4097, 7), 4096, 5000, 8192, 65536]:
        v = vllm_lookup(tmp_path / "v", 8, 7168, "NVIDIA H200", None, m)
        s = sglang_lookup(tmp_path / "s", "3.8.0", 8, 7168, "NVIDIA H200", m)
        assert v is not None and s is not None and set(v) == set(s) == set(vllm_tables.CONFIG_KEYS)
    assert vllm_lookup(tmp_path / "v", 8, 7168, "NVIDIA H200 NVL", None, 1) is not None  # vLLM folds H200 variants
    data = json.loads(vpath.read_text())
    assert [int(k) for k in data] == list(vllm_tables.VLLM_M_KEYS)  # nothing but int keys: vLLM's int(key) loads it
    assert vm.to_config(data["4"]) == faster  # 2x faster than the shipped entry in two agreeing rows
    shipped = vllm_tables.shipped_table(8, 7168, "NVIDIA H200")
    assert all(data[str(m)] == shipped[m] for m in vllm_tables.VLLM_M_KEYS if m != 4)  # unmeasured keys: shipped
    side = json.loads((tmp_path / "v" / ee.SIDECAR).read_text())
    k4 = side["files"][vpath.name]["keys"][2]
    assert k4["M"] == 4 and k4["changed"] is True and k4["basis"] == ee.CONFIRMED and "repeated" in k4["confirmed_by"]
    assert side["files"][vpath.name]["engine_version"] == "0.34.0"
    # SGLang's own entries are SGLang's (its triton_3_1_0 Mixtral table, found by its fallback search)
    sdata = json.loads(spath.read_text())
    stable = vllm_tables.shipped_table(8, 7168, "NVIDIA H200", engine="sglang")
    assert all(sdata[str(m)] == stable[m] for m in vllm_tables.VLLM_M_KEYS if m != 4)
    assert snote["engine_table"]["folder"] == "triton_3_1_0" and snote["engine_table"]["fallback"]


def test_a_single_row_lead_keeps_the_engine_entry_and_is_listed_unconfirmed(tmp_path, capsys):
    """Issue 30: one sweep row is no lead; the candidate is listed, the engine's entry stays."""
    shape = ee.shard_shape(MIXTRAL, tp=2)
    base, _ = ee.baseline(shape, 8, "NVIDIA H200")
    other = base.replace(num_warps=8 if base["num_warps"] != 8 else 4)
    store = store_with(tmp_path, shape, {(8, 0.0, base): 1.0, (8, 0.0, other): 0.58})
    path, note = ee.export(MIXTRAL, "vllm", tmp_path / "o", "NVIDIA H200", tp=2, stores=[store])
    assert vm.to_config(json.loads(path.read_text())["8"]) == base
    k8 = next(k for k in note["keys"] if k["M"] == 8)
    assert k8["basis"] == ee.SINGLE and not k8["changed"] and k8["unconfirmed_candidate"]["rows"] == 1
    assert note["unconfirmed"] == [{"M": 8, **k8["unconfirmed_candidate"]}]
    assert note["summary"] == {ee.CONFIRMED: 0, ee.SINGLE: 1, ee.ENGINE: 17}
    # repeats that disagree (one of them slower than the engine entry) are no confirmation either
    a = store_with(tmp_path, shape, {(8, 0.0, base): 1.0, (8, 0.0, other): 0.58}, name="x.sqlite")
    b = store_with(tmp_path, shape, {(8, 0.0, base): 1.0, (8, 0.0, other): 1.2}, name="y.sqlite", triton="3.5.1")
    _, note2 = ee.export(MIXTRAL, "vllm", tmp_path / "p", "NVIDIA H200", tp=2, stores=[a, b])
    assert next(k for k in note2["keys"] if k["M"] == 8)["basis"] != ee.CONFIRMED
    # a paired confirmation (benchmarks/vllm_export/run.py's JSON) confirms it
    bench = tmp_path / "bench_vllm_export.json"
    bench.write_text(json.dumps({
        "meta": {"engine_device_name": "NVIDIA H200", "routings": {"uniform": 0.0, "zipf-1.2": 1.2}},
        "models": {"mixtral-8x7b-tp2": {"rows": [{"M": 8, "routing": "uniform", "speedup": 1.3}]}},
        "details": {"mixtral-8x7b-tp2": {"shape": shape.describe(), "per_key": [
            {"M": 8, "routing": "uniform", "engine_entry": dict(base), "exported": dict(other)}]}}}))
    path3, note3 = ee.export(MIXTRAL, "vllm", tmp_path / "q", "NVIDIA H200", tp=2, stores=[store],
                             confirmations=[bench])
    k8 = next(k for k in note3["keys"] if k["M"] == 8)
    assert k8["basis"] == ee.CONFIRMED and k8["confirmed_by"].startswith("paired") and k8["measured_gain"] == 1.3
    assert vm.to_config(json.loads(path3.read_text())["8"]) == other
    lines = ee.summary_lines(note)
    assert len(lines) == 18 and "measured-single" in lines[3] and "unconfirmed candidate" in lines[3]


def test_small_batch_keys_ignore_aligned_rows(tmp_path):
    """vLLM 0.33 skips the alignment at M * top_k * 4 <= E: rows of the aligned path do not decide those keys."""
    shape = ee.shard_shape(OLMOE)  # E=64, top_k=8: M = 1, 2 run the small-batch path
    assert [ee.engine_path_kind(shape, m) for m in (1, 2, 4)] == [ee.SMALL_BATCH, ee.SMALL_BATCH, ee.ALIGNED]
    assert ee.engine_path_kind(shape, 1, "sglang-0.5.23") == ee.ALIGNED
    base, _ = ee.baseline(shape, 2, "NVIDIA H200")
    other = base.replace(num_warps=8 if base["num_warps"] != 8 else 4)
    stores = twice(tmp_path, shape, {(2, 0.0, base): 1.0, (2, 0.0, other): 0.5})
    path, note = ee.export(OLMOE, "vllm", tmp_path / "o", "NVIDIA H200", stores=stores, force=True)
    k2 = next(k for k in note["keys"] if k["M"] == 2)
    assert k2["basis"] == ee.ENGINE and k2["measured_configs"] == 0 and "small-batch" in k2["note"]
    _, snote = ee.export(OLMOE, "sglang", tmp_path / "s", "NVIDIA H200", stores=stores)  # SGLang aligns: counts
    k2 = next(k for k in snote["keys"] if k["M"] == 2)
    assert k2["measured_configs"] == 2 and not k2["baseline_measured"] and not k2["changed"]  # its entry: unmeasured


def test_sglang_second_gemm_tables_are_named_in_the_sidecar(tmp_path):
    """SGLang ships _down tables for a few shapes; a copied one would pair with our file's entries: the note says so."""
    spec = type("M", (), {"name": "e16", "num_experts": 16, "hidden": 4096, "intermediate": 4096, "top_k": 2})()
    _, note = ee.export(spec, "sglang", tmp_path, "NVIDIA H200", rows=[], force=True)
    assert note["sglang_down_files"] == ["configs/triton_3_7_1/E=16,N=4096,device_name=NVIDIA_H200_down.json"]
    assert note["engine_table"]["folder"] == "triton_3_7_1"  # SGLang's own first-GEMM table: kept as the entries


def test_expert_parallel_file_names_use_the_local_expert_count(tmp_path):
    shape = ee.shard_shape(MIXTRAL, ep=2)
    assert (shape.num_experts, shape.n, shape.ep) == (4, 14336, 2)
    path, note = ee.export(MIXTRAL, "vllm", tmp_path / "v", "NVIDIA H200", ep=2, rows=[], force=True)
    assert path.name == "E=4,N=14336,device_name=NVIDIA_H200.json" and note["shape"]["global_experts"] == 8
    assert "approximation" in note["ep_note"]
    assert all(k["engine_path"] == ee.ALIGNED for k in note["keys"])  # an expert map: never the small-batch path
    assert all(k["baseline"] == "default" and k["estimated"] for k in note["keys"])
    with pytest.raises(ValueError, match="--ep 3"):
        ee.shard_shape(MIXTRAL, ep=3)


def test_engine_files_are_written_atomically(tmp_path, monkeypatch):
    """A failure while writing (a full disk) leaves the previous file whole and no temporary file behind."""
    target = tmp_path / "E=8,N=14336,device_name=NVIDIA_H200.json"
    ee.write_atomic(target, '{"1": {}}\n')
    real_fsync = os.fsync

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space"):
        ee.write_atomic(target, '{"1": {"BLOCK_SIZE_M": 16}, "2": ')
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert json.loads(target.read_text()) == {"1": {}}
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_the_engine_entry_stays_without_a_measured_gain(tmp_path):
    shape = ee.shard_shape(MIXTRAL)
    base, _ = ee.baseline(shape, 64, "NVIDIA H200")
    other = base.replace(GROUP_SIZE_M=1 if base["GROUP_SIZE_M"] != 1 else 16)
    times = {(64, 0.0, base): 1.0, (64, 0.0, other): 0.995,  # 0.5%: below --min-gain
             (16, 0.0, other): 0.5}  # the baseline unmeasured at M=16: never replaced
    stores = twice(tmp_path, shape, times)
    path, note = ee.export(MIXTRAL, "vllm", tmp_path / "o", "NVIDIA H200", stores=stores)
    data = json.loads(path.read_text())
    assert vm.to_config(data["64"]) == base and vm.to_config(data["16"]) == ee.baseline(shape, 16, "NVIDIA H200")[0]
    assert not any(k["changed"] for k in note["keys"])
    assert ee.pick({base: 1.0, other: 0.9}, base, 0.01) == (other, pytest.approx(1 / 0.9))


def test_no_table_uses_vllms_default_rule_and_zipf_routing(tmp_path):
    shape = ee.shard_shape(OLMOE)
    base, src = ee.baseline(shape, 64, "NVIDIA H200")
    assert src == "default" and base == vm.to_config(vllm_tables.default_entry(64, 64))
    alt = vm.to_config({**vllm_tables.default_entry(64, 64), "BLOCK_SIZE_N": 128})
    stores = twice(tmp_path, shape, {(64, 1.2, base): 1.0, (64, 1.2, alt): 0.8})
    path, note = ee.export(OLMOE, "vllm", tmp_path / "o", "NVIDIA H200", routing="zipf:1.2", stores=stores)
    assert vm.to_config(json.loads(path.read_text())["64"]) == alt and note["routing"] == "zipf-1.2"
    with pytest.raises(ValueError, match="no vllm_fused_moe measurements"):  # measured at zipf only
        ee.export(OLMOE, "vllm", tmp_path / "u", "NVIDIA H200", routing="uniform", stores=stores)


def test_refusals_and_force(tmp_path):
    shape = ee.shard_shape(MIXTRAL)
    base, _ = ee.baseline(shape, 4, "NVIDIA H200")
    store = store_with(tmp_path, shape, {(4, 0.0, base): 1.0})
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
    # --force on the H200 for a shape vLLM ships a table for: the shipped entries, not the default rule (issue 23)
    path, note = ee.export(MIXTRAL, "vllm", tmp_path / "d", "NVIDIA H200", tp=4, stores=[store], force=True)
    shipped = vllm_tables.shipped_table(8, 3584, "NVIDIA H200")
    assert all(json.loads(path.read_text())[str(m)] == shipped[m] for m in vllm_tables.VLLM_M_KEYS)
    assert note["estimate"] and not any(k["estimated"] for k in note["keys"])  # shipped entries: not estimates


def test_cli_export_formats(tmp_path, monkeypatch):
    shape = ee.shard_shape(MIXTRAL)
    base, _ = ee.baseline(shape, 4, "NVIDIA H200")
    store = store_with(tmp_path, shape, {(4, 0.0, base): 1.0})
    assert export_cli.main(["--format", "vllm", "--store", str(store), "--out", str(tmp_path / "v")]) == 0
    assert (tmp_path / "v" / "E=8,N=14336,device_name=NVIDIA_H200.json").exists()
    assert export_cli.main(["--format", "sglang", "--store", str(store), "--out", str(tmp_path / "s"),
                            "--triton-version", "3.4.0"]) == 0
    assert os.path.exists(tmp_path / "s/configs/triton_3_4_0/E=8,N=14336,device_name=NVIDIA_H200.json")
    assert export_cli.main(["--format", "sglang", "--store", str(store), "--out", str(tmp_path / "e"), "--ep",
                            "2", "--force"]) == 0
    assert os.path.exists(tmp_path / "e/configs/triton_3_8_0/E=4,N=14336,device_name=NVIDIA_H200.json")
    with pytest.raises(ValueError, match="refusing to export"):
        export_cli.main(["--format", "vllm", "--store", str(store), "--tp", "2", "--out", str(tmp_path / "x")])


def test_a_lead_inside_the_rows_noise_is_not_taken():
    """pick: a 3% sweep lead with 8% spreads stays the engine's entry; the same lead with 1% spreads is taken."""
    shape = ee.shard_shape(MIXTRAL)
    base, _ = ee.baseline(shape, 4, "NVIDIA H200")
    other = base.replace(num_warps=8 if base["num_warps"] != 8 else 4)
    times = {base: 1.0, other: 0.97}
    assert ee.pick(times, base, 0.01, {base: 0.08, other: 0.08}) == (base, 1.0)
    assert ee.pick(times, base, 0.01, {base: 0.01, other: 0.01})[0] == other
