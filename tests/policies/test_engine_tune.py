"""`kernel-gym tune --engine` (kernel_gym/deploy/engine_tune.py): the dry-run plan on the CPU, the per-key rule
(never keep a config the paired timing does not confirm faster than the engine's own entry), the candidates (engine
entry, nearest measured shapes' winners, one local-search round), the file + confirmations it writes, resume
refusals. Timing is faked here; the GPU path runs in benchmarks/vllm_export/run_engines.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernel_gym.cli.tune import main as tune_main
from kernel_gym.deploy import engine_export as ee
from kernel_gym.deploy import engine_tune as et
from kernel_gym.kernels import vllm_moe as vm
from kernel_gym.kernels import vllm_tables
from kernel_gym.kernels.space import Config
from kernel_gym.measure import engine_timing
from kernel_gym.measure.store import Context, MeasurementStore
from kernel_gym.measure.types import OK, Measurement
from kernel_gym.models import BUILTIN_MODELS

OLMOE = BUILTIN_MODELS["olmoe-1b-7b"]


def store(tmp_path: Path, shape: ee.MoEShape, times: dict) -> Path:
    path = tmp_path / "rows.sqlite"
    ctx = Context("NVIDIA H200", "2.11", "3.6.0", "vllm_fused_moe", vm.store_key())
    with MeasurementStore(path) as st:
        st.put_many(ctx, [Measurement("vllm_fused_moe", shape.workload(m, s).key(), str(c), OK, t, 0.01, 10)
                          for (m, s, c), t in times.items()])
    return path


def test_dry_run_prints_the_plan_and_measures_nothing(tmp_path, capsys):
    shape = ee.shard_shape(OLMOE)
    near = ee.MoEShape(64, 2048, 1280, 8)  # a measured neighbour shape
    win = vm.to_config({"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
                        "num_warps": 4, "num_stages": 3})
    slow = win.replace(num_stages=2)
    rows = store(tmp_path, near, {(64, 0.0, win): 0.1, (64, 0.0, slow): 0.2})
    out = tmp_path / "out"
    assert tune_main(["--engine", "vllm", "--model", "olmoe-1b-7b", "--dry-run", "--out", str(out), "--store",
                      str(rows), "--no-packaged"]) == 0
    text = capsys.readouterr().out
    assert "E=64,N=1024,device_name=NVIDIA_H200.json" in text and "vllm-0.34.0" in text
    assert text.count("  M=") == 18 and "small-batch path" in text and "(64, 8, 2048, 1280)" in text
    assert not out.exists()  # nothing written, nothing measured
    pl = et.plan(shape, "vllm-0.33.0", "NVIDIA H200", 0.0, ee.measured_rows([rows]), (48, 64))
    assert pl["keys"][1]["seeds"][0] == dict(win)  # the neighbour's winner at its nearest M, fastest first
    assert pl["keys"][0]["engine_entry"] == vllm_tables.default_entry(48, 64)
    with pytest.raises(ValueError, match="--m-keys"):
        tune_main(["--engine", "vllm", "--model", "olmoe-1b-7b", "--dry-run", "--out", str(out), "--m-keys", "a"])
    with pytest.raises(ValueError, match="no tables of vllm-0.2.0"):
        tune_main(["--engine", "vllm-0.2.0", "--model", "olmoe-1b-7b", "--dry-run", "--out", str(out)])


class FakeTimer:
    gpu_s = 0.0


def fake_timing(monkeypatch, sweep: dict[Config, float], paired_gain: dict[Config, float]):
    """measure_config answers from `sweep` (unknown configs: 1.0 ms); confirm says the pick's paired gain."""
    seen: list[Config] = []

    def measure(inputs, ref, c, timer, sync, engine):
        seen.append(c)
        return Measurement("vllm_fused_moe", "{}", str(c), OK, sweep.get(c, 1.0), 0.0, 5), (lambda: None)

    def confirm(timer, a, b, rounds, min_gain):
        g = paired_gain.get(next(c for c in reversed(seen) if c in paired_gain), 1.0) if paired_gain else 1.0
        return g >= 1 + min_gain, 1.0, 1.0 / g

    monkeypatch.setattr(engine_timing, "measure_config", measure)
    monkeypatch.setattr(engine_timing, "confirm", confirm)
    return seen


ARGS = et.EngineTuneOptions(engine="vllm", model="x", out=Path("."), pair_rounds=2, min_gain=0.01)


def test_a_sweep_lead_that_does_not_hold_paired_keeps_the_engine_entry(monkeypatch):
    shape = ee.shard_shape(OLMOE)
    wl = shape.workload(256, 0.0)
    base = vm.default_config(wl)
    nb = vm.neighbours(base, wl)
    seen = fake_timing(monkeypatch, {base: 1.0, nb[0]: 0.7}, {nb[0]: 1.004})  # 30% sweep lead, 0.4% paired
    rec, measured = et._tune_key(None, None, base, wl, [], [], "NVIDIA H200", FakeTimer(), None, "vllm-0.33.0",
                                 1e18, ARGS)
    assert seen[0] == base and set(nb) <= set(seen)  # engine entry first, then one local-search round
    assert rec["basis"] == ee.ENGINE and rec["chosen"] == dict(base) and rec["pick"] == dict(nb[0])
    assert len(measured) == len(seen)


def test_a_paired_lead_is_kept_and_written_with_its_confirmation(monkeypatch, tmp_path):
    shape = ee.shard_shape(OLMOE)
    wl = shape.workload(256, 0.0)
    base = vm.default_config(wl)
    nb = vm.neighbours(base, wl)
    fake_timing(monkeypatch, {base: 1.0, nb[1]: 0.8}, {nb[1]: 1.2})
    rec, _ = et._tune_key(None, None, base, wl, [], [], "NVIDIA H200", FakeTimer(), None, "vllm-0.33.0", 1e18, ARGS)
    assert rec["basis"] == ee.CONFIRMED and rec["chosen"] == dict(nb[1]) and rec["paired_gain"] == 1.2
    rec.update(engine_source="default", engine_path=ee.ALIGNED)
    args = et.EngineTuneOptions(engine="vllm", model="olmoe-1b-7b", out=tmp_path, min_gain=0.01, budget_s=60)
    eng = vllm_tables.parse_engine("vllm")
    state = {"keys": {"256": rec}}
    assert et._finish(args, shape, eng, "uniform", 0.0, state, "NVIDIA H200", "", FakeTimer(), "NVIDIA H200", 0.0,
                      "3.6.0") == 0
    path = tmp_path / "files" / "E=64,N=1024,device_name=NVIDIA_H200.json"
    data = json.loads(path.read_text())
    assert [int(k) for k in data] == list(vllm_tables.VLLM_M_KEYS) and data["256"] == vm.to_entry(nb[1])
    assert data["1"] == vllm_tables.default_entry(1, 64)  # keys not tuned keep the engine entry
    side = json.loads((tmp_path / "files" / ee.SIDECAR).read_text())["files"][path.name]
    assert side["engine"] == "vllm-0.34.0" and side["summary"][ee.CONFIRMED] == 1
    # the run's confirmations confirm the key in a later export from stored rows
    _, note = ee.export(OLMOE, "vllm", tmp_path / "exp", "NVIDIA H200", rows=[],
                        confirmations=[tmp_path / et.RESULT])
    k = next(k for k in note["keys"] if k["M"] == 256)
    assert k["basis"] == ee.CONFIRMED and k["confirmed_by"].startswith("paired") and not note["estimate"]


def test_a_failing_engine_entry_is_reported_not_hidden(monkeypatch):
    shape = ee.shard_shape(OLMOE)
    wl = shape.workload(8, 0.0)
    base = vm.default_config(wl)
    monkeypatch.setattr(engine_timing, "measure_config", lambda *a: (
        Measurement("vllm_fused_moe", "{}", str(base), "compile_error", None, None, 0, reason="boom"), None))
    rec, _ = et._tune_key(None, None, base, wl, [], [], "NVIDIA H200", FakeTimer(), None, "vllm-0.33.0", 1e18, ARGS)
    assert rec["basis"] == ee.ENGINE and rec["error"] == "boom"


def test_resume_refuses_another_run(tmp_path):
    (tmp_path / et.STATE).write_text(json.dumps({"ident": {"engine": "sglang-0.5.23"}, "keys": {}}))
    with pytest.raises(ValueError, match="another run"):
        tune_main(["--engine", "vllm", "--model", "x", "--smoke", "--resume", "--out", str(tmp_path), "--no-packaged"])
    with pytest.raises(ValueError, match="pass --resume"):
        tune_main(["--engine", "vllm", "--model", "x", "--smoke", "--out", str(tmp_path), "--no-packaged"])
