"""The multi-GPU scripts' CPU paths: the collectives measurement with 2 gloo processes, the replay's refusal without a
measured table, the shard plan as a collect --plan file, topology parsing, the scaling figures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kernel_gym.parallel.collectives import NO_MULTICAST_ENV, CollectivesError, CollectiveTable, load_table
from tests.script_module import ROOT, load_script

TOPO = """\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV18\tNV18\t0-47\t0
GPU1\tNV18\t X \tNV18\t0-47\t0
GPU2\tNV18\tNV18\t X \t0-47\t0
"""


def test_gloo_dry_run_measures_and_checks_two_processes(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "measure_collectives.py"), "--dry-run", "--out",
                          str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads((tmp_path / "collectives.json").read_text())
    assert data["backend"] == "gloo" and data["gpu_counts"] == [2]
    assert data["env"] == NO_MULTICAST_ENV == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                               "NVSHMEM_DISABLE_NVLS": "1"}
    assert {r["op"] for r in data["results"]} == {"all_reduce", "all_to_all"}
    assert all(r["correct"] and r["median_s"] > 0 for r in data["results"])
    CollectiveTable(data)  # the schema the simulator reads
    with pytest.raises(CollectivesError, match="not NCCL"):
        load_table(tmp_path / "collectives.json")  # but a dry run never prices a step


def test_topology_parsing():
    mc = load_script("measure_collectives")
    assert mc.parse_topology(TOPO) == {"gpu0_links": {"GPU1": "NV18", "GPU2": "NV18"}, "link_types": ["NV18"]}


def test_replay_refuses_without_a_table(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KERNEL_GYM_COLLECTIVES", str(tmp_path / "absent.json"))
    pr = load_script("parallel_replay")
    assert pr.main(["run", "--traces", "bundled"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "scripts/measure_collectives.py" in err[0]


def test_shard_plan_is_a_collect_plan(tmp_path):
    from kernel_gym.measure.collect import load_plan_file

    pr = load_script("parallel_replay")
    path = tmp_path / "plan.json"
    assert pr.main(["plan", "--model", "olmoe-1b-7b", "--gpus", "2", "--configs", "2", "--max-tokens", "64",
                    "--out", str(path)]) == 0
    entries = json.loads(path.read_text())
    assert {e["layout"] for e in entries} == {"TP2", "EP2"}
    ep = [json.loads(e["workload"]) for e in entries if e["layout"] == "EP2"]
    assert all(w["num_experts"] == 32 and w["top_k"] == 1 for w in ep)
    plan = load_plan_file(str(path), ["fused_moe"])  # validates every config against the knob space
    assert len(plan) == len(entries)


def test_scaling_idle_share():
    fs = load_script("farm_scaling")
    rows = [{"gpu": "0", "created": 110.0}, {"gpu": "0", "created": 200.0}, {"gpu": "1", "created": 150.0}]
    assert fs.idle_share(rows, 100.0, 100.0, 2) == pytest.approx(1 - (100 + 50) / 200)
