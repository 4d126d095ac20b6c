"""The multi-GPU scripts' CPU paths: the collectives measurement with 2 gloo processes, the replay's refusal without a
measured table, the shard plan as a collect --plan file, topology parsing, the scaling figures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kernel_gym.parallel.collectives import NO_MULTICAST_ENV, CollectivesError, CollectiveTable, load_table
from tests.script_module import ROOT

COLLECTIVES = ROOT / "benchmarks" / "multigpu" / "run_collectives.py"

TOPO = """\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV18\tNV18\t0-47\t0
GPU1\tNV18\t X \tNV18\t0-47\t0
GPU2\tNV18\tNV18\t X \t0-47\t0
"""


def test_gloo_dry_run_measures_and_checks_two_processes(tmp_path):
    out = subprocess.run([sys.executable, str(COLLECTIVES), "--dry-run", "--out", str(tmp_path)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads((tmp_path / "collectives.json").read_text())
    assert data["backend"] == "gloo" and data["gpu_counts"] == [2]
    assert data["env"] == NO_MULTICAST_ENV == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                               "NVSHMEM_DISABLE_NVLS": "1"}
    assert {r["op"] for r in data["results"]} == {"all_reduce", "all_to_all"}
    assert all(r["correct"] and r["median_s"] > 0 and r["inner"] >= 1 for r in data["results"])
    assert data["complete"] and data["stopped"] == {}
    assert [r["bytes"] for r in data["results"] if r["op"] == "all_reduce"] == [1024, 4096, 16384]  # as asked
    CollectiveTable(data)  # the schema the simulator reads
    with pytest.raises(CollectivesError, match="not NCCL"):
        load_table(tmp_path / "collectives.json")  # but a dry run never prices a step


def test_gloo_dry_run_stops_together_when_the_budget_is_spent(tmp_path):
    out = subprocess.run([sys.executable, str(COLLECTIVES), "--dry-run", "--out",
                          str(tmp_path), "--budget-s", "0.001"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr[-2000:]
    assert not (tmp_path / "collectives.json").exists()  # nothing measured: no table the simulator could read
    data = json.loads((tmp_path / "collectives_failed.json").read_text())
    assert not data["complete"] and data["results"] == [] and "budget" in data["stopped"]["2"]
    assert "INCOMPLETE" in out.stderr


def test_topology_parsing():
    from benchmarks.multigpu import run_collectives as mc
    assert mc.parse_topology(TOPO) == {"gpu0_links": {"GPU1": "NV18", "GPU2": "NV18"}, "link_types": ["NV18"]}


def test_replay_refuses_without_a_table_or_prior(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KERNEL_GYM_COLLECTIVES", str(tmp_path / "absent.json"))
    monkeypatch.setattr("kernel_gym.parallel.collectives.PRIOR_TABLE", tmp_path / "no_prior.json")
    from benchmarks.multigpu import run_parallel_replay as pr
    assert pr.main(["run", "--traces", "bundled"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "benchmarks/multigpu/run_collectives.py" in err[0]


def test_shard_plan_is_a_collect_plan(tmp_path):
    from benchmarks.multigpu import run_parallel_replay as pr
    from kernel_gym.measure.collect import load_plan_file
    path = tmp_path / "plan.json"
    assert pr.main(["plan", "--model", "olmoe-1b-7b", "--gpus", "2", "--configs", "2", "--max-tokens", "64",
                    "--out", str(path)]) == 0
    entries = json.loads(path.read_text())
    assert {e["layout"] for e in entries} == {"TP2", "EP2"}
    ep = [json.loads(e["workload"]) for e in entries if e["layout"] == "EP2"]
    assert all(w["num_experts"] == 32 and w["top_k"] == 1 for w in ep)
    plan = load_plan_file(str(path), ["fused_moe"])  # validates every config against the knob space
    assert len(plan) == len(entries)


def test_scaling_budget_compile_pools_and_fresh_caches(tmp_path):
    from benchmarks.multigpu import run_farm_scaling as fs
    runs, agree = fs.split_budget(400, [1, 2, 4, 8])
    assert sum(runs.values()) + agree == pytest.approx(400) and agree == pytest.approx(100)
    assert runs[1] - 30 == pytest.approx(2 * (runs[2] - 30)) == pytest.approx(8 * (runs[8] - 30))  # start-up + 1 / n
    assert runs[8] > 30 and runs[1] > 100
    runs, _ = fs.split_budget(100, [1, 2, 4, 8])  # too little for 30 s each: in proportion only
    assert runs[1] == pytest.approx(8 * runs[8])
    assert fs.split_budget(0, [1, 2]) == ({1: 0.0, 2: 0.0}, 0.0)
    assert fs.compile_workers(8, cpus=128) == 15 and fs.compile_workers(8, cpus=4) == 1
    (tmp_path / "triton_cache" / "run").mkdir(parents=True)
    (tmp_path / "triton_cache" / "run" / "stale.so").write_text("x")
    env = fs._env("0,1", True, tmp_path, "run")  # a timed run: its own empty Triton cache
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and list((tmp_path / "triton_cache" / "run").iterdir()) == []
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "triton_cache" / "run")


def test_scaling_idle_share_and_steady_rate():
    from benchmarks.multigpu import run_farm_scaling as fs
    rows = [{"gpu": "0", "created": 110.0}, {"gpu": "0", "created": 200.0}, {"gpu": "1", "created": 150.0}]
    assert fs.idle_share(rows, 100.0, 100.0, 2) == pytest.approx(1 - (100 + 50) / 200)
    assert fs.steady_rate(rows) == pytest.approx(2 / 90) and fs.steady_rate(rows[:1]) is None


def test_live_check_plan_and_report(tmp_path, capsys):
    """plan on the CPU, then report against a hand-made live result: prediction = L x (kernel + collectives)."""
    from benchmarks.multigpu import run_live_parallel as lc
    from tests.parallel.fixture_table import fixture_table, fixture_time_s
    plan_path = tmp_path / "plan.json"
    assert lc.main(["plan", "--gpus", "2", "--tokens", "64", "--layers", "3", "--out", str(plan_path)]) == 0
    p = json.loads(plan_path.read_text())
    tp, ep = p["layouts"]
    assert (tp["layout"], ep["layout"]) == ("TP2", "EP2") and len(p["routing"]) == 64
    assert tp["all_reduce_bytes"] == 64 * p["hidden"] * 2 and tp["all_to_all_bytes"] == 0
    rows = [r["rows"] for r in ep["ranks"]]
    assert sum(rows) == 64 * p["top_k"] and ep["busiest_rank"] == rows.index(max(rows))
    assert ep["imbalance"] == pytest.approx(max(rows) / (sum(rows) / 2))
    table = fixture_table(gpu_counts=(2,))
    table["backend"] = "nccl"  # FIXTURE times; report reads only NCCL tables
    (tmp_path / "t.json").write_text(json.dumps(table))
    live = {"results": {"TP2": {"stack_s": 1e-3, "kernels_s": 0.7e-3, "collectives_s": 0.2e-3}}}
    (tmp_path / "live.json").write_text(json.dumps(live))
    args = ["report", "--plan", str(plan_path), "--live", str(tmp_path / "live.json"), "--table",
            str(tmp_path / "t.json"), "--json", str(tmp_path / "rep.json")]
    assert lc.main(args) == 1  # EP2 was not timed live
    rep = json.loads((tmp_path / "rep.json").read_text())
    assert rep["not_timed"] == ["EP2"] and len(rep["rows"]) == 1
    want = 3 * (tp["ranks"][0]["predicted_s"] + fixture_time_s("all_reduce", 2, tp["all_reduce_bytes"]))
    row = rep["rows"][0]
    assert row["predicted_s"] == pytest.approx(want) and row["error"] == pytest.approx(want / 1e-3 - 1)
    assert row["within_target"] == (abs(want / 1e-3 - 1) <= 0.10)
    assert row["parts_sum_error"] == pytest.approx(-0.1)
    live["results"]["EP2"] = {"stack_s": 2e-3, "kernels_s": 1e-3, "collectives_s": 1e-3}
    (tmp_path / "live.json").write_text(json.dumps(live))
    assert lc.main(args) == 0
    (tmp_path / "t.json").unlink()
    capsys.readouterr()
    assert lc.main(args) == 2  # no table: one line naming the command
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "benchmarks/multigpu/run_collectives.py" in err[0]
