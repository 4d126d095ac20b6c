"""Training: learning beats random, MLflow run contents, the self-contained pyfunc model, interruption and resume,
reproducibility. On the analytic test backend (tests/fakes/analytic_backend.py), with tiny step counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import mlflow
import numpy as np
import pytest

from kernel_gym.cli.train import add_arguments, train_args
from kernel_gym.train import train as train_mod
from kernel_gym.train.train import TrainArgs, train
from tests.fakes.analytic_backend import AnalyticBackend
from tests.fakes.mlflow_store import fresh_store

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlstore")
    uri = fresh_store(root)
    old = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    yield root, uri
    if old is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = old


def small_args(root: Path, **kw) -> TrainArgs:
    base = dict(env_id="KernelGym/MoE-v0", total_timesteps=2048, n_steps=32, batch_size=64, eval_freq=1024,
                checkpoint_freq=1024, checkpoint_dir=str(root / "ckpt-moe"), progress_bar=False, experiment="t")
    base.update(kw)
    return TrainArgs(**base)


@pytest.fixture(scope="module")
def trained(store):
    root, _ = store
    return train(small_args(root), backend=AnalyticBackend())


def test_learning_beats_random_clearly(trained):
    m = trained.metrics
    assert m["final/geomean_policy"] >= m["final/random_policy_geomean"] + 0.1
    assert m["final/geomean_policy"] >= 0.9
    assert m["final/geomean_policy"] > m["final/geomean_default"]
    assert trained.num_timesteps == 2048


def test_run_logs_params_curves_versions_plots_and_registered_model(trained, store):
    client = mlflow.tracking.MlflowClient()
    run = client.get_run(trained.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["env_id"] == "KernelGym/MoE-v0" and run.data.params["seed"] == "0"
    assert run.data.params["total_timesteps"] == "2048"
    assert len(run.data.tags["git_commit"]) >= 7
    assert len(run.data.tags["data.reference_hash"]) == 16
    curve = client.get_metric_history(trained.run_id, "rollout/ep_rew_mean")
    assert len(curve) >= 2 and curve[-1].value > curve[0].value
    assert [m.step for m in client.get_metric_history(trained.run_id, "eval/geomean_policy")] == [1024, 2048]
    assert "train/loss" in run.data.metrics
    artifacts = {a.path for a in client.list_artifacts(trained.run_id)} | {
        a.path for a in client.list_artifacts(trained.run_id, "plots")
    }
    assert {"catalogue.json", "evaluation.json", "plots/learning_curve.png", "plots/chosen_configs.png"} <= artifacts
    png = Path(client.download_artifacts(trained.run_id, "plots/learning_curve.png"))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ev = json.loads(Path(client.download_artifacts(trained.run_id, "evaluation.json")).read_text())
    assert ev["on"] == "heldout" and ev["geomean_policy"] == pytest.approx(trained.evaluation.geomean_policy)
    assert trained.model_uri.startswith("models:/kernel-gym-moe-v0-mixtral-8x7b/")
    version = client.get_model_version("kernel-gym-moe-v0-mixtral-8x7b", trained.model_uri.rsplit("/", 1)[1])
    assert version.run_id == trained.run_id
    tags = version.tags
    assert tags["policy.model"] == "mixtral-8x7b" and tags["policy.model_conditioned"] == "false"
    assert json.loads(tags["policy.model_spec"])[0]["num_experts"] == 8
    assert tags["env_id"] == "KernelGym/MoE-v0" and len(tags["git_commit"]) >= 7 and "data.dataset_hash" in tags
    assert run.data.tags["policy.model"] == "mixtral-8x7b"
    assert not list(Path(trained.checkpoint_dir).glob("*.tmp*"))  # checkpoints written via a temporary file


def test_pyfunc_loads_and_predicts_without_kernel_gym(trained, store, tmp_path):
    _, uri = store
    rows = trained.evaluation.rows
    script = textwrap.dedent(f"""
        import json, sys
        sys.path = [p for p in sys.path if p not in ("", {str(Path.cwd())!r})]
        sys.modules["kernel_gym"] = None  # any import of kernel_gym now fails
        import mlflow, pandas as pd
        model = mlflow.pyfunc.load_model({trained.model_uri!r})
        keys = {json.dumps([r["workload"] for r in rows])}
        out = model.predict(pd.DataFrame({{"workload_key": keys}}))
        print(json.dumps({{"config": list(out["config"]), "source": list(out["mask_source"])}}))
    """)
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri, PYTHONPATH="")
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["config"] == [r["chosen"] for r in rows]  # the same choices as the in-process policy
    assert set(out["source"]) == {"known"}


def test_pyfunc_accepts_feature_columns_and_matches_the_torch_policy(trained, store):
    import pandas as pd
    from sb3_contrib import MaskablePPO

    from kernel_gym.dispatch.observation import observe, raw_features
    from kernel_gym.kernels.workloads import workload_from_key
    from kernel_gym.train.pyfunc_model import actor_logits
    from kernel_gym.train.tracking import export_policy_arrays

    rows = trained.evaluation.rows
    model = mlflow.pyfunc.load_model(trained.model_uri)
    feats = pd.DataFrame([raw_features(workload_from_key("fused_moe", r["workload"])) for r in rows])
    out = model.predict(feats.assign(kernel="fused_moe"))
    assert set(out["mask_source"]) <= {"rules", "nearest"}
    assert list(out["config"]) == [r["chosen"] for r in rows]
    ppo = MaskablePPO.load(Path(trained.checkpoint_dir) / "latest.zip", device="cpu")
    params, act = export_policy_arrays(ppo)
    obs = np.stack([observe(workload_from_key("fused_moe", r["workload"])) for r in rows])
    import torch

    with torch.no_grad():
        dist = ppo.policy.get_distribution(torch.as_tensor(obs))
        torch_logits = dist.distribution.logits.numpy()
    ours = actor_logits(params, act, obs)
    np.testing.assert_allclose(ours - ours.max(1, keepdims=True), torch_logits - torch_logits.max(1, keepdims=True),
                               atol=1e-4)
    with pytest.raises(ValueError, match="this policy is for 'fused_moe'"):
        model.predict(feats.assign(kernel="decode_attention"))


def test_interrupted_run_checkpoints_and_resumes_the_same_run(store, monkeypatch):
    root, _ = store
    args = small_args(root, env_id="KernelGym/PrefillAttention-v0", total_timesteps=1024, eval_freq=512,
                      checkpoint_freq=0, checkpoint_dir=str(root / "ckpt-int"), log_model=False)
    real = train_mod.evaluate_model

    def interrupt(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_mod, "evaluate_model", interrupt)
    with pytest.raises(KeyboardInterrupt):
        train(args, backend=AnalyticBackend())
    state = json.loads((root / "ckpt-int" / "state.json").read_text())
    assert state["num_timesteps"] == 512
    client = mlflow.tracking.MlflowClient()
    assert client.get_run(state["run_id"]).info.status == "KILLED"
    monkeypatch.setattr(train_mod, "evaluate_model", real)
    result = train(replace(args, resume=True), backend=AnalyticBackend())
    assert result.run_id == state["run_id"] and result.num_timesteps == 1024
    assert client.get_run(result.run_id).info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(result.run_id, "eval/geomean_policy")]
    assert steps == [1024]


def test_resume_without_a_checkpoint_is_an_error(store):
    root, _ = store
    args = small_args(root, checkpoint_dir=str(root / "never-written"), resume=True, log_model=False)
    with pytest.raises(ValueError, match="--resume: no checkpoint in .*never-written"):
        train(args, backend=AnalyticBackend())
    import argparse

    ns = add_arguments(argparse.ArgumentParser()).parse_args(["--resume", str(root / "never-written")])
    parsed = train_args(ns)
    assert parsed.resume is True and parsed.checkpoint_dir == str(root / "never-written")
    with pytest.raises(ValueError, match="--resume: no checkpoint in .*never-written"):
        train(replace(parsed, log_model=False), backend=AnalyticBackend())


def test_seeded_runs_are_reproducible(store):
    root, _ = store
    args = small_args(root, env_id="KernelGym/PrefillAttention-v0", total_timesteps=512, eval_freq=0,
                      checkpoint_freq=0, log_model=False)
    a = train(replace(args, checkpoint_dir=str(root / "rep-a")), backend=AnalyticBackend())
    b = train(replace(args, checkpoint_dir=str(root / "rep-b")), backend=AnalyticBackend())
    assert a.run_id != b.run_id
    assert a.evaluation.rows == b.evaluation.rows and a.metrics == b.metrics
    client = mlflow.tracking.MlflowClient()
    ha = [m.value for m in client.get_metric_history(a.run_id, "train/loss")]
    hb = [m.value for m in client.get_metric_history(b.run_id, "train/loss")]
    assert ha and ha == hb


def test_short_training_on_the_real_recorded_data_beats_the_default_on_heldout_workloads(store):
    """The packaged H200 dataset: held-out batch sizes never seen in training, decided with zero measurements."""
    from kernel_gym.measure import make_backend

    root, _ = store
    args = small_args(root, env_id="KernelGym/DecodeAttention-v0", total_timesteps=2048, n_steps=64, batch_size=128,
                      eval_freq=0, checkpoint_freq=0, checkpoint_dir=str(root / "real"), log_model=False)
    result = train(args, backend=make_backend("recorded"))
    e = result.evaluation
    assert e.num_workloads >= 3 and e.policy_failures == 0
    assert e.geomean_policy > e.geomean_default + 0.1
    assert e.geomean_policy > result.metrics["final/random_policy_geomean"]


def test_argument_parser_round_trips_and_rejects_bad_values():
    import argparse

    parser = add_arguments(argparse.ArgumentParser())
    ns = parser.parse_args(["--env-id", "KernelGym/DecodeAttention-v0", "--total-timesteps", "100", "--seed", "3",
                            "--no-progress-bar", "--net-arch", "32", "32"])
    args = train_args(ns)
    assert (args.env_id, args.total_timesteps, args.seed, args.progress_bar) == ("KernelGym/DecodeAttention-v0", 100,
                                                                                 3, False)
    assert args.net_arch == (32, 32) and args.kernel == "decode_attention"
    assert "Share of the profile" in parser.format_help()
    with pytest.raises(ValueError, match="--resume a and --checkpoint-dir b disagree"):
        train_args(parser.parse_args(["--resume", "a", "--checkpoint-dir", "b"]))
    with pytest.raises(ValueError, match="'KernelGym/Nope-v0' is not a kernel env"):
        TrainArgs(env_id="KernelGym/Nope-v0")
    with pytest.raises(ValueError, match="holdout must be in"):
        TrainArgs(holdout=1.5)


def test_a_zoo_policys_model_spec_tag_says_where_the_specs_are_instead_of_being_cut_mid_json() -> None:
    from kernel_gym import zoo
    from kernel_gym.train import tracking

    specs = [zoo.shard(spec, tp) for spec in zoo.ZOO.values() for tp in (1, 2)]  # ~15k characters of JSON
    tag = tracking.policy_identity("KernelGym/MoE-v0", specs, "abc")["policy.model_spec"]
    assert len(tag) <= tracking.TAG_VALUE_LIMIT and "provenance (model_specs)" in tag
    one = tracking.policy_identity("KernelGym/MoE-v0", specs[:1], "abc")["policy.model_spec"]
    assert json.loads(one)[0]["name"] == specs[0].name
