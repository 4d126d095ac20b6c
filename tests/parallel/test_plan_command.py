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
    captured = capsys.readouterr()
    assert plan["next_best"] == [] and "recommended:" in captured.out  # one GPU: one layout, TP1
    assert "read these with the simulator against" in captured.out  # its error beside its figures (issue 29, item 5)
    assert "--model-id" not in captured.err  # a zoo model: its Hugging Face id is known
    assert (plan["engine"], plan["engine_version"]) == ("vllm", "0.34.0")  # the release whose defaults were priced
    assert best["deployment"]["version"] == "0.34.0"


def test_plan_refuses_a_release_it_does_not_model(capsys):
    rc = main(["--model", "mixtral-8x7b", "--gpus", "1", "--trace", "bundled", "--engine-version", "0.20.0",
               "--no-mlflow"])
    err = capsys.readouterr().err
    assert rc == 2 and "0.33.0, 0.34.0" in err and "--engine-version" in err


def test_plan_of_a_users_spec_says_to_name_the_checkpoint(tmp_path, capsys):
    """A spec file's name is no checkpoint an engine can load: the launch commands carry it, and plan says to pass
    --model-id (with it, the commands name that checkpoint)."""
    spec = json.loads((Path(__file__).resolve().parents[2] / "docs" / "example_spec.json").read_text())
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(spec))
    args = ["--model", str(path), "--gpus", "1", "--trace", "bundled", "--window-s", "4", "--train-steps", "8",
            "--samples", "0", "--refine-rounds", "0", "--next", "0", "--no-mlflow", "--json", str(tmp_path / "p.json")]
    assert main(args) == 0
    assert f"name the model {spec['name']!r}" in capsys.readouterr().err
    assert main([*args, "--model-id", "org/my-moe"]) == 0
    assert "--model-id" not in capsys.readouterr().err
    assert "vllm serve org/my-moe" in json.loads((tmp_path / "p.json").read_text())["recommended"]["launch"][0]


@pytest.mark.slow
def test_plan_with_the_load_curve_on_the_bundled_trace(tmp_path, capsys):
    """The README's plan on the bundled trace with the MLflow curve on: 4x the load compresses the trace's time, so the
    30 s window no longer fits its 120 s held-out part; the point is replayed on a shorter window (said so in the
    log, the JSON and the MLflow run), and the plan completes (rc 0) and writes its JSON."""
    import mlflow

    out, uri = tmp_path / "plan.json", f"sqlite:///{tmp_path / 'mlflow.db'}"
    rc = main(["--model", "mixtral-8x7b", "--gpus", "1", "--trace", "bundled", "--window-s", "30", "--train-steps",
               "0", "--samples", "0", "--refine-rounds", "0", "--next", "1", "--json", str(out), "--tracking-uri", uri])
    std = capsys.readouterr()
    assert rc == 0, std.err
    plan = json.loads(out.read_text())
    assert plan["recommended"]["predicted"]["goodput_req_per_s"] > 0 and plan["mlflow_run_id"]
    (pts,) = plan["goodput_vs_load"].values()
    assert [p["load"] for p in pts] == [0.5, 1, 2, 4]
    assert [p["window_s"] for p in pts[:3]] == [30.0] * 3 and 20 <= pts[3]["window_s"] < 24
    (note,) = plan["goodput_vs_load_notes"]
    assert note["load"] == 4 and not note["skipped"] and "held-out part" in note["note"]
    assert "load 4x replayed on a" in std.err and "MLflow run" in std.out
    assert pts[1]["goodput_req_per_s"] == plan["recommended"]["predicted"]["goodput_req_per_s"]  # 1x: the prediction
    run = mlflow.MlflowClient(tracking_uri=uri).get_run(plan["mlflow_run_id"])
    assert run.data.metrics["goodput_vs_load_points"] == 4 and run.data.metrics["goodput_vs_load_skipped"] == 0
    assert "load 4x replayed" in run.data.tags["goodput_vs_load_notes"]


@pytest.mark.slow
def test_plan_table_says_which_goodput_ranks(tmp_path, capsys):
    """The rows rank by training-window goodput (as the recommendation); the table shows it beside the held-out
    goodput (the prediction) and stars a row whose held-out goodput beats the recommended one's."""
    out = tmp_path / "plan.json"
    assert main(["--model", "mixtral-8x7b", "--gpus", "2", "--trace", "bundled", "--window-s", "4", "--train-steps",
                 "0", "--samples", "0", "--refine-rounds", "0", "--next", "2", "--no-mlflow", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    plan = json.loads(out.read_text())
    best, rows = plan["recommended"], plan["next_best"]
    train = [e["train_goodput_req_per_s"] for e in [best, *rows]]
    assert rows and train == sorted(train, reverse=True)
    assert "next best (ranked by training goodput, then headroom)" in text
    assert "train req/s" in text and "held-out req/s" in text
    assert f"training windows: {best['train_goodput_req_per_s']:.2f} req/s" in text
    lines = [line for line in text.splitlines() if line.startswith("  vllm-0.34.0:")]
    assert len(lines) == len(rows)
    for line, e in zip(lines, rows):
        held = e["predicted"]["goodput_req_per_s"]
        assert f"{e['train_goodput_req_per_s']:.2f}" in line and f"{held:.2f}" in line
        assert line.rstrip().split()[-3].endswith("*") == (held > best["predicted"]["goodput_req_per_s"])


def test_curve_points_that_do_not_fit_are_shortened_or_skipped():
    from kernel_gym.deploy.plan import fit_window

    def make(room):  # an env that holds windows up to `room` seconds (ServingPlan-v0's message when it does not)
        def f(w):
            if w > room:
                raise ValueError("the heldout part of trace 't' is shorter than context + warm-up + window")
            return ("env", w)
        return f

    assert fit_window(make(100), 60, 5) == (("env", 60), 60)
    env, w = fit_window(make(23.95), 60, 5)
    assert env == ("env", w) and w == 23.9
    assert fit_window(make(3.04), 60, 5) == (None, 3.0)  # under the minimum window: skipped

    def broken(w):
        raise ValueError("trace 't' has no arrivals in [0, 1) s")

    with pytest.raises(ValueError, match="no arrivals"):  # load_curve records other failures as skipped points
        fit_window(broken, 60, 5)


def test_load_curve_records_skipped_points():
    from kernel_gym.deploy.plan import baselines, load_curve, make_env
    from kernel_gym.traffic.windows import resolve_trace

    spec, trace = load_model("mixtral-8x7b"), resolve_trace("bundled")
    dep = baselines(spec, "vllm", 1)["engine_default"]
    pricer = make_env(spec, 1, "vllm", trace, (2, 0.1), 1, 2, "heldout").pricer
    curve, notes = load_curve(spec, 1, "vllm", trace, (2, 0.1), [dep], [1, 64], 2, pricer=pricer)
    (pts,) = curve.values()
    assert [p["load"] for p in pts] == [1] and pts[0]["window_s"] == 2
    (note,) = notes  # 64x: 120 s of held-out trace hold 1.9 simulated s, a 1.5 s window with its warm-up
    assert note["load"] == 64 and note["skipped"] and "skipped" in note["note"] and note["window_s"] < 2


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
