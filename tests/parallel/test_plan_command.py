"""kernel-gym plan (kernel_gym/cli/plan.py, kernel_gym/deploy/plan.py), the aiconfigurator scripts' error paths and
answer mapping, and a test against aiconfigurator itself that skips when the optional `kernel_gym[aic]` extra is
absent (CI)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from kernel_gym.cli.plan import main
from kernel_gym.deploy.plan import parse_slo
from kernel_gym.models import load_model
from kernel_gym.parallel import collectives as coll
from tests.script_module import load_script


def test_parse_slo_names_the_fix():
    assert parse_slo("ttft=2,tpot=0.1") == (2.0, 0.1)
    for bad in ("ttft=2", "ttft=x,tpot=1", "latency=1,tpot=1", "ttft=-1,tpot=0.1"):
        with pytest.raises(ValueError, match="ttft=SECONDS,tpot=SECONDS"):
            parse_slo(bad)
    assert main(["--model", "mixtral-8x7b", "--gpus", "9", "--trace", "bundled", "--no-mlflow"]) == 2


def test_aic_scripts_say_when_aiconfigurator_is_missing(capsys):
    if importlib.util.find_spec("aiconfigurator_core") is not None:
        pytest.skip("aiconfigurator is installed here; the missing-package message cannot be shown")
    from benchmarks.serving_plan import run_aic_answers as aic_answers

    aic_prior = load_script("aic_prior")

    assert aic_prior.main(["--out", "/nonexistent/x.json"]) == 2
    assert aic_answers.main(["--out", "/nonexistent/x.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("pip install 'kernel_gym[aic]'" in line for line in err)


def test_aic_answer_maps_to_a_deployment():
    from benchmarks.serving_plan import run as b

    spec = load_model("mixtral-8x7b")
    answer = {"ranked": [{"tp": "1", "dp": "1", "moe_tp": "1", "moe_ep": "1", "num_total_gpus": "1",
                          "parallel": "tp1pp1dp1etp1ep1", "seq/s": "18.0"}],
              "top1_launch": {"worker_args": ['--tensor-parallel-size "1" --max-num-seqs "512" '
                                              "--max-num-batched-tokens 3032"]}}
    dep, note = b.aic_deployment(answer, spec, "vllm", 8)
    assert (dep.replicas, dep.tp, dep.ep, dep.max_seqs, dep.max_batched_tokens) == (8, 1, 1, 512, 3032) and not note
    answer["ranked"][0].update(tp="1", dp="2", moe_tp="2", num_total_gpus="2", parallel="tp1pp1dp2etp2ep1")
    dep, note = b.aic_deployment(answer, spec, "vllm", 8)
    assert (dep.replicas, dep.tp, dep.ep) == (4, 2, 1) and "priced as MoE tp2 ep1" in note
    assert b.aic_deployment({"error": ["x"]}, spec, "vllm", 8)[0] is None


def test_committed_prior_matches_aiconfigurator():
    pytest.importorskip("aiconfigurator_core", reason="optional kernel_gym[aic] extra not installed (CI skips this)")
    import aiconfigurator_core

    aic_prior = load_script("aic_prior")

    root = Path(aiconfigurator_core.__file__).parent / "systems" / "data" / "h200_sxm"
    fresh = aic_prior.convert(root, "0.12.0")
    committed = json.loads(coll.PRIOR_TABLE.read_text())
    key = lambda r: (r["op"], r["gpus"], r["bytes"])  # noqa: E731
    assert {key(r): r["median_s"] for r in fresh["results"]} == {key(r): r["median_s"] for r in committed["results"]}


@pytest.mark.slow
def test_plan_end_to_end_on_one_gpu(tmp_path, capsys):
    out = tmp_path / "plan.json"
    rc = main(["--model", "mixtral-8x7b", "--gpus", "1", "--trace", "bundled", "--window-s", "4", "--train-steps",
               "8", "--samples", "0", "--refine-rounds", "0", "--next", "2", "--no-mlflow", "--json", str(out)])
    assert rc == 0
    plan = json.loads(out.read_text())
    best = plan["recommended"]
    assert best["launch"][0].startswith("CUDA_VISIBLE_DEVICES=0 vllm serve mistralai/")
    assert best["kernel_config_files"][0]["file"] == "E=8,N=14336,device_name=NVIDIA_H200.json"
    assert best["predicted"]["prior_share"] == 0.0 and 0 <= best["predicted"]["estimated_share"] <= 1
    assert plan["next_best"] == [] and "recommended:" in capsys.readouterr().out  # one GPU: one layout, TP1


def test_bench_order_and_windows():
    import numpy as np

    from benchmarks.serving_plan import run as b
    from kernel_gym.traffic.traces import Trace

    keys = b.priority(["a", "b"], [8, 1], ["conv", "code"], ["saturated", "own"])
    assert len(keys) == len(set(keys)) == 16 and keys[0] == ("conv", "saturated", "a", 8)
    tr = Trace("t", np.linspace(0, 1000, 501), np.full(501, 100), np.full(501, 10))
    for load in (1, 8, 64):
        w = b.window_for(tr, "azure-code", load, 300)
        assert (1 + 0.25) * w * load <= 0.2 * tr.duration_s  # window and warm-up fit the held-out 20%
    assert b.window_for(tr, "burstgpt", 2, 300) == 0.15 * 1000 / 2
